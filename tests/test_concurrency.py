"""Two engines in one process, decoding at the same time in two threads, and reset() giving the
KV memory back.

Each ``Llm`` owns its MNN runtime and its native cache (the cache releases the GIL during native
work, so the two threads really overlap). Greedy decoding is deterministic, so each engine must
produce exactly the tokens it produces alone; shared state between instances, or a race inside
one, would show up as a different continuation.
"""
import threading
import time

import pytest

from conftest import make_llm

PROMPTS = ("What is the capital of France?", "Write a short poem about the sea.")
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def two_engines():
    return make_llm(8), make_llm(8)


@pytest.mark.model
def test_two_engines_decode_concurrently_as_they_do_alone(two_engines):
    engines = two_engines
    alone = [llm.generate(p, max_new_tokens=NEW_TOKENS).token_ids for llm, p in zip(engines, PROMPTS)]
    assert alone[0] != alone[1]  # a mix-up between the engines would be visible
    assert all(len(a) > 4 for a in alone), alone

    for round_ in range(2):
        results, spans, errors = [None, None], [None, None], []
        barrier = threading.Barrier(2)

        def run(i):
            try:
                barrier.wait()
                t0 = time.perf_counter()
                results[i] = engines[i].generate(PROMPTS[i], max_new_tokens=NEW_TOKENS).token_ids
                spans[i] = (t0, time.perf_counter())
            except BaseException as e:  # noqa: BLE001 - reported below, in the main thread
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads), "a decoding thread hung"
        (a0, a1), (b0, b1) = spans
        assert max(a0, b0) < min(a1, b1), f"round {round_}: the two generations did not overlap: {spans}"
        assert results == alone, f"round {round_}: concurrent output differs from the output alone"


@pytest.mark.model
def test_reset_returns_all_kv_memory(two_engines):
    llm = two_engines[0]
    llm.reset()
    assert llm.cache.bytes_held() == 0 and llm.stats.kv_bytes_held == 0
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)
    llm.prefill(ids)
    for _ in range(3):
        llm.decode(int(ids[0]))
    held = llm.cache.bytes_held()
    assert held > 0 and llm.stats.kv_bytes_held == held
    # At least the K and V of every token in every layer (f16), unless blocks were evicted.
    c = llm.config
    assert held >= (len(ids) + 3) * 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2
    llm.reset()
    assert llm.cache.bytes_held() == 0, f"{llm.cache.bytes_held()} bytes still held after reset()"
    assert llm.stats.kv_bytes_held == 0 and llm.pos == 0
    # And the engine is usable again, from an empty context.
    llm.prefill(ids[:5])
    assert 0 < llm.cache.bytes_held() < held
    llm.reset()
    assert llm.cache.bytes_held() == 0
