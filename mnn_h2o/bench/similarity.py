"""How far a generated answer is from the full cache's answer to the same prompt.

Greedy generations that share a prefix and then diverge say little by the length of the shared
prefix alone (one different word early on changes every later token), so the demo also reports
two overlap scores of the answers' words: token F1 (bag of words, as in SQuAD) and ROUGE-L
(longest common subsequence, F-measure). Words are lower-cased runs of letters and digits, so
tokenisation and spacing do not count as differences.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import List, Optional, Sequence


def words(text: str) -> List[str]:
    return re.findall(r"\w+", text.lower())


def first_divergence(ref: Sequence[int], ids: Sequence[int]) -> Optional[int]:
    """Index of the first token where ``ids`` differs from ``ref`` (one sequence ending before
    the other counts as a difference there); None when they are equal."""
    for i, (a, b) in enumerate(zip(ref, ids)):
        if a != b:
            return i
    return None if len(ref) == len(ids) else min(len(ref), len(ids))


def _f(overlap: int, n_ref: int, n_cand: int) -> float:
    if n_ref == 0 and n_cand == 0:
        return 1.0
    if overlap == 0:
        return 0.0
    p, r = overlap / n_cand, overlap / n_ref
    return 2 * p * r / (p + r)


def token_f1(ref: str, cand: str) -> float:
    a, b = words(ref), words(cand)
    return _f(sum((Counter(a) & Counter(b)).values()), len(a), len(b))


def rouge_l(ref: str, cand: str) -> float:
    a, b = words(ref), words(cand)
    prev = [0] * (len(b) + 1)
    for x in a:
        row = [0]
        for j, y in enumerate(b):
            row.append(prev[j] + 1 if x == y else max(prev[j + 1], row[j]))
        prev = row
    return _f(prev[-1], len(a), len(b))
