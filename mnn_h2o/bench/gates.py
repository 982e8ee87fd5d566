"""The gates of a bench round, and their self-test.

A gate is ``{name, kind, value, op, threshold, pass, status}``. Two kinds:

- **guards** decide the round's exit status. *Invariants* hold whatever the reference: the
  lossless modes change no bit of what eviction alone computes, no chunk falls back, an answer where
  nothing was evicted is the baseline's. *Regression guards* compare each figure with the
  committed reference round of the same model and configuration (``reference.py``): memory,
  ratios and quality within ``gates.guard_tolerance`` (and the KL / top-1 allowances), decode
  speed relative to the same round's baseline within the measured noise.
- **targets** are the product's goals (``gates.min_*``, the speed of ``gates.speed_cases``
  against the baseline, ``gates.max_store_slowdown``): reported met or missed with their value;
  they decide the exit status only with ``--strict``.

``status`` is ``pass``, ``fail`` or ``inconclusive``: a speed gate whose measured spread exceeds
``gates.max_speed_noise`` cannot judge anything and says so instead of passing. :func:`self_test`
proves every kind of gate can fail: it builds rows that pass every gate, checks they do, then
breaks one quantity at a time and checks that the gate watching it fails (or, for too much noise,
is inconclusive), and that a missed target fails a round only under ``--strict``.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .cases import EVICT_CASES, LOSSLESS_CASES

_OPS: Dict[str, Callable[[float, float], bool]] = {
    ">=": lambda v, t: v >= t, "<=": lambda v, t: v <= t, "==": lambda v, t: v == t,
}
GUARD, TARGET = "guard", "target"

# Exit status of a round by its outcome (2 is taken by errors).
EXIT_STATUS = {"pass": 0, "fail": 1, "inconclusive": 3}


def gate(name: str, value, op: str, threshold, inconclusive: bool = False, kind: str = GUARD) -> dict:
    ok = value is not None and not (isinstance(value, float) and math.isnan(value)) and _OPS[op](value, threshold)
    status = "inconclusive" if inconclusive else ("pass" if ok else "fail")
    return {"name": name, "kind": kind, "value": value, "op": op, "threshold": threshold,
            "pass": status == "pass", "status": status}


def status_of(g: dict) -> str:
    """A gate's status; summaries written before ``status`` existed only have ``pass``."""
    return g.get("status", "pass" if g["pass"] else "fail")


def kind_of(g: dict) -> str:
    """A gate's kind; summaries written before targets existed hold guards only."""
    return g.get("kind", GUARD)


def deciding(gates: Sequence[dict], strict: bool = False) -> List[dict]:
    """The gates that decide a round's outcome: the guards, and the targets too under ``strict``."""
    return [g for g in gates if strict or kind_of(g) == GUARD]


def outcome(gates: Sequence[dict], strict: bool = False) -> str:
    """Over the deciding gates: ``fail`` if any failed, else ``inconclusive`` if any could not
    judge, else ``pass``."""
    statuses = {status_of(g) for g in deciding(gates, strict)}
    return "fail" if "fail" in statuses else ("inconclusive" if "inconclusive" in statuses else "pass")


def _by(rows: Sequence[dict]) -> Dict[Tuple[str, int], dict]:
    return {(r["case"], r["prompt_tokens"]): r for r in rows}


def _lossless_ratio(row: dict) -> float:
    return row["lossless_ratio"] if "lossless_ratio" in row else row["store"]["lossless_ratio"]


def evaluate(rows: Sequence[dict], demo: Sequence[dict], g: dict, reference: Optional[dict] = None,
             compare_speed: bool = True) -> List[dict]:
    """Every gate of a round: targets, invariants and, with a ``reference`` round
    (``reference.read``), the regression guards of each (case, prompt length) both measured;
    their speed guards only with ``compare_speed`` (a reference from another CPU has other
    speed ratios)."""
    by = _by(rows)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    lengths = sorted({r["prompt_tokens"] for r in rows})
    if not lengths:
        return [gate("runtime cases ran", 0, ">=", 1)]
    out = _targets(by, cases, lengths, g) + _invariants(by, cases, lengths, demo)
    if reference is not None:
        out += _regressions(by, _by(reference["cases"]), g, compare_speed)
    return out


