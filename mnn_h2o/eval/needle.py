"""Needle in a haystack: can the model still recall a fact buried in a long prompt?

A trial inserts one needle sentence (a fact with a random value) at a relative depth of filler
text from one domain's split, then asks for the value; the greedy answer must contain it. The
suite is every needle x depth x haystack length, the haystack domain alternating between two
domains, so 3 needles x 5 depths x 2 lengths = 30 trials per setting.

Two settings (``placement``):
- ``inside``: the question ends the prompt, and the prompt is prefilled as one; prefill eviction
  sees the question (the common chat case);
- ``after``: the haystack is prefilled first, then the question as a second turn; compression
  of the haystack cannot have used the question (kvpress's default, query-agnostic).

The answer starts inside the prompt ("Answer: The password ... is") so that a model as small as
SmolLM2-135M answers in a form that can be scored; the full cache's own hits are the ceiling.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

PLACEMENTS = ("inside", "after")


@dataclass(frozen=True)
class Needle:
    name: str
    fact: str        # with {v}
    question: str
    answer_prefix: str
    values: Tuple[str, ...]


_WORDS = ("marmalade", "copperfield", "thunderbolt", "lavender", "pinecone", "saxophone",
          "windmill", "blueberry", "harpsichord", "cinnamon", "tangerine", "zeppelin")
_CITIES = ("Lisbon", "Nairobi", "Montreal", "Kyoto", "Valparaiso", "Helsinki", "Bologna",
           "Adelaide", "Krakow", "Reykjavik", "Bergen", "Tbilisi")
NEEDLES = (
    Needle("vault_code", "The secret code for the blue vault is {v}.",
           "What is the secret code for the blue vault?", "The secret code for the blue vault is",
           tuple(str(v) for v in range(1000, 10000))),
    Needle("lighthouse_password", "The password for the old lighthouse is {v}.",
           "What is the password for the old lighthouse?", "The password for the old lighthouse is",
           _WORDS),
    Needle("birthplace", "Professor Amelia Hartwell was born in the city of {v}.",
           "In which city was Professor Amelia Hartwell born?",
           "Professor Amelia Hartwell was born in the city of", _CITIES),
)
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
LENGTHS = (3000, 7000)
HAYSTACK_DOMAINS = ("essays", "prose")
SEED = 7


@dataclass(frozen=True)
class Trial:
    needle: str
    depth: float
    length: int           # prompt tokens, question included
    domain: str
    value: str
    context: Tuple[int, ...]    # haystack with the needle
    question: Tuple[int, ...]   # question and answer prefix


def trials(tokenizer, split: str, needles: Sequence[Needle] = NEEDLES,
           depths: Sequence[float] = DEPTHS, lengths: Sequence[int] = LENGTHS,
           domains: Sequence[str] = HAYSTACK_DOMAINS, seed: int = SEED) -> List[Trial]:
    """Every needle x depth x length; the haystack domain alternates with needle and depth."""
    from .domains import haystack

    rng = np.random.default_rng(seed)
    out = []
    for ni, nd in enumerate(needles):
        question = tuple(tokenizer.encode(f"\n\nQuestion: {nd.question}\nAnswer: {nd.answer_prefix}"))
        for di, depth in enumerate(depths):
            domain = domains[(ni + di) % len(domains)]
            for length in lengths:
                value = nd.values[int(rng.integers(len(nd.values)))]
                fact = tuple(tokenizer.encode("\n\n" + nd.fact.format(v=value) + "\n\n"))
                n_hay = length - len(fact) - len(question)
                if n_hay < 1:
                    raise ValueError(f"a needle prompt of {length} tokens has no room for a haystack")
                hay = haystack(tokenizer, domain, split, ni * len(depths) + di, n_hay)
                at = int(depth * len(hay))
                out.append(Trial(nd.name, depth, length, domain, value,
                                 hay[:at] + fact + hay[at:], question))
    return out


def _norm(s: str) -> str:
    return re.sub(r"[^0-9a-z]", "", s.lower())


def is_hit(answer: str, value: str) -> bool:
    """The answer contains the value, ignoring case, spaces and punctuation ("4 8 2 1." holds
    4821). An empty value never matches."""
    v = _norm(value)
    return bool(v) and v in _norm(answer)
