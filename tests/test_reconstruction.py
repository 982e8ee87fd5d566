"""The kvzip policy's context reconstruction pass and the global budget, on the real SmolLM2."""
import numpy as np
import pytest

from conftest import make_llm

KVZIP = {"policy": "kvzip", "layer_budget": "global", "trigger_min_tokens": 0, "sink_tokens": 16,
         "recent_tokens": 32}


def test_kvzip_needs_the_prompt_whole():
    from mnn_h2o import config

    with pytest.raises(config.ConfigError, match="prefill_eviction chunk"):
        config.validate({"eviction": {"policy": "kvzip", "prefill_eviction": "chunk"}})
    assert config.validate({"eviction": {"policy": "kvzip", "layer_budget": "global"}})["eviction"]["layer_budget"] == "global"


@pytest.fixture(scope="module")
def llm():
    return make_llm(8, kv_dtype="q8")


@pytest.mark.model
def test_the_pass_leaves_the_prompt_as_it_was(llm, tokenizer):
    """Without eviction, a pass changes nothing: the cache holds the prompt's rows only, the
    memory is what it was, and decoding goes on bit for bit as without eviction."""
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 304)
    llm.configure_eviction(None)
    off = [llm.prefill(ids[:300])]
    rows_off = [llm.cache.read(layer, 1) for layer in (0, 15, 29)]
    held_off = llm.stats.kv_bytes_held
    off += [llm.decode(t) for t in ids[300:]]
    llm.configure_eviction(dict(KVZIP, trigger_min_tokens=100000))  # never evicts ...
    on = [llm.prefill(ids[:300], reserve=100000)]  # ... and the reserve makes the pass run now
    s = llm.stats
    assert s.reconstruct_tokens > 300 and 0 < s.reconstruct_s < s.prefill_s
    assert s.kv_bytes_held == held_off and s.kv_bytes_peak > held_off  # the pass's tokens, then freed
    assert all(h == 300 for layer in llm.cache.eviction_stats()["layers"] for h in layer["held"])
    for (k0, v0), layer in zip(rows_off, (0, 15, 29)):
        k1, v1 = llm.cache.read(layer, 1)
        np.testing.assert_array_equal(k0, k1)
        np.testing.assert_array_equal(v0, v1)
    scores = llm.cache.block_scores(15, reconstruction=True)
    assert scores.shape == (3, 19) and np.all((scores > 0) & (scores <= 1))  # every held block scored
    on += [llm.decode(t) for t in ids[300:]]
    np.testing.assert_array_equal(np.stack(off), np.stack(on))
    llm.configure_eviction(None)


