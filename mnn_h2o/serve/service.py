"""What a request does to the model (on the model thread): a chat turn continues a session of the
pool; a plain completion runs on a cache of its own, freed after the answer.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional

from ..engine import Llm, Sampling
from ..errors import ContextOverflowError
from ..session import Session, loads_over
from .pool import SessionPool
from .validation import ApiError, ChatRequest, CompletionRequest, SamplingParams

# Session/engine finish reasons -> OpenAI's.
_FINISH = {"stop": "stop", "length": "length", "cancelled": "cancelled",
           "stop_token": "stop", "stop_string": "stop", "max_new_tokens": "length"}


@dataclass
class Outcome:
    text: str
    finish_reason: str       # stop | length | cancelled
    prompt_tokens: int       # tokens prefilled for this request
    completion_tokens: int
    cached_tokens: int       # tokens of the conversation already in the cache, not prefilled again
    kv_bytes_held: int       # the conversation's KV cache after the answer
    whole_model_ratio: float
    session: Optional[str] = None  # chat: "new", "continued" (was in memory) or "restored" (from the session store)


class _Cancelled(Exception):
    pass


def _sampling(p: SamplingParams) -> Sampling:
    return Sampling(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed)


def context_error(e: ContextOverflowError, param: str) -> ApiError:
    return ApiError(str(e), param, "context_length_exceeded")


class Service:
    def __init__(self, llm: Llm, pool: SessionPool, max_tokens_limit: int):
        self.llm, self.pool, self.max_tokens_limit = llm, pool, max_tokens_limit

    @staticmethod
    def session_factories(llm: Llm):
        """The pool's ways to make a session and to load one from saved-session bytes."""
        return (lambda: Session(llm, compress_after_answer=True)), \
            (lambda data, where: Session.from_bytes(data, llm, where, compress_after_answer=True))

    @staticmethod
    def store_namespace(llm: Llm) -> str:
        """The pool's namespace of store keys: what a saved session must match to load here
        (mnn_h2o/session.py ``loads_over``), so servers of another model never meet its sessions."""
        identity = json.dumps(loads_over(llm), sort_keys=True)
        return "mnn_h2o.serve/" + hashlib.sha256(identity.encode("utf-8")).hexdigest()[:32]

    def chat(self, req: ChatRequest, emit: Callable[[str], None], cancel: threading.Event) -> Outcome:
        if cancel.is_set():  # the client left while the request waited
            return Outcome("", "cancelled", 0, 0, 0, 0, 0.0)
        max_new = req.max_tokens if req.max_tokens is not None else self._room(req.messages)
        try:
            with self.pool.checkout(req.messages) as co:
                cached = len(co.session.token_ids) if co.reused_messages else 0
                r = co.session.reply(req.messages, max_new_tokens=max_new, sampling=_sampling(req.sampling),
                                     stop=req.stop, on_text=emit, cancel=cancel)
        except ContextOverflowError as e:
            raise context_error(e, "messages") from None
        how = "restored" if co.restored else "continued" if co.reused_messages else "new"
        return Outcome(r.text, _FINISH[r.finish_reason], r.prompt_tokens, r.completion_tokens, cached,
                       r.stats["kv_bytes_held"], r.stats["whole_model_ratio"], how)

    def _room(self, messages: List[dict]) -> int:
        """max_tokens when a chat request gives none: serve.max_tokens_limit, or what the
        context leaves after the conversation, whichever is less."""
        tok = self.llm.tokenizer
        used = len(tok.encode(tok.render_chat(messages, add_generation_prompt=True)))
        room = min(self.max_tokens_limit, self.llm.max_context - used)
        if room < 1:
            raise ApiError(f"the conversation takes {used} tokens, which leaves no room for an answer in "
                           f"the context of {self.llm.max_context} tokens", "messages", "context_length_exceeded")
        return room

    def complete(self, req: CompletionRequest, emit: Callable[[str], None], cancel: threading.Event) -> Outcome:
        if cancel.is_set():
            return Outcome("", "cancelled", 0, 0, 0, 0, 0.0)
        llm = self.llm
        ctx = llm.new_context()
        sent: List[str] = []

        def stream(piece: str) -> None:
            if cancel.is_set():
                raise _Cancelled
            sent.append(piece)
            emit(piece)

        try:
            with llm.using(ctx):
                try:
                    g = llm.generate(req.prompt, req.max_tokens, _sampling(req.sampling), stop=req.stop,
                                     stream=stream, chat=False)
                    text, reason, done = g.text, _FINISH[g.stop_reason], g.stats.generated_tokens
                except _Cancelled:
                    text, reason, done = "".join(sent), "cancelled", llm.stats.generated_tokens
                st = llm.stats
                return Outcome(text, reason, st.prompt_tokens, done, 0, st.kv_bytes_held, st.whole_model_ratio)
        except ContextOverflowError as e:
            raise context_error(e, "prompt") from None
        finally:
            with llm.lock:
                ctx.cache.reset()

    def write_turns(self) -> None:
        """Right after a chat answer, on the model thread, before the requests waiting: the turn
        goes to the store's writer (a snapshot here), so that another replica finds it at once;
        one whose compression waits goes after it (after_answer)."""
        self.pool.write_back()

    def after_answer(self) -> None:
        """After a chat answer, on the model thread, behind the requests already waiting: the
        compression the answer left, then the compressed turns handed to the store's writer."""
        self.pool.compress_held()
        self.pool.write_back()

    def stats(self) -> dict:
        return self.pool.stats()

    def close(self) -> None:
        self.pool.close()