def _targets(by, cases, lengths, g) -> List[dict]:
    out: List[dict] = []
    longest = lengths[-1]
    for c in cases:
        if c in EVICT_CASES:
            out.append(gate(f"lossy_ratio {c} @{longest}", by[c, longest]["lossy_ratio"], ">=", g["min_lossy_ratio"],
                            kind=TARGET))
    if "store" in cases:
        out.append(gate(f"lossless_ratio store @{longest}", _lossless_ratio(by["store", longest]), ">=",
                        g["min_lossless_ratio"], kind=TARGET))
    for c in cases:
        if c == "baseline":
            continue
        for n in lengths:
            out.append(gate(f"top1_agreement {c} @{n}", by[c, n]["top1_agreement"], ">=", g["min_top1_agreement"],
                            kind=TARGET))
    cap = g["max_speed_noise"]
    for c in g["speed_cases"]:
        if c not in cases:
            continue
        for n in lengths:
            ratio, noise = _speed(by[c, n])
            # The allowance is the noise, so were it unbounded a noisy enough round would pass any
            # slowdown: beyond the cap the round cannot judge speed.
            out.append(gate(f"decode_speed {c}/baseline @{n} (noise {noise:.1%})", ratio, ">=",
                            round(1.0 - min(noise, cap), 4), inconclusive=noise > cap, kind=TARGET))
    if "store" in cases:
        for n in lengths:
            ratio, noise = _speed(by["store", n])
            # A speed ratio like the decode_speed targets: beyond the noise cap it cannot be
            # judged either way (the bound itself is not widened).
            out.append(gate(f"store_slowdown baseline/store @{n} (noise {noise:.1%})", 1.0 / ratio, "<=",
                            g["max_store_slowdown"], inconclusive=noise > cap, kind=TARGET))
    return out


def _invariants(by, cases, lengths, demo) -> List[dict]:
    out: List[dict] = []
    for c in cases:
        if c in LOSSLESS_CASES:
            out.append(gate(f"fallbacks {c}", sum(by[c, n]["store"]["fallbacks"] for n in lengths), "==", 0))
    if "full" in cases:
        out.append(gate("full-mode mismatches", sum(by["full", n]["store"]["mismatches"] for n in lengths), "==", 0))
    evicting = [c for c in cases if c in EVICT_CASES]
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
        # Where eviction evicted nothing it must not change the answer; where it did, how far the
        # answer moved (token F1, ROUGE-L) is reported, with no threshold to defend yet.
        kept_all = [c for c, d in ds.items() if c != "baseline" and d["lossy_ratio"] == 1.0]
        if kept_all:
            differ = sum(not ds[c]["identical_to_baseline"] for c in kept_all)
            out.append(gate(f"demo same answer as baseline (nothing evicted) {'/'.join(kept_all)} @{bucket}",
                            differ, "==", 0))
    return out


def _regressions(by, ref, g, compare_speed: bool) -> List[dict]:
    """Each figure against the reference round's. Memory, ratios and quality are deterministic on
    one machine (the same run twice gives the same bytes and logits); the tolerances absorb what
    another CPU's kernels change. Speed is judged as the ratio to the same round's baseline, whose
    noise is the largest spread of the four measurements behind the two ratios."""
    out: List[dict] = []
    tol, cap = g["guard_tolerance"], g["max_speed_noise"]
    for (c, n), r in by.items():
        f = ref.get((c, n))
        if f is None:
            continue
        at = f"{c} @{n} vs reference"
        out.append(gate(f"kv_bytes_held {at}", r["kv_bytes_held"], "<=", math.floor(f["kv_bytes_held"] * (1 + tol))))
        if c != "baseline":
            out.append(gate(f"lossy_ratio {at}", r["lossy_ratio"], ">=", round(f["lossy_ratio"] * (1 - tol), 4)))
            out.append(gate(f"kl {at}", r["kl"], "<=", round(f["kl"] * (1 + tol) + g["guard_kl_slack"], 6)))
            out.append(gate(f"top1_agreement {at}", r["top1_agreement"], ">=",
                            round(f["top1_agreement"] - g["guard_top1_drop"], 4)))
        if _lossless_ratio(f) > 0:
            out.append(gate(f"lossless_ratio {at}", _lossless_ratio(r), ">=", round(_lossless_ratio(f) * (1 - tol), 4)))
        if not compare_speed or c == "baseline":
            continue
        now, noise_now = _speed(r)
        then, ref_noise = _speed(f)
        if ref_noise > cap:
            # The reference itself measured this ratio too loosely to judge any round against
            # it: no guard (the round could only ever be inconclusive); a quieter reference
            # round brings it back.
            continue
        noise = math.hypot(noise_now, ref_noise)  # two independent estimates
        out.append(gate(f"decode_speed {c}/baseline @{n} vs reference (noise {noise:.1%})", round(now / then, 4),
                        ">=", round(1.0 - g["speed_tolerance"] - noise, 4), inconclusive=noise > cap))
    return out


