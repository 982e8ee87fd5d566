"""Teacher-forced comparison of a compressed cache with the full cache.

A prompt of essay text is prefilled, then the true continuation is fed one token at a time
through the decode path (so eviction runs exactly as in generation). At every continuation
position we compare the next-token distribution of the compressed run with the full run:
KL(full || compressed), top-1 agreement, and the perplexity of the true continuation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass
class Trace:
    """Log-probabilities at every continuation position, and the run's KV figures."""
    logp: np.ndarray          # [n_cont, vocab] float32
    lossy_ratio: float        # final, whole model
    lossy_ratio_avg: float    # averaged over the decode
    kv_bytes_held: int
    decode_tps: float
    evictions: int


def teacher_forced(llm, prompt: Sequence[int], continuation: Sequence[int]) -> Trace:
    """Prefill ``prompt``, then decode ``continuation`` token by token; log-probs of each
    continuation token's position (predicting continuation[i])."""
    llm.reset()
    out = np.empty((len(continuation), llm.config.vocab), np.float32)
    logits = llm.prefill(prompt)
    for i, t in enumerate(continuation):
        out[i] = log_softmax(logits)
        if i + 1 < len(continuation):
            logits = llm.decode(int(t))
    s = llm.stats
    return Trace(out, s.lossy_ratio, s.lossy_ratio_decode_avg, s.kv_bytes_held, s.decode_tps, s.evictions)


def compare(full: Trace, cand: Trace, continuation: Sequence[int]) -> Dict[str, float]:
    p = np.exp(full.logp.astype(np.float64))
    kl = float(np.mean(np.sum(p * (full.logp - cand.logp), axis=-1)))
    agree = float(np.mean(full.logp.argmax(-1) == cand.logp.argmax(-1)))
    idx = np.arange(len(continuation))
    nll = -cand.logp[idx, np.asarray(continuation)].astype(np.float64)
    nll_full = -full.logp[idx, np.asarray(continuation)].astype(np.float64)
    return {"kl": kl, "top1_agreement": agree, "ppl": float(np.exp(nll.mean())),
            "ppl_full": float(np.exp(nll_full.mean())),
            "lossy_ratio": cand.lossy_ratio, "lossy_ratio_decode_avg": cand.lossy_ratio_avg,
            "kv_bytes_held": cand.kv_bytes_held, "decode_tps": cand.decode_tps,
            "evictions": cand.evictions,
            # The floors (sink + recent) cap what a prompt of this length can reach; a run that
            # evicted nothing is the full cache again and says nothing about the policy.
            "evicted": cand.evictions > 0}


def h2o_section(base: dict, policy: str, ratio: float) -> dict:
    """The config's h2o section with the given policy and whole-model lossy ratio target."""
    return dict(base, enabled=True, policy=policy, target_keep_ratio=0.0, target_lossy_ratio=ratio)


def quality_sweep(llm, tokenizer, base_h2o: dict, prompt_lens: Sequence[int], cont_len: int,
                  policies: Sequence[str], ratios: Sequence[float], offset: int = 0,
                  progress: bool = True, on_row=None) -> List[dict]:
    """One row per (prompt length, policy, target ratio); the full cache runs once per length."""
    from tqdm import tqdm

    from ..essays import essay_tokens

    rows: List[dict] = []
    bar = tqdm(total=len(prompt_lens) * (1 + len(policies) * len(ratios)), desc="quality",
               unit="run", disable=not progress)
    for n in prompt_lens:
        ids = essay_tokens(tokenizer, n + cont_len, offset)
        prompt, cont = ids[:n], ids[n:]
        llm.configure_h2o(None)
        full = teacher_forced(llm, prompt, cont)
        bar.update(1)
        for policy in policies:
            for r in ratios:
                llm.configure_h2o(h2o_section(base_h2o, policy, r))
                row = {"prompt_tokens": n, "continuation_tokens": cont_len, "policy": policy,
                       "target_lossy_ratio": r}
                row.update(compare(full, teacher_forced(llm, prompt, cont), cont))
                rows.append(row)
                if on_row:
                    on_row(row)
                bar.update(1)
    bar.close()
    llm.configure_h2o(None)
    return rows


def format_rows(rows: List[dict], extra: Optional[Sequence[str]] = ()) -> str:
    cols = ["prompt_tokens", "policy", "target_lossy_ratio", "lossy_ratio", "evicted", "kl",
            "top1_agreement", "ppl", "ppl_full", *extra]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
