"""python -m mnn_h2o.bench: the bench and regression harness, on the real model.

    python -m mnn_h2o.bench [--config h2o.yaml] [--quick] [--compare RUN]   # a round with gates
    python -m mnn_h2o.bench selftest                     # every gate can fail
    python -m mnn_h2o.bench reference RUN                # RUN becomes the reference round
    python -m mnn_h2o.bench speed [--json FILE]          # ours vs stock MNN.llm, interleaved
    python -m mnn_h2o.bench speed --llama                # ... and llama.cpp (the `llama` extra)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..cli_numbers import number_list
from .speed import ENGINES as SPEED_ENGINES, LLAMA_ROWS

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS threads spin and steal MNN's cores
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


_parse_ints = number_list(int, 1)
DEFAULT_SPEED_ENGINES = ("ours", "ours_evict", "stock")


def _engine_list(text: str) -> list:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in SPEED_ENGINES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown engine(s) {', '.join(bad) or '(none)'}: use "
                                         f"{', '.join(SPEED_ENGINES)}")
    return names


def _speed(args, cfg) -> int:
    from ..engine import Llm
    from ..export import ensure_exported
    from ..stock_export import ensure_stock
    from ..model_source import resolve_gguf
    from ..stock import StockLlm
    from .speed import format_table, run_speed

    llama = None
    llama_rows = [e for e in args.engines if e in LLAMA_ROWS]
    if llama_rows:
        from . import llama_peer

        llama_peer.check()  # before loading anything: the install hint, exit 2
    gguf = resolve_gguf(cfg["model"]["name"])
    if llama_rows:
        llama_peer.preflight(gguf, cfg["runtime"]["threads"])
    longest = max(args.contexts) + args.n_decode + 8
    if cfg["runtime"]["max_context"] and cfg["runtime"]["max_context"] < longest:
        raise ValueError(f"runtime.max_context {cfg['runtime']['max_context']} < longest run {longest}")
    ours = Llm(ensure_exported(cfg["model"]), cfg)
    if longest > ours.max_context:
        raise ValueError(f"context {max(args.contexts)} + {args.n_decode} exceeds the model's {ours.max_context}")
    # Stock MNN.llm is one module, quantised at one width: the layers' (with a mixed export its
    # lm_head has fewer bits than ours, so it reads fewer bytes per token than we do).
    stock = None
    if "stock" in args.engines:
        stock = StockLlm(ensure_stock(gguf, ours.meta["weight_bits"]), threads=cfg["runtime"]["threads"],
                         memory=cfg["runtime"]["memory"], config={"dynamic_option": cfg["runtime"]["dynamic_quant"]})
        if longest > stock.max_context:
            raise ValueError(f"context {max(args.contexts)} + {args.n_decode} exceeds the stock model's "
                             f"{stock.max_context}")
    eviction = cfg["eviction"] if cfg["eviction"]["enabled"] and "ours_evict" in args.engines else None
    if "ours_evict" in args.engines and not cfg["eviction"]["enabled"]:
        raise ValueError("engine ours_evict needs eviction.enabled: true")
    threads = cfg["runtime"]["threads"]
    info = {}
    if llama_rows:
        llama = lambda n_ctx: llama_peer.make_peers(gguf, n_ctx, threads, llama_rows)
        info = llama_peer.system_info()
    results = run_speed(ours, stock, ours.tokenizer, args.contexts, args.n_decode, args.repetitions, eviction,
                        llama=llama, llama_rows=llama_rows, ours_full="ours" in args.engines)
    stock_bits = f" (stock: int{ours.meta['weight_bits']})" if stock is not None else ""
    print(f"\nmodel {cfg['model']['name']}, weights {ours.weights}{stock_bits}, "
          f"{threads} threads, KV {cfg['runtime']['kv_dtype']}, decode {args.n_decode} tokens")
    if info:
        print(f"llama.cpp: llama-cpp-python {info['llama_cpp_python']}, {threads} threads, the GGUF file as is "
              f"({gguf}); OMP_WAIT_POLICY for llama.cpp: {info['omp_wait_policy_at_load']}; {info['system_info']}")
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "speed": results, "llama_cpp": info or None}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


# --quick: a smoke round. Its prompt passes the default eviction trigger (eviction.trigger_min_tokens,
# 3072) by a few blocks, so the evicting cases really evict and their guards and targets mean something.
QUICK = {"bench.prompt_lengths": [3328], "bench.decode_tokens": 64, "bench.repetitions": 3,
         "bench.demo_buckets": [128], "bench.demo_new_tokens": 16}


def _round(args, cfg) -> int:
    from tqdm import tqdm

    from ..engine import Llm
    from ..export import ensure_exported
    from . import cases, gates, plots, reference, report
    from .environment import environment

    plots.check_available()
    b = cfg["bench"]
    started = time.strftime("%Y%m%d-%H%M%S")
    folder = args.out or os.path.join(b["output_dir"], started)
    if os.path.exists(folder) and not (os.path.isdir(folder) and not os.listdir(folder)):
        raise ValueError(f"run folder {folder} already exists; pick another --out")
    prev = report.load(args.compare) if args.compare else None  # fail early on a bad --compare
    ref, ref_note = reference.select(cfg, bool(args.quick), args.reference)  # and on a bad --reference
    llm = Llm(ensure_exported(cfg["model"]), cfg)
    need = max(max(b["prompt_lengths"]) + b["decode_tokens"], max(b["demo_buckets"]) + b["demo_new_tokens"] + 64)
    if need > llm.max_context:
        raise ValueError(f"the bench plan needs {need} tokens of context; the model has {llm.max_context} "
                         "(bench.prompt_lengths / bench.demo_buckets)")
    n_cases = len(dict.fromkeys(["baseline"] + b["cases"]))
    total = len(b["prompt_lengths"]) * n_cases * b["repetitions"] + \
        len(b["demo_buckets"]) * len(dict.fromkeys(["baseline"] + b["demo_cases"]))
    t0 = time.perf_counter()
    with tqdm(total=total, desc="bench", unit="run") as bar:
        def tick(case, n):
            bar.set_postfix_str(f"{case} @{n}")
            bar.update(1)
        rows = cases.run_cases(llm, llm.tokenizer, cfg, tick)
        demo = cases.run_demos(llm, llm.tokenizer, cfg, tick)
    env = environment()
    speed_comparable = ref is not None and ref["cpu"] == env["cpu"]
    if ref is not None and not speed_comparable:
        ref_note += f"; its CPU differs from this one ({env['cpu']}): speed guards skipped"
    elif ref is not None:
        loose = gates.loose_reference_speeds(ref, cfg["gates"]["max_speed_noise"])
        if loose:
            ref_note += (f"; no speed guard for {', '.join(loose)} (the reference's spread there exceeds "
                         "gates.max_speed_noise)")
    gate_rows = gates.evaluate(rows, demo, cfg["gates"], ref, compare_speed=speed_comparable)
    overall = gates.outcome(gate_rows, strict=args.strict)
    summary = {"schema_version": report.SCHEMA_VERSION, "overall": overall, "overall_pass": overall == "pass",
               "strict": bool(args.strict), "reference": ref_note,
               "gates": gate_rows, "cases": rows, "demo": demo, "model": cfg["model"]["name"],
               "weights": llm.weights,
               "started": started, "duration_s": time.perf_counter() - t0, "config": cfg,
               "environment": env, "quick": bool(args.quick)}
    _write_run_folder(folder, summary, rows, cfg)
    print(report.markdown(summary))
    if prev is not None:
        print(f"\n## Compared with {args.compare}\n\n" + report.compare(prev, summary, cfg["gates"]["max_speed_noise"]))
    print(f"\nrun folder: {folder} (summary.json, summary.md, plots, config.yaml)")
    print(f"guards: {ref_note}")
    targets = [g for g in gate_rows if gates.kind_of(g) == gates.TARGET]
    missed = [g for g in targets if g["status"] != "pass"]
    print(f"targets: {len(targets) - len(missed)} of {len(targets)} met" +
          "".join(f"\n  {g['status'].upper() if g['status'] == 'inconclusive' else 'MISSED'}: {g['name']} = "
                  f"{report.value_text(g['value'])} (target {g['op']} {g['threshold']})" for g in missed) +
          ("" if args.strict or not missed else "\n  (targets decide the exit status only with --strict)"))
    deciding = gates.deciding(gate_rows, args.strict)
    failed = [g["name"] for g in deciding if g["status"] == "fail"]
    unsure = [g["name"] for g in deciding if g["status"] == "inconclusive"]
    if failed:
        print(f"FAIL: {len(failed)} gate(s): " + "; ".join(failed), file=sys.stderr)
    if unsure:
        print(f"{'also ' if failed else ''}INCONCLUSIVE: {len(unsure)} speed gate(s) measured a 95% interval "
              f"wider than gates.max_speed_noise ({cfg['gates']['max_speed_noise']:.0%}), too noisy to judge "
              "(a machine whose load changes within a few steps?): " + "; ".join(unsure), file=sys.stderr)
    if overall == "pass":
        print("PASS: every guard" + (" and every target" if args.strict else ""))
    return gates.EXIT_STATUS[overall]


def _write_run_folder(folder: str, summary: dict, rows, cfg: dict) -> None:
    """Write the run into a hidden sibling folder and rename it into place, so an interrupted
    or failed write never leaves a run folder that looks complete."""
    import shutil
    import tempfile

    import yaml

    from . import plots, report

    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", dir=parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a run folder is not
        summary["plots"] = plots.write_all(rows, tmp)
        report.write(tmp, summary)
        with open(os.path.join(tmp, "config.yaml"), "w") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _cache_sweep(args, cfg) -> int:
    """Store-mode decode speed and bytes held against the decode cache budget, interleaved."""
    from tqdm import tqdm

    from ..engine import Llm
    from ..export import ensure_exported
    from ..essays import essay_tokens
    from .cases import case_config, run_interleaved
    from ..measure import summarize

    llm = Llm(ensure_exported(cfg["model"]), cfg)
    n_dec = cfg["bench"]["decode_tokens"]
    ids = essay_tokens(llm.tokenizer, args.context + n_dec)
    prompt, cont = ids[:args.context], ids[args.context:]
    configs = {"baseline": case_config(cfg, "baseline"), "evict": case_config(cfg, "evict")}
    for m in args.budgets_mib:
        budget = dict(cfg, lossless=dict(cfg["lossless"], decode_cache_bytes=int(m * (1 << 20))))
        configs[f"store cache {m:g} MiB"] = case_config(budget, "store")
    with tqdm(total=len(configs) * args.repetitions, desc="cache sweep", unit="prefill") as bar:
        # Whole decodes in turn: the decode cache's point is the prefetch running beside the
        # steps, which token-by-token interleaving would hand to the other candidates.
        runs, _, _ = run_interleaved(llm, configs, prompt, cont, args.repetitions, on_run=lambda _: bar.update(1),
                                     interleave_steps=False)
    base = summarize([m["decode_tps"] for m in runs["baseline"]])["median"]
    print(f"\nprompt {args.context} + {n_dec} decode tokens, {args.repetitions} interleaved repetitions\n")
    print("| case | decode tok/s median (min-max) | vs baseline | KV held MiB | cache MiB | hits | misses |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, ms in runs.items():
        s = summarize([m["decode_tps"] for m in ms])
        st = ms[0]["store"]
        rows.append({"case": name, "decode_tps": s, "kv_bytes_held": ms[0]["kv_bytes_held"], "store": st})
        print(f"| {name} | {s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f}) | {s['median'] / base:.2f}x | "
              f"{ms[0]['kv_bytes_held'] / (1 << 20):.2f} | {st.get('cache_bytes', 0) / (1 << 20):.2f} | "
              f"{st.get('cache_hits', 0)} | {st.get('cache_misses', 0)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "context": args.context, "rows": rows}, f, indent=1)
    return 0


def _make_reference(args) -> int:
    from . import reference, report

    summary = report.load(args.run, what="reference")
    if summary.get("overall") == "fail" and any(g["status"] == "fail" and g.get("kind", "guard") == "guard"
                                                for g in summary["gates"]):
        raise ValueError(f"{args.run}: a guard failed in that round; a reference must be a healthy round")
    path = reference.write(summary, args.to or reference.default_path(summary["model"], bool(summary["quick"])))
    print(f"wrote {path} (commit {summary['environment'].get('commit', '-')}, {summary['environment'].get('cpu')}); "
          "commit it with the change that moved the figures")
    return 0


def _selftest(cfg) -> int:
    from .gates import self_test

    results = self_test(cfg["gates"])
    for r in results:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['breakage']} (expect {r['expect']}): failing gates "
              f"{r['failed'] or 'none'}; inconclusive gates {r['inconclusive'] or 'none'}")
    bad = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(bad)}/{len(results)} gate checks behave")
    return 1 if bad else 0


def main(argv=None) -> int:
    from .. import config as config_mod
    from ..cli_errors import run

    ap = argparse.ArgumentParser(
        prog="python -m mnn_h2o.bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The bench and regression harness on the real model.\n\n"
                    "Without a command, runs a round: the runtime cases (bench.cases: baseline = full "
                    "cache, evict = eviction alone, probe/full/store = eviction + that lossless mode) over bench.prompt_lengths, "
                    "bench.repetitions times, teacher-forced on essay text, every case in a context of its own "
                    "with the decode steps of all cases taking turns token by token (a case's speed against the "
                    "baseline is judged on those paired steps, so another program on the machine barely moves "
                    "it); then the "
                    "demo cases on real prompts per bucket. Quality (KL, top-1 vs baseline), memory "
                    "(bytes held, RSS) and speed come from the same runs. Two kinds of gates (config "
                    "section `gates`): guards (invariants such as bit-identical lossless modes, and "
                    "regressions against the committed reference round of the same model and settings) "
                    "decide the exit status; targets (the product's goals: ratios, top-1, speed) are "
                    "reported met or missed, and decide it too only with --strict. Exit status: 0 pass, "
                    "1 a guard failed (or a target was missed, with --strict), 2 an error, 3 inconclusive "
                    "(nothing failed, but a speed ratio's 95% interval was wider than gates.max_speed_noise). "
                    "Writes a run folder: summary.json (docs/summary_schema.md), summary.md, PNG plots, "
                    "config.yaml.",
        epilog="examples:\n"
               "  python -m mnn_h2o.bench                         # default round (durations: README.md)\n"
               "  python -m mnn_h2o.bench --quick                 # smoke round\n"
               "  python -m mnn_h2o.bench --compare bench_runs/OLD\n"
               "  python -m mnn_h2o.bench --model qwen2.5-0.5b\n"
               "  python -m mnn_h2o.bench selftest\n"
               "  python -m mnn_h2o.bench reference bench_runs/NEW   # make NEW the reference round\n"
               "  python -m mnn_h2o.bench speed --contexts 512,4096")
    ap.add_argument("--config", help="YAML config (every key: docs/config.md); default: h2o.yaml's values, "
                                     "which are the built-in defaults")
    ap.add_argument("--model", help="named model (smollm2, qwen2.5-0.5b, qwen2.5-1.5b) or GGUF path; "
                                    "overrides model.name")
    ap.add_argument("--quick", action="store_true", help="smoke round: one 3328-token prompt, 64 decode "
                                                         "tokens, one 128-token demo bucket")
    ap.add_argument("--compare", metavar="PREVIOUS_RUN", help="run folder (or summary.json) of an earlier "
                                                               "round: print the regression table against it")
    ap.add_argument("--out", help="run folder (default: bench.output_dir/<timestamp>)")
    ap.add_argument("--strict", action="store_true",
                    help="targets (gates.min_*, speed_cases, max_store_slowdown) decide the exit status too, "
                         "not only the guards")
    ap.add_argument("--reference", metavar="FILE",
                    help="reference round for the regression guards (default: the committed one of the "
                         "model and kind, mnn_h2o/bench/references/<model>-<round|quick>.json, used when "
                         "the settings match it)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one config key (repeatable), e.g. --set lossless.decode_cache_bytes=4194304")
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("selftest", help="feed every gate a failing input and check that it fails")
    rp = sub.add_parser("reference", help="make a run folder's round the reference of its model and kind "
                                          "(writes mnn_h2o/bench/references/<model>-<round|quick>.json, or --to)")
    rp.add_argument("run", metavar="RUN", help="run folder (or its summary.json)")
    rp.add_argument("--to", metavar="FILE", help="write the reference here instead")
    cs = sub.add_parser("cache-sweep", help="store mode: decode tokens/s and bytes held against the decode "
                                            "cache budget (lossless.decode_cache_bytes), interleaved with the "
                                            "baseline and eviction alone")
    cs.add_argument("--context", type=int, default=4096, help="prompt tokens (default 4096)")
    cs.add_argument("--budgets-mib", type=number_list(float, 0), default=[0, 8, 32, 128],
                    help="decode cache budgets in MiB (default 0,8,32,128)")
    cs.add_argument("--repetitions", type=int, default=3, help="interleaved rounds (default 3)")
    cs.add_argument("--json", help="also write the figures to this JSON file")
    sp = sub.add_parser("speed", help="prefill/decode tokens/s of our engine vs stock MNN.llm on the same "
                                      "weights (and llama.cpp on the same GGUF with --llama), interleaved "
                                      "A B / B A, medians and spread")
    sp.add_argument("--contexts", type=_parse_ints, default=[512, 2048, 4096],
                    help="context lengths in tokens of essay text (default 512,2048,4096)")
    sp.add_argument("--n-decode", type=int, default=64, help="decode tokens per run (default 64)")
    sp.add_argument("--repetitions", type=int, default=3, help="interleaved rounds (default 3, minimum 3)")
    sp.add_argument("--json", help="also write the figures to this JSON file")
    sp.add_argument("--engines", type=_engine_list, default=None,
                    help="comma-separated rows to run: ours (our engine, full cache), ours_evict (with the "
                         "config's eviction), stock, llama_f16, llama_f16_fa, llama_q8_fa (default "
                         f"{','.join(DEFAULT_SPEED_ENGINES)}, without ours_evict when eviction.enabled is false; one of ours/ours_evict at least; the llama_* rows need "
                         "the `llama` extra). Leave out rows that take long at long contexts, e.g. "
                         "--engines ours_evict,llama_f16")
    sp.add_argument("--llama", action="store_true",
                    help="also run llama.cpp (llama-cpp-python, the optional `llama` extra: pip install "
                         "'.[llama]') on the same GGUF file, threads and prompt token ids, interleaved with "
                         "the others, in three configs: f16 KV, f16 KV + flash attention, q8_0 K/V + flash "
                         "attention; adds its KV buffer size and, untimed, the quality of each compressing "
                         "row against its own full cache (mean KL, top-1 over --n-decode teacher-forced "
                         "tokens); the same as adding llama_f16,llama_f16_fa,llama_q8_fa to --engines. "
                         "Without the extra: an install hint and exit status 2")
    args = ap.parse_args(argv)

    def body() -> int:
        overrides = {"model.name": args.model} if args.model else {}
        if args.quick:
            overrides.update(QUICK)
        overrides.update(config_mod.parse_assignment(a) for a in args.set)
        cfg = config_mod.load(args.config, overrides)
        if args.command == "selftest":
            return _selftest(cfg)
        if args.command == "reference":
            return _make_reference(args)
        if args.command == "cache-sweep":
            if args.repetitions < 3:
                raise ValueError("--repetitions must be >= 3")
            return _cache_sweep(args, cfg)
        if args.command == "speed":
            if args.repetitions < 3:
                raise ValueError("--repetitions must be >= 3 (medians of fewer runs mean little on a noisy machine)")
            if args.n_decode < 1:
                raise ValueError("--n-decode must be >= 1")
            if args.engines is None:
                args.engines = [e for e in DEFAULT_SPEED_ENGINES if e != "ours_evict" or cfg["eviction"]["enabled"]]
            if not {"ours", "ours_evict"} & set(args.engines):
                raise ValueError("--engines must include ours or ours_evict")
            args.engines += [e for e in LLAMA_ROWS if args.llama and e not in args.engines]
            return _speed(args, cfg)
        return _round(args, cfg)

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
