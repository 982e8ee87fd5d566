"""The server's conversations: which session a request continues, which stay in memory, and what
goes to the session store (session_store.py).

Matching. A request carries its whole conversation (OpenAI's protocol is stateless). A session's
key is a digest of the messages it holds (``conversation_keys``: SHA-256 over the namespace, i.e.
the model and cache a saved session must match, then each message's role and content in order).
Each proper prefix of a request's messages has a key, and the longest one held wins: a session in
memory, else one in the store, which is loaded (``restored``). Only the messages after it are
prefilled; none held: a new session. A session in memory that another server has continued
since (the store holds a longer prefix of the request) gives way to the stored one.

Memory: the KV bytes of the sessions in memory are held to ``kv_budget_bytes``. Over it, the
least recently used idle session leaves memory, written to the store first unless the store
already holds its last turn; its next request loads it again. The session in use never leaves,
so it may exceed the budget alone. At most ``max_sessions`` stay in memory.

Writing. A store that outlives the server (disk:PATH, Redis) gets every completed turn:
``write_back``, which the model thread runs right after the answer (and again after a compression
the answer left), snapshots each session whose last turn the store lacks, and one writer thread
writes them (the snapshot is the only part on the model thread). A conversation's new turn
replaces its previous one in the store.
The other stores (memory, a temporary directory) get a session only when it leaves memory, and
give it up when it comes back.

Failures cost a prefill, never an answer: a value that does not load (damaged, truncated,
another model's: Session.from_bytes refuses it) is deleted and its conversation prefilled again
(``restore_failed``); a store that cannot be reached is counted (``store_failed``), logged and
shown in /health (``store``), and the conversation is prefilled again.

Threads: ``checkout``, ``compress_held``, ``write_back`` and ``close`` run on the one model
thread (model_thread.py); ``stats`` on any thread; the writer thread only encodes and writes.
Sessions are made and loaded by the callables given, so tests can run the pool over a fake.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from .. import session_file
from .session_store import RETRY_AFTER_S, SessionStore, StoreUnavailable

log = logging.getLogger("mnn_h2o.serve")


def conversation_keys(namespace: str, messages: Sequence[dict]) -> List[str]:
    """``keys[k]`` is the store key of ``messages[:k]``, for k = 0 .. len(messages)."""
    h = hashlib.sha256(namespace.encode("utf-8"))
    keys = [h.hexdigest()]
    for m in messages:  # concatenated JSON arrays: no two message lists encode alike
        h.update(json.dumps([m["role"], m["content"]], ensure_ascii=False).encode("utf-8"))
        keys.append(h.hexdigest())
    return keys


@dataclass
class _Entry:
    id: str
    session: object
    key: Optional[str] = None     # key of the messages the session holds (None before its first turn)
    stored: Optional[str] = None  # key of the session's turn the store holds (its last one when == key)
    kv_bytes: int = 0             # its KV bytes when last measured (counts to the budget)
    held: bool = False            # its compression waits for compress_held (when last measured)


@dataclass
class Checkout:
    """A session for one request."""
    session: object
    reused_messages: int     # messages of the request the session already held (0: new session)
    restored: bool           # loaded from the store for this request


class SessionPool:
    def __init__(self, new_session: Callable[[], object], load_session: Callable[[bytes, str], object],
                 store: SessionStore, namespace: str, kv_budget_bytes: int, max_sessions: int):
        self._new, self._load = new_session, load_session
        self.store, self.namespace = store, namespace
        self.budget = kv_budget_bytes
        self.max_sessions = max_sessions
        self.write_every_turn = store.outlives_server
        self._entries: "OrderedDict[str, _Entry]" = OrderedDict()  # in memory; least recently used first
        self._lock = threading.Lock()  # the bookkeeping, shared with stats() and the writer thread
        self.counters = {"offloaded": 0, "restored": 0, "restore_failed": 0, "dropped": 0,
                         "compressed_after_answer": 0, "stored_turns": 0, "store_failed": 0}
        self._writer = _Writer(self)

    # --- requests ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def checkout(self, messages: List[dict]):
        """The session to answer ``messages`` with (restored or made as needed); after the
        request, it becomes the most recently used and the budget is enforced."""
        keys = conversation_keys(self.namespace, messages)
        e, reused = self._find(keys)
        longer = [keys[k] for k in range(len(messages) - 1, reused, -1)]  # longest first
        found = self._restore(longer, messages) if longer else None
        restored = found is not None
        if restored:
            if e is not None:
                self._drop(e, "another server continued its conversation")
            session, reused = found
            self._drop_beyond(self.max_sessions - 1)
            e = self._add(session, keys[reused])
        elif e is None:
            self._drop_beyond(self.max_sessions - 1)
            e = self._add(self._new(), None)
        with self._lock:
            self._entries.move_to_end(e.id)
        self._enforce_budget(keep=e)
        try:
            yield Checkout(e.session, reused, restored)
        finally:
            msgs = e.session.messages
            if not msgs or (len(msgs) == 1 and msgs[0]["role"] == "system"):
                self._drop(e)  # a first turn that failed: nothing worth keeping
            else:
                key = conversation_keys(self.namespace, msgs)[-1]
                for other in [o for o in self._entries.values() if o.key == key and o is not e]:
                    self._drop(other, "a newer session holds the same conversation")
                st = e.session.stats()
                with self._lock:
                    e.key, e.kv_bytes, e.held = key, st["kv_bytes_held"], st["compression_held"]
                self._enforce_budget(keep=e)

    def _add(self, session, key: Optional[str]) -> _Entry:
        st = session.stats()
        e = _Entry(uuid.uuid4().hex, session, key, key if self.write_every_turn else None,
                   st["kv_bytes_held"], st["compression_held"])
        with self._lock:
            self._entries[e.id] = e
        return e

    def _find(self, keys: List[str]):
        """The session in memory holding the longest proper prefix (the more recent on a tie) and its length."""
        length = {k: n for n, k in enumerate(keys[1:-1], start=1)}
        best, best_n = None, 0
        for e in self._entries.values():  # later = more recent: wins a tie
            n = length.get(e.key, 0)
            if n and n >= best_n:
                best, best_n = e, n
        return best, best_n

    def _restore(self, keys: List[str], messages: List[dict]):
        """(session, messages it holds) for the first of ``keys`` (longest prefix first) the store
        holds, or None."""
        try:
            i = self.store.first_present(keys)
            value = None if i is None else self.store.get(keys[i])
        except StoreUnavailable as err:
            self._store_failed("look up a conversation", err)
            return None
        if value is None:  # none, or replaced by another server's write in between
            return None
        key, n = keys[i], len(messages) - 1 - i
        where = f"stored session {key[:16]} ({self.store.where})"
        try:
            session = self._load(value, where)
        except ValueError as err:  # Session.from_bytes: damaged, truncated, another model's, ...
            log.warning("%s does not load (%s); deleted, its conversation prefills again", where, err)
            self._count("restore_failed")
            self._delete_quietly(key)
            return None
        if session.messages != messages[:n]:  # a forged value: its messages are not its key's
            log.warning("%s holds other messages than its key says; deleted, prefilling again", where)
            session.close()
            self._count("restore_failed")
            self._delete_quietly(key)
            return None
        if not self.write_every_turn:
            self._delete_quietly(key)  # it lives in memory until it leaves again
        self._count("restored")
        return session, n

    # --- memory --------------------------------------------------------------------------------
    def compress_held(self) -> int:
        """Runs the compression each session in memory left for after its answer (the most
        recently used first), then holds the budget again. Returns how many ran."""
        done = 0
        for e in reversed(list(self._entries.values())):
            if not e.held:
                continue
            try:
                ran = e.session.compress()
            except ValueError as err:  # no room for the pass: the session forgot its cache
                log.warning("session %s: compression after the answer failed (%s); its next turn "
                            "prefills the conversation again", e.id, err)
                ran = False
            done += ran
            st = e.session.stats()
            with self._lock:
                e.kv_bytes, e.held = st["kv_bytes_held"], st["compression_held"]
                self.counters["compressed_after_answer"] += ran
        if done:
            self._enforce_budget(keep=None)
        return done

    def kv_bytes_held(self) -> int:
        return sum(e.kv_bytes for e in self._entries.values())

    def _enforce_budget(self, keep: Optional[_Entry]) -> None:
        for e in list(self._entries.values()):  # least recently used first
            if self.kv_bytes_held() <= self.budget:
                return
            if e is not keep:
                self._offload(e)

    def _offload(self, e: _Entry) -> None:
        """An idle session leaves memory, in the store; when it cannot be written it is dropped
        (memory comes first)."""
        self._writer.settle(e)
        if e.key is None:  # no completed turn: nothing to keep
            self._drop(e)
            return
        try:
            if e.stored != e.key or self.store.first_present([e.key]) is None:
                self._write(e, *e.session.saved())
        except (StoreUnavailable, ValueError) as err:
            log.error("could not save session %s (%s); dropped: its next request prefills again", e.id, err)
            self._drop(e)
            return
        e.session.close()
        with self._lock:
            self._entries.pop(e.id, None)
            self.counters["offloaded"] += 1

    def _drop_beyond(self, n: int) -> None:
        """Drop the least recently used sessions until at most ``n`` are in memory."""
        while len(self._entries) > n:
            self._drop(next(iter(self._entries.values())), "over serve.max_sessions")

    def _drop(self, e: _Entry, why: str = "") -> None:
        self._writer.settle(e)
        e.session.close()
        with self._lock:
            self._entries.pop(e.id, None)
            self.counters["dropped"] += 1
        if why:
            log.debug("session %s dropped: %s", e.id, why)

    # --- the store -----------------------------------------------------------------------------
    def write_back(self) -> int:
        """With a store that outlives the server: hands every session whose last turn the store
        lacks to the writer thread (a snapshot here, the write there), but those whose
        compression waits (compress_held first: the turn is written as the next turn finds it).
        Returns how many."""
        if not self.write_every_turn:
            return 0
        handed = 0
        for e in list(self._entries.values()):
            if e.key is None or e.key == e.stored or e.held or self._writer.has(e, e.key):
                continue
            try:
                meta, cache = e.session.saved()
            except ValueError as err:  # lossless.mode store: not saveable (__main__ refuses it with such a store)
                log.error("session %s cannot be written to the store: %s", e.id, err)
                continue
            self._writer.submit(e, e.key, meta, cache)
            handed += 1
        return handed

    def _write(self, e: _Entry, meta: dict, cache: bytes, key: Optional[str] = None) -> None:
        """Writes ``e``'s turn ``key`` (its last one by default), replacing the turn the store held."""
        key = key or e.key
        self.store.put(key, session_file.encode(meta, cache), replaces=e.stored)
        with self._lock:
            e.stored = key
            self.counters["stored_turns"] += 1

    def _delete_quietly(self, key: str) -> None:
        try:
            self.store.delete(key)
        except StoreUnavailable as err:
            self._store_failed("delete a value", err)

    def _store_failed(self, what: str, err: Exception) -> None:
        self._count("store_failed")  # the store logs when it goes down and when it is back
        log.debug("session store: could not %s (%s)", what, err)

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1

    # --- state ---------------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            live = list(self._entries.values())
            out = {"sessions_in_memory": len(live),
                   "sessions_saved": self.store.count(),
                   "kv_bytes_held": sum(e.kv_bytes for e in live),
                   "sessions_compression_held": sum(1 for e in live if e.held),
                   "kv_budget_bytes": self.budget,
                   **self.counters}
            # Completed turns the store lacks yet (being written, or waiting for a store that is down).
            unwritten = sum(1 for e in live if e.key is not None and e.key != e.stored) if self.write_every_turn else 0
        out["store"] = dict(self.store.health(), writes_pending=unwritten)
        return out

    def close(self) -> None:
        """Waits for the writes under way; a store that outlives the server then gets every
        session in memory whose last turn it lacks. The sessions are closed."""
        self._writer.close()
        for e in list(self._entries.values()):
            if self.write_every_turn and e.key is not None and e.key != e.stored:
                try:
                    self._write(e, *e.session.saved())
                except (StoreUnavailable, ValueError) as err:
                    log.error("could not save session %s at stop (%s); its next request prefills again", e.id, err)
            e.session.close()
        with self._lock:
            self._entries.clear()