@pytest.mark.model
def test_kvzip_meets_the_ratio_and_keeps_prompt_rows(llm, tokenizer):
    """The global budget holds what the uniform one holds (the whole-model target, measured), in
    prefill and decode, within one block per head (kvzip's token plan may leave a head's last
    block partial: never over); what stays of each head are rows of the prompt, in order, chosen
    per token (runs that do not start on a block boundary)."""
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 448)
    llm.configure_eviction(None)
    llm.prefill(ids[:400])
    full = {(l, h): llm.cache.read(l, h)[0] for l in (3, 20) for h in range(3)}
    held, blocks = {}, {}
    for name, section in (("h2o", {"policy": "h2o", "layer_budget": "uniform", "trigger_min_tokens": 0, "sink_tokens": 16,
                                    "recent_tokens": 32, "update_interval": 16}),
                          ("kvzip", dict(KVZIP, update_interval=16))):
        llm.configure_eviction(dict(section, target_lossy_ratio=3.2))
        llm.prefill(ids[:400])
        held[name] = llm.stats.kv_bytes_held
        assert 3.0 < llm.stats.whole_model_ratio < 3.4, (name, llm.stats.whole_model_ratio)
        lengths = [h for layer in llm.cache.eviction_stats()["layers"] for h in layer["held"]]
        blocks[name] = sum(2 * -(-n // 16) for n in lengths)  # K and V blocks of 16 tokens
        if name == "kvzip":
            lengths = [h for layer in llm.cache.eviction_stats()["layers"] for h in layer["held"]]
            assert len(set(lengths)) > 1  # heads of different needs got different shares
            unaligned = 0
            for (l, h), k_full in full.items():
                k = llm.cache.read(l, h)[0]
                # every kept row is a prompt row, in order (a subsequence of the full cache)
                at, prev = 0, -1
                for row in k:
                    while at < len(k_full) and not np.array_equal(k_full[at], row):
                        at += 1
                    assert at < len(k_full), (l, h)
                    unaligned += at != prev + 1 and at % 16 != 0  # a run starting inside a block
                    prev = at
                    at += 1
            assert unaligned > 0
        for t in ids[400:]:
            llm.decode(t)
        assert 3.0 < llm.stats.whole_model_ratio < 3.4, (name, llm.stats.whole_model_ratio)
    block_bytes = held["h2o"] // blocks["h2o"]
    heads = len(lengths)  # (layer, kv head) pairs, every one evicting
    assert held["h2o"] - 2 * heads * block_bytes <= held["kvzip"] <= held["h2o"], (held, block_bytes)
    llm.configure_eviction(None)


@pytest.mark.model
@pytest.mark.slow
def test_kvzip_keeps_a_fact_asked_after_compression(llm, tokenizer):
    """A password planted in an essay, the question asked after the cache was cut to 3.2x: the
    full cache answers, h2o (uniform) has evicted it, kvzip (global) answers. Greedy, so fixed."""
    from mnn_h2o.essays import essay_tokens

    hay = essay_tokens(tokenizer, 420)
    fact = tokenizer.encode("\n\nThe password for the old lighthouse is thunderbolt.\n\n")
    question = tokenizer.encode("\n\nQuestion: What is the password for the old lighthouse?\n"
                                "Answer: The password for the old lighthouse is")
    answers = {}
    for name, section in (("full", None),
                          ("h2o", {"policy": "h2o", "layer_budget": "uniform", "trigger_min_tokens": 0, "sink_tokens": 16, "recent_tokens": 32}),
                          ("kvzip", KVZIP)):
        llm.configure_eviction(None if section is None else dict(section, target_lossy_ratio=3.2))
        llm.prefill(hay[:150] + fact + hay[150:])
        answers[name] = llm.generate(question, 4, chat=False, keep_context=True).text
    assert "thunderbolt" in answers["full"] and "thunderbolt" in answers["kvzip"], answers
    assert "thunderbolt" not in answers["h2o"], answers
    llm.configure_eviction(None)


@pytest.mark.model
def test_each_context_repeats_only_its_own_tokens(llm, tokenizer):
    """The tokens a pass will repeat belong to one context: a session's answer is never repeated
    in another session's pass (the server runs many contexts on one Llm)."""
    from mnn_h2o import config
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 40)
    cfg = config.load(None, {})
    cfg["eviction"].update(KVZIP, trigger_min_tokens=100000)
    a, b, alone = llm.new_context(cfg), llm.new_context(cfg), llm.new_context(cfg)
    with llm.using(alone):
        llm.prefill(ids[:20], reserve=100000)  # the reserve makes each pass run now
        repeated_alone = llm.stats.reconstruct_tokens
    with llm.using(a):
        llm.prefill(ids[:30], reserve=100000)  # the pass takes the prompt's tokens
        llm.decode(ids[30])    # the answer's wait for a's next pass
    with llm.using(b):
        llm.prefill(ids[:20], reserve=100000)
        assert 20 < llm.stats.reconstruct_tokens == repeated_alone  # none of a's
    assert a.unpassed == [ids[30]] and b.unpassed == []


@pytest.mark.model
def test_the_pass_waits_for_the_trigger(llm, tokenizer):
    """Below eviction.trigger_min_tokens a prompt runs no pass; the first prompt, reserve or decode
    step that reaches the trigger runs one over every token written until then."""
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 80)
    llm.configure_eviction(dict(KVZIP, trigger_min_tokens=64))
    llm.prefill(ids[:40])
    assert llm.stats.reconstruct_tokens == 0 and llm.unpassed == ids[:40]
    llm.prefill(ids[40:70])  # 70 >= 64: one pass over both prompts
    assert llm.stats.reconstruct_tokens > 70 and llm.unpassed == []

    llm.reset()
    llm.prefill(ids[:40], reserve=24)  # the decode to come reaches the trigger: pass now
    assert llm.stats.reconstruct_tokens > 40 and llm.unpassed == []

    llm.reset()
    llm.prefill(ids[:60])
    for t in ids[60:63]:
        llm.decode(t)
    assert llm.stats.reconstruct_tokens == 0 and len(llm.unpassed) == 63
    llm.decode(ids[63])  # the 64th token: the pass runs before it
    assert llm.stats.reconstruct_tokens > 63 and llm.unpassed == [ids[63]]
    llm.configure_eviction(None)


