"""The KV cache's lossless store through mnn_h2o._core: bit-identical attention against the raw
cache (with H2O evicting), accounting, modes, faults and reset. No model needed."""
import numpy as np
import pytest

core = pytest.importorskip("mnn_h2o._core")

L, KV, HD, H, BT = 3, 2, 64, 4, 16


def make_cache(eviction=True, per_head=False):
    cache = core.KvCache(L, KV, HD, H, dtype="f16", block_tokens=BT, max_tokens=1024, threads=1)
    if eviction:
        cache.enable_eviction(sink_tokens=16, recent_tokens=48, target_keep_ratio=0.6, target_lossy_ratio=0.0,
                         layer_start=1, trigger_min_tokens=96, update_interval=8, per_head_budget=per_head)
    return cache


# Every argument these tests depend on (the keyword defaults are the config schema's, which may move).
STORE = dict(front_n=1, scope="front_n_and_kept", hot_sink_tokens=16, hot_recent_tokens=32, chunk_tokens=32,
             v_dedup_layers=0, async_threads=0, decode_cache_bytes=8 << 20)


def store(**kw):
    return {**STORE, **kw}


def kv_rows(rng, n):
    scale = 0.25 + (np.arange(KV * HD) % HD % 8)  # per-channel scales, like real keys
    return (rng.standard_normal((n, KV * HD)) * scale).astype(np.float32)


def run(cache, seed=7, decode=40, drain=False, with_prompt=True):
    """Two prefill chunks (unless ``with_prompt`` is false) then decode steps; every attention output,
    concatenated."""
    rng = np.random.default_rng(seed)
    outs = []
    for n, prefill in ([(200, True), (90, True)] if with_prompt else []) + [(1, False)] * decode:
        for layer in range(L):
            q = (rng.standard_normal((n, H * HD)) * 2).astype(np.float32)
            out = np.empty((n, H * HD), np.float32)
            cache.step(layer, q, kv_rows(rng, n), kv_rows(rng, n), out)
            outs.append(out)
        cache.end_step(n, prefill)
        if drain:
            cache.drain_store()
    return np.concatenate([o.ravel() for o in outs])


def same_kv(a, b):
    for layer in range(L):
        for h in range(KV):
            (ka, va), (kb, vb) = a.read(layer, h), b.read(layer, h)
            if ka.tobytes() != kb.tobytes() or va.tobytes() != vb.tobytes():
                return False
    return True


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("async_threads,cache_bytes,drain", [(0, 0, False), (0, 1 << 20, False),
                                                             (2, 32 << 10, False), (2, 0, True)])
def test_store_is_bit_identical(per_head, async_threads, cache_bytes, drain):
    raw = make_cache(per_head=per_head)
    want = run(raw)
    cache = make_cache(per_head=per_head)
    cache.enable_store(**store(mode="store", async_threads=async_threads, decode_cache_bytes=cache_bytes))
    got = run(cache, drain=drain)  # free-running workers install jobs whenever they finish
    cache.drain_store()
    assert got.tobytes() == want.tobytes()
    assert same_kv(raw, cache)
    # Free-running workers may install every chunk after the last step read the cache; once
    # drained, the next step reads stored chunks whatever the timing (so it misses at least once).
    assert run(cache, seed=8, decode=1, with_prompt=False).tobytes() == run(raw, seed=8, decode=1, with_prompt=False).tobytes()
    s = cache.store_stats()
    assert s["mode"] == "store" and s["chunks_stored"] > 0 and s["chunks_held"] > 0
    assert cache.eviction_stats()["layers"][1]["evictions"] > 0
    if not per_head and (drain or not async_threads):  # deterministic runs; with this data the
        assert s["repacked"] > 0                         # shared budget trims stored chunks
    assert s["cache_misses"] > 0 and (s["cache_bytes"] == 0) == (cache_bytes == 0)
    assert s["lossless_ratio"] > 1.0 and s["blob_bytes"] < s["stored_raw_bytes"]
    assert cache.pool_bytes_held() < raw.pool_bytes_held()
    assert sum(l["chunks_held"] for l in s["layers"]) == s["chunks_held"]


def test_accounting():
    raw = make_cache()
    run(raw)
    cache = make_cache()
    cache.enable_store(**store(mode="store", async_threads=1, decode_cache_bytes=0))
    run(cache)
    cache.drain_store()
    s = cache.store_stats()
    assert s["pool_bytes"] == cache.pool_bytes_held() and s["bytes_held"] == cache.bytes_held()
    assert s["bytes_held"] == (s["pool_bytes"] + s["blob_bytes"] + s["table_bytes"] + s["cache_bytes"]
                               + s["scratch_bytes"])
    assert s["table_bytes"] == 0  # no V dedup layer
    assert s["pool_bytes"] + s["blob_bytes"] < raw.pool_bytes_held()
    assert s["total_ratio"] == pytest.approx(s["bytes_uncompressed"] / s["bytes_held"])
    assert s["bytes_uncompressed"] == cache.eviction_stats()["bytes_uncompressed"]
    assert cache.eviction_stats()["bytes_held"] == cache.pool_bytes_held()  # the lossy (pool-only) figure


