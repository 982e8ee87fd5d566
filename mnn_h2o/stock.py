"""A small runner for a stock ``MNN.llm`` model directory (see :mod:`mnn_h2o.stock_export`).

The stock baseline is what a user would run instead of our engine: MNN's own ``Llm`` with
its fused Attention op and KV cache. This wrapper adds what our measurements need:

* ``generate`` with prefill/decode timings (tokens/s),
* teacher-forced next-token ``logits`` for every position of a token sequence,
* ``prefill``/``decode`` steps that return logits.

Facts about ``MNN.llm`` 3.6.1 this relies on (found by reading MNN's llm.cpp and trying):

* ``Llm.forward(ids)`` embeds ``ids``, runs them through the graph *appending to the KV cache*
  and returns the logits as a Var: ``[1, 1, vocab]`` (last position) by default, or
  ``[1, n, vocab]`` (every position) after ``set_config({"all_logits": true})``. The graph's
  ``logits_index`` input is what selects this (-1 or 0).
* After a ``forward`` the context counts as "decoding" (``gen_seq_len`` > 0); a multi-token
  forward then uses a module cloned for that exact length. We set ``gen_seq_len`` back to 0
  before multi-token chunks so they share the prefill module.
* ``reset()`` forgets the context (KV cache emptied on the next forward); it does not clear
  the ``prefill_us``/``decode_us`` counters, which also accumulate across ``generate`` calls:
  timings here are differences of consecutive readings.
* The Python wrapper's ``generate(ids)`` hides the C++ ``max_new_tokens`` argument; the C
  object's ``generate(ids, max_new_tokens)`` takes it.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

import numpy as np

from .mnn_runtime import import_mnn, redirect_fds
from .speed_counters import SpeedCounters


@dataclass
class StockStats(SpeedCounters):
    """prefill_s / decode_s are MNN's own timers (prefill: embedding + graph + first sample);
    decode_steps counts the decode forwards MNN ran (each sampled token is fed back)."""
    wall_s: float = 0.0         # Python wall time of the whole generate call


@dataclass
class StockGeneration:
    text: str
    token_ids: List[int]
    stop_reason: str  # "stop_token" | "max_new_tokens"
    stats: StockStats = field(default_factory=StockStats)


class StockLlm:
    """``MNN.llm`` model loaded from a stock export's ``config.json`` (or its directory).

    ``threads``, ``memory`` ("low"/"normal") and ``precision`` override config.json, and so
    does any other MNN.llm runtime key in ``config`` (e.g. ``{"dynamic_option": 2}``: input
    activations quantised per block, asymmetric; more accurate with Memory_Low).
    Tokenisation uses our GGUF tokenizer saved next to the export when present (MNN's own
    byte-level BPE uses a fixed split regex that differs from SmolLM2's on some text), else
    MNN's tokenizer. Not thread-safe.
    """

    def __init__(self, config_path: str, threads: int = 2, memory: Optional[str] = None,
                 precision: Optional[str] = None, config: Optional[dict] = None):
        if os.path.isdir(config_path):
            config_path = os.path.join(config_path, "config.json")
        if not os.path.isfile(config_path):
            raise ValueError(f"stock model config not found: {config_path}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        if memory not in (None, "low", "normal", "high"):
            raise ValueError(f"memory must be 'low', 'normal' or 'high', got {memory!r}")
        if precision not in (None, "low", "normal", "high"):
            raise ValueError(f"precision must be 'low', 'normal' or 'high', got {precision!r}")
        self.config_path = config_path
        self.dir = os.path.dirname(os.path.abspath(config_path))
        with open(config_path) as f:
            self.runtime = json.load(f)
        # MNN.llm does not fail cleanly on a missing file (it crashes later): check first
        needed = [self.runtime.get("llm_config", "llm_config.json"), self.runtime.get("llm_model", "llm.mnn"),
                  self.runtime.get("llm_weight", "llm.mnn.weight"),
                  self.runtime.get("tokenizer_file", "tokenizer.txt"),
                  self.runtime.get("embedding_file", "embeddings_bf16.bin")]
        missing = [f for f in needed if not os.path.isfile(os.path.join(self.dir, f))]
        if missing:
            raise ValueError(f"incomplete stock model directory {self.dir}: missing {', '.join(missing)}")
        with open(os.path.join(self.dir, self.runtime.get("llm_config", "llm_config.json"))) as f:
            self.llm_config = json.load(f)
        info_path = os.path.join(self.dir, "export_info.json")
        self.info = json.load(open(info_path)) if os.path.isfile(info_path) else {}
        self.vocab = int(self.info.get("config", {}).get("vocab", 0)) or None
        self.max_context = int(self.runtime.get("max_all_tokens", 2048))

        if config is not None and not isinstance(config, dict):
            raise ValueError(f"config must be a dict of MNN.llm runtime options, got {config!r}")
        overrides = dict(config or {})
        overrides["thread_num"] = threads
        if memory is not None:
            overrides["memory"] = memory
        if precision is not None:
            overrides["precision"] = precision
        self.runtime.update(overrides)
        mllm = import_mnn().llm
        with redirect_fds(os.devnull, (1,)):
            self._llm = mllm.create(config_path)
            self._llm.set_config(overrides)
            self._llm.load()
        self._c = self._llm._c_obj
        self._all_logits: Optional[bool] = None
        self._set_all_logits(False)
        self._warm = set()

        self.tokenizer = None
        tok_path = os.path.join(self.dir, "mnn_h2o_tokenizer.json")
        if os.path.isfile(tok_path):
            from .tokenizer import Tokenizer

            self.tokenizer = Tokenizer.load(tok_path)
        self.stop_token_ids = set(self.info.get("stop_token_ids", []))
        if self.tokenizer is not None:
            self.stop_token_ids |= set(self.tokenizer.stop_token_ids)
        self.pos = 0

    # --- text ------------------------------------------------------------------------------
    def encode(self, text: str) -> List[int]:
        if self.tokenizer is not None:
            return self.tokenizer.encode(text)
        return list(self._llm.tokenizer_encode(text))

    def decode_text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids)
        return "".join(self._llm.tokenizer_decode(int(t)) for t in ids if int(t) not in self.stop_token_ids)

    def apply_chat_template(self, text: str) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.apply_chat_template(text)
        return self._llm.apply_chat_template(text)

    # --- low level -------------------------------------------------------------------------
    def _set_all_logits(self, on: bool):
        if self._all_logits is not on:
            self._llm.set_config({"all_logits": bool(on)})
            self._all_logits = on

    def _check_ids(self, ids) -> List[int]:
        ids = [int(t) for t in np.asarray(ids, dtype=np.int64).reshape(-1)]
        if self.vocab and ids and (min(ids) < 0 or max(ids) >= self.vocab):
            raise ValueError(f"token ids must be in [0, {self.vocab}), got {min(ids)}..{max(ids)}")
        return ids

    def _forward(self, ids: List[int], all_logits: bool) -> np.ndarray:
        if self.pos + len(ids) > self.max_context:
            raise ValueError(f"{self.pos} + {len(ids)} tokens exceed the context limit {self.max_context}")
        self._set_all_logits(all_logits)
        if len(ids) > 1:
            # multi-token chunk: use the prefill module, not a clone per chunk length
            self._llm.context.update(gen_seq_len=0)
        key = (len(ids) > 1, all_logits)
        quiet = redirect_fds(os.devnull, (1,)) if key not in self._warm else contextlib.nullcontext()
        with quiet:  # the first call of a kind may print "module need new clone"
            var = self._c.forward(ids)
        self._warm.add(key)
        if var is None:
            raise RuntimeError("MNN.llm forward failed")
        out = np.array(var.read(), dtype=np.float32, copy=True)
        self.pos += len(ids)
        return out.reshape(-1, out.shape[-1])

    def reset(self) -> None:
        """Forget the context (MNN drops its KV cache on the next forward)."""
        self._llm.reset()
        self.pos = 0

    def prefill(self, ids: Sequence[int], all_logits: bool = False, chunk: int = 512) -> np.ndarray:
        """Append ``ids`` to the context; logits of the last token [vocab], or of every token
        [n, vocab] with ``all_logits``."""
        ids = self._check_ids(ids)
        if not ids:
            raise ValueError("prefill needs at least one token")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        outs = []
        for s in range(0, len(ids), chunk):
            outs.append(self._forward(ids[s:s + chunk], all_logits))
        return np.concatenate(outs, 0) if all_logits else outs[-1][-1]

    def decode(self, token: int) -> np.ndarray:
        """Append one token; logits [vocab] of the next."""
        return self._forward(self._check_ids([token]), False)[0]

    def logits(self, token_ids: Sequence[int], chunk: int = 512) -> np.ndarray:
        """Teacher-forced next-token logits [n, vocab] for a fresh context of ``token_ids``
        (row i predicts token i+1), computed by chunked prefill with all logits."""
        self.reset()
        return self.prefill(token_ids, all_logits=True, chunk=chunk)

    def next_tokens(self, token_ids: Sequence[int], chunk: int = 512) -> np.ndarray:
        """Teacher-forced greedy next token per position (argmax of :meth:`logits`)."""
        self.reset()
        ids = self._check_ids(token_ids)
        out = [self._forward(ids[s:s + chunk], True).argmax(1) for s in range(0, len(ids), chunk)]
        return np.concatenate(out)

    # --- generation ------------------------------------------------------------------------
    def _counters(self):
        ctx = self._llm.context
        return ctx.prefill_us, ctx.decode_us

    def generate(self, prompt: Union[str, Sequence[int]], max_new_tokens: int = 128,
                 chat: bool = True) -> StockGeneration:
        """Greedy generation by MNN.llm's own loop from a fresh context. ``prompt``: text (in
        the chat template when ``chat`` and the model has one) or token ids (as they are)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if isinstance(prompt, str):
            ids = self.encode(self.apply_chat_template(prompt) if chat else prompt)
        else:
            ids = self._check_ids(prompt)
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) + max_new_tokens > self.max_context:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"the context limit of {self.max_context}")
        self.reset()
        self._set_all_logits(False)
        p0, d0 = self._counters()
        t0 = time.perf_counter()
        out = list(self._c.generate(ids, max_new_tokens))
        wall = time.perf_counter() - t0
        p1, d1 = self._counters()
        # MNN resets its counters in some code paths: a negative difference means "restarted"
        prefill_us = p1 - p0 if p1 >= p0 else p1
        decode_us = d1 - d0 if d1 >= d0 else d1
        # MNN feeds every sampled token back (also the last one): the decode forwards are
        # the tokens the context grew by beyond the prompt
        self.pos = int(self._llm.context.all_seq_len)
        decode_steps = max(self.pos - len(ids), 0)
        reason = "max_new_tokens"
        if out and out[-1] in self.stop_token_ids:
            out = out[:-1]
            reason = "stop_token"
        st = StockStats(prompt_tokens=len(ids), generated_tokens=len(out),
                        prefill_s=prefill_us / 1e6, decode_s=decode_us / 1e6,
                        decode_steps=decode_steps, wall_s=wall)
        return StockGeneration(self.decode_text(out), out, reason, st)

    def close(self) -> None:
        self._llm = None
        self._c = None


def bench(llm: StockLlm, context_ids: Sequence[int], n_decode: int = 64, runs: int = 5,
          warmup: int = 1) -> dict:
    """Median prefill tokens/s (the whole context as one prompt) and decode tokens/s (the
    ``n_decode`` greedy tokens after it) over ``runs`` fresh generations, MNN's own timers."""
    ids = list(context_ids)
    for _ in range(warmup):
        llm.generate(ids, min(n_decode, 8))
    pre, dec, steps = [], [], []
    for _ in range(runs):
        g = llm.generate(ids, n_decode)
        pre.append(g.stats.prefill_tps)
        dec.append(g.stats.decode_tps)
        steps.append(g.stats.decode_steps)
    return {"context": len(ids), "n_decode": n_decode, "runs": runs,
            "prefill_tps": float(np.median(pre)), "decode_tps": float(np.median(dec)),
            "prefill_tps_all": pre, "decode_tps_all": dec, "decode_steps": steps}