@pytest.mark.model
def test_chunk_softmax_is_the_full_one_for_a_single_chunk(llm, tokenizer, monkeypatch):
    """eviction.reconstruction_softmax chunk (KVzip's scoring): with the context in one chunk the
    sinks, the chunk and the pass are every key a query sees, so the scores are those of the full
    softmax; in several chunks each scores only its own tokens, every block still scored."""
    from mnn_h2o import reconstruction
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 300)

    def scores(softmax):
        llm.configure_eviction(dict(KVZIP, trigger_min_tokens=100000, reconstruction_softmax=softmax))
        llm.prefill(ids, reserve=100000)  # the pass runs, nothing is evicted
        return [llm.cache.block_scores(layer, reconstruction=True) for layer in (0, 15, 29)]

    full, chunk = scores("all"), scores("chunk")
    for a, b in zip(full, chunk):
        # Not the last block (rows 288-303): the pass's first tokens fill it after the prompt's
        # last, and the full softmax's block peaks (the kernel's) count theirs too.
        np.testing.assert_allclose(b[:, :-1], a[:, :-1], rtol=1e-4, atol=1e-7)
    monkeypatch.setattr(reconstruction, "CHUNK_TOKENS", 100)
    full, chunk = scores("all"), scores("chunk")
    assert not all(np.allclose(a, b) for a, b in zip(full, chunk))
    assert all(np.all((b > 0) & (b <= 1)) for b in chunk)  # each block is in some chunk
    llm.configure_eviction(None)


