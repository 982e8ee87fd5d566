"""Benchmark of the native attention (mnn_h2o.native.KvCache) on the reference model's shape.

Decode: per-layer time of one query token over a context of C cached tokens, cycling through all
layers (as a real decode step does, so the KV streams from DRAM, not from cache), and the
bandwidth that implies; one cache per element type (--dtypes), their rounds interleaved, with
each type's time relative to the first's (median and range of the per-round ratios). Prefill: per-layer time of a chunk of queries appended to a context, and
the attention throughput in query-key pairs per second. After eviction: decode steps over the
~28% of a 4096-token context that H2O (or random) eviction keeps, against the same number of
tokens appended in one go, interleaved, with a 4.5 MB buffer read between layers as MNN's weights
would be: this is where the layout of the kept blocks shows (docs/eviction.md, Compaction). A decode
step of fewer than 1024 keys (kParallelMinQueryKeys in attention.h) runs on one thread whatever
--threads says.

    python -m mnn_h2o.tools.bench_attention [--contexts 512 2048 4096] [--threads 1 2] [--isa avx512]
        [--dtypes f16 q8 q4 q4r]
"""
import argparse
import statistics
import time

import numpy as np

from .. import native

N_LAYERS, N_KV, HEAD_DIM, N_HEADS = 30, 3, 64, 9


def filled_cache(context, dtype, threads, rng, max_tokens=8192):
    cache = native.KvCache(N_LAYERS, N_KV, HEAD_DIM, N_HEADS, dtype=dtype, block_tokens=64,
                           max_tokens=max_tokens, threads=threads)
    for layer in range(N_LAYERS):
        for t0 in range(0, context, 512):
            n = min(512, context - t0)
            kv = rng.standard_normal((n, N_KV * HEAD_DIM), dtype=np.float32)
            cache.append(layer, kv, kv)
    return cache


def bench_decode(context, dtypes, threads, isa, rounds, rng):
    """{dtype: (best s/layer, median s/layer, GB/s at best, per-round ratios to dtypes[0])}."""
    caches = {dt: filled_cache(context, dt, threads, rng) for dt in dtypes}
    q = rng.standard_normal((1, N_HEADS * HEAD_DIM), dtype=np.float32)
    out = np.empty_like(q)
    per_layer = {dt: [] for dt in dtypes}
    for _ in range(rounds):
        for dt, cache in caches.items():  # A B A B: drifts of a noisy machine hit every type alike
            scores = np.zeros((N_KV, cache.max_blocks), np.float32)
            t0 = time.perf_counter()
            for layer in range(N_LAYERS):
                cache.attend(layer, q, out, isa=isa, scores=scores)
            per_layer[dt].append((time.perf_counter() - t0) / N_LAYERS)
    res = {}
    for dt in dtypes:
        kv_bytes = N_KV * context * native.kv_row_bytes(dt, HEAD_DIM) * 2
        t = per_layer[dt]
        ratios = [a / b for a, b in zip(per_layer[dtypes[0]], t)]
        res[dt] = (min(t), statistics.median(t), kv_bytes / min(t), ratios)
    return res


def bench_prefill(context, chunk, dtype, threads, isa, rounds, rng):
    """One chunk of `chunk` queries at the end of a context of `context` tokens (chunk included)."""
    cache = filled_cache(context, dtype, threads, rng)
    q = rng.standard_normal((chunk, N_HEADS * HEAD_DIM), dtype=np.float32)
    out = np.empty_like(q)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        cache.attend(0, q, out, isa=isa)
        times.append(time.perf_counter() - t0)
    t = min(times)
    pairs = N_HEADS * sum(context - chunk + i + 1 for i in range(chunk))  # causal (query head, key) pairs
    return t, pairs / t


