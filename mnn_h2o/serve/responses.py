"""Response bodies out, in OpenAI's shapes: ``chat.completion``, ``chat.completion.chunk``,
``text_completion`` and server-sent events. ``usage`` carries extra fields: the
conversation's ``kv_bytes_held`` and its ``whole_model_ratio``, and for a chat turn ``session``:
whether the conversation's cache was new, continued in memory or restored from the session store
(docs/serve.md)."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from .service import Outcome

SSE_DONE = "data: [DONE]\n\n"


@dataclass
class Head:
    """What every object of one response repeats."""
    model: str
    prefix: str  # chatcmpl | cmpl
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or f"{self.prefix}-{uuid.uuid4().hex}"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def usage(o: Outcome) -> dict:
    u = {"prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
         "total_tokens": o.prompt_tokens + o.completion_tokens,
         "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
         "kv_bytes_held": o.kv_bytes_held, "whole_model_ratio": round(o.whole_model_ratio, 4)}
    if o.session is not None:
        u["session"] = o.session
    return u


def chat_completion(h: Head, o: Outcome) -> dict:
    return {"id": h.id, "object": "chat.completion", "created": h.created, "model": h.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": o.text},
                         "logprobs": None, "finish_reason": o.finish_reason}],
            "usage": usage(o)}


def chat_chunk(h: Head, delta: dict, finish_reason: Optional[str] = None, with_usage: bool = False) -> dict:
    """One streamed piece; with stream_options.include_usage every chunk has usage: null."""
    d = {"id": h.id, "object": "chat.completion.chunk", "created": h.created, "model": h.model,
         "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    if with_usage:
        d["usage"] = None
    return d


def usage_chunk(h: Head, o: Outcome, obj: str) -> dict:
    """The last chunk when stream_options.include_usage: no choices, the usage."""
    return {"id": h.id, "object": obj, "created": h.created, "model": h.model, "choices": [], "usage": usage(o)}


def completion(h: Head, o: Outcome) -> dict:
    return {"id": h.id, "object": "text_completion", "created": h.created, "model": h.model,
            "choices": [{"index": 0, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason}],
            "usage": usage(o)}


def completion_chunk(h: Head, text: str, finish_reason: Optional[str] = None, with_usage: bool = False) -> dict:
    d = {"id": h.id, "object": "text_completion", "created": h.created, "model": h.model,
         "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if with_usage:
        d["usage"] = None
    return d
