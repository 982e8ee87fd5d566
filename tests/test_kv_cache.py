"""mnn_h2o._core.KvCache against a float64 numpy attention reference, and its input checks."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

core = pytest.importorskip("mnn_h2o._core")

ISAS = core.available_isas()


def make_cache(n_layers=2, n_kv=3, hd=64, group=3, **kw):
    # f16 rows, blocks of 64 and one thread unless a test says otherwise (not the config defaults).
    return core.KvCache(n_layers, n_kv, hd, n_kv * group, **{"dtype": "f16", "block_tokens": 64, "threads": 1, **kw})


def hadamard(n):
    """The normalised Walsh-Hadamard matrix of the r types (kv_dtype.h), float64, symmetric."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def queries_seen(dtype, q):
    """q [n, n_heads, hd] as attention over a cache of dtype uses it (attention.h): an int8 cache's
    prompt queries (n > 1) rounded to int8 rows, the codes of kv_rows_encode times their fp16
    scales (a q8r cache's in its rotated basis, rotated back here)."""
    n, heads, hd = q.shape
    if dtype not in ("q8", "q8r") or n == 1:
        return q
    rows = core.kv_rows_encode(dtype, q.reshape(-1, hd).astype(np.float32))
    codes = rows[:, :hd].view(np.int8).astype(np.float64)
    seen = codes * np.repeat(np.ascontiguousarray(rows[:, hd:]).view(np.float16).astype(np.float64), 32, axis=1)
    if dtype == "q8r":
        seen = seen @ hadamard(hd)
    return seen.reshape(n, heads, hd)


def reference(cache, layer, q):
    """float64 causal GQA attention of q [n, n_heads, hd] over what the cache holds, the queries as
    the cache's dtype has them seen."""
    q = queries_seen(cache.dtype, q)
    n = q.shape[0]
    hd, g, bt = cache.head_dim, cache.group, cache.block_tokens
    out = np.zeros((n, cache.n_heads, hd))
    scores = np.zeros((cache.n_kv_heads, cache.max_blocks))
    for h in range(cache.n_kv_heads):
        k, v = (x.astype(np.float64) for x in cache.read(layer, h))
        length = k.shape[0]
        for qh in range(h * g, (h + 1) * g):
            s = q[:, qh, :].astype(np.float64) @ k.T / np.sqrt(hd)  # [n, length]
            visible = length - n + np.arange(n)[:, None] + 1
            s = np.where(np.arange(length)[None, :] < visible, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out[:, qh, :] = p @ v
            per_key = p.sum(axis=0)
            np.add.at(scores[h], np.arange(length) // bt, per_key)
    return out.reshape(n, -1), scores


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("dtype", core.kv_dtypes())
@pytest.mark.parametrize("isa", ISAS)
def test_step_matches_reference(dtype, isa):
    rng = np.random.default_rng(0)
    cache = make_cache(dtype=dtype)
    layer = 1
    # Prefill in two uneven chunks, then decode steps, checking each call.
    for n in (70, 45, 1, 1, 3):
        q = rand(rng, n, 9, 64, scale=2.0)
        k, v = rand(rng, n, 3 * 64), rand(rng, n, 3 * 64)
        cache.append(layer, k, v)
        out = np.full((n, 9 * 64), np.nan, dtype=np.float32)
        scores = np.zeros((3, cache.max_blocks), dtype=np.float32)
        cache.attend(layer, q, out, isa=isa, scores=scores)
        want, want_scores = reference(cache, layer, q)
        if dtype in ("q8", "q8r") and n > 1 and core.attention_kernels(isa) == "avx512-bf16":
            # P x V as bf16 products (docs/kv_cache.md "What takes them"): probabilities and
            # values to 8 significant bits; native/tests/test_support.h's attention_tolerance.
            assert np.linalg.norm(out - want) < 6e-3 * np.linalg.norm(want)
        else:
            np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=2e-5 * n * 3)
        np.testing.assert_allclose(scores.sum(axis=1), n * 3, rtol=1e-5)
    assert cache.length(layer) == 120 and cache.length(0) == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_step_long_context_gqa(threads):
    rng = np.random.default_rng(1)
    cache = make_cache(n_layers=1, n_kv=2, hd=128, group=4, threads=threads, block_tokens=32, max_tokens=2048)
    q0 = rand(rng, 1200, 8 * 128)
    k0, v0 = rand(rng, 1200, 2, 128), rand(rng, 1200, 2, 128)  # 3-D rows are accepted too
    out0 = np.empty((1200, 8 * 128), np.float32)
    cache.step(0, q0, k0, v0, out0)
    want0, _ = reference(cache, 0, q0.reshape(1200, 8, 128))
    np.testing.assert_allclose(out0, want0, rtol=0, atol=2e-5 * np.abs(want0).max())
    for _ in range(3):
        q, k, v = rand(rng, 1, 8, 128, scale=3.0), rand(rng, 1, 256), rand(rng, 1, 256)
        out = np.empty((1, 1024), np.float32)
        scores = np.ones((2, cache.max_blocks), np.float32)  # accumulates on top of what is there
        cache.step(0, q, k, v, out, scores)
        want, want_scores = reference(cache, 0, q)
        np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())
        np.testing.assert_allclose(scores - 1.0, want_scores, rtol=0, atol=1e-5)


