"""Interleaved A/B timing: run the candidates in turn (A B A B ...), then medians and spread."""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Sequence


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
