"""Sessions on the real model (SmolLM2, default config): turns reuse the cached prefix, sessions
over one Llm do not interfere, a saved (or forked) session continues with the same logits bit for
bit (q8 and f16, after eviction), and bad files, models and settings are refused clearly."""
import copy
import threading

import zlib

import numpy as np
import pytest

from mnn_h2o import config, session_file
from mnn_h2o.engine import Llm
from mnn_h2o.errors import ContextOverflowError, SessionFileError
from mnn_h2o.session import Session

pytestmark = pytest.mark.model

# Evicts within a short conversation: a layer is cut once it has seen 64 tokens.
EVICTING = {"eviction": {"trigger_min_tokens": 64, "sink_tokens": 16, "recent_tokens": 32, "update_interval": 8}}
STORY = "Tell me a story about a cat named Tom who lived in Paris and ate fish every day."


@pytest.fixture(scope="module")
def llm():
    return Llm.load("smollm2", progress=False)


def evicting(kv_dtype="q8r", **more):
    return config.validate(dict(EVICTING, runtime={"kv_dtype": kv_dtype}, **more))


def continuation(session, text="And then?", n=10):
    """Logits of a follow-up turn's prefill and of n greedy decode steps, [n + 1, vocab]."""
    ids = session.llm.tokenizer.encode(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    with session.llm.using(session._ctx) as llm:
        out = [llm.prefill(ids)]
        for _ in range(n):
            out.append(llm.decode(int(np.argmax(out[-1]))))
    return np.stack(out)


def test_turns_reuse_the_cached_prefix(llm):
    s = Session(llm)
    pieces = []
    r1 = s.say("What is 2 + 2?", max_new_tokens=8, on_text=pieces.append)
    assert "".join(pieces) == r1.text and r1.completion_tokens >= 1
    assert r1.finish_reason in ("stop", "length")
    first = s.token_ids
    assert r1.prompt_tokens == len(llm.tokenizer.encode(llm.tokenizer.render_chat(
        [{"role": "user", "content": "What is 2 + 2?"}])))
    r2 = s.reply(s.messages + [{"role": "user", "content": "And 3 + 3?"}], max_new_tokens=8)
    assert s.token_ids[:len(first)] == first          # the history was not fed again
    assert r2.prompt_tokens < 20
    assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]
    assert s.messages[-1]["content"] == r2.text
    assert s.stats()["tokens"] == len(s.token_ids)
    assert r2.stats == s.stats() and r2.stats["kv_bytes_held"] > 0 and r2.stats["whole_model_ratio"] > 1
    assert s.common_prefix(s.messages) == 4 and s.common_prefix([{"role": "user", "content": "x"}]) == 0
    with pytest.raises(ValueError, match="must extend"):
        s.reply([{"role": "user", "content": "something else"}])
    with pytest.raises(ValueError, match="no new message"):
        s.reply(s.messages)
    with pytest.raises(ValueError, match="role must be one of"):
        s.reply(s.messages + [{"role": "robot", "content": "hi"}])
    s.reset()
    assert s.messages == [] and s.token_ids == [] and s.stats()["kv_bytes_held"] == 0


