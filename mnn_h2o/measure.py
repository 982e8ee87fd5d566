"""What the bench, the evaluations and the tools measure with, one copy for all of them:
interleaved A/B runs (the candidates in turn, A B, B A, ...) with their medians and spread, the
speed ratio of two candidates whose steps were interleaved one by one, one run's prefill and
decode speed, and log-probabilities from logits."""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Dict, List, Sequence

import numpy as np


def summarize(values: Sequence[float]) -> dict:
    """Median, min, max and relative spread ((max - min) / median) of repeated measurements."""
    v = sorted(values)
    med = statistics.median(v)
    return {"median": med, "min": v[0], "max": v[-1], "n": len(v),
            "spread": (v[-1] - v[0]) / med if med else 0.0, "values": list(values)}


# Steps per block of a paired speed ratio: long enough that a block's two sums see the same
# stretch of a busy machine, short enough for tens of blocks per round.
RATIO_BLOCK_STEPS = 16


def paired_ratio(base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]],
                 block: int = RATIO_BLOCK_STEPS) -> dict:
    """How fast ``cand`` is relative to ``base`` when their steps were interleaved one by one:
    ``base[r][i]`` and ``cand[r][i]`` are the seconds of step i of repetition r, taken back to
    back. ``ratio`` = sum(base) / sum(cand) (above 1: cand is faster); ``noise`` the relative
    half-width of its 95% interval.

    The unit is a block of ``block`` steps (both candidates' sums over it saw the same stretch of
    load; single steps are not independent). A block's log ratio differs from repetition to
    repetition by the machine's noise only, since every repetition does the same work at the same
    step (an eviction, a chunk the store encodes): so the noise is taken from each block's
    departures from its own mean over the repetitions, and work that is heavier at some steps
    than at others is not mistaken for noise. One repetition has no such reference: its blocks'
    own spread is used (an overestimate where the work is uneven). ``inf`` with too few blocks."""
    x: List[List[float]] = []
    tb = tc = 0.0
    for b_run, c_run in zip(base, cand):
        if len(b_run) != len(c_run):
            raise ValueError("paired_ratio: runs of different lengths")
        tb, tc = tb + sum(b_run), tc + sum(c_run)
        x.append([math.log(sum(b_run[i:i + block]) / sum(c_run[i:i + block]))
                  for i in range(0, len(b_run) - block + 1, block)])
    ratio = tb / tc if tc else float("nan")
    reps, k = len(x), min((len(r) for r in x), default=0)
    if reps >= 2 and k >= 1:
        means = [statistics.fmean(x[j][i] for j in range(reps)) for i in range(k)]
        ss = sum((x[j][i] - means[i]) ** 2 for j in range(reps) for i in range(k))
        dof = k * (reps - 1)
    elif reps == 1 and k >= 2:
        ss, dof = (k - 1) * statistics.variance(x[0]), k - 1
    else:
        return {"ratio": ratio, "noise": float("inf"), "blocks": reps * k, "block_steps": block}
    se = math.sqrt(ss / dof / (reps * k))
    noise = math.expm1(_t975(dof) * se)
    return {"ratio": ratio, "noise": noise, "blocks": reps * k, "block_steps": block}


def _t975(dof: int) -> float:
    """Student's t at 97.5% for ``dof`` degrees of freedom (Cornish-Fisher; within 2% from 4 on)."""
    z = 1.959964
    return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)


def interleave(runners: Dict[str, Callable[[], dict]], repetitions: int,
               on_run: Callable[[str, int, dict], None] | None = None) -> Dict[str, List[dict]]:
    """Call every runner once per repetition, alternating order each round (A B, B A, ...) so a
    drift of the machine does not favour whoever runs first."""
    names = list(runners)
    results: Dict[str, List[dict]] = {n: [] for n in names}
    for rep in range(repetitions):
        order = names if rep % 2 == 0 else names[::-1]
        for n in order:
            r = runners[n]()
            results[n].append(r)
            if on_run:
                on_run(n, rep, r)
    return results


# The engine's counters a phase's time is split into (mnn_h2o.engine.Stats; disjoint), and the
# key of each in the split; an engine without one of them (a test's stand-in) counts 0 there.
SPLIT_COUNTERS = (("mnn_s", "mnn"), ("dense_s", "dense"), ("convert_s", "convert"), ("attention_s", "attention"),
                  ("policy_s", "policy"), ("head_s", "head"))
SPLIT_KEYS = ("total",) + tuple(k for _, k in SPLIT_COUNTERS) + ("glue", "mnn_calls")


def _counters(stats) -> dict:
    d = {k: getattr(stats, c, 0.0) for c, k in SPLIT_COUNTERS}
    d["mnn_calls"] = getattr(stats, "mnn_calls", 0)
    return d


def _time_split(before: dict, after: dict, seconds: float, n_tokens: int) -> dict:
    """ms per token of a phase, split into MNN module forwards, the native decode layers, numpy <->
    MNN copies, the native cache step (append, attention, score collection), the native end of a
    forward (eviction policy, store), the native tail and head, and the rest (Python glue,
    sampling), from the engine's counters at the phase's start and end; mnn_calls: Module.forward
    calls per token."""
    per_tok = 1e3 / n_tokens
    d = {"total": seconds * per_tok}
    for _, k in SPLIT_COUNTERS:
        d[k] = (after[k] - before[k]) * per_tok
    d["glue"] = d["total"] - sum(d[k] for _, k in SPLIT_COUNTERS)
    d["mnn_calls"] = (after["mnn_calls"] - before["mnn_calls"]) / n_tokens
    return d


def time_run(engine, ids: Sequence[int], n_decode: int) -> dict:
    """One fresh context: prefill ``ids`` then decode ``n_decode`` greedy tokens."""
    engine.reset()
    stats = getattr(engine, "stats", None)
    snap = lambda: _counters(stats) if stats is not None else None
    b0 = snap()
    t0 = time.perf_counter()
    logits = engine.prefill(ids)
    t1 = time.perf_counter()
    b1 = snap()
    tok = int(logits.argmax())
    for _ in range(n_decode):
        tok = int(engine.decode(tok).argmax())
    t2 = time.perf_counter()
    b2 = snap()
    r = {"prefill_tps": len(ids) / (t1 - t0), "decode_tps": n_decode / (t2 - t1)}
    if stats is not None:
        r["prefill_ms"] = _time_split(b0, b1, t1 - t0, len(ids))
        r["decode_ms"] = _time_split(b1, b2, t2 - t1, n_decode)
        r["kv_bytes_held"] = stats.kv_bytes_held
    return r


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
