"""python -m mnn_h2o.eval frontier: KV memory against quality on held-out text.

Every method (ours: each eviction policy and KV element type; kvpress: each press, on a float
cache or on llama.cpp's q8_0 blocks, with the optional extra `pip install .[compare]`) at each
target whole-model ratio, on the chosen split of three text domains (essays, Python reference
prose, Python source code):

  - teacher-forced KL(full || compressed), top-1 agreement and perplexity delta over the
    continuation tokens after each prompt, against the same engine's own full cache; and
    kl_exact, KL against the exact model (the float model without our int8 engine), computed
    once per segment;
  - KV bytes held at run time and the whole-model ratio (f16 bytes of every token / bytes held);
  - needle trials (3 needles x 5 depths x 2 haystack lengths), with the question inside the
    compressed prompt and after it.

Writes --json (meta, per-run records, aggregated rows; rewritten after every run, so --resume
continues an interrupted sweep), a Markdown table next to it and plots PREFIX_kl.png,
PREFIX_top1.png, PREFIX_needle.png. Defaults are chosen on --split dev; results are reported
on --split test (the default). See docs/evaluation.md for the metrics, sources and cost.

Cost on 2 cores (SmolLM2): ~16 s per run at 4096 tokens, ~30 s at 7936, ~15 s per needle trial;
the full default sweep of our four methods is ~2.5 hours; --quick (plumbing only, tiny
segments) ~1-2 minutes.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..cli_numbers import number_list

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

# --quick: tiny segments that exercise every path; the numbers mean nothing.
QUICK = {"prompt_lens": [640], "continuation": 16, "segments": 1, "ratios": [2.0],
         "needle_lengths": [640], "needle_depths": [0.5], "needles": 1}
# Floors small enough that a 640-token prompt is really evicted to 2x.
QUICK_EVICTION = {"eviction.sink_tokens": 16, "eviction.recent_tokens": 64, "eviction.trigger_min_tokens": 128}


_floats = number_list(float)
_ints = number_list(int, 1)


def _parser() -> argparse.ArgumentParser:
    from . import frontier  # the names in the help are the config schema's
    from .kvpress_peer import DTYPES as PEER_DTYPES

    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("frontier", help="memory vs quality of every method on held-out text",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--json", default="frontier.json", help="output file (default frontier.json)")
    f.add_argument("--out", help="prefix of the plots and the .md table (default: --json without .json)")
    f.add_argument("--quick", action="store_true", help="tiny segments, one ratio: checks the plumbing")
    f.add_argument("--resume", action="store_true", help="keep the runs already in --json and do the rest")
    f.add_argument("--config", help="YAML config; its runtime and eviction sections are the base of our runs")
    f.add_argument("--model", help="named model or GGUF path (overrides model.name)")
    f.add_argument("--methods", default="ours,ours:none@q8,ours:h2o@q8,kvpress,kvpress@q8",
                   help="comma-separated engine:policy[@kv_dtype], e.g. ours:h2o,ours:none@q8,"
                        "kvpress:snapkv,kvpress:kvzip@q8; 'ours' / 'kvpress' alone = every policy / "
                        "press on f16 KV, 'kvpress@q8' every press on q8_0 KV; kv_dtype: ours "
                        f"{', '.join(frontier.our_dtypes())}; kvpress {' or '.join(PEER_DTYPES)} (llama.cpp's "
                        "q8_0 blocks). With a quantised "
                        "type the target stays whole-model: eviction makes up what the type does not "
                        "save, and targets the type alone exceeds are skipped (default "
                        "ours,ours:none@q8,ours:h2o@q8,kvpress,kvpress@q8; kvpress is skipped with a "
                        "message when the extra is missing)")
    f.add_argument("--ratios", type=_floats, default=[1.5, 2, 3.2, 5, 8],
                   help="target whole-model ratios (default 1.5,2,3.2,5,8)")
    f.add_argument("--split", choices=("test", "dev"), default="test",
                   help="segments to run: test (report) or dev (choose defaults); default test")
    f.add_argument("--domains", default="essays,prose,code", help="default essays,prose,code")
    f.add_argument("--prompt-lens", type=_ints, default=[4096, 7936],
                   help="prompt tokens (default 4096,7936: 7936 + 256 fills SmolLM2's 8192)")
    f.add_argument("--continuation", type=int, default=256, help="teacher-forced tokens (default 256)")
    f.add_argument("--segments", type=int, default=2, help="segments per domain and length (1-4, default 2)")
    f.add_argument("--needle-lengths", type=_ints, default=[3000, 7000],
                   help="needle prompt tokens (default 3000,7000; empty run: --no-needle)")
    f.add_argument("--needle-depths", type=_floats, default=[0.1, 0.3, 0.5, 0.7, 0.9])
    f.add_argument("--placements", default="inside,after", help="needle question placement (default inside,after)")
    f.add_argument("--no-needle", action="store_true", help="skip the needle trials")
    f.add_argument("--no-kl", action="store_true", help="skip the teacher-forced runs")
    f.add_argument("--no-exact", action="store_true",
                   help="skip kl_exact (the float numpy model over each segment: ~8 min a 4096-token segment on "
                        "the 1.5B); the KL against the engine's own full cache stays")
    g = sub.add_parser("factors", help="our h2o under config variants, one factor at a time (issue 19)",
                       description=_factors_doc(), formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--json", default="factors.json", help="output file (default factors.json); a .md table beside it")
    g.add_argument("--resume", action="store_true", help="keep the runs already in --json and do the rest")
    g.add_argument("--config", help="YAML config: the base every variant changes")
    g.add_argument("--variants", default="base,layers0,floors16,block32,prefill_end,no_decode,kvpress_like",
                   help="comma-separated variant names (see mnn_h2o/eval/factors.py VARIANTS)")
    g.add_argument("--ratios", type=_floats, default=[3.2], help="target whole-model ratios (default 3.2)")
    g.add_argument("--split", choices=("test", "dev"), default="dev", help="default dev")
    g.add_argument("--domains", default="essays,prose,code")
    g.add_argument("--prompt-lens", type=_ints, default=[4096, 7936])
    g.add_argument("--continuation", type=int, default=256)
    g.add_argument("--segments", type=int, default=1, help="segments per domain and length (default 1)")
    z = sub.add_parser("kvzip-structure", help="KVzip's own scores cut by token or by our blocks and floors",
                       description=_module_doc("kvzip_structure"), formatter_class=argparse.RawDescriptionHelpFormatter)
    z.add_argument("--json", default="kvzip_structure.json", help="output file; a .md table beside it")
    z.add_argument("--config", help="YAML config: runtime.block_tokens and the eviction floors it applies")
    z.add_argument("--ratio", type=float, default=3.2, help="target whole-model ratio (default 3.2)")
    z.add_argument("--split", choices=("test", "dev"), default="dev", help="default dev")
    z.add_argument("--domains", default="essays,prose,code")
    z.add_argument("--prompt-len", type=int, default=4096)
    z.add_argument("--continuation", type=int, default=256)
    z.add_argument("--segments", type=int, default=1, help="segments per domain (default 1)")
    r = sub.add_parser("fair", help="the default against presses over q8_0, from frontier files: table and plot",
                       description=_module_doc("fair"), formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("files", nargs="+", help="frontier --json files; a later file's row replaces an earlier one's")
    r.add_argument("--default", default="ours:kvzip@q8r", help="the method to compare (default ours:kvzip@q8r, "
                   "SmolLM2's default)")
    r.add_argument("--out", default="fair", help="prefix of the .md table and the .png plot (default fair)")
    w = sub.add_parser("weights", help="weight precision (layers / lm_head bits) vs the exact model, and speed",
                       description=_weights_doc(), formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--json", default="weights.json", help="output file (default weights.json); a .md table beside it")
    w.add_argument("--variants", default="8,4,4/8",
                   help="comma-separated LAYERS[/HEAD] weight bits (8, 4 or 0 = float); default 8,4,4/8")
    w.add_argument("--config", help="YAML config: runtime and eviction settings of every variant")
    w.add_argument("--model", help="named model or GGUF path (overrides model.name)")
    w.add_argument("--split", choices=("test", "dev"), default="test", help="default test")
    w.add_argument("--domains", default="essays,prose,code", help="default essays,prose,code ('' = no quality runs)")
    w.add_argument("--tokens", type=int, default=1024, help="teacher-forced tokens per domain (default 1024)")
    w.add_argument("--contexts", type=_ints, default=[512, 4096], help="speed: prompt tokens (default 512,4096)")
    w.add_argument("--decode", type=int, default=64, help="speed: decoded tokens per run (default 64)")
    w.add_argument("--repetitions", type=int, default=3, help="speed: interleaved rounds (default 3)")
    w.add_argument("--no-speed", action="store_true", help="quality only")
    return ap


def _module_doc(name: str) -> str:
    import importlib

    return importlib.import_module(f".{name}", __package__).__doc__


def _weights_doc() -> str:
    from . import weights

    return weights.__doc__


def _factors_doc() -> str:
    from . import factors

    return factors.__doc__ + "\nVariants:\n" + "\n".join(f"  {v.name:13s} {v.what}" for v in factors.VARIANTS.values())


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from .. import config as config_mod
    from ..cli_errors import run

    if args.command == "weights":
        from . import weights

        if args.tokens < 2 or args.decode < 1 or args.repetitions < 1:
            raise SystemExit("error: --tokens must be >= 2, --decode and --repetitions >= 1")
        return run(lambda: weights.sweep(args, config_mod))
    if args.command == "fair":
        from . import fair

        return run(lambda: print(fair.report(args.files, args.default, args.out)) or 0)
    if args.command == "kvzip-structure":
        from . import kvzip_structure

        return run(lambda: kvzip_structure.sweep(args, config_mod))
    if args.command == "factors":
        from . import factors

        return run(lambda: factors.sweep(args, config_mod),
                   interrupted=f"interrupted: the runs finished so far are in {args.json} (--resume goes on)")
    return run(lambda: _frontier(args, config_mod),
               interrupted=f"interrupted: the runs finished so far are in {args.json} (--resume goes on)")


def _frontier(args, config_mod) -> int:
    from tqdm import tqdm

    from . import domains as D
    from . import frontier as F
    from . import needle as N
    from .frontier_plots import plot_all

    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    else:
        args.needles = len(N.NEEDLES)
    if args.continuation < 2:
        raise ValueError("--continuation must be >= 2")
    doms = [d for d in args.domains.split(",") if d]
    for d in doms:
        if d not in D.DOMAINS:
            raise ValueError(f"unknown domain {d!r} (allowed: {', '.join(D.DOMAINS)})")
    placements = [p for p in args.placements.split(",") if p]
    for p in placements:
        if p not in N.PLACEMENTS:
            raise ValueError(f"unknown placement {p!r} (allowed: {', '.join(N.PLACEMENTS)})")
    if any(r < 1 for r in args.ratios):
        raise ValueError("--ratios must be >= 1")

    overrides = dict(QUICK_EVICTION) if args.quick else {}
    if args.model:
        overrides["model.name"] = args.model
    cfg = config_mod.load(args.config, overrides)
    presses, why_not = F.peer_presses()
    spec = args.methods
    every_press = ("kvpress", "kvpress@q8")
    if why_not and any(s.strip() in every_press for s in spec.split(",")):
        print(f"note: kvpress rows skipped: {why_not}", file=sys.stderr)
        spec = ",".join(s for s in spec.split(",") if s.strip() not in every_press)
    methods = F.parse_methods(spec, presses)
    if why_not and any(m.engine == "kvpress" for m in methods):
        raise ValueError(f"kvpress methods asked for, but {why_not}")

    ours = F.OursEngine(cfg)
    tok = ours.tokenizer
    if any(m.engine == "ours" and m.policy == "predicted_kvzip" for m in methods):
        # Before the sweep, not at its first predicted_kvzip run. Asked for by name, a missing
        # scorer is an error naming the command that fits it; within a bare `ours` (every policy)
        # its rows are skipped with a note, as kvpress's are without the peer.
        from ..token_scorer import ScorerFileError

        named = any(s.strip().startswith("ours:predicted_kvzip") for s in spec.split(","))
        try:
            ours.check_scorer()
        except ScorerFileError as e:
            if named:
                raise
            print(f"note: ours:predicted_kvzip rows skipped: {e}", file=sys.stderr)
            methods = [m for m in methods if not (m.engine == "ours" and m.policy == "predicted_kvzip")]
    engines = {"ours": ours}
    if any(m.engine == "kvpress" for m in methods):
        from ..model_source import resolve_gguf

        engines["kvpress"] = F.PeerEngine(resolve_gguf(cfg["model"]["name"]), cfg["runtime"]["threads"], tok,
                                          [m for m in methods if m.engine == "kvpress"], args.ratios)
    # Every engine needs its own full cache as the reference.
    for e in engines:
        if F.Method(e, "none") not in methods:
            methods.insert(0, F.Method(e, "none"))

    segs = [] if args.no_kl else [s for n in args.prompt_lens for d in doms
                                  for s in D.segments(tok, d, args.split, n, args.continuation, args.segments)]
    trials = [] if args.no_needle else N.trials(tok, args.split, N.NEEDLES[:args.needles],
                                                args.needle_depths, args.needle_lengths)
    settings = {k: getattr(args, k) for k in ("ratios", "split", "prompt_lens", "continuation",
                                               "segments", "needle_lengths", "needle_depths", "needles")}
    settings.update(domains=doms, placements=placements, methods=[m.name for m in methods],
                    config={s: cfg[s] for s in ("model", "runtime", "eviction")})
    meta = {"settings": settings, "domains": D.describe(tok, doms),
            "needles": [n.__dict__ | {"values": len(n.values)} for n in N.NEEDLES[:args.needles]],
            "needle_seed": N.SEED,
            # What kl_exact is measured against, per engine (docs/evaluation.md).
            "exact_model": {"ours": "mnn_h2o.reference.ReferenceModel, float32, GGUF weights dequantised",
                            "kvpress": "the peer's full cache: transformers, float32, GGUF weights dequantised"}}
    results = F.Results(args.json, meta, args.resume)
    total = F.sweep_size(methods, args.ratios, len(segs), len(trials), placements)
    bar = tqdm(total=total, desc="frontier", unit="run")
    F.kl_sweep(engines, methods, args.ratios, segs, results, lambda: bar.update(1), exact=not args.no_exact)
    F.needle_sweep(engines, methods, args.ratios, trials, placements, args.split, results,
                   lambda: bar.update(1))
    bar.close()
    results.save()

    rows = F.aggregate(results.runs)
    prefix = args.out or (args.json[:-5] if args.json.endswith(".json") else args.json)
    report = F.table(rows)
    cmp = F.peer_comparison(rows)
    with open(prefix + ".md", "w") as f:
        f.write(report + ("\n\n" + cmp if cmp else "") + "\n")
    print(report)
    if cmp:
        print("\n" + cmp)
    for p in plot_all(rows, prefix):
        print(f"wrote {p}")
    print(f"wrote {args.json} and {prefix}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
