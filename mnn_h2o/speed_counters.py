"""Prefill/decode counters shared by our engine's and the stock baseline's statistics."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeedCounters:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s else 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(prefill_tps=self.prefill_tps, decode_tps=self.decode_tps)
        return d