def test_isas_agree():
    rng = np.random.default_rng(2)
    cache = make_cache(n_layers=1)
    cache.append(0, rand(rng, 777, 192), rand(rng, 777, 192))
    for n in (1, 2, 40):
        q = rand(rng, n, 576)
        outs = []
        for isa in ISAS:
            out = np.empty((n, 576), np.float32)
            cache.attend(0, q, out, isa=isa)
            outs.append(out)
        for out in outs[1:]:
            np.testing.assert_allclose(out, outs[0], rtol=0, atol=1e-5 * np.abs(outs[0]).max())


def test_read_bytes_truncate_reset():
    rng = np.random.default_rng(3)
    cache = make_cache(dtype="f32", block_tokens=16, max_tokens=100)
    k, v = rand(rng, 40, 192), rand(rng, 40, 192)
    cache.append(0, k, v)
    rk, rv = cache.read(0, 2)
    np.testing.assert_array_equal(rk, k[:, 128:])
    np.testing.assert_array_equal(rv, v[:, 128:])
    block_bytes = 16 * 64 * 4
    assert cache.bytes_held() == 3 * 2 * 3 * block_bytes  # 3 heads x (K, V) x 3 blocks
    assert cache.bytes_mapped() >= cache.bytes_held()
    cache.truncate(0, 1, 16)
    assert cache.length(0, 1) == 16 and cache.length(0, 0) == 40
    assert cache.bytes_held() == (2 * 3 + 1) * 2 * block_bytes
    cache.reset()
    assert cache.bytes_held() == 0 and cache.bytes_mapped() == 0 and cache.length(0, 2) == 0
    assert cache.read(0, 0)[0].shape == (0, 64)

    f16 = make_cache(n_layers=1)
    f16.append(0, k, v)
    rk, _ = f16.read(0, 0)
    np.testing.assert_array_equal(rk, k[:, :64].astype(np.float16).astype(np.float32))


def test_properties_and_best_isa():
    cache = make_cache(dtype="bf16", block_tokens=32, max_tokens=1000, threads=2)
    assert (cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.n_heads, cache.group) == (2, 3, 64, 9, 3)
    assert (cache.dtype, cache.block_tokens, cache.max_tokens, cache.max_blocks, cache.threads) == (
        "bf16", 32, 1000, 32, 2)
    assert core.best_isa() in ISAS and "scalar" in ISAS
    assert all(core.attention_kernels(isa).startswith(isa) for isa in ISAS)
    assert core.attention_kernels() == core.attention_kernels(core.best_isa())


@pytest.mark.skipif("avx512" not in ISAS, reason="no AVX-512 here")
def test_cpu_disable_hides_avx512_extensions():
    # The sets a CPU with AVX-512 BF16 / VNNI never picks run when those are hidden (ctest's
    # test_attention_vnni / test_attention_avx512 test them so).
    def kernels(disable):
        root = os.path.dirname(os.path.dirname(os.path.abspath(core.__file__)))  # this core's package
        env = {**os.environ, "MNN_H2O_CPU_DISABLE": disable, "PYTHONPATH": root}
        code = "from mnn_h2o import _core; print(_core.attention_kernels('avx512'))"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    assert kernels("avx512_vnni") == "avx512"
    assert kernels("avx512_bf16") in ("avx512", "avx512-vnni")
    assert kernels("") == core.attention_kernels("avx512")


