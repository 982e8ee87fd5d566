"""Long-run soak of the lossless store: memory stays within its budget and nothing leaks.

    python -m mnn_h2o.tools.store_soak [--config h2o.yaml] [--prompt 1024] [--tokens 5000]
                                       [--runs 2] [--json soak.json] [--plot soak.png]

Each run prefills ``--prompt`` tokens of essay text and then decodes ``--tokens`` tokens of the
true continuation (teacher-forced, so the text never degenerates into a loop), with H2O and the
lossless store on (``--mode store``, or ``--mode full`` to check every chunk byte for byte). Runs follow each other on one engine (reset between),
so ``--runs 2 --tokens 5000`` is a 10 000-token soak. Every ``--every`` tokens it samples the
cache's own accounting (raw blocks, compressed chunks, decode cache, scratch) and the process
RSS. It checks, and exits 1 if any check fails:

- budget: bytes held never exceed the bytes H2O's kept tokens take raw (the store never costs
  memory), what H2O keeps follows its target ratio after warm-up, and the decode cache never
  exceeds lossless.decode_cache_bytes;
- no leak: RSS minus the bytes the cache holds grows by less than --leak-mib between the end
  of the first run's warm-up (--warmup tokens) and the end of the last run;
- reset: every run ends with bytes held 0 after its reset.

Positions stay below the model's context (prompt + tokens <= 8192 for SmolLM2).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

MIB = 1 << 20


def _rss() -> int:
    from ..bench.cases import rss_bytes

    return rss_bytes()


def soak(llm, tokenizer, prompt_len: int, n_tokens: int, runs: int, every: int, progress: bool = True):
    from tqdm import tqdm

    from ..bench.cases import store_summary
    from ..essays import essay_tokens

    samples = []
    ends = []
    bar = tqdm(total=runs * n_tokens, desc="soak", unit="tok", disable=not progress)
    for run in range(runs):
        ids = essay_tokens(tokenizer, prompt_len + n_tokens, offset=run * 9000 % 40000)
        llm.reset()
        llm.prefill(ids[:prompt_len])
        t0 = time.perf_counter()
        for i, t in enumerate(ids[prompt_len:]):
            llm.decode(int(t))
            if i % every == 0 or i == n_tokens - 1:
                st = llm.stats
                ss = llm.store_stats() or {}
                samples.append({"run": run, "token": i, "context": llm.pos, "bytes_held": st.kv_bytes_held,
                                "pool_bytes": st.kv_bytes_pool, "kept_bytes": st.kv_bytes_kept, "uncompressed": st.kv_bytes_uncompressed,
                                "blob_bytes": ss.get("blob_bytes", 0), "table_bytes": ss.get("table_bytes", 0),
                                "cache_bytes": ss.get("cache_bytes", 0),
                                "scratch_bytes": ss.get("scratch_bytes", 0), "rss": _rss(),
                                "elapsed_s": time.perf_counter() - t0})
            bar.update(1)
        stats = llm.store_stats() or {}
        summary = store_summary(stats)
        llm.reset()
        ends.append({"run": run, "decode_tps": llm_tps(samples, run), "bytes_after_reset": llm.cache.bytes_held(),
                     "chunks_encoded": stats.get("chunks_encoded", 0),
                     "verify_mismatches": stats.get("verify_mismatches", 0),
                     "fallbacks": summary["fallback_reasons"], "error_fallbacks": summary["fallbacks"],
                     "lossless_ratio": stats.get("lossless_ratio", 0.0), "deferrals": stats.get("deferrals", 0),
                     "repacked": stats.get("repacked", 0), "merged": stats.get("merged", 0), "dissolved": stats.get("dissolved", 0)})
    bar.close()
    return samples, ends


def llm_tps(samples, run) -> float:
    s = [x for x in samples if x["run"] == run]
    return (s[-1]["token"] / s[-1]["elapsed_s"]) if s and s[-1]["elapsed_s"] else 0.0


def check(samples, ends, cfg, head_dim: int, warmup: int, leak_mib: float) -> list:
    target = cfg["eviction"]["target_lossy_ratio"]
    warm = [s for s in samples if s["token"] >= warmup]  # every run warms up again after its reset
    after = [s for s in samples if s["run"] > 0 or s["token"] >= warmup]  # the first warm-up, on
    checks = []
    # The store holds at most what H2O's kept tokens take raw, plus its bounded working memory:
    # copies of the chunks in flight to the workers (max_queue of them) and the decode cache.
    ll = cfg["lossless"]
    from .. import native
    chunk_raw = 2 * ll["chunk_tokens"] * native.kv_row_bytes(cfg["runtime"]["kv_dtype"], head_dim)
    slack = ll["max_queue"] * chunk_raw + ll["decode_cache_bytes"]
    worst = max(s["bytes_held"] - s["scratch_bytes"] - s["kept_bytes"] for s in samples)
    checks.append({"check": "bytes held - scratch <= kept tokens at raw size + max_queue chunks + decode cache",
                   "worst_excess_bytes": worst, "allowed_bytes": slack, "pass": worst <= slack})
    # And what H2O keeps follows its budget (the adaptive target lands a few % under; between
    # two updates the new tokens wait for the next one).
    worst_ratio = min(s["uncompressed"] / s["kept_bytes"] for s in warm) if warm else 0.0
    checks.append({"check": "lossy ratio after warm-up >= 0.9 x eviction.target_lossy_ratio", "min_ratio": worst_ratio,
                   "target": target, "pass": worst_ratio >= 0.9 * target})
    worst_cache = max(s["cache_bytes"] for s in samples)
    checks.append({"check": "decode cache <= lossless.decode_cache_bytes", "max_cache_bytes": worst_cache,
                   "budget": cfg["lossless"]["decode_cache_bytes"],
                   "pass": worst_cache <= cfg["lossless"]["decode_cache_bytes"]})
    if after:
        overhead = [s["rss"] - s["bytes_held"] for s in after]
        growth = (overhead[-1] - overhead[0]) / MIB
        checks.append({"check": f"RSS - bytes held grows < {leak_mib} MiB after warm-up", "growth_mib": growth,
                       "pass": growth < leak_mib})
    checks.append({"check": "reset returns every byte", "bytes_after_reset": [e["bytes_after_reset"] for e in ends],
                   "pass": all(e["bytes_after_reset"] == 0 for e in ends)})
    checks.append({"check": "no verify mismatches", "mismatches": [e["verify_mismatches"] for e in ends],
                   "chunks_encoded": [e["chunks_encoded"] for e in ends],
                   "pass": all(e["verify_mismatches"] == 0 for e in ends)})
    checks.append({"check": "no error fallbacks", "fallbacks": [e["fallbacks"] for e in ends],
                   "pass": all(e["error_fallbacks"] == 0 for e in ends)})
    return checks


def plot(samples, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    runs = sorted({s["run"] for s in samples})
    offset = 0
    for r in runs:
        s = [x for x in samples if x["run"] == r]
        x = [offset + p["token"] for p in s]
        kw = {} if r == runs[0] else {"label": None}
        ax.plot(x, [p["bytes_held"] / MIB for p in s], "tab:red", **({"label": "KV bytes held"} if r == 0 else kw))
        ax.plot(x, [p["kept_bytes"] / MIB for p in s], "tab:green", **({"label": "H2O alone (kept tokens, raw)"} if r == 0 else kw))
        ax.plot(x, [p["pool_bytes"] / MIB for p in s], "tab:orange", **({"label": "of which raw blocks"} if r == 0 else kw))
        ax.plot(x, [p["uncompressed"] / MIB / 10 for p in s], "k:", **({"label": "uncompressed / 10"} if r == 0 else kw))
        ax.plot(x, [(p["rss"] - s[0]["rss"] + s[0]["bytes_held"]) / MIB for p in s], "tab:blue", lw=0.8,
                **({"label": "RSS (shifted to start at bytes held)"} if r == 0 else kw))
        offset = x[-1] + 1
    ax.set_xlabel("decode tokens (runs back to back)")
    ax.set_ylabel("MiB")
    ax.set_title("Store-mode soak: memory held and RSS")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from .. import config as config_mod
    from ..engine import Llm
    from ..export import ensure_exported
    from ..errors import ContextOverflowError, ModelFileError

    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.store_soak", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--config", help="YAML config (docs/config.md)")
    ap.add_argument("--mode", choices=("store", "full"), default="store",
                    help="lossless mode (default store; full checks every chunk byte for byte)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one config key (repeatable), e.g. --set lossless.front_n=30")
    ap.add_argument("--model", help="named model or GGUF path (overrides model.name)")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens per run (default 1024)")
    ap.add_argument("--tokens", type=int, default=5000, help="decode tokens per run (default 5000)")
    ap.add_argument("--runs", type=int, default=2, help="runs back to back on one engine (default 2)")
    ap.add_argument("--every", type=int, default=50, help="sample every this many tokens (default 50)")
    ap.add_argument("--warmup", type=int, default=1000, help="tokens of the first run excluded from the leak check")
    ap.add_argument("--leak-mib", type=float, default=16.0, help="allowed growth of RSS - bytes held (default 16)")
    ap.add_argument("--json", help="write samples and checks here")
    ap.add_argument("--plot", help="write a PNG of memory over the soak here")
    args = ap.parse_args(argv)
    try:
        if min(args.prompt, args.tokens, args.runs, args.every) < 1:
            raise ValueError("--prompt, --tokens, --runs and --every must be >= 1")
        overrides = dict(config_mod.parse_assignment(a) for a in args.set)
        overrides.update({"lossless.mode": args.mode, **({"model.name": args.model} if args.model else {})})
        cfg = config_mod.load(args.config, overrides)
        llm = Llm(ensure_exported(cfg["model"]), cfg)
        if args.prompt + args.tokens > llm.max_context:
            raise ContextOverflowError(f"--prompt + --tokens = {args.prompt + args.tokens} exceeds the model's "
                                       f"context of {llm.max_context}: use more --runs instead")
        samples, ends = soak(llm, llm.tokenizer, args.prompt, args.tokens, args.runs, args.every)
        checks = check(samples, ends, cfg, llm.config.head_dim, args.warmup, args.leak_mib)
    except (ModelFileError, ContextOverflowError, config_mod.ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    last = [s for s in samples if s["token"] == args.tokens - 1]
    for s, e in zip(last, ends):
        print(f"run {e['run']}: {e['decode_tps']:.1f} tok/s, held {s['bytes_held'] / MIB:.2f} MiB "
              f"(raw blocks {s['pool_bytes'] / MIB:.2f}, chunks {s['blob_bytes'] / MIB:.2f}, V row tables "
              f"{s['table_bytes'] / MIB:.2f}, cache "
              f"{s['cache_bytes'] / MIB:.2f}, scratch {s['scratch_bytes'] / MIB:.2f}) of {s['uncompressed'] / MIB:.1f} "
              f"uncompressed; RSS {s['rss'] / MIB:.0f} MiB; lossless {e['lossless_ratio']:.3f}; "
              f"deferrals {e['deferrals']}, repacked {e['repacked']}, merged {e['merged']}, dissolved {e['dissolved']}")
    for ch in checks:
        print(("PASS " if ch["pass"] else "FAIL ") + json.dumps(ch))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "samples": samples, "runs": ends, "checks": checks}, f, indent=1)
    if args.plot:
        plot(samples, args.plot)
    return 0 if all(ch["pass"] for ch in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