@pytest.mark.model
def test_prefill_reports_the_prompt_then_the_pass(llm, tokenizer):
    """prefill's progress follows the prompt chunk by chunk, then the pass's tokens (what the
    stats count as repeated), each stage ending at its total; no pass, no "pass" stage."""
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 300)
    calls = []
    llm.configure_eviction(dict(KVZIP, trigger_min_tokens=100000))
    llm.prefill(ids[:100], progress=lambda *a: calls.append(a))  # below the trigger: no pass
    assert calls == [("prompt", 100, 100)]
    llm.reset()
    calls.clear()
    llm.prefill(ids, reserve=100000, progress=lambda *a: calls.append(a))
    prompt = [c for c in calls if c[0] == "prompt"]
    passed = [c for c in calls if c[0] == "pass"]
    assert calls == prompt + passed and len(prompt) == -(-300 // llm.prefill_chunk)
    assert prompt[-1] == ("prompt", 300, 300)
    assert passed[-1] == ("pass", llm.stats.reconstruct_tokens, llm.stats.reconstruct_tokens)
    dones = [c[1] for c in passed]
    assert dones == sorted(set(dones)) and all(c[2] == dones[-1] for c in passed)
    llm.configure_eviction(None)


def test_prefill_bars_draw_on_a_terminal_only(monkeypatch):
    """PrefillBars draws one bar per stage on a terminal (after its delay) and nothing
    elsewhere; a prefill cut short does not leave its bar to the next."""
    import io

    from mnn_h2o import prefill_progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(prefill_progress, "DELAY_S", 0)
    pipe = io.StringIO()
    bars = prefill_progress.PrefillBars(pipe)
    bars("prompt", 50, 100)
    bars("prompt", 100, 100)
    assert pipe.getvalue() == "" and bars.bar is None
    tty = Tty()
    bars = prefill_progress.PrefillBars(tty)
    bars("prompt", 50, 100)
    assert bars.stage == "prompt" and bars.bar.n == 50
    bars("prompt", 20, 40)  # a new prefill after one cut short: a new bar
    assert bars.bar.n == 20 and bars.bar.total == 40
    bars("prompt", 40, 40)
    assert bars.bar is None  # a stage's bar goes when it ends
    bars("pass", 10, 80)
    assert bars.stage == "pass" and bars.bar.total == 80
    bars.close()
    assert "prompt" in tty.getvalue() and "kvzip pass" in tty.getvalue()


@pytest.mark.model
def test_a_saved_session_keeps_what_its_next_pass_repeats(llm, tmp_path):
    """The tokens no pass has repeated yet survive fork, save and load (docs/session_format.md
    ``unpassed``), so the next pass scores them too."""
    from mnn_h2o import config
    from mnn_h2o.session import Session

    cfg = config.load(None, {})
    cfg["eviction"].update(KVZIP, trigger_min_tokens=100000)
    s = Session(llm, cfg)
    s.add([{"role": "user", "content": "The ferry leaves at seven."}, {"role": "assistant", "content": "Noted."}])
    want = list(s._ctx.unpassed)
    assert want and want == s.token_ids[-len(want):]
    twin = s.fork()
    s.save(str(tmp_path / "s.session"))
    loaded = Session.load(str(tmp_path / "s.session"), llm)
    try:
        assert twin._ctx.unpassed == want and loaded._ctx.unpassed == want
    finally:
        for x in (s, twin, loaded):
            x.close()


@pytest.mark.model
def test_a_deferred_pass_waits_for_compress_then_holds_the_budget(llm, tokenizer):
    """prefill(defer_pass=True): the answer decodes over the whole prompt (no pass, nothing
    evicted); compress() then runs the pass over the prompt and the answer and holds the budget,
    as a prefill of the same tokens does at once (within one block per head), never over it."""
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 408)
    llm.configure_eviction(dict(KVZIP, target_lossy_ratio=3.2))
    llm.prefill(ids[:400], reserve=8, defer_pass=True)
    assert llm.held and llm.stats.reconstruct_tokens == 0
    for t in ids[400:]:
        llm.decode(t)
    assert llm.stats.evictions == 0
    assert all(h == 408 for layer in llm.cache.eviction_stats()["layers"] for h in layer["held"])
    assert llm.compress() and not llm.held and not llm.compress()
    s = llm.stats
    assert s.reconstruct_tokens > 408 and s.compress_s >= s.reconstruct_s > 0 and s.evictions == 1
    assert 3.0 < s.whole_model_ratio < 3.4, s.whole_model_ratio
    deferred = s.kv_bytes_held
    lengths = [h for layer in llm.cache.eviction_stats()["layers"] for h in layer["held"]]
    llm.reset()
    llm.prefill(ids)  # the same 408 tokens, the pass at once
    at_once = llm.stats.kv_bytes_held
    block_bytes = at_once // sum(2 * -(-n // 16) for layer in llm.cache.eviction_stats()["layers"] for n in layer["held"])
    assert deferred <= at_once + 2 * len(lengths) * block_bytes, (deferred, at_once)
    llm.configure_eviction(None)