def loose_reference_speeds(reference: dict, cap: float) -> List[str]:
    """The ``case @n`` whose decode speed relative to the baseline the reference measured with
    more noise than ``cap``: no speed guard compares with them."""
    return [f"{c} @{n}" for (c, n), f in _by(reference["cases"]).items()
            if c != "baseline" and _speed(f)[1] > cap]


def _speed(row: dict) -> Tuple[float, float]:
    """(a case's decode speed relative to the baseline, the relative half-width of its 95%
    interval), measured on steps interleaved with the baseline's (``measure.paired_ratio``)."""
    d = row["decode_vs_baseline"]
    return d["ratio"], d["noise"]


# --- self-test ---------------------------------------------------------------------------------

def _row(case: str, n: int, spread: float) -> dict:
    eviction = case != "baseline"
    return {"case": case, "prompt_tokens": n, "lossy_ratio": 3.5 if eviction else 1.0,
            "kv_bytes_held": 1000 if eviction else 3500, "kl": 0.02 if eviction else 0.0,
            "top1_agreement": 1.0 if not eviction else 0.95,
            "decode_tps": {"median": 100.0 if case != "store" else 60.0, "spread": spread},
            "decode_vs_baseline": {"ratio": 1.0 if case != "store" else 0.6, "noise": 0.0 if not eviction else spread},
            "logits_sha256": "base" if not eviction else "evict",
            "store": {"lossless_ratio": 1.3 if case == "store" else 0.0, "fallbacks": 0, "mismatches": 0}}


def _quiet_spread(g: dict) -> float:
    return min(0.05, g["max_speed_noise"] / 2)


def _passing_round(g: dict):
    cases = ["baseline", "evict", "probe", "full", "store"]
    rows = [_row(c, n, _quiet_spread(g)) for n in (512, 4096) for c in cases]
    demo = [{"case": c, "bucket": 128, "token_ids": [1, 2, 3], "store": {"fallbacks": 0}, "lossy_ratio": 1.0,
             "identical_to_baseline": True} for c in ("full", "store")]
    return rows, demo