def evicted_cache(policy, context, keep_ratio, threads, rng):
    """A cache whose prompt of `context` tokens was cut to `keep_ratio` by `policy` (or, for
    "appended", a cache filled with that many tokens in one go)."""
    cache = native.KvCache(N_LAYERS, N_KV, HEAD_DIM, N_HEADS, dtype="f16", block_tokens=16, threads=threads)
    evicting = policy != "appended"
    if not evicting:
        context = int(context * keep_ratio) // 16 * 16
    else:
        cache.enable_eviction(policy=policy, target_keep_ratio=keep_ratio, layer_start=0)
    q = rng.standard_normal((256, N_HEADS * HEAD_DIM), dtype=np.float32)
    out = np.empty_like(q)
    for t0 in range(0, context, 256):
        n = min(256, context - t0)
        kv = rng.standard_normal((n, N_KV * HEAD_DIM), dtype=np.float32)
        for layer in range(N_LAYERS):
            cache.step(layer, q[:n], kv, kv, out[:n])
        if evicting:
            cache.end_step(n, True)
    if evicting:
        cache.disable_eviction()  # time the layout alone
    return cache


def bench_evicted(threads, rounds, rng, context=4096, keep_ratio=0.28):
    flush = np.ones(4_500_000 // 8)
    caches = {p: evicted_cache(p, context, keep_ratio, threads, rng) for p in ("appended", "h2o", "random")}
    q = rng.standard_normal((1, N_HEADS * HEAD_DIM), dtype=np.float32)
    out = np.empty_like(q)
    times = {p: [] for p in caches}
    for _ in range(rounds):
        for p, cache in caches.items():  # interleaved: one round of each in turn
            t = 0.0
            for layer in range(N_LAYERS):
                flush.sum()
                t0 = time.perf_counter()
                cache.attend(layer, q, out)
                t += time.perf_counter() - t0
            times[p].append(t / N_LAYERS)
    return {p: (cache.length(5, 0), statistics.median(times[p])) for p, cache in caches.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 4096])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtypes", nargs="+", default=["f16", "q8", "q4", "q4r"], choices=native.kv_dtypes(),
                    help="KV element types of the decode table; speed-ups are relative to the first "
                         "(default f16 q8 q4 q4r); prefill uses the first")
    ap.add_argument("--isa", default=None, help="kernel set (default: best, %s)" % native.best_isa())
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--no-evicted", action="store_true")
    args = ap.parse_args()
    isa = args.isa or native.best_isa()
    rng = np.random.default_rng(0)

    print(f"decode attention, {isa}, {N_LAYERS} layers x {N_KV} kv heads x {HEAD_DIM}")
    print("(best and median of the interleaved rounds; a round runs every layer once; GB/s from the best;")
    print(f" speed-up = {args.dtypes[0]} time / this type's time, median (min-max) over rounds)")
    print(f"{'context':>8} {'threads':>7} {'dtype':>5} {'us/layer':>9} {'median':>7} {'ms/token':>9} {'GB/s':>6} "
          f"{'speed-up':>20}")
    for context in args.contexts:
        for threads in args.threads:
            for dt, (t, med, bw, r) in bench_decode(context, args.dtypes, threads, isa, args.rounds, rng).items():
                up = f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"
                print(f"{context:>8} {threads:>7} {dt:>5} {t * 1e6:>9.1f} {med * 1e6:>7.1f} {med * N_LAYERS * 1e3:>9.2f} "
                      f"{bw / 1e9:>6.1f} {up:>20}")

    if not args.no_evicted:
        print("\ndecode attention after eviction of a 4096-token prompt to 28% (median of the rounds)")
        print(f"{'layout':>9} {'threads':>7} {'tokens':>7} {'us/layer':>9}")
        for threads in args.threads:
            for p, (n, t) in bench_evicted(threads, args.rounds, rng).items():
                print(f"{p:>9} {threads:>7} {n:>7} {t * 1e6:>9.1f}")

    if args.no_prefill:
        return
    print(f"\nprefill attention (one layer), {isa}, {args.dtypes[0]} KV")
    print(f"{'context':>8} {'chunk':>6} {'threads':>7} {'ms/layer':>9} {'Gpairs/s':>9}")
    for context, chunk in ((512, 512), (2048, 512), (4096, 512), (8192, 512)):
        for threads in args.threads:
            t, rate = bench_prefill(context, chunk, args.dtypes[0], threads, isa, max(3, args.rounds // 10), rng)
            print(f"{context:>8} {chunk:>6} {threads:>7} {t * 1e3:>9.2f} {rate / 1e9:>9.2f}")


if __name__ == "__main__":
    main()
