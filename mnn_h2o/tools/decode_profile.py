"""Where a decode token's time goes, per context length: our default (the config's KV dtype + H2O)
against our full cache of the same dtype, beside llama.cpp's per-token time when it is installed.

The runs are `python -m mnn_h2o.bench speed`'s (mnn_h2o/bench/speed.py: a fresh context, the same
essay prompt for every engine, greedy decode, an untimed warm-up, runs interleaved A B / B A),
with the engines ``ours_evict`` (the config, by default q8 KV + eviction) and ``ours`` (no eviction,
same KV dtype), and llama.cpp's f16 KV config (its fastest on every machine measured) when the
`llama` extra is installed. A decode token of ours is split by the engine's counters
(mnn_h2o.engine.Stats):

    mnn        MNN Module.forward calls (their number per token beside it)
    dense      our native decode layers (runtime.decode_layers; then no MNN call a token)
    convert    copies between numpy and MNN (embedding/RoPE rows and the attention output
               written, q/k/v and the logits read)
    attention  the native cache step: append, attention, score collection (eviction)
    policy     the native end of a forward: the eviction policy when due, store jobs
    head       the native tail and lm_head
    glue       the rest: Python around them, sampling

Medians over the repetitions (min-max). The counters read the clock between consecutive parts;
their cost per token is measured and printed (and stored in the JSON) as "timer overhead".

    python -m mnn_h2o.tools.decode_profile [--contexts 256,512,1024,2048] [--tokens 64]
        [--repetitions 3] [--llama auto|off|llama_f16,...] [--set SECTION.KEY=VALUE]
        [--json decode_profile.json]
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bench speed: idle BLAS threads steal MNN's cores
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from ..cli_numbers import number_list  # noqa: E402
from ..measure import summarize  # noqa: E402

PARTS = ("mnn", "dense", "convert", "attention", "policy", "head", "glue")
OURS = ("ours_evict", "ours")


def _llama_rows(text: str) -> list:
    """The llama.cpp configs asked for: [] for off, llama_f16 for auto when installed."""
    from ..bench import llama_peer

    if text == "off":
        return []
    if text == "auto":
        try:
            llama_peer.check()
        except llama_peer.LlamaUnavailable:
            return []
        return ["llama_f16"]
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in llama_peer.CONFIGS]
    if bad or not names:
        raise SystemExit(f"--llama: unknown config(s) {', '.join(bad) or '(none)'}: use auto, off or "
                         f"{', '.join(llama_peer.CONFIGS)}")
    llama_peer.check()  # asked for by name: the install hint if missing
    return names


class _CountingClock:
    """Stands in for the engine's `time` module for one decode step: counts the clock reads."""

    def __init__(self):
        self.reads = 0

    def perf_counter(self):
        self.reads += 1
        return time.perf_counter()


def timer_overhead(llm, token: int) -> dict:
    """The clock reads of one decode step of ``llm`` (counted by running one, untimed) and what
    they cost: the mean of a time.perf_counter() call here, times the reads."""
    from .. import engine

    clock = _CountingClock()
    engine.time = clock
    try:
        llm.decode(token)
    finally:
        engine.time = time
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        time.perf_counter()
    per_read = (time.perf_counter() - t0) / n
    return {"clock_reads_per_token": clock.reads, "us_per_read": per_read * 1e6,
            "us_per_token": clock.reads * per_read * 1e6}


def profile_rows(results: dict) -> dict:
    """{context: {engine: {part: summary of ms/token over the runs}}} from run_speed's results."""
    out = {}
    for ctx, row in results.items():
        out[ctx] = {}
        for name in OURS:
            if name not in row:
                continue
            runs = [r["decode_ms"] for r in row[name]["runs"]]
            out[ctx][name] = {k: summarize([r[k] for r in runs]) for k in ("total",) + PARTS + ("mnn_calls",)}
        for name, e in row.items():
            if name.startswith("llama_"):
                out[ctx][name] = {"total": summarize([1e3 / v for v in e["decode_tps"]["values"]])}
    return out