def test_bad_inputs_raise():
    cache = make_cache(max_tokens=10)
    good_kv = np.zeros((2, 192), np.float32)
    q, out = np.zeros((2, 576), np.float32), np.zeros((2, 576), np.float32)
    bad = [
        lambda: cache.append(0, good_kv.astype(np.float64), good_kv),  # dtype
        lambda: cache.append(0, np.zeros((2, 191), np.float32), good_kv),  # width
        lambda: cache.append(0, np.zeros((2, 3, 65), np.float32), good_kv),  # 3-D shape
        lambda: cache.append(0, np.zeros((192,), np.float32), good_kv),  # 1-D
        lambda: cache.append(0, np.zeros((192, 2), np.float32).T, good_kv),  # not C-contiguous
        lambda: cache.append(0, [[0.0] * 192] * 2, good_kv),  # not an array
        lambda: cache.append(0, good_kv, np.zeros((3, 192), np.float32)),  # row mismatch
        lambda: cache.append(0, np.zeros((11, 192), np.float32), np.zeros((11, 192), np.float32)),  # capacity
        lambda: cache.step(0, q, good_kv, good_kv, np.zeros((1, 576), np.float32)),  # out rows
        lambda: cache.step(0, q, good_kv, good_kv, out, np.zeros((2, 5), np.float32)),  # scores shape
        lambda: cache.step(0, q, good_kv, good_kv, out, np.zeros((3, 0), np.float32)),  # scores width
        lambda: cache.attend(1, q, out),  # nothing cached
        lambda: cache.attend(0, q, out, isa="sse9"),
        lambda: core.KvCache(1, 3, 60, 9),
        lambda: core.KvCache(1, 3, 64, 8),
        lambda: core.KvCache(1, 3, 64, 9, dtype="int8"),
    ]
    for i, call in enumerate(bad):
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"case {i} did not raise")
    readonly = np.zeros((2, 576), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        cache.step(0, q, good_kv, good_kv, readonly)
    with pytest.raises(IndexError):
        cache.append(5, good_kv, good_kv)
    with pytest.raises(IndexError):
        cache.length(0, 3)
    assert cache.length(0) == 0 and cache.bytes_held() == 0  # nothing was appended by the failures
    cache.step(0, q, good_kv, good_kv, out)
    assert cache.length(0) == 2


def test_threads_share_one_cache():
    """Python threads may call one cache concurrently (the GIL is released): calls serialise."""
    cache = make_cache(n_layers=4, max_tokens=4096, threads=2)
    errors = []

    def worker(layer):
        rng = np.random.default_rng(layer)
        try:
            for _ in range(30):
                q, k, v = rand(rng, 1, 576), rand(rng, 1, 192), rand(rng, 1, 192)
                out = np.empty((1, 576), np.float32)
                cache.step(layer, q, k, v, out)
                assert np.isfinite(out).all()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [cache.length(i) for i in range(4)] == [30] * 4


def test_quantised_rows_size_error_and_accounting():
    """q8 rows are 68 bytes per 64 values, the f16 reference of the whole-model ratio is the same
    for every type, and what reads back is within the format's error."""
    rng = np.random.default_rng(5)
    assert core.kv_dtypes() == ["f16", "bf16", "f32", "q8", "q4", "q4r", "q8r"]
    assert [core.kv_row_bytes(d, 64) for d in core.kv_dtypes()] == [128, 128, 256, 68, 36, 36, 68]
    with pytest.raises(ValueError, match="multiple of 32"):
        core.kv_row_bytes("q8", 48)
    with pytest.raises(ValueError, match="dtype must be one of f16, bf16, f32, q8, q4, q4r, q8r"):
        make_cache(dtype="int8")
    k, v = rand(rng, 100, 3 * 64), rand(rng, 100, 3 * 64)
    k[:, 5] = 30.0  # an outlier channel: what rotation is for
    err = {}
    for dtype in ("f16", "q8", "q4", "q4r", "q8r"):
        cache = make_cache(dtype=dtype, block_tokens=16)
        cache.append(0, k, v)
        st = cache.eviction_stats()
        assert st["bytes_f16"] == 100 * 3 * 64 * 2 * 2
        assert st["bytes_held"] == cache.bytes_held() == 2 * 3 * 7 * -(-16 * core.kv_row_bytes(dtype, 64) // 64) * 64
        assert st["whole_model_ratio"] == pytest.approx(st["bytes_f16"] / st["bytes_held"])
        rk, rv = cache.read(0, 0)
        err[dtype] = float(np.sqrt(np.mean((rk - k[:, :64]) ** 2)))
    assert err["f16"] < 1e-2 < err["q8"] < 0.1 < err["q4r"] < err["q4"] / 2, err
    assert err["q8r"] < err["q8"] / 2, err


@pytest.mark.parametrize("dtype", ["q8", "q8r", "q4", "q4r"])
def test_store_takes_quantised_rows(dtype):
    """The store holds quantised rows as Gear Q8 / Q4 frames: read() and attention see exactly
    the rows of the same cache without it."""
    rng = np.random.default_rng(5)
    k, v = rand(rng, 300, 3 * 64), rand(rng, 300, 3 * 64)
    q = rand(rng, 1, 9 * 64)
    raw, cache = (make_cache(n_layers=1, dtype=dtype, block_tokens=16) for _ in range(2))
    cache.enable_store(mode="store", scope="front_n", front_n=1, hot_sink_tokens=16, hot_recent_tokens=16,
                       chunk_tokens=64, v_dedup_layers=0, async_threads=0)
    for c in (raw, cache):
        c.append(0, k, v)
        c.end_step(300, True)
    for head in range(3):
        for a, b in zip(raw.read(0, head), cache.read(0, head)):
            assert a.tobytes() == b.tobytes()
    want, got = np.empty((1, 9 * 64), np.float32), np.empty((1, 9 * 64), np.float32)
    raw.attend(0, q, want)
    cache.attend(0, q, got)
    assert want.tobytes() == got.tobytes()
    s = cache.store_stats()
    assert s["chunks_held"] > 0 and s["cache_misses"] > 0 and s["lossless_ratio"] > 1.0  # attention decoded frames


@pytest.mark.parametrize("isa", ISAS)
def test_quantised_attention_is_close_to_exact(isa):
    """Against an f32 cache fed the same rows through step(): the quantised types' outputs stay
    within their own step sizes, and rotation helps q4 on keys with an outlier channel. (The
    reference test above reads the cache back, so it cannot see a rotation applied to K or V
    on the way in but not on the way out.)"""
    rng = np.random.default_rng(9)
    n = 300
    k, v = rand(rng, n, 3 * 64), rand(rng, n, 3 * 64)
    k[:, 5] *= 8.0
    q = rand(rng, n, 9 * 64)
    err = {}
    for dtype in ("f32", "q8", "q4", "q4r", "q8r"):
        cache = make_cache(dtype=dtype, block_tokens=16, threads=2)
        out = np.zeros((n, 9 * 64), np.float32)
        for t0 in range(0, n, 100):  # prefill chunks, then a decode step
            cache.step(0, q[t0:t0 + 100], k[t0:t0 + 100], v[t0:t0 + 100], out[t0:t0 + 100])
        last = np.zeros((1, 9 * 64), np.float32)
        cache.step(0, q[:1], k[:1], v[:1], last)
        if dtype == "f32":
            exact, exact_last = out, last
        err[dtype] = max(float(np.abs(out - exact).mean()), float(np.abs(last - exact_last).mean()))
    assert err["q8"] < 0.01 and err["q4r"] < 0.7 * err["q4"] and err["q4"] < 0.2, err
    # Less of q8's error is the keys' since the queries are rounded too (the same in both bases).
    assert err["q8r"] < 0.8 * err["q8"], err


def test_kv_rows_encode_checks_its_input():
    with pytest.raises(ValueError, match="2-D"):
        core.kv_rows_encode("q8", np.zeros(64, np.float32))
    with pytest.raises(ValueError):
        core.kv_rows_encode("q8", np.zeros((2, 48), np.float32))  # not whole 32-value groups
    assert core.kv_rows_encode("q8", np.zeros((3, 64), np.float32)).shape == (3, core.kv_row_bytes("q8", 64))


def test_kv_rows_encode_rotates_as_the_cache():
    """kv_rows_encode("q8r") gives the rotated rows a q8r cache stores: decoded and rotated back,
    what the cache reads back (native/tests/test_kv_cache.cpp checks the bytes bit for bit)."""
    rng = np.random.default_rng(4)
    k, v = rand(rng, 24, 2 * 64), rand(rng, 24, 2 * 64)
    k[:, 5] = 30.0  # an outlier channel: the rotation's point
    cache = make_cache(n_kv=2, dtype="q8r", block_tokens=16)
    cache.append(0, k, v)
    rk, _ = cache.read(0, 0)
    rows = core.kv_rows_encode("q8r", k[:, :64])
    seen = rows[:, :64].view(np.int8) * np.repeat(rows[:, 64:].copy().view(np.float16).astype(np.float64), 32, axis=1)
    np.testing.assert_allclose(seen @ hadamard(64), rk, rtol=0, atol=1e-5 * np.abs(rk).max())
    assert not np.array_equal(rows, core.kv_rows_encode("q8", k[:, :64]))


def test_q8_estimate_tool_quantises_as_the_cache():
    """tools/q8_lossless_estimate measures the cache's own q8 codes: its split of
    _core.kv_rows_encode's rows into codes and scales gives exactly the values the cache reads
    back (the row layout of docs/kv_cache.md)."""
    from mnn_h2o.tools.q8_lossless_estimate import quantise_q8

    rng = np.random.default_rng(3)
    k, v = rand(rng, 40, 3 * 64), rand(rng, 40, 3 * 64)
    k[:, 7] = 25.0
    k[3, :32] = 0.0  # an all-zero group: scale 0, codes 0
    cache = make_cache(dtype="q8", block_tokens=16)
    cache.append(0, k, v)
    for head in range(3):
        rk, rv = cache.read(0, head)
        for ours, x in ((rk, k), (rv, v)):
            codes, scales = quantise_q8(x[:, head * 64:(head + 1) * 64])
            deq = codes.astype(np.float32).reshape(40, 2, 32) * scales.astype(np.float32)[..., None]
            np.testing.assert_array_equal(ours, deq.reshape(40, 64))


def test_a_window_layer_attends_to_its_window_and_holds_no_more():
    """KvCache(windows=...): layer 0 a sliding window of 40 tokens, layer 1 global, fed the same
    tokens in prompt chunks and decode steps. The window layer's output is the global layer's
    attention restricted to the newest 40 keys (numpy), it holds less than a block past its window,
    and eviction over window layers alone is refused (native/tests/test_attention.cpp tests the
    kernels on every ISA, test_eviction_budgets.cpp eviction beside window layers)."""
    rng = np.random.default_rng(5)
    window, bt = 40, 16
    cache = make_cache(n_layers=2, n_kv=1, hd=64, group=2, block_tokens=bt, windows=[window, 0])
    assert cache.windows == [window, 0]
    seen = 0
    for n in (70, 30, 1, 1, 45):
        q, k, v = rand(rng, n, 2, 64), rand(rng, n, 1, 64), rand(rng, n, 1, 64)
        out = [np.empty((n, 128), np.float32) for _ in range(2)]
        for layer in (0, 1):
            cache.step(layer, q, k, v, out[layer])
        seen += n
        # after the step, what the next query can see (less than a block more)
        assert min(seen, window - 1) <= cache.length(0, 0) < min(seen, window - 1) + bt
        kg, vg = (x.astype(np.float64) for x in cache.read(1, 0))
        want = np.empty((n, 2, 64))
        total = kg.shape[0]
        for t in range(n):
            hi = total - n + t + 1
            lo = max(0, hi - window)
            s = q[t].astype(np.float64) @ kg[lo:hi].T / 8.0
            p = np.exp(s - s.max(axis=1, keepdims=True))
            want[t] = (p / p.sum(axis=1, keepdims=True)) @ vg[lo:hi]
        assert np.allclose(out[0], want.reshape(n, -1), atol=2e-3), "the window layer's attention"
    assert cache.length(1, 0) == 147
    with pytest.raises(ValueError, match="sliding window"):
        cache.enable_eviction(policy="h2o", layer_end=1)  # window layers only: nothing to evict
    with pytest.raises(ValueError, match="windows must be empty or one per layer"):
        make_cache(n_layers=2, windows=[8])