@pytest.mark.parametrize("mode", ["full", "probe"])
def test_measuring_modes_leave_the_kv_alone(mode):
    raw = make_cache()
    want = run(raw)
    cache = make_cache()
    cache.enable_store(**store(mode=mode, probe_every=3, async_threads=2))
    assert run(cache, drain=True).tobytes() == want.tobytes()
    s = cache.store_stats()
    assert s["chunks_encoded"] > 0 and s["chunks_stored"] == 0 and s["chunks_held"] == 0
    assert s["verify_mismatches"] == 0 and s["raw_bytes"] > s["compressed_bytes"]
    assert cache.pool_bytes_held() == raw.pool_bytes_held() and same_kv(raw, cache)
    assert cache.store_config()["mode"] == mode


@pytest.mark.parametrize("fault", ["encode_error", "verify_mismatch", "alloc_failure", "worker_exception"])
def test_faults_fall_back(fault):
    raw = make_cache()
    want = run(raw)
    cache = make_cache()
    cache.enable_store(**store(mode="store", async_threads=2, faults=[fault]))
    # Drained every step, so chunks are in place before evictions reach them (alloc_failure).
    assert run(cache, drain=True).tobytes() == want.tobytes()
    cache.drain_store()
    s = cache.store_stats()
    assert s["fallbacks"][fault] > 0
    assert same_kv(raw, cache)


def test_deferral_with_a_one_job_queue():
    raw = make_cache()
    want = run(raw)
    cache = make_cache()
    cache.enable_store(**store(mode="store", async_threads=1, max_queue=1))
    assert run(cache).tobytes() == want.tobytes()
    cache.drain_store()
    s = cache.store_stats()
    assert s["deferrals"] > 0 and s["queue_peak"] == 1 and s["chunks_stored"] > 0


def test_reset_disable_and_bad_args():
    cache = make_cache()
    cache.enable_store(**store(mode="store", async_threads=2))
    run(cache, decode=5)
    cache.reset()
    assert cache.bytes_held() == 0 and cache.store_stats()["chunks_encoded"] == 0
    run(cache, decode=5)
    cache.drain_store()
    assert cache.store_stats()["chunks_held"] > 0
    cache.disable_store()
    assert cache.store_config() is None and cache.bytes_held() == cache.pool_bytes_held()
    for kw, field in [({"chunk_tokens": 24}, "chunk_tokens"), ({"front_n": 9}, "front_n"),
                      ({"mode": "zip"}, "mode"), ({"max_queue": 0}, "max_queue"),
                      ({"decode_cache_bytes": -1}, "decode_cache_bytes"), ({"faults": ["nope"]}, "faults"),
                      ({"v_dedup_layers": L + 1}, "v_dedup_layers")]:
        with pytest.raises(ValueError, match=f"enable_store: {field}"):
            cache.enable_store(**store(**kw))
    assert cache.store_config() is None


def test_v_dedup_layer_holds_repeated_rows_once():
    """Layer 0's V rows drawn from 30 token rows: held once per head in the table, bit-identical."""
    rng = np.random.default_rng(3)
    vocab = kv_rows(rng, 30)
    ids = rng.integers(0, 30, 400)
    k = kv_rows(rng, 400)
    q = rng.standard_normal((400, H * HD)).astype(np.float32)
    outs = {}
    for dedup in (0, 1):
        cache = make_cache(eviction=False)
        cache.enable_store(**store(mode="store", v_dedup_layers=dedup))
        out = np.empty((400, H * HD), np.float32)
        cache.step(0, q, k, vocab[ids], out)
        cache.end_step(400, True)
        cache.step(0, q[:1], k[:1], vocab[ids[:1]], out[:1])  # attends over the stored chunks
        outs[dedup] = out[:1].copy()
        s = cache.store_stats()
        assert cache.store_config()["v_dedup_layers"] == dedup
        assert s["layers"][0]["chunks_held"] > 0 and s["verify_mismatches"] == 0
        assert np.array_equal(cache.read(0, 1)[1][:400], vocab[ids][:, HD:].astype(np.float16).astype(np.float32))
        if dedup:
            # 30 distinct rows per head fit one 64-row page (+ hash slots).
            assert 0 < s["layers"][0]["table_bytes"] <= KV * (64 * HD * 2 + 64 * 4 + 64)
            assert s["layers"][0]["blob_bytes"] + s["table_bytes"] < without
        else:
            assert s["table_bytes"] == 0
            without = s["layers"][0]["blob_bytes"]
    assert outs[0].tobytes() == outs[1].tobytes()