def format_profile(profile: dict) -> str:
    f = lambda s: f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
    head = ["context", "engine", "ms/token", "MNN forwards: calls / ms", "native layers ms", "convert ms",
            "attention ms", "policy ms", "head ms", "glue ms", "vs ours full", "vs llama.cpp"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ctx, engines in profile.items():
        llama = [n for n in engines if n.startswith("llama_")]
        best = min(llama, key=lambda n: engines[n]["total"]["median"]) if llama else None
        for name, p in engines.items():
            t = p["total"]["median"]
            vs_full = f"{t / engines['ours']['total']['median']:.3f}x" if "ours" in engines and name != "ours" \
                and name in OURS else ""
            vs_llama = f"{t / engines[best]['total']['median']:.3f}x" if best and name != best else ""
            if name in OURS:
                cells = [f"{p['mnn_calls']['median']:.0f} / {f(p['mnn'])}"] + [f(p[k]) for k in PARTS[1:]]
            else:
                cells = [""] * len(PARTS)
            lines.append("| " + " | ".join([ctx, name, f(p["total"])] + cells + [vs_full, vs_llama]) + " |")
    lines.append("ms per decode token: median over the interleaved runs (min-max). vs: ratio of median ms/token "
                 "(below 1: faster).")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml", help="the settings (default h2o.yaml); ours_evict is "
                    "its eviction section, ours the same without eviction")
    ap.add_argument("--contexts", type=number_list(int, 1), default=[256, 512, 1024, 2048],
                    help="prompt tokens of essay text (default 256,512,1024,2048)")
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per run (default 64)")
    ap.add_argument("--repetitions", type=int, default=3, help="interleaved rounds (default 3, minimum 3)")
    ap.add_argument("--llama", default="auto",
                    help="llama.cpp rows: auto (llama_f16 when the `llama` extra is installed, else none), "
                         "off, or comma-separated configs of bench speed (llama_f16, llama_f16_fa, llama_q8_fa)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config key (repeatable), e.g. --set model.weight_bits=8")
    ap.add_argument("--json", default="decode_profile.json", help="where the figures go (default decode_profile.json)")
    args = ap.parse_args(argv)
    if args.repetitions < 3:
        ap.error("--repetitions must be >= 3")
    if args.tokens < 1:
        ap.error("--tokens must be >= 1")
    from ..cli_errors import run

    return run(lambda: _profile(ap, args))


def _profile(ap, args) -> int:
    from .. import config as config_mod
    from ..bench.speed import run_speed
    from ..engine import Llm
    from ..model_source import resolve_gguf

    cfg = config_mod.load(args.config, dict(config_mod.parse_assignment(a) for a in args.set))
    if not cfg["eviction"]["enabled"]:
        ap.error(f"{args.config}: eviction.enabled is false; the profile compares the config's eviction with none")
    llama_rows = _llama_rows(args.llama)
    llm = Llm.load(None, cfg, progress=False)
    longest = max(args.contexts) + args.tokens + 8
    if longest > llm.max_context:
        ap.error(f"context {max(args.contexts)} + {args.tokens} tokens exceeds the model's {llm.max_context}")
    llama = None
    if llama_rows:
        from ..bench import llama_peer

        gguf = resolve_gguf(cfg["model"]["name"])
        llama_peer.preflight(gguf, cfg["runtime"]["threads"])
        llama = lambda n_ctx: llama_peer.make_peers(gguf, n_ctx, cfg["runtime"]["threads"], llama_rows)
    results = run_speed(llm, None, llm.tokenizer, args.contexts, args.tokens, args.repetitions, cfg["eviction"],
                        llama=llama, llama_rows=llama_rows, measure_quality=False)
    overhead = timer_overhead(llm, llm.tokenizer.bos_token_id or 0)
    profile = profile_rows(results)
    c = llm.config
    print(f"model {cfg['model']['name']}, weights {llm.weights}, {cfg['runtime']['threads']} threads, "
          f"KV {cfg['runtime']['kv_dtype']}, {c.n_layers} layers, {args.tokens} decode tokens, "
          f"{args.repetitions} interleaved rounds; ours_evict = the config's eviction (policy {llm.policy_of(cfg['eviction'])}, "
          f"trigger {cfg['eviction']['trigger_min_tokens']} tokens), ours = no eviction")
    print("llama.cpp: " + (", ".join(llama_rows) if llama_rows else
                           "not run (" + ("--llama off" if args.llama == "off" else "the `llama` extra is not installed") + ")"))
    print(format_profile(profile))
    print(f"timer overhead: {overhead['clock_reads_per_token']} clock reads per decode token x "
          f"{overhead['us_per_read']:.3f} us = {overhead['us_per_token']:.1f} us per token")
    with open(args.json, "w") as f:
        json.dump({"config": cfg, "contexts": args.contexts, "tokens": args.tokens, "repetitions": args.repetitions,
                   "llama_rows": llama_rows, "timer_overhead": overhead, "profile": profile, "speed": results},
                  f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
