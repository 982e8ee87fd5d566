"""A conversation over its own KV cache: turns through the chat template, history kept compressed.

    llm = Llm.load("smollm2")
    s = Session(llm, system="You are terse.")
    print(s.say("Name a prime number.", max_new_tokens=32).text)
    s.save("chat.session")                     # the cache as held (docs/session_format.md)
    s2 = Session.load("chat.session", llm)     # continues with the same logits

Several sessions share one :class:`~mnn_h2o.engine.Llm` (its MNN modules); each owns a native
cache configured by its config (runtime.kv_dtype, eviction, lossless). Each call runs under the Llm's
lock, so sessions may be used from several threads: their turns are serialised.

How a turn is fed (docs/sessions.md "Turns and the chat template"): the whole conversation is
rendered with the template, and only the text after what the cache already holds is tokenised
and prefilled. The match is on text: ``_fed_text`` is exactly the text the cache's tokens stand
for, and the render of the history must start with it.

``compress_after_answer`` (the chat and the server set it; docs/sessions.md "Compression after
the answer"): a turn's answer starts from the cache as prefilled, and kvzip's pass and eviction
wait for :meth:`Session.compress`, which the caller runs while the session is idle; a turn that
finds them still waiting runs them first, so a session holds more than its budget only from its
prompt to the end of its answer, as long as the pass alone would.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from . import config as config_mod
from . import session_file
from .engine import Llm, Sampling, Stats
from .errors import ContextOverflowError, SessionClosedError, SessionFileError
from .reconstruction import PassCancelled

# The model identity a saved session must match (docs/session_format.md, META "model").
_MODEL_KEYS = ("n_layers", "n_kv_heads", "n_heads", "head_dim", "vocab")
# The Stats counters a saved session keeps; the byte counters are recomputed from the cache.
_SAVED_STATS = ("prompt_tokens", "generated_tokens", "prefill_s", "decode_s", "decode_steps", "mnn_s",
                "mnn_calls", "dense_s", "convert_s", "attention_s", "policy_s", "head_s", "evictions", "kv_bytes_peak",
                "decode_bytes_uncompressed_sum", "decode_bytes_held_sum")

ROLES = ("system", "user", "assistant")


@dataclass
class Reply:
    text: str
    finish_reason: str      # "stop" (end of turn or a stop string) | "length" | "cancelled"
    prompt_tokens: int      # tokens prefilled this turn (the new messages only, with prefix reuse)
    completion_tokens: int  # tokens generated
    stats: dict = field(default_factory=dict)  # Session.stats() after the turn


def check_messages(messages: Sequence[dict]) -> List[dict]:
    """The messages as plain {"role", "content"} dicts; ValueError naming the first bad one."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}]: role must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]: content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


