"""The server's request validation and its session pool (prefix match, LRU offload to disk,
restore, restart), over a fake session: no model, fast."""
import json
import os
import platform

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from mnn_h2o.serve.pool import SessionDirInUse, SessionPool  # noqa: E402
from mnn_h2o.serve.validation import ApiError, parse_chat, parse_completion, parse_json  # noqa: E402

LIMIT = 256


# --- validation ----------------------------------------------------------------------------------
def user(text):
    return {"role": "user", "content": text}


def test_a_chat_request_is_read_with_openai_defaults():
    r = parse_chat({"model": "smollm2", "messages": [{"role": "system", "content": "Be terse."}, user("Hi")]}, LIMIT)
    assert r.messages == [{"role": "system", "content": "Be terse."}, user("Hi")]
    assert (r.max_tokens, r.stream, r.include_usage, r.stop) == (None, False, False, [])
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.seed) == (1.0, 1.0, None)


def test_chat_parameters_map_to_sampling_and_stops():
    r = parse_chat({"messages": [user("Hi"), {"role": "assistant", "content": [{"type": "text", "text": "He"},
                                                                                 {"type": "text", "text": "llo"}]},
                                 user("Again")],
                    "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3, "seed": 11,
                    "stop": "\n", "stream": True, "stream_options": {"include_usage": True},
                    "n": 1, "presence_penalty": 0, "user": "someone"}, LIMIT)
    assert r.messages[1]["content"] == "Hello"
    assert (r.max_tokens, r.stop, r.stream, r.include_usage) == (7, ["\n"], True, True)
    s = r.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.0, 0.5, 3, 11)


