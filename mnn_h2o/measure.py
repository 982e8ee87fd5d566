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


def _time_split(before, after, seconds: float, n_tokens: int) -> dict:
    """ms per token of a phase, split into MNN module forwards, the native cache step (append,
    attention, eviction) and the rest (Python glue, sampling), from the engine's counters
    (mnn_s, attention_s) at the phase's start and end."""
    per_tok = 1e3 / n_tokens
    d = {"total": seconds * per_tok, "mnn": (after[0] - before[0]) * per_tok,
         "attention": (after[1] - before[1]) * per_tok}
    d["glue"] = d["total"] - d["mnn"] - d["attention"]
    return d


def time_run(engine, ids: Sequence[int], n_decode: int) -> dict:
    """One fresh context: prefill ``ids`` then decode ``n_decode`` greedy tokens."""
    engine.reset()
    stats = getattr(engine, "stats", None)
    snap = lambda: (stats.mnn_s, stats.attention_s) if stats is not None else None
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
