"""python -m mnn_h2o.eval quality: quality of KV eviction against the full cache.

For each prompt length, policy (h2o, streaming, random) and target whole-model lossy ratio, a
teacher-forced continuation of essay text is compared with the full-cache run (KL, top-1
agreement, perplexity) and a needle-in-a-haystack test is run. Writes a table, a PNG of
quality vs measured lossy ratio and, with --json, one row per run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


def _floats(s):
    try:
        v = [float(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None
    if not v:
        raise argparse.ArgumentTypeError("expected at least one value")
    return v


def plot_quality(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lens = sorted({r["prompt_tokens"] for r in rows})
    fig, axes = plt.subplots(len(lens), 2, figsize=(10, 3.6 * len(lens)), squeeze=False)
    for i, n in enumerate(lens):
        for policy, style in (("h2o", "o-"), ("streaming", "s--"), ("random", "^:")):
            rs = sorted((r for r in rows if r["prompt_tokens"] == n and r["policy"] == policy
                         and r["evicted"]), key=lambda r: r["lossy_ratio"])
            if not rs:
                continue
            x = [r["lossy_ratio"] for r in rs]
            axes[i][0].plot(x, [r["kl"] for r in rs], style, label=policy)
            axes[i][1].plot(x, [r["top1_agreement"] for r in rs], style, label=policy)
        axes[i][0].set(title=f"{n}-token prompt: KL(full || compressed)", xlabel="measured whole-model lossy ratio",
                       ylabel="mean KL (nats)", yscale="log")
        axes[i][1].set(title=f"{n}-token prompt: top-1 agreement with full cache",
                       xlabel="measured whole-model lossy ratio", ylabel="agreement")
        for ax in axes[i]:
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from .. import config as config_mod
    from ..engine import ContextOverflowError, Llm
    from ..gguf_model import ModelFileError
    from .needle import needle_hits, needle_prompts
    from .quality import format_rows, h2o_section, quality_sweep

    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality", help="KL / top-1 agreement / perplexity / needle vs the full cache")
    q.add_argument("--config", help="YAML config; its h2o section is the base of every run")
    q.add_argument("--model", help="named model or GGUF path (overrides model.name)")
    q.add_argument("--prompt-lens", type=lambda s: [int(x) for x in _floats(s)], default=[1024, 4096],
                   help="prompt lengths in tokens (default 1024,4096)")
    q.add_argument("--continuation", type=int, default=256, help="teacher-forced tokens (default 256)")
    q.add_argument("--policies", default="h2o,streaming,random", help="default h2o,streaming,random")
    q.add_argument("--ratios", type=_floats, default=[1.5, 2, 3, 4, 6, 8],
                   help="target whole-model lossy ratios (default 1.5,2,3,4,6,8)")
    q.add_argument("--needle-context", type=int, default=2048, help="needle haystack tokens (0 = skip)")
    q.add_argument("--needle-depths", type=_floats, default=[0.1, 0.3, 0.5, 0.7, 0.9])
    q.add_argument("--out", default="quality", help="output prefix for .png (default ./quality)")
    q.add_argument("--json", help="write rows to this JSON file")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    try:
        bad = [p for p in policies if p not in ("h2o", "streaming", "random")]
        if bad:
            raise ValueError(f"unknown policy {bad[0]!r} (allowed: h2o, streaming, random)")
        if args.continuation < 2:
            raise ValueError("--continuation must be >= 2")
        cfg = config_mod.load(args.config, {"model.name": args.model} if args.model else None)
        llm = Llm.load(None, cfg)
        rows = quality_sweep(llm, llm.tokenizer, cfg["h2o"], args.prompt_lens, args.continuation,
                             policies, args.ratios)
        if args.needle_context:
            prompts = needle_prompts(llm.tokenizer, args.needle_context, args.needle_depths)
            llm.configure_h2o(None)
            full = needle_hits(llm, prompts)
            print(f"needle, full cache: {full['needle_hits']}/{full['needle_total']}")
            from tqdm import tqdm

            done = {}
            bar = tqdm(total=len({(r["policy"], r["target_lossy_ratio"]) for r in rows}), desc="needle", unit="config")
            for r in rows:
                key = (r["policy"], r["target_lossy_ratio"])
                if key not in done:
                    llm.configure_h2o(h2o_section(cfg["h2o"], *key))
                    done[key] = needle_hits(llm, prompts)
                    bar.update(1)
                r.update(done[key], needle_context=args.needle_context,
                         needle_hits_full=full["needle_hits"])
            bar.close()
            llm.configure_h2o(None)
    except (ModelFileError, ContextOverflowError, config_mod.ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_rows(rows, ("needle_hits",) if args.needle_context else ()))
    plot_quality(rows, args.out + ".png")
    print(f"wrote {args.out}.png")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
