"""Request bodies in: JSON checked into a :class:`ChatRequest` or :class:`CompletionRequest`, or an
:class:`ApiError` that names the parameter (OpenAI's error shape, HTTP 400).

Checked by hand rather than by a schema library so that every message says which parameter is
wrong and what is allowed, as OpenAI's do. Parameters the server does not implement (tools,
logprobs, n > 1, penalties) are refused when they would change the answer, not silently ignored;
unknown keys are ignored, as clients send extras (user, metadata, ...).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, List, Optional

ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 4        # OpenAI's limit
MAX_SEED = (1 << 63) - 1    # numpy's generators take seeds >= 0
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, message: str, param: Optional[str] = None, code: Optional[str] = "invalid_value",
                 status: int = 400, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class SamplingParams:
    """OpenAI's defaults: temperature 1, top_p 1 (top_k is an extension; 0 = off)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None


@dataclass
class ChatRequest:
    messages: List[dict]               # {"role", "content"} with content a string
    model: Optional[str] = None
    max_tokens: Optional[int] = None   # None: up to serve.max_tokens_limit or the context's end
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: List[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False        # stream_options.include_usage


@dataclass
class CompletionRequest:
    prompt: str
    model: Optional[str] = None
    max_tokens: int = COMPLETION_DEFAULT_MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: List[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object."""
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise ApiError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise ApiError("the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise ApiError(f"the request body must be a JSON object, got {_kind(obj)}", code="invalid_json")
    return obj


def parse_chat(obj: dict, max_tokens_limit: int) -> ChatRequest:
    """A /v1/chat/completions body."""
    _refuse_unsupported(obj)
    req = ChatRequest(messages=_messages(obj), model=_model(obj))
    name = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
    if obj.get(name) is not None:
        req.max_tokens = _int(obj, name, 1, max_tokens_limit)
    _common(obj, req)
    return req


def parse_completion(obj: dict, max_tokens_limit: int) -> CompletionRequest:
    """A /v1/completions body (the prompt is used as it is, without the chat template)."""
    _refuse_unsupported(obj)
    for name, allowed in (("echo", (None, False)), ("suffix", (None, "")), ("best_of", (None, 1))):
        if obj.get(name, None) not in allowed:
            raise ApiError(f"{name} is not supported by this server", name, "unsupported_parameter")
    req = CompletionRequest(prompt=_prompt(obj), model=_model(obj))
    if obj.get("max_tokens") is not None:
        req.max_tokens = _int(obj, "max_tokens", 1, max_tokens_limit)
    elif req.max_tokens > max_tokens_limit:
        req.max_tokens = max_tokens_limit
    _common(obj, req)
    return req


# --- parts ---------------------------------------------------------------------------------------
def _kind(x: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(x), type(x).__name__)


def _model(obj: dict) -> Optional[str]:
    m = obj.get("model")
    if m is not None and not isinstance(m, str):
        raise ApiError(f"model must be a string, got {_kind(m)}", "model", "invalid_type")
    return m


def _messages(obj: dict) -> List[dict]:
    if "messages" not in obj:
        raise ApiError("messages is required", "messages", "missing_required_parameter")
    msgs = obj["messages"]
    if not isinstance(msgs, list):
        raise ApiError(f"messages must be an array, got {_kind(msgs)}", "messages", "invalid_type")
    if not msgs:
        raise ApiError("messages must hold at least one message", "messages", "empty_array")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(f"{where} must be an object, got {_kind(m)}", where, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            shown = repr(role) if isinstance(role, str) else _kind(role)
            raise ApiError(f"{where}.role must be one of {', '.join(ROLES)}, got {shown}", f"{where}.role")
        out.append({"role": role, "content": _content(m.get("content"), f"{where}.content")})
    return out


def _content(c: Any, where: str) -> str:
    """A string, or an array of text parts (joined), as OpenAI accepts."""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        texts = []
        for j, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(f"{where}[{j}] must be a text part {{\"type\": \"text\", \"text\": ...}}; "
                               "this server reads text only", f"{where}[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"{where} must be a string or an array of text parts, got {_kind(c)}", where, "invalid_type")


def _prompt(obj: dict) -> str:
    if "prompt" not in obj:
        raise ApiError("prompt is required", "prompt", "missing_required_parameter")
    p = obj["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if not isinstance(p, str):
        raise ApiError(f"prompt must be a string (or an array of one string), got {_kind(p)}", "prompt",
                       "invalid_type")
    if not p:
        raise ApiError("prompt is empty", "prompt")
    return p


def _number(obj: dict, name: str, lo: float, hi: float, lo_open: bool = False) -> float:
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(f"{name} must be a number, got {_kind(v)}", name, "invalid_type")
    if v != v or v > hi or v < lo or (lo_open and v == lo):
        raise ApiError(f"{name} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v}", name)
    return float(v)


def _int(obj: dict, name: str, lo: int, hi: int) -> int:
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(f"{name} must be an integer, got {_kind(v)}", name, "invalid_type")
    if not lo <= v <= hi:
        raise ApiError(f"{name} must be in [{lo}, {hi}], got {v}", name)
    return v


def _bool(obj: dict, name: str) -> bool:
    v = obj[name]
    if not isinstance(v, bool):
        raise ApiError(f"{name} must be a boolean, got {_kind(v)}", name, "invalid_type")
    return v


def _common(obj: dict, req) -> None:
    """Sampling, stop strings and streaming: the same for both endpoints."""
    s = req.sampling
    if obj.get("temperature") is not None:
        s.temperature = _number(obj, "temperature", 0.0, 2.0)
    if obj.get("top_p") is not None:
        s.top_p = _number(obj, "top_p", 0.0, 1.0, lo_open=True)
    if obj.get("top_k") is not None:
        s.top_k = _int(obj, "top_k", 0, 1 << 20)
    if obj.get("seed") is not None:
        s.seed = _int(obj, "seed", 0, MAX_SEED)
    stop = obj.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
            raise ApiError(f"stop must be a string or an array of strings, got {_kind(stop)}", "stop", "invalid_type")
        if len(stop) > MAX_STOP_STRINGS:
            raise ApiError(f"stop holds at most {MAX_STOP_STRINGS} strings, got {len(stop)}", "stop")
        req.stop = [x for x in stop if x]
    if obj.get("stream") is not None:
        req.stream = _bool(obj, "stream")
    opts = obj.get("stream_options")
    if opts is not None:
        if not req.stream:
            raise ApiError("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(opts, dict):
            raise ApiError(f"stream_options must be an object, got {_kind(opts)}", "stream_options", "invalid_type")
        if opts.get("include_usage") is not None:
            req.include_usage = _bool(opts, "include_usage")


def _refuse_unsupported(obj: dict) -> None:
    """Parameters that would change the answer in ways this server does not implement."""
    if obj.get("n") is not None and _int(obj, "n", 1, 1 << 20) != 1:
        raise ApiError("n must be 1: this server returns one choice", "n", "unsupported_parameter")
    for name in ("tools", "functions"):
        if obj.get(name):
            raise ApiError(f"{name} are not supported by this server", name, "unsupported_parameter")
    for name in ("tool_choice", "function_call"):
        if obj.get(name) not in (None, "none"):
            raise ApiError(f"{name} is not supported by this server", name, "unsupported_parameter")
    if obj.get("logprobs") not in (None, False) or obj.get("top_logprobs") is not None:
        raise ApiError("logprobs are not supported by this server", "logprobs", "unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        if obj.get(name) is not None and _number(obj, name, -2.0, 2.0) != 0.0:
            raise ApiError(f"{name} is not supported by this server (only 0)", name, "unsupported_parameter")
    if obj.get("logit_bias"):
        raise ApiError("logit_bias is not supported by this server", "logit_bias", "unsupported_parameter")
    fmt = obj.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise ApiError("response_format: only {\"type\": \"text\"} is supported", "response_format",
                       "unsupported_parameter")
