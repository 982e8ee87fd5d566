"""A prompt's layers in our core against MNN's modules and llama.cpp, runs interleaved.

Each engine prefills the same essay prompt from an empty cache and greedy-decodes --n-decode
tokens, round after round in turn (measure.interleave): ``native`` and ``mnn`` are our engine with
runtime.prompt_layers native / mnn (eviction off, the config's other settings), ``llama_*`` the
llama.cpp peers of bench.llama_peer on the same GGUF (the `llama` extra). Prints each engine's
median prefill and decode tokens/s with their range, and the prefill ratios of native to the
others. Quality of the prompt path: tests/test_native_layers.py (KL to the exact model).

    python -m mnn_h2o.tools.prompt_layers [--model qwen2.5-1.5b] [--contexts 512 2048]
        [--repetitions 3] [--n-decode 16] [--engines native mnn llama_f16_fa llama_q8_fa]
"""
from __future__ import annotations

import argparse
import copy
import json

ENGINES = ("native", "mnn", "llama_f16", "llama_f16_fa", "llama_q8_fa")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.prompt_layers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", help="named model or GGUF path (default qwen2.5-1.5b)")
    ap.add_argument("--config", default="h2o.yaml", help="our settings (default h2o.yaml; eviction is turned off)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048], help="prompt tokens (default 512 2048)")
    ap.add_argument("--repetitions", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--n-decode", type=int, default=16, help="greedy decode tokens after each prompt (default 16)")
    ap.add_argument("--engines", nargs="+", default=["native", "mnn", "llama_f16_fa", "llama_q8_fa"], choices=ENGINES,
                    help="engines to interleave (default native mnn llama_f16_fa llama_q8_fa)")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args(argv)
    if args.repetitions < 1 or args.n_decode < 1:
        raise SystemExit("--repetitions and --n-decode must be at least 1")

    from ..config import load
    from ..engine import Llm
    from ..essays import essay_tokens
    from ..measure import interleave, summarize, time_run
    from ..model_source import resolve_gguf

    cfg = load(args.config, {"model.name": args.model, "eviction.enabled": False})
    ours = {}
    for name in ("native", "mnn"):
        if name in args.engines:
            c = copy.deepcopy(cfg)
            c["runtime"]["prompt_layers"] = name
            ours[name] = Llm.load(args.model, c)
    peers_wanted = [e for e in args.engines if e.startswith("llama")]
    if peers_wanted:
        from ..bench.llama_peer import make_peers
    tok = next(iter(ours.values())).tokenizer if ours else None
    if tok is None:
        raise SystemExit("--engines needs native or mnn (their tokenizer makes the prompt)")
    out = {"model": args.model, "contexts": {}}
    for ctx in args.contexts:
        ids = essay_tokens(tok, ctx)
        peers = make_peers(resolve_gguf(args.model), ctx + args.n_decode + 8, cfg["runtime"]["threads"],
                           peers_wanted) if peers_wanted else {}
        try:
            engines = {**ours, **peers}
            for e in engines.values():  # untimed warm-up: first-use allocations are not steady state
                time_run(e, ids[:64], 2)
            runs = interleave({n: (lambda e: lambda: time_run(e, ids, args.n_decode))(e) for n, e in engines.items()},
                              args.repetitions)
        finally:
            for p in peers.values():
                p.close()
        row = {}
        for name, rs in runs.items():
            row[name] = {k: summarize([r[k] for r in rs]) for k in ("prefill_tps", "decode_tps")}
            p, d = row[name]["prefill_tps"], row[name]["decode_tps"]
            print(f"{ctx:6d} {name:13s} prefill {p['median']:8.1f} tok/s ({p['min']:.1f}-{p['max']:.1f})   "
                  f"decode {d['median']:7.2f} tok/s ({d['min']:.2f}-{d['max']:.2f})")
        if "native" in row:
            for other in row:
                if other != "native":
                    r = row["native"]["prefill_tps"]["median"] / row[other]["prefill_tps"]["median"]
                    print(f"{ctx:6d} prefill native / {other}: {r:.2f}x")
        out["contexts"][str(ctx)] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
