"""Teacher-forced comparison of a compressed cache with the full cache.

A prompt is prefilled, then the true continuation is fed one token at a time through the
decode path (so eviction runs exactly as in generation). At every continuation position the
next-token distribution of the compressed run is compared with the full run's: KL(full ||
compressed), top-1 agreement, and the perplexity of the true continuation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence

import numpy as np

from ..measure import log_softmax


@dataclass
class Trace:
    """Log-probabilities at every continuation position, and the run's final KV figures."""
    logp: np.ndarray          # [n_cont, vocab] float32; row i predicts continuation[i]
    kv_bytes_held: int        # everything the cache holds at the end
    f16_bytes: int            # what an f16 cache of every token written would hold


def teacher_forced(llm, prompt: Sequence[int], continuation: Sequence[int]) -> Trace:
    """Prefill ``prompt`` (fresh context), then decode ``continuation`` token by token."""
    llm.reset()
    out = np.empty((len(continuation), llm.config.vocab), np.float32)
    logits = llm.prefill(list(prompt))
    for i, t in enumerate(continuation):
        out[i] = log_softmax(logits)
        if i + 1 < len(continuation):
            logits = llm.decode(int(t))
    return Trace(out, llm.stats.kv_bytes_held, f16_bytes(llm))


def f16_bytes(llm) -> int:
    """Bytes an f16 cache of every token written so far would hold (K and V, every layer): the
    numerator of every whole-model ratio we report, whatever the cache's own element type."""
    return llm.stats.kv_bytes_f16


def metrics(full_logp: np.ndarray, cand_logp: np.ndarray, continuation: Sequence[int]) -> Dict[str, float]:
    """Mean KL(full || compressed) in nats, top-1 agreement and perplexities of the true
    continuation, from log-probabilities [positions, vocab] of both runs."""
    f = full_logp.astype(np.float64)
    c = cand_logp.astype(np.float64)
    kl = float(np.mean(np.sum(np.exp(f) * (f - c), axis=-1)))
    idx = np.arange(len(continuation))
    tgt = np.asarray(continuation)
    ppl = float(np.exp(-c[idx, tgt].mean()))
    ppl_full = float(np.exp(-f[idx, tgt].mean()))
    # KL is >= 0; float rounding of two identical runs can give -1e-17.
    return {"kl": max(kl, 0.0), "top1": float(np.mean(f.argmax(-1) == c.argmax(-1))),
            "ppl": ppl, "ppl_full": ppl_full, "ppl_delta": ppl - ppl_full}


def eviction_target(target: float, dtype_gain: float) -> float:
    """The ratio eviction must make for a whole-model ``target`` (against f16) when the element
    type alone saves ``dtype_gain`` (f16 bytes / its bytes): the type pays its part, eviction the
    rest; 1 means no eviction. Our cache applies this very rule to ``eviction.target_lossy_ratio``
    (native ``EvictionState::keep_ratio``; ``tests/test_frontier.py`` checks the two agree), and the
    kvpress peer's ``@q8`` presses are set with it."""
    return max(1.0, target / dtype_gain)


def eviction_section(base: dict, policy: str, ratio: float) -> dict:
    """The config's eviction section with the given policy and whole-model lossy ratio target, evicting
    at every prompt length (a frontier point is a method at a ratio; the default's trigger, which
    leaves short contexts alone, is a product choice measured on its own)."""
    return dict(base, enabled=True, policy=policy, target_keep_ratio=0.0, target_lossy_ratio=ratio,
                kv_budget_bytes=0, trigger_min_tokens=0)