@pytest.mark.parametrize("body, param, code", [
    ({}, "messages", "missing_required_parameter"),
    ({"messages": []}, "messages", "empty_array"),
    ({"messages": "Hi"}, "messages", "invalid_type"),
    ({"messages": ["Hi"]}, "messages[0]", "invalid_type"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"content": "Hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0]", "invalid_value"),
    ({"messages": [user("Hi")], "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"messages": [user("Hi")], "max_tokens": LIMIT + 1}, "max_tokens", "invalid_value"),
    ({"messages": [user("Hi")], "max_tokens": "5"}, "max_tokens", "invalid_type"),
    ({"messages": [user("Hi")], "max_tokens": 5.0}, "max_tokens", "invalid_type"),
    ({"messages": [user("Hi")], "max_tokens": True}, "max_tokens", "invalid_type"),
    ({"messages": [user("Hi")], "temperature": 2.5}, "temperature", "invalid_value"),
    ({"messages": [user("Hi")], "temperature": "hot"}, "temperature", "invalid_type"),
    ({"messages": [user("Hi")], "top_p": 0}, "top_p", "invalid_value"),
    ({"messages": [user("Hi")], "seed": -1}, "seed", "invalid_value"),
    ({"messages": [user("Hi")], "stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"messages": [user("Hi")], "stop": [1]}, "stop", "invalid_type"),
    ({"messages": [user("Hi")], "stream": "yes"}, "stream", "invalid_type"),
    ({"messages": [user("Hi")], "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({"messages": [user("Hi")], "n": 2}, "n", "unsupported_parameter"),
    ({"messages": [user("Hi")], "tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
    ({"messages": [user("Hi")], "logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"messages": [user("Hi")], "presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
    ({"messages": [user("Hi")], "response_format": {"type": "json_object"}}, "response_format",
     "unsupported_parameter"),
    ({"messages": [user("Hi")], "model": 3}, "model", "invalid_type"),
])
def test_bad_chat_requests_name_the_parameter(body, param, code):
    with pytest.raises(ApiError) as e:
        parse_chat(body, LIMIT)
    err = e.value.body()["error"]
    assert (e.value.status, err["param"], err["code"], err["type"]) == (400, param, code, "invalid_request_error")
    assert err["message"]


def test_a_completion_request_takes_a_plain_prompt():
    r = parse_completion({"prompt": ["The capital of France is"], "max_tokens": 4}, LIMIT)
    assert (r.prompt, r.max_tokens) == ("The capital of France is", 4)
    assert parse_completion({"prompt": "x"}, LIMIT).max_tokens == 16  # OpenAI's default
    assert parse_completion({"prompt": "x"}, 8).max_tokens == 8
    for body, param in (({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": [1, 2]}, "prompt"),
                        ({"prompt": "x", "echo": True}, "echo"), ({"prompt": "x", "max_tokens": 10**6}, "max_tokens")):
        with pytest.raises(ApiError) as e:
            parse_completion(body, LIMIT)
        assert e.value.param == param


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b"null", b'"text"', b"[" * 100000])
def test_bad_json_bodies(raw):
    with pytest.raises(ApiError) as e:
        parse_json(raw)
    assert e.value.code == "invalid_json" and e.value.status == 400


# --- the pool, over fake sessions -----------------------------------------------------------------
BYTES_PER_MESSAGE = 1000


class FakeSession:
    """What the pool uses of mnn_h2o.session.Session: a conversation whose 'cache' grows with it."""
    closed = 0

    # Like Session's compress_after_answer: an answer leaves the cache HELD_FACTOR times its
    # compressed size until compress().
    HELD_FACTOR = 3

    def __init__(self, messages=None, compress_after_answer=False):
        self._messages = list(messages or [])
        self.open = True
        self.compress_after_answer = compress_after_answer
        self.held = False

    @property
    def messages(self):
        return [dict(m) for m in self._messages]

    @property
    def token_ids(self):
        return list(range(10 * len(self._messages)))

    def reply(self, messages):
        assert self.open
        assert messages[:len(self._messages)] == self._messages and len(messages) > len(self._messages)
        self.compress()  # a turn runs what the last one left first
        self._messages = list(messages) + [{"role": "assistant", "content": f"answer {len(messages)}"}]
        self.held = self.compress_after_answer
        return self._messages[-1]["content"]

    def compress(self):
        ran, self.held = self.held, False
        return ran

    def stats(self):
        return {"kv_bytes_held": BYTES_PER_MESSAGE * len(self._messages) * (self.HELD_FACTOR if self.held else 1),
                "compression_held": self.held}

    def save(self, path):
        assert self.open
        with open(path, "w") as f:
            json.dump({"fake_session": self._messages}, f)

    @classmethod
    def load(cls, path, compress_after_answer=False):
        with open(path) as f:
            obj = json.load(f)
        if not isinstance(obj, dict) or "fake_session" not in obj:
            raise ValueError(f"{path} is not a saved session")
        return cls(obj["fake_session"], compress_after_answer)

    def close(self):
        self.open = False
        FakeSession.closed += 1


def make_pool(tmp_path, budget=10**9, max_sessions=100):
    return SessionPool(FakeSession, FakeSession.load, str(tmp_path), budget, max_sessions)


def turn(pool, messages):
    """One request; returns (the conversation after it, how many messages were reused, restored)."""
    with pool.checkout(messages) as co:
        co.session.reply(messages)
        return co.session.messages, co.reused_messages, co.restored


def test_a_follow_up_continues_the_session_that_holds_its_history(tmp_path):
    pool = make_pool(tmp_path)
    conv, reused, _ = turn(pool, [user("a")])
    assert reused == 0 and len(conv) == 2
    conv, reused, _ = turn(pool, conv + [user("b")])
    assert reused == 2 and len(conv) == 4
    # Another conversation, and an edited history: neither extends a session, both start new ones.
    assert turn(pool, [user("x")])[1] == 0
    assert turn(pool, [user("a"), {"role": "assistant", "content": "edited"}, user("b")])[1] == 0
    # The same history twice: the second request does not extend the first session's conversation
    # (it already holds an answer to the last message), so it gets its own.
    assert turn(pool, [user("a")])[1] == 0
    assert pool.stats()["sessions_in_memory"] == 4


def test_the_longest_matching_history_wins(tmp_path):
    pool = make_pool(tmp_path)
    short, _, _ = turn(pool, [user("a")])
    longer, _, _ = turn(pool, short + [user("b")])
    other, _, _ = turn(pool, [user("a")])  # a second session holding [a, answer]
    assert other == short
    _, reused, _ = turn(pool, longer + [user("c")])
    assert reused == 4


def test_over_budget_the_least_recently_used_idle_session_goes_to_disk_and_comes_back(tmp_path):
    # Each conversation after one turn holds 2 messages = 2000 bytes; the budget holds two of them.
    pool = make_pool(tmp_path, budget=4000)
    a, _, _ = turn(pool, [user("a")])
    b, _, _ = turn(pool, [user("b")])
    assert pool.stats()["sessions_saved"] == 0
    c, _, _ = turn(pool, [user("c")])  # a is the least recently used: offloaded
    st = pool.stats()
    assert (st["sessions_in_memory"], st["sessions_saved"], st["offloaded"], st["kv_bytes_held"]) == (2, 1, 1, 4000)
    saved = [f for f in os.listdir(tmp_path) if f.endswith(".session")]
    assert len(saved) == 1
    # a's follow-up restores it from disk (its files go: it lives in memory again), b goes out.
    a2, reused, restored = turn(pool, a + [user("a2")])
    assert (reused, restored, len(a2)) == (2, True, 4)
    assert saved[0] not in os.listdir(tmp_path)
    st = pool.stats()
    assert (st["restored"], st["offloaded"], st["sessions_saved"]) == (1, 3, 2)  # b and c out: a holds 4000
    # The session in use is never offloaded, even alone over the budget.
    assert st["kv_bytes_held"] == 4000 and st["sessions_in_memory"] == 1
    a3, _, _ = turn(pool, a2 + [user("a3")])
    assert pool.stats()["sessions_in_memory"] == 1 and pool.stats()["kv_bytes_held"] == 6000
    # Every conversation continues, restored or not.
    for conv in (b, c):
        _, reused, restored = turn(pool, conv + [user("more")])
        assert (reused, restored) == (2, True)


def test_at_most_max_sessions_are_kept(tmp_path):
    pool = make_pool(tmp_path, budget=2000, max_sessions=2)
    a, _, _ = turn(pool, [user("a")])
    turn(pool, [user("b")])
    turn(pool, [user("c")])  # a (on disk by now) is dropped, its files too
    assert pool.stats()["sessions_in_memory"] + pool.stats()["sessions_saved"] == 2
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".session")]) == 1
    assert turn(pool, a + [user("again")])[1] == 0  # a prefills its history again


def test_compression_after_the_answer_brings_the_pool_back_within_its_budget(tmp_path):
    """A session's answer leaves its cache uncompressed (3x here) and counted as such; the work the
    model thread runs after the answer compresses it, and only what is still over the budget then
    goes to disk."""
    pool = SessionPool(lambda: FakeSession(compress_after_answer=True), lambda p: FakeSession.load(p, True),
                       str(tmp_path), 4000, 100)
    a, _, _ = turn(pool, [user("a")])
    st = pool.stats()
    assert (st["kv_bytes_held"], st["sessions_compression_held"], st["offloaded"]) == (6000, 1, 0)  # alone: kept
    assert pool.compress_held() == 1
    st = pool.stats()
    assert (st["kv_bytes_held"], st["sessions_compression_held"], st["compressed_after_answer"]) == (2000, 0, 1)
    assert pool.compress_held() == 0  # nothing left to do
    turn(pool, [user("b")])  # b held (6000) + a (2000) over 4000: a, the idle one, goes to disk
    st = pool.stats()
    assert (st["kv_bytes_held"], st["offloaded"]) == (6000, 1)
    pool.compress_held()
    turn(pool, a + [user("a2")])  # a comes back (4 messages, held: 12000), b (2000) goes out
    assert pool.stats()["offloaded"] == 2 and pool.stats()["kv_bytes_held"] == 12000
    pool.compress_held()
    assert pool.stats()["kv_bytes_held"] == 4000 <= pool.budget


def test_a_failed_first_turn_keeps_nothing(tmp_path):
    pool = make_pool(tmp_path)
    with pytest.raises(RuntimeError):
        with pool.checkout([user("a")]):
            raise RuntimeError("context overflow, say")
    assert pool.stats()["sessions_in_memory"] == 0


def test_a_clean_stop_saves_every_session_and_a_restart_continues_them(tmp_path):
    pool = make_pool(tmp_path, budget=10**9)
    a, _, _ = turn(pool, [user("a")])
    b, _, _ = turn(pool, [user("b")])
    pool.close()
    pool = make_pool(tmp_path, budget=10**9)
    assert pool.stats()["sessions_saved"] == 2
    for conv in (a, b):
        assert turn(pool, conv + [user("next")])[1:] == (2, True)
    pool.close(save=False)  # a temporary directory: nothing worth writing
    assert [f for f in os.listdir(tmp_path) if f != ".lock"] == []


def test_after_a_crash_the_sessions_on_disk_continue(tmp_path):
    pool = make_pool(tmp_path, budget=2000)  # one conversation in memory, the others on disk
    convs = [turn(pool, [user(t)])[0] for t in "abc"]
    pool._dir_lock.close()  # the crash: the process is gone, its lock with it; nothing else runs
    pool = make_pool(tmp_path, budget=2000)
    st = pool.stats()
    assert (st["sessions_saved"], st["sessions_in_memory"]) == (2, 0)
    assert [turn(pool, c + [user("next")])[1:] for c in convs] == [(2, True), (2, True), (0, False)]


def test_one_server_per_session_dir(tmp_path):
    pool = make_pool(tmp_path)
    with pytest.raises(SessionDirInUse, match="in use by another server"):
        make_pool(tmp_path)
    pool.close()
    make_pool(tmp_path).close()


def test_broken_saved_sessions_are_set_aside_and_the_conversation_prefills_again(tmp_path):
    pool = make_pool(tmp_path, budget=2000)
    a, _, _ = turn(pool, [user("a")])
    b, _, _ = turn(pool, [user("b")])  # a on disk
    (name,) = [f for f in os.listdir(tmp_path) if f.endswith(".session")]
    (tmp_path / name).write_text("garbage")
    assert turn(pool, a + [user("a2")])[1:] == (0, False)
    assert pool.stats()["restore_failed"] == 1
    assert name not in os.listdir(tmp_path)
    pool.close()
    # Leftovers of an interrupted save and indexes without their cache are removed at start.
    (tmp_path / "x.session.tmp1234").write_text("partial")
    (tmp_path / "y.json").write_text(json.dumps({"format": "mnn_h2o.serve.session_index", "version": 1,
                                                 "messages": [user("y")], "kv_bytes": 0}))
    (tmp_path / "z.json").write_text("{not json")
    (tmp_path / "w.session").write_text("a cache whose index was never written")
    pool = make_pool(tmp_path)
    assert not {"x.session.tmp1234", "y.json", "z.json", "w.session"} & set(os.listdir(tmp_path))
    assert pool.stats()["sessions_saved"] == 2


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_server_keeps_large_buffers_mapped():
    """The server fixes glibc's mmap threshold (freed session buffers go back to the system);
    tests/test_serve_load.py checks the memory bound it keeps."""
    from mnn_h2o.serve.__main__ import keep_large_buffers_mapped

    assert keep_large_buffers_mapped() is True


def test_the_work_after_an_answer_runs_behind_the_requests_that_came_meanwhile():
    """ModelThread.stream's ``then`` (the server's compression after an answer) is queued when the
    job ends, so a request already waiting is answered first; its errors are logged, not raised."""
    import asyncio
    import threading

    from mnn_h2o.serve.model_thread import ModelThread

    order = []
    started = threading.Event()
    release = threading.Event()

    def first(emit):
        started.set()
        release.wait(10)
        order.append("first")

    def failing_then():
        order.append("then")
        raise RuntimeError("logged, not raised")

    async def main():
        mt = ModelThread()
        events = mt.stream(first, then=failing_then)
        pending = asyncio.ensure_future(events.__anext__())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        waiting = asyncio.ensure_future(mt.run(lambda: order.append("second")))  # queued during `first`
        release.set()
        assert (await pending)[0] == "done"
        await waiting
        await mt.run(lambda: None)  # behind `then`
        mt.shutdown()

    asyncio.run(main())
    assert order == ["first", "second", "then"]
