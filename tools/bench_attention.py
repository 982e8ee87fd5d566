"""Benchmark of the native attention (mnn_h2o._core.KvCache) on the reference model's shape.

Decode: per-layer time of one query token over a context of C cached tokens, cycling through all
layers (as a real decode step does, so the KV streams from DRAM, not from cache), and the
bandwidth that implies. Prefill: per-layer time of a chunk of queries appended to a context, and
the attention throughput in query-key pairs per second.

    PYTHONPATH=. python tools/bench_attention.py [--contexts 512 2048 4096] [--threads 1 2] [--isa avx512]
"""
import argparse
import statistics
import time

import numpy as np

from mnn_h2o import _core as core

N_LAYERS, N_KV, HEAD_DIM, N_HEADS = 30, 3, 64, 9
DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


def filled_cache(context, dtype, threads, rng, max_tokens=8192):
    cache = core.KvCache(N_LAYERS, N_KV, HEAD_DIM, N_HEADS, dtype=dtype, max_tokens=max_tokens, threads=threads)
    for layer in range(N_LAYERS):
        for t0 in range(0, context, 512):
            n = min(512, context - t0)
            kv = rng.standard_normal((n, N_KV * HEAD_DIM), dtype=np.float32)
            cache.append(layer, kv, kv)
    return cache


def bench_decode(context, dtype, threads, isa, rounds, rng):
    cache = filled_cache(context, dtype, threads, rng)
    q = rng.standard_normal((1, N_HEADS * HEAD_DIM), dtype=np.float32)
    out = np.empty_like(q)
    scores = np.zeros((N_KV, cache.max_blocks), np.float32)
    per_layer = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for layer in range(N_LAYERS):
            cache.attend(layer, q, out, isa=isa, scores=scores)
        per_layer.append((time.perf_counter() - t0) / N_LAYERS)
    kv_bytes = N_KV * context * HEAD_DIM * DTYPE_BYTES[dtype] * 2
    return min(per_layer), statistics.median(per_layer), kv_bytes / min(per_layer)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 4096])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtype", default="f16", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--isa", default=None, help="kernel set (default: best, %s)" % core.best_isa())
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-prefill", action="store_true")
    args = ap.parse_args()
    isa = args.isa or core.best_isa()
    rng = np.random.default_rng(0)

    print(f"decode attention, {isa}, {args.dtype} KV, {N_LAYERS} layers x {N_KV} kv heads x {HEAD_DIM}")
    print("(best and median of the rounds; a round runs every layer once; GB/s from the best)")
    print(f"{'context':>8} {'threads':>7} {'us/layer':>9} {'median':>7} {'ms/token':>9} {'GB/s':>6}")
    for context in args.contexts:
        for threads in args.threads:
            t, med, bw = bench_decode(context, args.dtype, threads, isa, args.rounds, rng)
            print(f"{context:>8} {threads:>7} {t * 1e6:>9.1f} {med * 1e6:>7.1f} {t * N_LAYERS * 1e3:>9.2f} {bw / 1e9:>6.1f}")

    if args.no_prefill:
        return
    print(f"\nprefill attention (one layer), {isa}, {args.dtype} KV")
    print(f"{'context':>8} {'chunk':>6} {'threads':>7} {'ms/layer':>9} {'Gpairs/s':>9}")
    for context, chunk in ((512, 512), (2048, 512), (4096, 512), (8192, 512)):
        for threads in args.threads:
            t, rate = bench_prefill(context, chunk, args.dtype, threads, isa, max(3, args.rounds // 10), rng)
            print(f"{context:>8} {chunk:>6} {threads:>7} {t * 1e3:>9.2f} {rate / 1e9:>9.2f}")


if __name__ == "__main__":
    main()