class Session:
    """A conversation over its own native KV cache (see the module docstring)."""

    def __init__(self, llm: Llm, cfg: Optional[dict] = None, system: Optional[str] = None,
                 compress_after_answer: bool = False):
        self.llm = llm
        self.compress_after_answer = compress_after_answer
        self.cfg = llm.cfg if cfg is None else config_mod.validate(None, cfg)
        if not llm.tokenizer.chat_template:
            raise ValueError("sessions need a chat model: this model has no chat template "
                             "(tokenizer.chat_template in its GGUF)")
        self._ctx = llm.new_context(self.cfg)
        self._system = system
        self.reset()

    # --- state -------------------------------------------------------------------------------
    @property
    def messages(self) -> List[dict]:
        """The conversation so far (copies)."""
        return [dict(m) for m in self._messages]

    @property
    def token_ids(self) -> List[int]:
        """Every token id fed to the cache so far, including those since evicted: the prefix key."""
        return list(self._token_ids)

    def reset(self) -> None:
        """Back to an empty conversation (the system message kept); the KV memory is returned."""
        with self._using() as llm:
            llm.reset()
        self._messages: List[dict] = [{"role": "system", "content": self._system}] if self._system else []
        # The conversation as the model saw it: an assistant answer cut by a stop string is held
        # up to the last token fed, which may hold the stop string's start (see reply()).
        self._rendered: List[dict] = [dict(m) for m in self._messages]
        self._token_ids: List[int] = []
        self._fed_text = ""  # the text the cache's tokens stand for

    def close(self) -> None:
        """Frees the native cache. Any later call but close() raises SessionClosedError."""
        if self._ctx is not None:
            with self.llm.lock:
                self._ctx.cache.reset()
                self._ctx = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _using(self):
        if self._ctx is None:
            raise SessionClosedError("the session is closed")
        return self.llm.using(self._ctx)

    def common_prefix(self, messages: Sequence[dict]) -> int:
        """How many leading messages of ``messages`` equal the session's."""
        n = 0
        for a, b in zip(self._messages, messages):
            if not isinstance(b, dict) or a["role"] != b.get("role") or a["content"] != b.get("content"):
                break
            n += 1
        return n

    def stats(self) -> dict:
        """tokens (fed, = len(token_ids)), tokens_held (mean over layers and kv heads of the tokens
        a head holds after eviction), kv_bytes_held (everything the cache holds), kv_bytes_f16
        (an f16 cache of every token fed), whole_model_ratio (their ratio; Stats in engine.py) and
        compression_held (a pass and eviction wait for compress()). Waits for a compress() that
        another thread runs."""
        with self.llm.lock:
            if self._ctx is None:
                raise SessionClosedError("the session is closed")
            st, cache = self._ctx.stats, self._ctx.cache
            c = self.llm.config
            held = sum(cache.length(layer, h) for layer in range(c.n_layers) for h in range(c.n_kv_heads))
            return {"tokens": len(self._token_ids),
                    "tokens_held": round(held / (c.n_layers * c.n_kv_heads)),
                    "kv_bytes_held": st.kv_bytes_held,
                    "kv_bytes_f16": st.kv_bytes_f16,
                    "whole_model_ratio": st.whole_model_ratio,
                    "compression_held": self._ctx.held}

    def compress(self, cancel: Optional[threading.Event] = None, progress=None) -> bool:
        """Runs the pass and eviction a turn left for later (``compress_after_answer``); False
        when none waited. ``cancel.set()`` (another thread) stops the pass: the cache is then
        forgotten and the next turn prefills the conversation again, nothing of it lost.
        ``progress`` as reply()'s (stage "pass")."""
        with self._using() as llm:
            return self._compress_now(llm, progress, cancel)

    # --- snapshots ---------------------------------------------------------------------------
    def fork(self) -> "Session":
        """An independent copy of this session (cache included) that can diverge from it."""
        blob = self._snapshot()
        twin = Session(self.llm, self.cfg, self._system, self.compress_after_answer)
        twin._install(blob, self._state(), {k: getattr(self._ctx.stats, k) for k in _SAVED_STATS})
        return twin

    def save(self, path: str) -> None:
        """Writes the session (conversation and cache as held) to ``path`` atomically
        (docs/session_format.md). ValueError when the lossless store is on."""
        session_file.write(path, *self.saved())

    def saved(self) -> Tuple[dict, bytes]:
        """The session as saved: its META and its cache's bytes (session_file.encode makes them the
        saved-session bytes). ValueError when the lossless store is on."""
        meta = dict(self._state(), model=_model_identity(self.llm),
                    cache={"block_tokens": self._ctx.cache.block_tokens, "max_tokens": self._ctx.cache.max_tokens},
                    config={"runtime": {"kv_dtype": self.cfg["runtime"]["kv_dtype"]},
                            "eviction": self.cfg["eviction"], "lossless": self.cfg["lossless"]},
                    stats={k: getattr(self._ctx.stats, k) for k in _SAVED_STATS})
        return meta, self._snapshot()

    @classmethod
    def load(cls, path: str, llm: Llm, compress_after_answer: bool = False) -> "Session":
        """The session saved in ``path``, over ``llm``'s model, with the cache settings it was
        saved with (a pass left for compress() is not saved: the next turn's runs it).
        SessionFileError (a ValueError) for a file that is not a session, damaged,
        truncated, newer, or from another model or incompatible settings."""
        meta, blob = session_file.read(path)
        return cls.from_saved(meta, blob, llm, f"session file {path}", compress_after_answer)

    @classmethod
    def from_bytes(cls, data: bytes, llm: Llm, where: str, compress_after_answer: bool = False) -> "Session":
        """load() of saved-session bytes held elsewhere than in a file (the server's session
        store); ``where`` names them in errors."""
        meta, blob = session_file.decode(data, where)
        return cls.from_saved(meta, blob, llm, where, compress_after_answer)

    @classmethod
    def from_saved(cls, meta: dict, blob: bytes, llm: Llm, where: str,
                   compress_after_answer: bool = False) -> "Session":
        """The session of a decoded META and cache (load()'s checks; ``where`` names it)."""
        saved_model, model = meta.get("model"), _model_identity(llm)
        if saved_model != model:
            raise SessionFileError(f"{where} was saved with another model ({_describe(saved_model)}); "
                                   f"this one is {_describe(model)}")
        cache = meta.get("cache") or {}
        for key, mine in (("block_tokens", llm.cfg["runtime"]["block_tokens"]), ("max_tokens", llm.max_context)):
            if cache.get(key) != mine:
                raise SessionFileError(f"{where} holds a cache with {key} {cache.get(key)}; this model is "
                                       f"loaded with {mine} (runtime.block_tokens / runtime.max_context)")
        try:
            cfg = config_mod.validate(meta.get("config"), llm.cfg, notify=False)  # its own old names, silently
        except ValueError as e:
            raise SessionFileError(f"{where}: its settings are not valid here: {e}") from None
        try:
            state = _checked_state(meta, llm)
        except (KeyError, TypeError, ValueError) as e:
            raise SessionFileError(f"{where} is damaged: its META section is malformed ({e})") from None
        s = cls(llm, cfg, state["system"], compress_after_answer)
        try:
            s._install(blob, state, meta.get("stats"))
        except ValueError as e:
            s.close()
            raise SessionFileError(f"{where}: its cache does not load: {e}") from None
        return s

    def _snapshot(self) -> bytes:
        if self.cfg["lossless"]["mode"] != "off":
            raise ValueError(f"a session with lossless.mode {self.cfg['lossless']['mode']} cannot be saved or "
                             f"forked (the lossless store is not part of the session format); use "
                             f"lossless.mode off")
        with self._using() as llm:
            return llm.cache.snapshot()

    def _state(self) -> dict:
        return {"system": self._system, "messages": self.messages, "rendered": [dict(m) for m in self._rendered],
                "token_ids": list(self._token_ids), "fed_text": self._fed_text,
                "unpassed": len(self._ctx.unpassed)}

    def _install(self, blob: bytes, state: dict, stats: Optional[dict] = None) -> None:
        """Restores the cache from ``blob`` and the conversation from ``state`` (already checked)."""
        with self._using() as llm:
            llm.cache.restore(blob)
            seen = llm.cache.eviction_stats()["layers"][0]["tokens_seen"]
            if seen != len(state["token_ids"]):
                llm.reset()
                raise ValueError(f"the cache has seen {seen} tokens, the conversation {len(state['token_ids'])}")
            llm.pos = seen
            llm.unpassed = state["token_ids"][seen - state["unpassed"]:]
            llm.stats = Stats(**{k: v for k, v in (stats or {}).items() if k in _SAVED_STATS})
            llm.refresh_kv_stats()
        self._messages = [dict(m) for m in state["messages"]]
        self._rendered = [dict(m) for m in state["rendered"]]
        self._token_ids = list(state["token_ids"])
        self._fed_text = state["fed_text"]

    # --- turns -------------------------------------------------------------------------------
    def say(self, text: str, **kw) -> Reply:
        """reply() to the conversation so far plus one user message."""
        return self.reply(self._messages + [{"role": "user", "content": text}], **kw)

    def add(self, messages: Sequence[dict], progress=None) -> int:
        """Feeds ``messages`` (which must start with the session's messages and add at least one)
        into the cache without an answer: turns the caller writes, an assistant's included (a
        conversation given in advance, a fixed acknowledgement). They are prefilled as one prompt
        (evicted after it, as a turn is) and appended to the messages. Returns the tokens
        prefilled. Errors as reply()'s; ``progress`` as reply()'s."""
        messages = check_messages(messages)
        with self._using() as llm:
            new = self._new_messages(messages)
            if llm.held:
                self._compress_now(llm, progress)
            ids, _ = self._prefill(llm, new, generation_prompt=False, reserve=0, progress=progress)
            self._messages += new
            self._rendered += new
        return len(ids)

    def reply(self, messages: Sequence[dict], max_new_tokens: int = 256, sampling: Optional[Sampling] = None,
              stop: Iterable[str] = (), on_text: Optional[Callable[[str], None]] = None,
              cancel: Optional[threading.Event] = None, progress=None) -> Reply:
        """The assistant's answer to ``messages``, which must start with the session's messages
        and add at least one. Only the new messages are prefilled. The answer streams through
        ``on_text`` (text pieces) and ends at the end-of-turn token ("stop"), a stop string
        ("stop", cut before it), max_new_tokens ("length") or ``cancel.set()`` ("cancelled");
        it is appended to the messages and its tokens stay in the cache. ``progress`` follows the
        turn's prefill (``Llm.prefill``'s: the prompt, then a kvzip pass when one runs).

        Raises ValueError for messages that do not extend the session's, ContextOverflowError
        when the turn plus max_new_tokens exceeds the context (the session is left as it was)."""
        messages = check_messages(messages)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        sampling = sampling or Sampling()
        stops = [s for s in stop if s]
        with self._using() as llm:  # the lock: another thread's turn cannot come in between
            new = self._new_messages(messages)
            if llm.held:  # the last turn's compression did not run while the session was idle
                self._compress_now(llm, progress)
            ids, logits = self._prefill(llm, new, generation_prompt=True, reserve=max_new_tokens, progress=progress,
                                        defer=self.compress_after_answer)
            try:
                # Every token but the last is fed (its logits give the next); the last only when
                # the turn ended at the end-of-turn token, which itself is never fed: the next
                # render writes it.
                d = llm.sample_tokens(logits, max_new_tokens, sampling, stops, on_text, cancel, feed_last=False)
                answer, out, fed, reason = d.text, d.token_ids, d.fed, _FINISH[d.stop_reason]
                self._token_ids += out[:fed]
            except BaseException:
                self._forget_cache(llm)
                raise
            fed_text = llm.tokenizer.decode(out[:fed])
            self._fed_text += fed_text
            self._messages += new + [{"role": "assistant", "content": answer}]
            self._rendered += new + [{"role": "assistant",
                                      "content": answer if answer.startswith(fed_text) else fed_text}]
        return Reply(answer, reason, len(ids), len(out), self.stats())

    def _new_messages(self, messages: List[dict]) -> List[dict]:
        """The messages after the session's; ValueError unless they extend it by at least one."""
        n = self.common_prefix(messages)
        if n < len(self._messages):
            raise ValueError(f"messages must extend the session's {len(self._messages)} messages: "
                             f"message {n} differs")
        new = messages[n:]
        if not new:
            raise ValueError(f"no new message after the session's {len(self._messages)}")
        return new

    def _compress_now(self, llm: Llm, progress, cancel: Optional[threading.Event] = None) -> bool:
        try:
            return llm.compress(progress, cancel)
        except PassCancelled:
            self._forget_cache(llm)
            return False
        except BaseException:
            self._forget_cache(llm)
            raise

    def _prefill(self, llm: Llm, new: List[dict], generation_prompt: bool, reserve: int, progress=None,
                 defer: bool = False):
        """Prefills what the render of the conversation plus ``new`` adds to the cache (all of it
        when the render no longer starts with the text fed; ``defer``: Llm.prefill's defer_pass).
        Returns the ids fed and the last logits. ContextOverflowError, before anything is fed,
        when they and ``reserve`` more tokens pass the context."""
        tok = llm.tokenizer
        text = tok.render_chat(self._rendered + new, add_generation_prompt=generation_prompt)
        # A template whose render of the history changes as the conversation grows cannot
        # reuse the cache: the conversation is then prefilled again from the start.
        rebuild = self._fed_text is None or not text.startswith(self._fed_text)
        suffix = text if rebuild else text[len(self._fed_text):]
        ids = (tok.sequence_start() if rebuild else []) + tok.encode(suffix)
        start = 0 if rebuild else llm.pos
        if start + len(ids) + reserve > llm.max_context:
            raise ContextOverflowError(
                f"context overflow: {start} tokens in the conversation + {len(ids)} new + "
                f"max_new_tokens {reserve} > limit {llm.max_context} (runtime.max_context / "
                f"the model's context); reset the session or ask for fewer tokens")
        try:
            if rebuild:
                llm.reset()
                self._token_ids, self._fed_text = [], ""
            logits = llm.prefill(ids, reserve=reserve, progress=progress, defer_pass=defer)
        except BaseException:
            self._forget_cache(llm)
            raise
        self._token_ids += ids
        self._fed_text += suffix
        return ids, logits

    def _forget_cache(self, llm: Llm) -> None:
        """After a turn failed midway the cache no longer matches token_ids: forget it, keep the
        conversation; the next turn prefills the conversation again."""
        llm.reset()
        self._token_ids, self._fed_text = [], None


