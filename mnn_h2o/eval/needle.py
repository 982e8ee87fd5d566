"""Needle in a haystack: can the model still recall a fact buried in a long prompt?

A sentence with a random 4-digit code is inserted at several depths of essay text; the prompt
ends with a question about it and the greedy answer must contain the code. The full cache is
the reference: a needle it cannot find says nothing about eviction.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

NEEDLE = "\n\nThe secret code for the blue vault is {code}. Remember it.\n\n"
QUESTION = ("\n\nQuestion: What is the secret code for the blue vault?\n"
            "Answer: The secret code for the blue vault is")


def needle_prompts(tokenizer, context: int, depths: Sequence[float], seed: int = 0):
    """[(prompt ids, code)] with the needle at each relative depth of ``context`` tokens."""
    from ..essays import essay_tokens

    rng = np.random.default_rng(seed)
    q = tokenizer.encode(QUESTION)
    out = []
    for d in depths:
        code = str(int(rng.integers(1000, 10000)))
        needle = tokenizer.encode(NEEDLE.format(code=code))
        hay = essay_tokens(tokenizer, context - len(q) - len(needle))
        at = int(d * len(hay))
        out.append((hay[:at] + needle + hay[at:] + q, code))
    return out


def needle_hits(llm, prompts, max_new_tokens: int = 8) -> Dict[str, object]:
    answers: List[str] = []
    hits = 0
    for ids, code in prompts:
        g = llm.generate(ids, max_new_tokens=max_new_tokens, chat=False)
        answers.append(g.text)
        hits += code in g.text.replace(" ", "")
    return {"needle_hits": hits, "needle_total": len(prompts), "answers": answers}