def _breakages(g: dict):
    """(what is broken, the kind and name prefix of the gate that must fail or be inconclusive,
    a function that breaks it, the status that gate must then have)."""
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

    def demo_unevicted_differs(rows, demo):
        demo[0]["identical_to_baseline"] = False

    quiet, cap, tol = _quiet_spread(g), g["max_speed_noise"], g["guard_tolerance"]
    slower = {"ratio": 1.0 - 2 * quiet - 0.01, "noise": quiet}
    speed = lambda ratio, noise: {"ratio": ratio, "noise": noise}
    return [
        # Targets: missed, they fail a round only under --strict.
        ("eviction ratio below target", TARGET, "lossy_ratio store",
         set_("store", 4096, ["lossy_ratio"], g["min_lossy_ratio"] * 0.9)),
        ("lossless ratio below target", TARGET, "lossless_ratio store",
         set_("store", 4096, ["store", "lossless_ratio"], g["min_lossless_ratio"] * 0.9)),
        ("quality below the floor", TARGET, "top1_agreement probe @512",
         set_("probe", 512, ["top1_agreement"], g["min_top1_agreement"] - 0.05)),
        ("quality is NaN", TARGET, "top1_agreement full @4096", set_("full", 4096, ["top1_agreement"], float("nan"))),
        ("decode slower than the noise", TARGET, "decode_speed probe", set_("probe", 4096, ["decode_vs_baseline"], slower)),
        ("eviction alone slower than the noise", TARGET, "decode_speed evict", set_("evict", 512, ["decode_vs_baseline"], slower)),
        ("decode slower than the capped noise", TARGET, "decode_speed probe",
         set_("probe", 512, ["decode_vs_baseline"], speed(1.0 - cap - 0.01, cap))),
        # A round too noisy to judge: a 317% interval, 0.38x the baseline's speed.
        ("speed noise beyond gates.max_speed_noise", TARGET, "decode_speed evict",
         set_("evict", 4096, ["decode_vs_baseline"], speed(0.3771, max(3.168, 2 * cap))), "inconclusive"),
        ("eviction alone below target", TARGET, "lossy_ratio evict",
         set_("evict", 4096, ["lossy_ratio"], g["min_lossy_ratio"] * 0.9)),
        ("store far slower", TARGET, "store_slowdown",
         set_("store", 512, ["decode_vs_baseline"], speed(1.0 / (g["max_store_slowdown"] * 1.5), quiet))),
        ("store slower on a noisy machine", TARGET, "store_slowdown",
         set_("store", 4096, ["decode_vs_baseline"], speed(1.0 / (g["max_store_slowdown"] * 1.5), 2 * cap)),
         "inconclusive"),
        # Invariants.
        ("a fallback", GUARD, "fallbacks store", set_("store", 512, ["store", "fallbacks"], 1)),
        ("a full-mode mismatch", GUARD, "full-mode mismatches", set_("full", 4096, ["store", "mismatches"], 2)),
        ("store logits differ from full", GUARD, "identical logits", set_("store", 4096, ["logits_sha256"], "other")),
        ("eviction alone logits differ", GUARD, "identical logits", set_("evict", 512, ["logits_sha256"], "other")),
        ("demo tokens differ", GUARD, "demo identical tokens", demo_tokens),
        ("demo fallback", GUARD, "demo fallbacks", demo_fallback),
        ("demo answer changed though nothing was evicted", GUARD, "demo same answer as baseline",
         demo_unevicted_differs),
        # Regressions against the reference round (the intact round).
        ("more KV bytes held than the reference", GUARD, "kv_bytes_held store @4096 vs reference",
         set_("store", 4096, ["kv_bytes_held"], int(1000 * (1 + 2 * tol)))),
        ("lower lossy ratio than the reference", GUARD, "lossy_ratio evict @4096 vs reference",
         set_("evict", 4096, ["lossy_ratio"], 3.5 * (1 - 2 * tol))),
        ("lower lossless ratio than the reference", GUARD, "lossless_ratio store @4096 vs reference",
         set_("store", 4096, ["store", "lossless_ratio"], 1.3 * (1 - 2 * tol))),
        ("higher KL than the reference", GUARD, "kl probe @512 vs reference",
         set_("probe", 512, ["kl"], 0.02 * (1 + 2 * tol) + 2 * g["guard_kl_slack"])),
        ("lower top-1 than the reference", GUARD, "top1_agreement full @512 vs reference",
         set_("full", 512, ["top1_agreement"], 0.95 - 2 * g["guard_top1_drop"])),
        ("slower than the reference, beyond the noise", GUARD, "decode_speed store/baseline @512 vs reference",
         set_("store", 512, ["decode_vs_baseline"],
              speed(0.6 * (1 - g["speed_tolerance"] - 3 * quiet), quiet))),
        ("slower than the reference on a noisy machine", GUARD, "decode_speed evict/baseline @512 vs reference",
         set_("evict", 512, ["decode_vs_baseline"], speed(1.0, 2 * cap)), "inconclusive"),
    ]


def self_test(g: dict) -> List[dict]:
    """Runs every breakage; returns one row per breakage with ``ok``: the gate watching it failed
    (or was inconclusive) as it must and the round's outcome says so (a target: only under
    --strict; without it the round passes); with an intact round every gate passed. Raises
    nothing."""
    g = dict(g, speed_cases=["evict", "probe"])
    rows, demo = _passing_round(g)
    reference = {"cases": copy.deepcopy(rows)}
    intact = evaluate(rows, demo, g, reference)
    results = [{"breakage": "intact round", "expect": "pass", "gate": "-",
                "failed": [x["name"] for x in intact if x["status"] == "fail"],
                "inconclusive": [x["name"] for x in intact if x["status"] == "inconclusive"],
                "ok": outcome(intact, strict=True) == "pass" and {kind_of(x) for x in intact} == {GUARD, TARGET}}]
    for what, kind, prefix, breaker, *expect in _breakages(g):
        expect = expect[0] if expect else "fail"
        r, d = copy.deepcopy(rows), copy.deepcopy(demo)
        breaker(r, d)
        # A target is checked without a reference, so that no guard watches the same figure.
        gs = evaluate(r, d, g, reference if kind == GUARD else None)
        watching = [x["status"] for x in gs if x["name"].startswith(prefix) and kind_of(x) == kind]
        ok = expect in watching and outcome(gs, strict=True) == expect
        if kind == TARGET:
            ok = ok and outcome(gs) == "pass"
        results.append({"breakage": what, "expect": expect if kind == GUARD else f"{expect} under --strict",
                        "gate": prefix,
                        "failed": [x["name"] for x in gs if x["status"] == "fail"],
                        "inconclusive": [x["name"] for x in gs if x["status"] == "inconclusive"],
                        "ok": ok})
    return results