def test_sessions_over_one_llm_do_not_interfere(llm):
    generated = llm.generate("Say hi.", 4).text
    pos = llm.pos
    questions = {"a": ["Name a color.", "Another one?"], "b": ["Name an animal.", "Another one?"]}
    sessions = {k: Session(llm) for k in questions}
    errors = []

    def talk(k):
        try:
            for q in questions[k]:
                sessions[k].say(q, max_new_tokens=6)
        except Exception as e:  # reported below: an exception in a thread would pass silently
            errors.append(e)

    threads = [threading.Thread(target=talk, args=(k,)) for k in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    alone = Session(llm)
    for q in questions["a"]:
        alone.say(q, max_new_tokens=6)
    assert alone.messages == sessions["a"].messages and alone.token_ids == sessions["a"].token_ids
    assert llm.pos == pos  # the Llm's own context was not touched
    assert llm.generate("Say hi.", 4).text == generated
    for s in (*sessions.values(), alone):
        s.close()
    with pytest.raises(ValueError, match="closed"):
        alone.say("hello")


@pytest.mark.parametrize("kv_dtype", ["q8r", "f16"])
def test_saved_and_forked_sessions_continue_bit_exactly(llm, tmp_path, kv_dtype):
    s = Session(llm, evicting(kv_dtype), system="You are a storyteller.")
    s.say(STORY, max_new_tokens=40)
    assert s._ctx.stats.evictions > 0 and s.stats()["tokens_held"] < s.stats()["tokens"]
    path = str(tmp_path / "a.session")
    s.save(path)
    loaded, forked = Session.load(path, llm), s.fork()
    for other in (loaded, forked):
        assert other.messages == s.messages and other.token_ids == s.token_ids
        assert other.stats() == s.stats() and other.cfg == s.cfg
    want = continuation(s)
    assert np.array_equal(continuation(loaded), want)
    assert np.array_equal(continuation(forked), want)


def test_a_loaded_session_takes_turns(llm, tmp_path):
    s = Session(llm, evicting())
    s.say("Name a fruit.", max_new_tokens=6)
    s.save(str(tmp_path / "b.session"))
    t = Session.load(str(tmp_path / "b.session"), llm)
    assert s.say("Another one?", max_new_tokens=6).text == t.say("Another one?", max_new_tokens=6).text
    assert s.token_ids == t.token_ids


def test_a_session_of_format_1_loads_with_its_old_section_name(llm, tmp_path, capsys):
    """Format 1 named the eviction section h2o in META's config; such a file loads silently and
    continues as the session it was."""
    s = Session(llm, evicting())
    s.say("Name a fruit.", max_new_tokens=6)
    path = str(tmp_path / "new.session")
    s.save(path)
    meta, cache = session_file.read(path)
    meta["config"] = {("h2o" if k == "eviction" else k): v for k, v in meta["config"].items()}
    old = bytearray(session_file.encode(meta, cache))
    old[8:12] = (1).to_bytes(4, "little")
    old[16:20] = zlib.crc32(bytes(old[:16])).to_bytes(4, "little")
    with open(tmp_path / "old.session", "wb") as f:
        f.write(old)
    capsys.readouterr()
    t = Session.load(str(tmp_path / "old.session"), llm)
    assert t.cfg == s.cfg and capsys.readouterr().err == ""
    assert s.say("Another one?", max_new_tokens=6).text == t.say("Another one?", max_new_tokens=6).text


def test_bad_files_models_and_settings_are_refused(llm, tmp_path):
    s = Session(llm)
    s.say("Hi!", max_new_tokens=4)
    path = str(tmp_path / "s.session")
    s.save(path)
    meta, cache = session_file.read(path)

    def refused(edit, match):
        bad = copy.deepcopy(meta)
        edit(bad)
        session_file.write(path + ".bad", bad, cache)
        with pytest.raises(SessionFileError, match=match):
            Session.load(path + ".bad", llm)

    refused(lambda m: m["model"].update(source_sha256="0" * 64), "saved with another model")
    refused(lambda m: m["model"].update(weight_bits=8), "saved with another model")
    refused(lambda m: m["cache"].update(block_tokens=32), "block_tokens 32")
    refused(lambda m: m["config"].update(eviction={"no_such_key": 1}), "settings are not valid")
    refused(lambda m: m["config"]["runtime"].update(kv_dtype="f16"), "dtype")
    refused(lambda m: m.update(token_ids=[-1]), "malformed")
    refused(lambda m: m.update(unpassed=len(m["token_ids"]) + 1), "unpassed must be")
    refused(lambda m: m.update(token_ids=m["token_ids"][:-1], unpassed=0), "has seen")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x10
    with open(path + ".bad", "wb") as f:
        f.write(bytes(data))
    with pytest.raises(SessionFileError, match="damaged"):
        Session.load(path + ".bad", llm)
    store = Session(llm, config.validate({"runtime": {"kv_dtype": "f16"}, "lossless": {"mode": "full"}}))
    with pytest.raises(ValueError, match="lossless.mode full"):
        store.save(path)


def test_overflow_cancel_and_stop_leave_the_session_usable(llm):
    s = Session(llm)
    with pytest.raises(ContextOverflowError, match="context overflow"):
        s.say("Hello", max_new_tokens=llm.max_context)
    assert s.messages == [] and s.token_ids == []
    cancel = threading.Event()
    r = s.say("Count from 1 to 50.", max_new_tokens=40, on_text=lambda _: cancel.set(), cancel=cancel)
    assert r.finish_reason == "cancelled" and r.completion_tokens < 5
    r = s.say("Count from 1 to 10, separated by commas.", max_new_tokens=30, stop=["5"])
    assert r.finish_reason == "stop" and "5" not in r.text
    before = s.token_ids
    r = s.say("Thanks.", max_new_tokens=4)
    assert r.prompt_tokens < 20 and s.token_ids[:len(before)] == before  # the history was not fed again
    assert len(s.token_ids) == s.stats()["tokens"]
