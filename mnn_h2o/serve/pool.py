"""The server's conversations: which session a request continues, and which stay in memory.

A request carries its whole conversation (OpenAI's protocol is stateless). The pool finds the
session whose messages are the longest proper prefix of the request's, equal in role and content
(``find``): only the messages after it are prefilled. No match: a new session, whose first turn
prefills the whole conversation. Nothing the client needs is held only here: a dropped or lost
session costs a prefill, never an answer.

Memory: the KV bytes of the sessions in memory are held to ``kv_budget_bytes``. Over it, the
least recently used idle session is saved to ``session_dir`` (the saved-session format of
mnn_h2o/session.py, plus a small JSON file with its messages, so that matching never opens a
saved cache) and closed; its next request loads it again. The session in use is never offloaded,
so it may exceed the budget alone. At most ``max_sessions`` are kept, in memory or on disk.
A session's answer starts from its cache as prefilled (Session's ``compress_after_answer``); its
kvzip pass and eviction run in ``compress_held``, which the model thread calls after the answer,
behind the requests already waiting (docs/serve.md "Compression after the answer"), or at the
start of its next turn when that comes first.

Files: ``<id>.session`` (the cache) and ``<id>.json`` (messages, written after the cache, so a
``.json`` names a complete ``.session``). A restored session's files are deleted: it lives in
memory until it is offloaded again. ``close`` saves every session in memory. After a crash, the
sessions on disk load on their next request; those that were in memory are lost. A server
started on a directory indexes the saved sessions it finds (newest last in the LRU order).

Threads: ``checkout`` and ``close`` run on the one model thread (model_thread.py); ``stats``
may be called from any thread. Sessions are made and loaded by the callables given, so tests can
run the pool over a fake engine.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, List, Optional

log = logging.getLogger("mnn_h2o.serve")

INDEX_FORMAT = "mnn_h2o.serve.session_index"
INDEX_VERSION = 1


class SessionDirInUse(OSError):
    """Another server holds the session directory."""


@dataclass
class _Entry:
    id: str
    messages: List[dict]     # the conversation the session holds (a saved one: as it was saved)
    session: object = None   # the Session, or None while it is saved on disk
    kv_bytes: int = 0        # its KV bytes when last measured (in memory: counts to the budget)
    held: bool = False       # its compression waits for compress_held (when last measured)


@dataclass
class Checkout:
    """A session for one request."""
    session: object
    reused_messages: int     # messages of the request the session already held (0: new session)
    restored: bool           # loaded from disk for this request


class SessionPool:
    def __init__(self, new_session: Callable[[], object], load_session: Callable[[str], object],
                 session_dir: str, kv_budget_bytes: int, max_sessions: int):
        self._new, self._load = new_session, load_session
        self.dir = session_dir
        self.budget = kv_budget_bytes
        self.max_sessions = max_sessions
        self._entries: "OrderedDict[str, _Entry]" = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # the bookkeeping, for stats() from other threads
        self.counters = {"offloaded": 0, "restored": 0, "restore_failed": 0, "dropped": 0,
                         "compressed_after_answer": 0}
        os.makedirs(session_dir, exist_ok=True)
        self._dir_lock = open(os.path.join(session_dir, ".lock"), "a")
        try:
            fcntl.flock(self._dir_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._dir_lock.close()
            raise SessionDirInUse(f"session directory {session_dir} is in use by another server") from None
        self._index_saved()

    # --- requests ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def checkout(self, messages: List[dict]):
        """The session to answer ``messages`` with (restored or made as needed); after the
        request, it becomes the most recently used and the budget is enforced."""
        e = self._find(messages)
        reused, restored = (len(e.messages), False) if e is not None else (0, False)
        if e is not None and e.session is None:
            restored = self._restore(e)
            if not restored:
                e, reused = None, 0
        if e is None:
            self._drop_beyond(self.max_sessions - 1)
            e = _Entry(uuid.uuid4().hex, [], self._new())
            with self._lock:
                self._entries[e.id] = e
        with self._lock:
            self._entries.move_to_end(e.id)
        self._enforce_budget(keep=e)
        try:
            yield Checkout(e.session, reused, restored)
        finally:
            e.messages = e.session.messages
            if not e.messages or (len(e.messages) == 1 and e.messages[0]["role"] == "system"):
                self._drop(e)  # a first turn that failed: nothing worth keeping
            else:
                st = e.session.stats()
                e.kv_bytes, e.held = st["kv_bytes_held"], st["compression_held"]
                self._enforce_budget(keep=e)

    def _find(self, messages: List[dict]) -> Optional[_Entry]:
        best = None
        for e in self._entries.values():  # later = more recent: wins a tie
            n = len(e.messages)
            if 0 < n < len(messages) and messages[:n] == e.messages and (best is None or n >= len(best.messages)):
                best = e
        return best

    # --- memory --------------------------------------------------------------------------------
    def compress_held(self) -> int:
        """Runs the compression each session in memory left for after its answer (the most
        recently used first), then holds the budget again. Returns how many ran."""
        done = 0
        for e in reversed(list(self._entries.values())):
            if e.session is None or not e.held:
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
        return sum(e.kv_bytes for e in self._entries.values() if e.session is not None)

    def _enforce_budget(self, keep: _Entry) -> None:
        for e in list(self._entries.values()):  # least recently used first
            if self.kv_bytes_held() <= self.budget:
                return
            if e is not keep and e.session is not None:
                self._offload(e)

    def _offload(self, e: _Entry) -> None:
        """Save and close an idle session; on failure drop it (memory comes first)."""
        try:
            e.session.save(self._path(e.id, ".session"))  # atomic: a complete file or none
            _write_json(self._path(e.id, ".json"), {"format": INDEX_FORMAT, "version": INDEX_VERSION,
                                                    "messages": e.messages, "kv_bytes": e.kv_bytes})
        except (OSError, ValueError) as err:
            log.error("could not save session %s (%s); dropped: its next request prefills again", e.id, err)
            self._drop(e)
            return
        e.session.close()
        with self._lock:
            e.session = None
            self.counters["offloaded"] += 1

    def _restore(self, e: _Entry) -> bool:
        path = self._path(e.id, ".session")
        try:
            session = self._load(path)
        except (OSError, ValueError) as err:
            log.warning("could not restore session %s (%s); its conversation prefills again", e.id, err)
            self._drop(e)
            with self._lock:
                self.counters["restore_failed"] += 1
            return False
        if session.messages != e.messages:
            log.warning("session %s: its file holds other messages than its index; prefilling again", e.id)
            session.close()
            self._drop(e)
            return False
        self._remove_files(e.id)
        with self._lock:
            e.session = session
            st = session.stats()
            e.kv_bytes, e.held = st["kv_bytes_held"], st["compression_held"]
            self.counters["restored"] += 1
        return True

    def _drop_beyond(self, n: int) -> None:
        """Drop the least recently used sessions until at most ``n`` are kept."""
        while len(self._entries) > n:
            self._drop(next(iter(self._entries.values())))

    def _drop(self, e: _Entry) -> None:
        if e.session is not None:
            e.session.close()
        self._remove_files(e.id)
        with self._lock:
            self._entries.pop(e.id, None)
            self.counters["dropped"] += 1

    # --- files ---------------------------------------------------------------------------------
    def _path(self, sid: str, ext: str) -> str:
        return os.path.join(self.dir, sid + ext)

    def _remove_files(self, sid: str) -> None:
        for name in os.listdir(self.dir):
            if name.startswith(sid + "."):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.dir, name))

    def _index_saved(self) -> None:
        """The saved sessions of an earlier server, oldest first; leftovers of an interrupted save
        and unreadable indexes are removed."""
        found = []
        for name in os.listdir(self.dir):
            sid, ext = os.path.splitext(name)
            if ext.startswith(".tmp"):  # a save cut short (ours: .json.tmp; the session's: .session.tmpPID)
                os.remove(os.path.join(self.dir, name))
                continue
            if ext != ".json":
                continue
            path = os.path.join(self.dir, name)
            messages = _read_index(path)
            if messages is None or not os.path.exists(self._path(sid, ".session")):
                log.warning("ignoring %s: not a complete saved session", path)
                self._remove_files(sid)
                continue
            found.append((os.path.getmtime(path), sid, messages))
        for _, sid, messages in sorted(found):
            self._entries[sid] = _Entry(sid, messages)
        for name in os.listdir(self.dir):  # a .session without its index: its save was cut
            sid, ext = os.path.splitext(name)
            if ext == ".session" and sid not in self._entries:
                os.remove(os.path.join(self.dir, name))
        self._drop_beyond(self.max_sessions)
        if found:
            log.info("%d saved sessions found in %s", len(self._entries), self.dir)

    # --- state ---------------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            live = [e for e in self._entries.values() if e.session is not None]
            return {"sessions_in_memory": len(live),
                    "sessions_saved": len(self._entries) - len(live),
                    "kv_bytes_held": sum(e.kv_bytes for e in live),
                    "sessions_compression_held": sum(1 for e in live if e.held),
                    "kv_budget_bytes": self.budget,
                    **self.counters}

    def close(self, save: bool = True) -> None:
        """Save (or just close) every session in memory, then let the directory go."""
        for e in list(self._entries.values()):
            if e.session is not None:
                if save:
                    self._offload(e)
                else:
                    e.session.close()
        fcntl.flock(self._dir_lock, fcntl.LOCK_UN)
        self._dir_lock.close()


def _write_json(path: str, obj: dict) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def _read_index(path: str) -> Optional[List[dict]]:
    """The messages of a saved session's index, or None if it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(obj, dict) or obj.get("format") != INDEX_FORMAT or obj.get("version") != INDEX_VERSION:
        return None
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not all(
            isinstance(m, dict) and set(m) == {"role", "content"} and all(isinstance(v, str) for v in m.values())
            for m in msgs):
        return None
    return msgs