class _Writer:
    """The thread that writes snapshots to the store, oldest first. Only a session's newest
    snapshot waits: a newer one replaces it."""

    def __init__(self, pool: SessionPool):
        self._pool = pool
        self._jobs: "OrderedDict[str, tuple]" = OrderedDict()  # entry id -> (entry, key, meta, cache)
        self._busy: Optional[_Entry] = None
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="mnn_h2o-store-writer", daemon=True)
        self._thread.start()

    def submit(self, e: _Entry, key: str, meta: dict, cache: bytes) -> None:
        with self._cond:
            self._jobs[e.id] = (e, key, meta, cache)
            self._cond.notify_all()

    def has(self, e: _Entry, key: str) -> bool:
        with self._cond:
            job = self._jobs.get(e.id)
            return job is not None and job[1] == key

    def settle(self, e: _Entry) -> None:
        """Forget ``e``'s waiting snapshot and wait for its write under way, if any."""
        with self._cond:
            self._jobs.pop(e.id, None)
            self._cond.wait_for(lambda: self._busy is not e)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closing)
                if not self._jobs:
                    return
                _, (e, key, meta, cache) = self._jobs.popitem(last=False)
                self._busy = e
            retry = False
            try:
                self._pool._write(e, meta, cache, key)
            except StoreUnavailable as err:
                self._pool._store_failed(f"write session {e.id}'s turn", err)
                retry = True
            except Exception:  # a bug: logged, the writer goes on
                log.exception("writing session %s to the store failed", e.id)
            with self._cond:
                self._busy = None
                # The store is down: the snapshot waits for it (unless a newer one came), so a
                # turn answered meanwhile reaches the store once it is back.
                if retry and not self._closing and e.id not in self._jobs:
                    self._jobs[e.id] = (e, key, meta, cache)
                    self._jobs.move_to_end(e.id, last=False)
                self._cond.notify_all()
                if retry:
                    self._cond.wait_for(lambda: self._closing, timeout=RETRY_AFTER_S)
