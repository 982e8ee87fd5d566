"""Prefill time of several cache configurations against each other, prompts interleaved.

Each engine (the same DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY] spelling as
decode_interleave's) prefills the same essay prompt from an empty cache, round after round, the
order rotating each round (A B, B A, ...) so slow drifts of a noisy machine hit all alike. Prints
per engine the median prefill time with its range, the part of it spent in kvzip's
reconstruction pass, and the ratio of each engine's median to the first engine's. --llama adds
llama.cpp peers (bench.llama_peer's configs, the same GGUF, the `llama` extra) to the rotation:
their time is llama-cpp-python's prefill of the same ids up to the last token's logits, the
point where ours can sample the first token too (time to first token).

    python -m mnn_h2o.tools.prefill_interleave [--contexts 4096 7936] [--rounds 2]
        [--engines q8:h2o q8:kvzip] [--llama llama_f16_fa llama_q8_fa]
"""
import argparse
import time

import numpy as np

from ..config import load
from ..engine import Llm
from ..essays import essay_tokens
from .decode_interleave import check_llama_configs, make_engines, parse_engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="h2o.yaml")
    ap.add_argument("--model", help="named model or GGUF path (default: the config's model.name)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096], help="prompt tokens (default 4096)")
    ap.add_argument("--rounds", type=int, default=2, help="prefills per engine and context (default 2)")
    ap.add_argument("--engines", nargs="+", default=["q8:h2o", "q8:kvzip"],
                    help="DTYPE:POLICY[@RATIO][+LAYERS[/HEAD]][~MEMORY][^LM_HEAD[/TAIL]] per engine (as "
                         "decode_interleave's); ratios are against the first (default q8:h2o q8:kvzip)")
    ap.add_argument("--llama", nargs="*", default=[], metavar="CONFIG",
                    help="llama.cpp peers in the rotation (bench.llama_peer.CONFIGS, e.g. llama_f16_fa llama_q8_fa)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    check_llama_configs(args.llama)
    cfg = load(args.config, {"model.name": args.model} if args.model else None)
    cfg["lossless"]["mode"] = "off"
    engines = make_engines(cfg, [parse_engine(s, cfg) for s in args.engines])
    limit = min(llm.max_context for _, llm in engines)
    if max(args.contexts) > limit:
        raise SystemExit(f"--contexts: {max(args.contexts)} tokens is past the context limit {limit} "
                         "(runtime.max_context / the model's)")
    peers = {}
    if args.llama:
        from ..bench.llama_peer import make_peers
        from ..model_source import resolve_gguf

        peers = make_peers(resolve_gguf(cfg["model"]["name"]), max(args.contexts) + 8, cfg["runtime"]["threads"],
                           args.llama)
        engines += list(peers.items())
    try:
        _rotate(engines, args)
    finally:
        for p in peers.values():
            p.close()
    return 0


def _prefill(engine, ids) -> tuple:
    """(seconds, of them the reconstruction pass's) of one prefill from an empty cache."""
    if isinstance(engine, Llm):
        engine.reset()
        s0, p0 = engine.stats.prefill_s, engine.stats.reconstruct_s
        engine.prefill(ids)
        return engine.stats.prefill_s - s0, engine.stats.reconstruct_s - p0
    engine.reset()
    t0 = time.perf_counter()
    engine.prefill(ids)
    return time.perf_counter() - t0, 0.0


def _rotate(engines, args) -> None:
    cfg_name = engines[0][1].cfg["model"]["name"]
    threads = engines[0][1].cfg["runtime"]["threads"]
    n = len(engines)
    print(f"{cfg_name}, essay prompts, {args.rounds} rounds, {threads} threads, order rotating each round")
    print(f"{'context':>7} {'engine':>16} {'prefill s':>9} {'range':>13} {'pass s':>7} {'vs first':>8}")
    for context in args.contexts:
        ids = essay_tokens(engines[0][1].tokenizer, context)
        total = [[] for _ in engines]
        passed = [[] for _ in engines]
        for r in range(args.rounds):
            for j in range(n):
                e = (r + j) % n
                t, p = _prefill(engines[e][1], ids)
                total[e].append(t)
                passed[e].append(p)
        first = np.median(total[0])
        for (label, _), t, p in zip(engines, total, passed):
            print(f"{context:>7} {label:>16} {np.median(t):>9.2f} {min(t):>6.2f}-{max(t):<6.2f} "
                  f"{np.median(p):>7.2f} {np.median(t) / first:>8.2f}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
