"""What the bench, the evaluations and the tools measure with, one copy for all of them:
interleaved A/B runs (the candidates in turn, A B, B A, ...) with their medians and spread, one
run's prefill and decode speed, and log-probabilities from logits."""
from __future__ import annotations

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
