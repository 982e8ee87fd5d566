"""python -m mnn_h2o.bench: benchmarks of mnn_h2o on the real model.

    python -m mnn_h2o.bench [--config h2o.yaml]          # the default round
    python -m mnn_h2o.bench speed [--json FILE]          # ours vs stock MNN.llm, interleaved
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS threads spin and steal MNN's cores
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


def _parse_ints(s: str):
    try:
        v = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return v


def _speed(args, cfg) -> int:
    from ..engine import Llm
    from ..stock_export import ensure_stock
    from ..model_source import resolve_gguf
    from ..stock import StockLlm
    from .speed import format_table, run_speed

    gguf = resolve_gguf(cfg["model"]["name"])
    longest = max(args.contexts) + args.n_decode + 8
    if cfg["runtime"]["max_context"] and cfg["runtime"]["max_context"] < longest:
        raise ValueError(f"runtime.max_context {cfg['runtime']['max_context']} < longest run {longest}")
    ours = Llm.load(None, cfg)
    if longest > ours.max_context:
        raise ValueError(f"context {max(args.contexts)} + {args.n_decode} exceeds the model's {ours.max_context}")
    stock = StockLlm(ensure_stock(gguf, cfg["model"]["weight_bits"]), threads=cfg["runtime"]["threads"],
                     memory=cfg["runtime"]["memory"], config={"dynamic_option": cfg["runtime"]["dynamic_quant"]})
    if longest > stock.max_context:
        raise ValueError(f"context {max(args.contexts)} + {args.n_decode} exceeds the stock model's {stock.max_context}")
    h2o = cfg["h2o"] if cfg["h2o"]["enabled"] else None
    results = run_speed(ours, stock, ours.tokenizer, args.contexts, args.n_decode, args.repetitions, h2o)
    print(f"\nmodel {cfg['model']['name']}, weights int{cfg['model']['weight_bits']}, "
          f"{cfg['runtime']['threads']} threads, KV {cfg['runtime']['kv_dtype']}, decode {args.n_decode} tokens")
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "speed": results}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    from .. import config as config_mod
    from ..engine import ContextOverflowError
    from ..gguf_model import ModelFileError

    ap = argparse.ArgumentParser(
        prog="python -m mnn_h2o.bench",
        description="Benchmarks on the real model. Without a command, runs the default round "
                    "(currently: `speed`) on the configuration given by --config (default h2o.yaml "
                    "values). Speed targets live here, not in the tests.")
    ap.add_argument("--config", help="YAML config (see docs/config.md); default: built-in defaults")
    ap.add_argument("--model", help="named model or GGUF path (overrides model.name)")
    sub = ap.add_subparsers(dest="command")
    sp = sub.add_parser("speed", help="prefill/decode tokens/s of our engine vs stock MNN.llm on the same "
                                      "weights, interleaved A B / B A, medians and spread")
    for p in (ap, sp):
        p.add_argument("--contexts", type=_parse_ints, default=[512, 2048, 4096],
                       help="context lengths in tokens of essay text (default 512,2048,4096)")
        p.add_argument("--n-decode", type=int, default=64, help="decode tokens per run (default 64)")
        p.add_argument("--repetitions", type=int, default=3, help="interleaved rounds (default 3, minimum 3)")
        p.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    try:
        if args.repetitions < 3:
            raise ValueError("--repetitions must be >= 3 (medians of fewer runs mean little on a noisy machine)")
        if args.n_decode < 1:
            raise ValueError("--n-decode must be >= 1")
        cfg = config_mod.load(args.config, {"model.name": args.model} if args.model else None)
        return _speed(args, cfg)
    except (ModelFileError, ContextOverflowError, config_mod.ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
