"""Pass/fail gates of a bench round, and their self-test.

A gate is ``{name, value, op, threshold, pass}``; :func:`evaluate` derives them from the case
rows of a round and the ``gates`` config section. :func:`self_test` proves every kind of gate
can fail: it builds rows that pass every gate, checks they do, then breaks one quantity at a
time and checks that the gate watching it fails.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Sequence, Tuple

from .cases import H2O_CASES, LOSSLESS_CASES

_OPS: Dict[str, Callable[[float, float], bool]] = {
    ">=": lambda v, t: v >= t, "<=": lambda v, t: v <= t, "==": lambda v, t: v == t,
}


def gate(name: str, value, op: str, threshold) -> dict:
    ok = value is not None and not (isinstance(value, float) and math.isnan(value)) and _OPS[op](value, threshold)
    return {"name": name, "value": value, "op": op, "threshold": threshold, "pass": bool(ok)}


def _by(rows: Sequence[dict]) -> Dict[Tuple[str, int], dict]:
    return {(r["case"], r["prompt_tokens"]): r for r in rows}


def evaluate(rows: Sequence[dict], demo: Sequence[dict], g: dict) -> List[dict]:
    out: List[dict] = []
    by = _by(rows)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    lengths = sorted({r["prompt_tokens"] for r in rows})
    if not lengths:
        return [gate("runtime cases ran", 0, ">=", 1)]
    longest = lengths[-1]
    for c in cases:
        if c in H2O_CASES:
            out.append(gate(f"lossy_ratio {c} @{longest}", by[c, longest]["lossy_ratio"], ">=", g["min_lossy_ratio"]))
    if "store" in cases:
        out.append(gate(f"lossless_ratio store @{longest}", by["store", longest]["store"]["lossless_ratio"], ">=",
                        g["min_lossless_ratio"]))
    for c in cases:
        if c == "baseline":
            continue
        for n in lengths:
            out.append(gate(f"top1_agreement {c} @{n}", by[c, n]["top1_agreement"], ">=", g["min_top1_agreement"]))
    for c in g["speed_cases"]:
        if c not in cases:
            continue
        for n in lengths:
            base, cand = by["baseline", n]["decode_tps"], by[c, n]["decode_tps"]
            noise = max(base["spread"], cand["spread"])
            out.append(gate(f"decode_speed {c}/baseline @{n} (noise {noise:.1%})",
                            cand["median"] / base["median"], ">=", round(1.0 - noise, 4)))
    if "store" in cases:
        for n in lengths:
            out.append(gate(f"store_slowdown baseline/store @{n}", by["baseline", n]["decode_tps"]["median"] /
                            by["store", n]["decode_tps"]["median"], "<=", g["max_store_slowdown"]))
    for c in cases:
        if c in LOSSLESS_CASES:
            out.append(gate(f"fallbacks {c}", sum(by[c, n]["store"]["fallbacks"] for n in lengths), "==", 0))
    if "full" in cases:
        out.append(gate("full-mode mismatches", sum(by["full", n]["store"]["mismatches"] for n in lengths), "==", 0))
    evicting = [c for c in cases if c in H2O_CASES]
    if len(evicting) > 1:
        for n in lengths:
            differ = sum(by[c, n]["logits_sha256"] != by[evicting[0], n]["logits_sha256"] for c in evicting)
            out.append(gate(f"identical logits {'/'.join(evicting)} @{n}", differ, "==", 0))
    by_bucket: Dict[int, Dict[str, dict]] = {}
    for d in demo:
        by_bucket.setdefault(d["bucket"], {})[d["case"]] = d
    for bucket, ds in sorted(by_bucket.items()):
        lossless = [c for c in ds if c in LOSSLESS_CASES]
        if len(lossless) > 1:
            differ = sum(ds[c]["token_ids"] != ds[lossless[0]]["token_ids"] for c in lossless)
            out.append(gate(f"demo identical tokens {'/'.join(lossless)} @{bucket}", differ, "==", 0))
        for c in lossless:
            out.append(gate(f"demo fallbacks {c} @{bucket}", ds[c]["store"]["fallbacks"], "==", 0))
    return out


# --- self-test ---------------------------------------------------------------------------------

def _row(case: str, n: int) -> dict:
    h2o = case != "baseline"
    return {"case": case, "prompt_tokens": n, "lossy_ratio": 3.5 if h2o else 1.0,
            "top1_agreement": 1.0 if not h2o else 0.95,
            "decode_tps": {"median": 100.0 if case != "store" else 60.0, "spread": 0.05},
            "logits_sha256": "base" if not h2o else "h2o",
            "store": {"lossless_ratio": 1.3 if case == "store" else 0.0, "fallbacks": 0, "mismatches": 0}}


def _passing_round(g: dict):
    cases = ["baseline", "h2o", "probe", "full", "store"]
    rows = [_row(c, n) for n in (512, 4096) for c in cases]
    demo = [{"case": c, "bucket": 128, "token_ids": [1, 2, 3], "store": {"fallbacks": 0}} for c in ("full", "store")]
    return rows, demo


def _breakages(g: dict):
    """(what is broken, the gate name prefix that must fail, a function that breaks it)."""
    def row(rows, case, n):
        return next(r for r in rows if r["case"] == case and r["prompt_tokens"] == n)

    def set_(case, n, path, value):
        def f(rows, demo):
            r = row(rows, case, n)
            for k in path[:-1]:
                r = r[k]
            r[path[-1]] = value
        return f

    def demo_tokens(rows, demo):
        demo[-1]["token_ids"] = [1, 2, 4]

    def demo_fallback(rows, demo):
        demo[0]["store"]["fallbacks"] = 1

    return [
        ("H2O ratio below target", "lossy_ratio store", set_("store", 4096, ["lossy_ratio"], g["min_lossy_ratio"] * 0.9)),
        ("lossless ratio below target", "lossless_ratio store",
         set_("store", 4096, ["store", "lossless_ratio"], g["min_lossless_ratio"] * 0.9)),
        ("quality below the floor", "top1_agreement probe @512",
         set_("probe", 512, ["top1_agreement"], g["min_top1_agreement"] - 0.05)),
        ("quality is NaN", "top1_agreement full @4096", set_("full", 4096, ["top1_agreement"], float("nan"))),
        ("decode slower than the noise", "decode_speed probe",
         set_("probe", 4096, ["decode_tps"], {"median": 80.0, "spread": 0.05})),
        ("H2O alone slower than the noise", "decode_speed h2o",
         set_("h2o", 512, ["decode_tps"], {"median": 80.0, "spread": 0.05})),
        ("H2O alone below target", "lossy_ratio h2o", set_("h2o", 4096, ["lossy_ratio"], g["min_lossy_ratio"] * 0.9)),
        ("store far slower", "store_slowdown", set_("store", 512, ["decode_tps"],
                                                    {"median": 100.0 / (g["max_store_slowdown"] * 1.5), "spread": 0.05})),
        ("a fallback", "fallbacks store", set_("store", 512, ["store", "fallbacks"], 1)),
        ("a full-mode mismatch", "full-mode mismatches", set_("full", 4096, ["store", "mismatches"], 2)),
        ("store logits differ from full", "identical logits", set_("store", 4096, ["logits_sha256"], "other")),
        ("H2O alone logits differ", "identical logits", set_("h2o", 512, ["logits_sha256"], "other")),
        ("demo tokens differ", "demo identical tokens", demo_tokens),
        ("demo fallback", "demo fallbacks", demo_fallback),
    ]


def self_test(g: dict) -> List[dict]:
    """Runs every breakage; returns one row per breakage with ``ok`` (the gate failed as it
    must, and with an intact round every gate passed). Raises nothing."""
    g = dict(g, speed_cases=["h2o", "probe"])
    rows, demo = _passing_round(g)
    baseline_gates = evaluate(rows, demo, g)
    results = [{"breakage": "intact round", "expect_fail": "-",
                "failed": [x["name"] for x in baseline_gates if not x["pass"]],
                "ok": all(x["pass"] for x in baseline_gates)}]
    for what, prefix, breaker in _breakages(g):
        r, d = copy.deepcopy(rows), copy.deepcopy(demo)
        breaker(r, d)
        failed = [x["name"] for x in evaluate(r, d, g) if not x["pass"]]
        results.append({"breakage": what, "expect_fail": prefix, "failed": failed,
                        "ok": any(name.startswith(prefix) for name in failed)})
    return results
