"""Progress bars for a long prefill, on a terminal: the prompt, then the kvzip reconstruction
pass, which takes longer than the prompt itself once a context passes eviction.trigger_min_tokens (a
pasted document, or the chat turn that takes a conversation past it; docs/eviction.md
"Reconstruction (kvzip)"). Without them the demo and the chat sit silent for minutes before the
first token.

A bar appears only after ``DELAY_S``, so a short chat turn shows nothing, and it is cleared
when its stage ends, so the answer that follows is not interleaved with it.
"""
from __future__ import annotations

import sys
from typing import Optional, TextIO

DELAY_S = 1.0
STAGE_NAMES = {"prompt": "prompt", "pass": "scoring the cache (kvzip pass)"}


class PrefillBars:
    """A ``progress(stage, done, total)`` callback for ``Llm.prefill`` (and ``generate``,
    ``Session.reply``) that draws one tqdm bar per stage on ``out`` (stderr by default), or
    nothing when ``out`` is not a terminal."""

    def __init__(self, out: Optional[TextIO] = None):
        self.out = out if out is not None else sys.stderr
        self.enabled = self.out.isatty()
        self.bar = None
        self.stage: Optional[str] = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage != self.stage or done < self.bar.n:  # a new stage, or a new prefill after one cut short
            self.close()
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=STAGE_NAMES.get(stage, stage), unit="tok", file=self.out,
                            delay=DELAY_S, leave=False, dynamic_ncols=True)
            self.stage = stage
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.stage = None, None