@pytest.mark.model
def test_a_session_answers_from_the_cache_as_prefilled_and_compresses_after(llm, tokenizer):
    """compress_after_answer (the chat's and the server's): the first answer is the full cache's,
    token for token; compress() brings the session to its budget; a turn that finds the
    compression waiting runs it first; a cancelled compression forgets the cache, never the
    conversation."""
    import threading

    from mnn_h2o import config
    from mnn_h2o.essays import essay_tokens
    from mnn_h2o.session import Session

    cfg = config.load(None, {})
    cfg["eviction"].update(KVZIP, target_lossy_ratio=3.2)
    full_cfg = config.load(None, {})
    full_cfg["eviction"]["enabled"] = False
    doc = "Read this; I will ask about it.\n\n" + tokenizer.decode(essay_tokens(tokenizer, 400))
    s, full = Session(llm, cfg, compress_after_answer=True), Session(llm, full_cfg)
    try:
        first, want = s.say(doc, max_new_tokens=6), full.say(doc, max_new_tokens=6)
        assert first.text == want.text
        st = s.stats()
        assert st["compression_held"] and st["whole_model_ratio"] < 2.0  # q8 rows, nothing evicted
        assert s.compress() and not s.stats()["compression_held"]
        assert 3.0 < s.stats()["whole_model_ratio"] < 3.4
        s.say("In one word, the topic?", max_new_tokens=3)
        assert s.stats()["compression_held"]
        s.say("And in two?", max_new_tokens=3)  # the waiting compression ran first
        assert s._ctx.stats.evictions >= 2
        n = len(s.token_ids)
        cancel = threading.Event()
        cancel.set()
        assert not s.compress(cancel=cancel)
        assert s.token_ids == [] and len(s.messages) == 6
        r = s.say("Thanks.", max_new_tokens=2)
        assert r.prompt_tokens > n  # the whole conversation prefilled again
    finally:
        s.close()
        full.close()


def test_chunk_starts_leave_the_last_chunk_its_window():
    from mnn_h2o.engine import chunk_starts

    assert chunk_starts(600, 256) == [0, 256, 512]
    assert chunk_starts(600, 256, 32) == [0, 256, 512]      # 88 tokens: enough
    assert chunk_starts(520, 256, 32) == [0, 256, 488]      # 8 would be too few: 32, from the chunk before
    assert chunk_starts(20, 256, 32) == [0]                 # one chunk: all there is
    assert chunk_starts(257, 256, 32) == [0, 225]
    assert chunk_starts(3, 1, 2) == [0, 1, 2]               # never an empty chunk before the last


@pytest.mark.model
def test_the_prompts_end_scores_its_share_first(llm, tokenizer):
    """eviction.prompt_end_share: the prompt's last chunk (here 8 tokens past a chunk boundary,
    so it takes observation_window from the one before) keeps about share x keep ratio of every
    evicting head's tokens first (score KEPT_FIRST + their own), pending for the plan; share 0
    keeps none; the cache's share is back to 0 after the prompt. A second prompt (a conversation's
    next turn) releases the first one's marks and takes its share among its own tokens alone."""
    from mnn_h2o import native
    from mnn_h2o.essays import essay_tokens

    ids = essay_tokens(tokenizer, 520)
    counts = {}
    for share in (0.0, 0.5):
        llm.configure_eviction(dict(KVZIP, target_lossy_ratio=3.2, prompt_end_share=share))
        llm.prefill(ids, defer_pass=True)  # the pass waits: the scores are pending
        assert llm.held and llm.cache.prompt_end_share == 0.0
        counts[share] = {int(n) for layer in (0, 15, 29)
                         for n in np.sum(llm.cache.token_scores(layer) >= native.KEPT_FIRST, axis=1)}
    assert counts[0.0] == {0}
    (m,) = counts[0.5]  # one count for every head
    keep = 1.88 / 3.2   # q8 pays 1.88x of the whole-model 3.2x, eviction the rest (about)
    assert abs(m - 0.5 * keep * 520) < 0.05 * 520, m

    assert llm.compress()  # the pass and the plan: the first prompt's marks now on its blocks
    turn = essay_tokens(tokenizer, 120)[-72:]
    llm.prefill(turn, defer_pass=True)
    mine = set()
    for layer in (0, 15, 29):
        scores = llm.cache.token_scores(layer)
        for h, row in enumerate(scores):
            first = llm.cache.length(layer, h) - len(turn)  # the turn's own tokens: each head's newest
            assert (row[:first] < native.KEPT_FIRST).all(), (layer, h)  # the first prompt's released
            mine.add(int(np.sum(row[first:first + len(turn)] >= native.KEPT_FIRST)))
    (m2,) = mine
    assert 0 < m2 <= 0.5 * len(turn), m2
    llm.configure_eviction(None)
