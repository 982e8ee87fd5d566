"""KVzip's context reconstruction pass (eviction.policy kvzip; docs/eviction.md "Reconstruction
(kvzip)"), as kvpress runs it: after a prompt the model is asked to repeat it, chunk by chunk,
teacher-forced, and the evicting layers keep the largest probability each held token gets from
those queries (eviction.reconstruction_softmax: in a softmax over every key, or, chunk, over the
sinks, that chunk and the pass: KVzip's own scoring). The pass's own tokens are dropped after each
chunk, so afterwards the cache holds exactly what it held before, with the scores.

The engine decides when a pass is due and over which tokens (engine.py ``Llm._reconstruct``);
this module is the protocol: the prompts that ask for the repetition and the pass over them.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional, Sequence

from .errors import ContextOverflowError

# The context is repeated in chunks of this many tokens, each after a prompt asking for it; a
# chunk after the first quotes the last QUOTE_TOKENS tokens of the one before.
CHUNK_TOKENS = 2048
QUOTE_TOKENS = 8
REPEAT_FIRST = "\n\nRepeat the previous context exactly."
REPEAT_LATER = "\n\nRepeat the part of the previous context exactly, starting with"


class PassCancelled(Exception):
    """Llm.compress was cancelled mid-pass: the cache holds partial scores (reset it)."""


def repeat_ids(tokenizer) -> tuple:
    """The ids of the reconstruction prompts: the first chunk's, a later chunk's (before its
    quote of the previous chunk) and what closes the request, i.e. the chat template's text
    after a user turn (end of turn, assistant header) when the model has one, else a newline
    (kvpress's choice)."""
    suffix = "\n"
    if tokenizer.chat_template:
        marker = "\u241e"  # a character no template writes: its end is where the user text ends
        suffix = tokenizer.apply_chat_template(marker).split(marker, 1)[1]
    return tokenizer.encode(REPEAT_FIRST), tokenizer.encode(REPEAT_LATER), tokenizer.encode(suffix)


def run_pass(context: Sequence[int], repeat: tuple, layers: Callable[[List[int], int], object], cache, stats,
             pos: int, max_context: int, prefill_chunk: int, windowed: bool, progress=None,
             cancel: Optional[threading.Event] = None) -> None:
    """The pass over ``context`` (the tokens to repeat, the last len(context) held by ``cache``):
    ``repeat`` = repeat_ids(...); ``layers(ids, pos)`` runs ids through the model against the
    cache at positions pos.. (engine.py ``Llm._layers``); ``pos`` is the first free position,
    ``windowed`` eviction.reconstruction_softmax chunk. Its time and tokens go to ``stats``.
    ``progress(stage, done, total)`` as Llm.prefill's, stage "pass"; ``cancel.set()`` stops it
    between chunks with PassCancelled."""
    first, later, suffix = repeat
    prompt_max = max(len(first), len(later) + QUOTE_TOKENS) + len(suffix)
    chunk = min(CHUNK_TOKENS, max_context - pos - prompt_max)
    if chunk < 1:
        raise ContextOverflowError(
            f"the reconstruction pass of eviction.policy kvzip needs {prompt_max + 1} free positions after "
            f"the {pos} tokens in context (limit {max_context})")
    t0 = time.perf_counter()
    context = list(context)
    # (offset of the chunk in context, the prompt that repeats it)
    prompts = [(s, (first if s == 0 else later + context[max(0, s - QUOTE_TOKENS):s]) + suffix + context[s:s + chunk])
               for s in range(0, len(context), chunk)]
    total, done = sum(len(ids) for _, ids in prompts), 0
    cache.begin_reconstruction()
    try:
        for s, ids in prompts:
            if windowed:  # the chunk's tokens: the last len(context) - s rows held, chunk of them
                cache.set_reconstruction_window(len(context) - s, min(chunk, len(context) - s))
            for o in range(0, len(ids), prefill_chunk):
                if cancel is not None and cancel.is_set():
                    raise PassCancelled("the reconstruction pass was cancelled")
                sub = ids[o:o + prefill_chunk]
                layers(sub, pos + o)
                stats.kv_bytes_peak = max(stats.kv_bytes_peak, cache.bytes_held())
                done += len(sub)
                if progress is not None:
                    progress("pass", done, total)
            stats.reconstruct_tokens += len(ids)
            cache.rewind_reconstruction()
    finally:
        cache.end_reconstruction()
    stats.reconstruct_s += time.perf_counter() - t0