# OpenAI's finish reasons for the engine's stop reasons.
_FINISH = {"max_new_tokens": "length", "stop_token": "stop", "stop_string": "stop", "cancelled": "cancelled"}


def _model_identity(llm: Llm) -> dict:
    meta = llm.meta
    return dict({k: getattr(llm.config, k) for k in _MODEL_KEYS}, name=llm.config.name,
                source_sha256=meta["source_sha256"], weight_bits=meta["weight_bits"],
                head_bits=meta.get("head_bits", meta["weight_bits"]), export_version=meta["export_version"])


def loads_over(llm: Llm) -> dict:
    """What a saved session must match to load over ``llm`` (Session.from_saved refuses the
    others): the model's identity, the cache's block size and context limit, the format version.
    The server keys its stored sessions with it, so servers of other models never meet theirs."""
    return {"model": _model_identity(llm), "block_tokens": llm.cfg["runtime"]["block_tokens"],
            "max_tokens": llm.max_context, "format": session_file.VERSION}


def _describe(model) -> str:
    if not isinstance(model, dict):
        return "unknown"
    sha = str(model.get("source_sha256", "?"))[:12]
    return f"{model.get('name', '?')}, GGUF sha256 {sha}..., weights int{model.get('weight_bits', '?')}"


def _checked_state(meta: dict, llm: Llm) -> dict:
    """The conversation fields of a saved META, type-checked (ValueError/TypeError/KeyError)."""
    system, fed = meta["system"], meta["fed_text"]
    if system is not None and not isinstance(system, str):
        raise TypeError("system is not a string")
    if fed is not None and not isinstance(fed, str):
        raise TypeError("fed_text is not a string")
    ids = meta["token_ids"]
    vocab = llm.config.vocab
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < vocab for t in ids):
        raise ValueError(f"token_ids must be a list of ints in [0, {vocab})")
    if len(ids) > llm.max_context:
        raise ValueError(f"{len(ids)} token ids exceed the context limit {llm.max_context}")
    stats = meta.get("stats")
    if not isinstance(stats, dict) or not all(isinstance(v, (int, float)) for v in stats.values()):
        raise TypeError("stats is not a mapping of numbers")
    unpassed = meta.get("unpassed", 0)  # absent from files written before it was kept
    if type(unpassed) is not int or not 0 <= unpassed <= len(ids):
        raise ValueError(f"unpassed must be an int in [0, {len(ids)}]")
    messages, rendered = check_messages(meta["messages"]), check_messages(meta["rendered"])
    if len(rendered) != len(messages):
        raise ValueError(f"{len(messages)} messages but {len(rendered)} rendered")
    return {"system": system, "messages": messages, "rendered": rendered, "token_ids": ids, "fed_text": fed,
            "unpassed": unpassed}
