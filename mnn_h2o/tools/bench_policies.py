"""What each eviction policy costs per update, on the model's cache shapes (default SmolLM2:
30 layers, 3 kv heads of 64, 9 query heads, f16 rows), against the attention time it saves.

Per policy: a prompt of --tokens random tokens is appended to every layer and its last
--window queries attend (so every signal has something to read), then

- the prompt cut: one update that evicts every layer to --ratio (policy_us of that update);
- steady decode: --updates decode updates of --interval tokens each (policy_us per update and
  per decode token);
- attention per decode token over the full prompt and over what is kept (one step per layer).

The numbers are of this machine at this moment; docs/eviction.md keeps the ones it quotes.

    python -m mnn_h2o.tools.bench_policies [--tokens 4096] [--policies h2o,keydiff]
"""
import argparse
import time

import numpy as np

from mnn_h2o import config


def _args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.bench_policies", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--heads", type=int, default=9, help="query heads")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="f16")
    # The eviction settings default to the config schema's (docs/config.md).
    default = lambda name: config.key("eviction." + name).default  # noqa: E731
    ap.add_argument("--ratio", type=float, default=default("target_lossy_ratio"), help="whole-model target_lossy_ratio")
    ap.add_argument("--interval", type=int, default=default("update_interval"), help="update_interval (decode tokens)")
    ap.add_argument("--updates", type=int, default=4, help="decode updates measured")
    ap.add_argument("--window", type=int, default=default("observation_window"), help="observation_window")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--policies", default="", help="comma-separated (default: every registry policy)")
    return ap.parse_args(argv)


def _decode_attention_ms(cache, a, rng, reps=3):
    """One decode token's attention, all layers (append + attend, no end_step), best of reps;
    the token is truncated away again."""
    q = rng.standard_normal((1, a.heads * a.head_dim), dtype=np.float32)
    k = rng.standard_normal((1, a.kv_heads * a.head_dim), dtype=np.float32)
    out = np.empty_like(q)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for layer in range(a.layers):
            cache.append(layer, k, k)
            cache.attend(layer, q, out)
        best = min(best, time.perf_counter() - t0)
        for layer in range(a.layers):
            for h in range(a.kv_heads):
                cache.truncate(layer, h, cache.length(layer, h) - 1)
    return best * 1e3


def run(policy, a):
    from mnn_h2o import native

    rng = np.random.default_rng(0)
    cache = native.KvCache(a.layers, a.kv_heads, a.head_dim, a.heads, dtype=a.dtype, block_tokens=16,
                           max_tokens=a.tokens + a.interval * (a.updates + 1) + 64, threads=a.threads)
    cache.enable_eviction(policy=policy, target_lossy_ratio=a.ratio, layer_start=0, update_interval=a.interval,
                     observation_window=a.window)
    n, w = a.tokens, a.window
    kv = rng.standard_normal((n - w, a.kv_heads * a.head_dim), dtype=np.float32)
    for layer in range(a.layers):  # the prompt but its last w tokens: appended (no attention)
        cache.append(layer, kv, kv * 0.5)
    q = rng.standard_normal((w, a.heads * a.head_dim), dtype=np.float32)
    k = rng.standard_normal((w, a.kv_heads * a.head_dim), dtype=np.float32)
    out = np.empty_like(q)
    for layer in range(a.layers):  # ... and the last w attend: the window, EMA and query statistics
        cache.step(layer, q, k, k, out)
    full_ms = _decode_attention_ms(cache, a, rng)
    cache.end_step(w, True)
    s = cache.eviction_stats()
    cut_us = s["policy_us"]
    kept_ms = _decode_attention_ms(cache, a, rng)
    q1 = rng.standard_normal((1, a.heads * a.head_dim), dtype=np.float32)
    k1 = rng.standard_normal((1, a.kv_heads * a.head_dim), dtype=np.float32)
    o1 = np.empty_like(q1)
    for _ in range(a.updates * a.interval):
        for layer in range(a.layers):
            cache.step(layer, q1, k1, k1, o1)
        cache.end_step(1, False)
    s2 = cache.eviction_stats()
    per_update = (s2["policy_us"] - cut_us) / max(1, s2["updates"] - s["updates"])
    held = sum(sum(l["held"]) for l in s2["layers"]) / (a.layers * a.kv_heads)
    return dict(policy=policy, cut_us=cut_us, update_us=per_update, per_token_us=per_update / a.interval,
                held=held, full_ms=full_ms, kept_ms=kept_ms, ratio=s2["lossy_ratio"])


def main(argv=None):
    a = _args(argv)
    from mnn_h2o import native

    policies = [p for p in a.policies.split(",") if p] or native.policy_names()
    print(f"{a.layers} layers x {a.kv_heads} kv heads x {a.head_dim}, {a.heads} query heads, {a.dtype}, "
          f"{a.tokens}-token prompt, ratio {a.ratio}, update every {a.interval} decode tokens, "
          f"window {a.window}, {a.threads} thread(s)")
    print("| policy | prompt cut (us) | decode update (us) | per decode token (us) | tokens held per head "
          "| attention per token, full / kept (ms) | lossy ratio |")
    print("|---|---|---|---|---|---|---|")
    for p in policies:
        r = run(p, a)
        print(f"| {r['policy']} | {r['cut_us']:.0f} | {r['update_us']:.0f} | {r['per_token_us']:.1f} | "
              f"{r['held']:.0f} | {r['full_ms']:.2f} / {r['kept_ms']:.2f} | {r['ratio']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
