"""Comma-separated numbers on the command line (``bench speed --contexts 512,4096``, ``eval
frontier --ratios 1.5,2``): one argparse type for every command, so they read and refuse a list
alike."""
from __future__ import annotations

import argparse
from typing import Callable, List, Optional


def number_list(kind: type, minimum: Optional[float] = None) -> Callable[[str], List]:
    """An argparse type: comma-separated numbers of ``kind`` (int or float), at least one, each
    >= ``minimum`` when it is given."""
    def parse(s: str) -> List:
        try:
            v = [kind(x) for x in s.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {s!r}") from None
        if not v:
            raise argparse.ArgumentTypeError(f"expected at least one {kind.__name__}, got {s!r}")
        if minimum is not None and min(v) < minimum:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}s >= {minimum}, got {s!r}")
        return v
    return parse
