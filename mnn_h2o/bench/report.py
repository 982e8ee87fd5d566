"""The run folder of a bench round: summary.json (docs/summary_schema.md), summary.md, the
config used, and the regression table of ``--compare``."""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence, Tuple

SCHEMA_VERSION = 1
MIB = 1 << 20


def _mib(b) -> str:
    return f"{b / MIB:.2f}"


def _tps(s: dict) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def _ratio(x: float) -> str:
    return f"{x:.3f}" if x else "-"


def runtime_table(rows: Sequence[dict]) -> str:
    lines = ["| case | prompt | decode tok/s median (min-max) | vs baseline (interleaved, 95%) | prefill tok/s | KV held MiB | "
             "kept (raw size) MiB | uncompressed MiB | lossy x | total x | vs f16 x | lossless x (scope) | RSS delta MiB | "
             "KL | top-1 | ppl (base) | fallbacks | mismatches |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        v = r["decode_vs_baseline"]
        vs = "-" if r["case"] == "baseline" else f"{v['ratio']:.3f}x ± {v['noise']:.1%}"
        st = r["store"]
        lines.append(
            f"| {r['case']} | {r['prompt_tokens']} | {_tps(r['decode_tps'])} | {vs} | "
            f"{r['prefill_tps']['median']:.0f} | {_mib(r['kv_bytes_held'])} | {_mib(r['kv_bytes_kept'])} | "
            f"{_mib(r['kv_bytes_uncompressed'])} | {_ratio(r['lossy_ratio'])} | {_ratio(r['total_ratio'])} | "
            f"{_ratio(r.get('whole_model_ratio', 0.0))} | {_ratio(st['lossless_ratio'])} | {_mib(r['rss_delta_bytes']['median'])} | {r['kl']:.4f} | "
            f"{r['top1_agreement']:.3f} | {r['ppl']:.2f} ({r['ppl_baseline']:.2f}) | {st['fallbacks']} | "
            f"{st['mismatches']} |")
    return "\n".join(lines)


def store_table(rows: Sequence[dict]) -> str:
    keys = ["chunks_stored", "raw_bytes", "compressed_bytes", "encode_us", "decode_us", "async_wait_us",
            "queue_peak", "deferrals", "cache_hits", "cache_misses", "table_bytes", "cache_bytes", "scratch_bytes",
            "repacked", "merged", "dissolved"]
    present = [k for k in keys if any(k in r["store"] for r in rows)]
    lines = ["| case | prompt | " + " | ".join(present) + " | fallback reasons |",
             "|---|---:|" + "---:|" * len(present) + "---|"]
    for r in rows:
        if r["case"] == "baseline":
            continue
        st = r["store"]
        vals = []
        for k in present:
            v = st.get(k, "-")
            vals.append(f"{v:.0f}" if isinstance(v, float) else str(v))
        lines.append(f"| {r['case']} | {r['prompt_tokens']} | " + " | ".join(vals) + " | "
                     f"{st['fallback_reasons'] or '-'} |")
    return "\n".join(lines)


def demo_table(demo: Sequence[dict]) -> str:
    lines = ["| bucket | case | prompt | generated | decode tok/s | prefill tok/s | KV held MiB | lossy x | "
             "total x | first divergence | token F1 | ROUGE-L | start of the answer |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for d in demo:
        text = d["text"].replace("\n", " ").replace("|", "/")[:70]
        div = "-" if d["first_divergence"] is None else f"token {d['first_divergence']}"
        lines.append(f"| {d['bucket']} | {d['case']} | {d['prompt_tokens']} | {d['generated_tokens']} | "
                     f"{d['decode_tps']:.1f} | {d['prefill_tps']:.0f} | {_mib(d['kv_bytes_held'])} | "
                     f"{_ratio(d['lossy_ratio'])} | {_ratio(d['total_ratio'])} | "
                     f"{div} | {d['token_f1']:.3f} | {d['rouge_l']:.3f} | {text} |")
    return "\n".join(lines)


_STATUS = {"guard": {"pass": "PASS", "fail": "**FAIL**", "inconclusive": "*inconclusive*"},
           "target": {"pass": "met", "fail": "**missed**", "inconclusive": "*inconclusive*"}}


def value_text(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def gates_table(gates: Sequence[dict], kind: str) -> str:
    from .gates import kind_of, status_of

    lines = ["| gate | value | rule | status |", "|---|---:|---|---|"]
    for g in gates:
        if kind_of(g) == kind:
            lines.append(f"| {g['name']} | {value_text(g['value'])} | {g['op']} {g['threshold']} | "
                         f"{_STATUS[kind][status_of(g)]} |")
    return "\n".join(lines)


def markdown(summary: dict) -> str:
    env = summary["environment"]
    out = [f"# Bench round {summary['started']}", "",
           f"Model `{summary['model']}`, weights {summary.get('weights', '?')}, "
           f"{summary['config']['runtime']['threads']} threads, KV {summary['config']['runtime']['kv_dtype']}; "
           f"{env.get('cpu', '?')} ({env.get('cores', '?')} cores, ISA {env.get('isa', '?')}); "
           f"{summary['duration_s'] / 60:.1f} min. **Overall: {summary['overall'].upper()}**", "",
           "## Guards", "", "Invariants, and regressions against the reference round; they decide the exit "
           f"status. Reference: {summary.get('reference', '-')}.", "", gates_table(summary["gates"], "guard"), "",
           "## Targets", "", "The product's goals, reported met or missed; they decide the exit status only with "
           f"--strict{' (this round ran with --strict)' if summary.get('strict') else ''}.", "",
           gates_table(summary["gates"], "target"), "",
           "## Runtime cases", "",
           f"Teacher-forced decode of {summary['cases'][0]['decode_tokens'] if summary['cases'] else 0} essay tokens "
           "after each prompt, every case in a context of its own, their decode steps interleaved token by token; "
           "tokens/s: medians over the repetitions (min-max); vs baseline: the ratio of the paired steps' times "
           "with its 95% interval (blocks of 16 steps), what the speed gates judge; memory and quality from the "
           "first repetition; RSS delta: the process's growth over the case's prefill. KV held = every byte the cache holds (raw blocks + compressed chunks + decode cache "
           "+ scratch); kept = the tokens held at raw size (what eviction alone leaves); lossy x = uncompressed / kept; "
           "total x = uncompressed / KV held; KL and top-1 vs the "
           "baseline (full cache) on the same tokens.", "",
           runtime_table(summary["cases"]), "", "### Lossless store counters (first repetition)", "",
           store_table(summary["cases"]), ""]
    if summary["demo"]:
        out += ["## Demo cases", "", "Real prompts (essay excerpt + question, chat template), greedy generation, "
                "one run per bucket and case. Against the baseline's answer to the same prompt: the first "
                "generated token that differs (- = identical answers), and the overlap of the answers' words "
                "(token F1: bag of words; ROUGE-L: longest common subsequence; 1 = same words).", "",
                demo_table(summary["demo"]), ""]
    if summary.get("plots"):
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in summary["plots"]] + [""]
    return "\n".join(out)


def write(folder: str, summary: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(folder, "summary.md"), "w") as f:
        f.write(markdown(summary))


def read_json(path: str, what: str):
    """The JSON document in ``path``; a ValueError that names ``what`` and the file otherwise."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: {path} is not valid JSON: {e}") from None


def load(path: str, what: str = "--compare") -> dict:
    p = os.path.join(path, "summary.json") if os.path.isdir(path) else path
    s = read_json(p, what)
    if not isinstance(s, dict) or s.get("schema_version") != SCHEMA_VERSION or "cases" not in s:
        raise ValueError(f"{what}: {p} is not a summary.json of schema version {SCHEMA_VERSION}")
    return s


# metric name, how to read it from a case row, whether higher is better, how to read its noise
# from a row (None: deterministic, any change counts)
_METRICS: Tuple[Tuple[str, object, bool, Optional[object]], ...] = (
    ("decode vs baseline", lambda r: r["decode_vs_baseline"]["ratio"], True, lambda r: r["decode_vs_baseline"]["noise"]),
    ("decode tok/s", lambda r: r["decode_tps"]["median"], True, lambda r: r["decode_tps"]["spread"]),
    ("prefill tok/s", lambda r: r["prefill_tps"]["median"], True, lambda r: r["prefill_tps"]["spread"]),
    ("KV held MiB", lambda r: r["kv_bytes_held"] / MIB, False, None),
    ("total ratio", lambda r: r["total_ratio"], True, None),
    ("lossless ratio", lambda r: r["store"]["lossless_ratio"], True, None),
    ("KL", lambda r: r["kl"], False, None),
    ("top-1", lambda r: r["top1_agreement"], True, None),
)


def _plan(s: dict) -> str:
    lengths = sorted({r["prompt_tokens"] for r in s["cases"]})
    cases = list(dict.fromkeys(r["case"] for r in s["cases"]))
    kind = "a --quick round" if s.get("quick") else "a round"
    return f"{kind} of {', '.join(cases) or 'no cases'} at {'/'.join(map(str, lengths)) or 'no'} prompt tokens"


def _flag(change: float, higher: bool, noise: Optional[float], max_noise: float) -> str:
    worse = (change < 0) if higher else (change > 0)
    if noise is None:
        return ("worse" if worse else "better") if abs(change) > 1e-9 else ""
    if abs(change) <= min(noise, max_noise):
        return ""
    # Beyond the cap the spread is too wide to call a change either way (as for the gates).
    if noise > max_noise:
        return f"inconclusive (noise {noise:.0%})"
    return "worse" if worse else "better"


def compare(prev: dict, now: dict, max_noise: Optional[float] = None) -> str:
    """Regression table: every metric of every (case, prompt) present in both rounds. Speed
    changes count only beyond the larger noise of that metric in the two rounds (the interleaved
    ratio's interval; the spread of whole runs' tokens/s), and are
    inconclusive when that spread exceeds ``max_noise`` (default: the config's
    ``gates.max_speed_noise``)."""
    from .. import config
    from .gates import status_of

    if max_noise is None:
        max_noise = now.get("config", {}).get("gates", {}).get(
            "max_speed_noise", config.key("gates.max_speed_noise").default)
    old = {(r["case"], r["prompt_tokens"]): r for r in prev["cases"]}
    lines, gate_lines = [], []
    for r in now["cases"]:
        o: Optional[dict] = old.get((r["case"], r["prompt_tokens"]))
        if o is None:
            continue
        for name, get, higher, noise_of in _METRICS:
            if name == "decode vs baseline" and r["case"] == "baseline":
                continue
            a, b = get(o), get(r)
            if not a and not b:
                continue
            change = (b - a) / abs(a) if a else float("inf")
            noise = max(noise_of(o), noise_of(r)) if noise_of else None
            lines.append(f"| {r['case']} | {r['prompt_tokens']} | {name} | {a:.4g} | {b:.4g} | {change:+.1%} | "
                         f"{_flag(change, higher, noise, max_noise)} |")
    pg = {g["name"]: status_of(g) for g in prev.get("gates", [])}
    for g in now.get("gates", []):
        was, st = pg.get(g["name"]), status_of(g)
        if was is not None and was != st:
            verdict = {"pass": "fixed", "fail": "REGRESSED", "inconclusive": "inconclusive"}[st]
            gate_lines.append(f"| gate | | {g['name']} | {was} | {st} | | {verdict} |")
    table = "\n".join(["| case | prompt | metric | previous | now | change | |",
                       "|---|---:|---|---:|---:|---:|---|"] + lines + gate_lines)
    if lines:
        return table
    return (f"Nothing to compare: the previous run is {_plan(prev)}, this one is {_plan(now)}; no "
            "(case, prompt length) was measured in both. Compare rounds of the same kind (a --quick "
            "round with a --quick round)." + ("\n\n" + table if gate_lines else ""))
