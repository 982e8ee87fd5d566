"""Where the server keeps the conversations it does not hold in memory: a session store, one
interface over three backends, chosen by ``serve.session_store`` (docs/serve.md "Several replicas"):

    memory                 a dict in this process: nothing outlives the server
    disk:PATH              files in PATH, one server at a time (disk: alone: a temporary directory
                           removed when the server stops)
    redis://HOST:PORT/DB   a Redis database, shared by every server that names it

A value is a conversation's saved-session bytes (docs/session_format.md; checked when loaded, by
Session.from_bytes), a key the digest the pool makes of the messages the session holds (pool.py):
each turn of a conversation has its own key, so two servers never write different turns into one
value, and a write is whole or absent (a Redis SET, a file renamed into place). ``put(key, value,
replaces=previous)`` writes a conversation's new turn and deletes its previous one together.

The memory and disk stores are this server's alone and hold at most ``max_values`` values, the
least recently used going first. A Redis store is bounded by Redis itself (its maxmemory policy).

A backend that fails (Redis unreachable, a full disk) raises :class:`StoreUnavailable`, and
``health()`` says so until a call succeeds again; the pool counts it and the conversation is
prefilled again. After a failure the store is not tried again for ``RETRY_AFTER_S``, so that a
store that is down costs a request nothing but the prefill.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from collections import OrderedDict
from typing import List, Optional, Sequence

from ..session_file import write_atomic

log = logging.getLogger("mnn_h2o.serve")

RETRY_AFTER_S = 2.0
REDIS_CONNECT_TIMEOUT_S = 1.0
REDIS_TIMEOUT_S = 10.0       # a whole value of tens of MB on one connection
REDIS_PREFIX = "mnn_h2o:session:"
_KEY = re.compile(r"[0-9a-f]{64}")  # the pool's keys: SHA-256 digests in hex


class StoreUnavailable(OSError):
    """The store could not be reached or written; its message says which and why."""


class StoreInUse(OSError):
    """Another server holds the disk store's directory."""


class SessionStore:
    """The interface. Subclasses implement the ``_`` methods; the public ones keep the health."""

    where = ""                # the setting, as /health and the logs name the store
    outlives_server = False   # another server (a restart, a replica) reads what this one writes

    def __init__(self):
        self._lock = threading.Lock()
        self._error: Optional[str] = None
        self._failed_at = 0.0
        self._failures = 0

    def get(self, key: str) -> Optional[bytes]:
        """The value of ``key``, or None when the store has none."""
        return self._call(self._get, key)

    def put(self, key: str, value: bytes, replaces: Optional[str] = None) -> None:
        """Writes ``key``; ``replaces``, when given, is deleted with it (a conversation's previous turn)."""
        self._call(self._put, key, value, replaces if replaces != key else None)

    def delete(self, key: str) -> None:
        self._call(self._delete, key)

    def first_present(self, keys: Sequence[str]) -> Optional[int]:
        """The index in ``keys`` of the first one the store holds, or None."""
        return self._call(self._first_present, list(keys)) if keys else None

    def count(self) -> Optional[int]:
        """Values held; None for a store that other servers write too (theirs would count)."""
        return None

    def health(self) -> dict:
        with self._lock:
            return {"where": self.where, "available": self._error is None, "error": self._error,
                    "failures": self._failures}

    def close(self) -> None:
        pass

    def _call(self, fn, *args):
        with self._lock:
            if self._error is not None and time.monotonic() - self._failed_at < RETRY_AFTER_S:
                raise StoreUnavailable(f"{self.where} is unavailable ({self._error}); retried "
                                       f"{RETRY_AFTER_S:g} s after the last failure")
        try:
            out = fn(*args)
        except StoreUnavailable as e:
            with self._lock:
                went_down = self._error is None
                self._error, self._failed_at = str(e), time.monotonic()
                self._failures += 1
            if went_down:
                log.warning("session store unavailable: %s; until it is back, conversations prefill what it "
                            "would have given and their turns wait to be written", e)
            raise
        with self._lock:
            came_back, self._error = self._error is not None, None
        if came_back:
            log.warning("session store %s is available again", self.where)
        return out


class MemoryStore(SessionStore):
    where = "memory"

    def __init__(self, max_values: int):
        super().__init__()
        self.max_values = max_values
        self._values: "OrderedDict[str, bytes]" = OrderedDict()  # least recently used first
        self._values_lock = threading.Lock()  # the model thread and the writer thread

    def _get(self, key):
        with self._values_lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def _put(self, key, value, replaces):
        with self._values_lock:
            self._values.pop(replaces, None)
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.max_values:
                self._values.popitem(last=False)

    def _delete(self, key):
        with self._values_lock:
            self._values.pop(key, None)

    def _first_present(self, keys):
        with self._values_lock:
            return next((i for i, k in enumerate(keys) if k in self._values), None)

    def count(self):
        with self._values_lock:
            return len(self._values)


class DiskStore(SessionStore):
    """``<key>.session`` files in a directory that one server holds (a lock file, ``.lock``)."""

    def __init__(self, path: str, max_values: int):
        super().__init__()
        self.temporary = not path
        self.dir = tempfile.mkdtemp(prefix="mnn_h2o-sessions-") if self.temporary else path
        self.where = "disk:" + path if path else f"disk: (temporary: {self.dir})"
        self.outlives_server = not self.temporary
        self.max_values = max_values
        os.makedirs(self.dir, exist_ok=True)
        self._dir_lock = open(os.path.join(self.dir, ".lock"), "a")
        try:
            fcntl.flock(self._dir_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._dir_lock.close()
            raise StoreInUse(f"serve.session_store {self.where}: the directory is in use by another server "
                             f"(one server at a time per directory; replicas share a Redis store)") from None
        self.ignored: List[str] = []  # files that are not values of this store (left alone)
        for name in os.listdir(self.dir):
            if ".tmp" in name:  # a write cut short by a crash
                os.remove(os.path.join(self.dir, name))
            elif name != ".lock" and not self._is_value(name):
                self.ignored.append(name)
        if self.ignored:
            log.warning("%s: %d files there are not sessions of this store (left alone): %s", self.where,
                        len(self.ignored), ", ".join(sorted(self.ignored)[:5]))

    @staticmethod
    def _is_value(name: str) -> bool:
        return name.endswith(".session") and bool(_KEY.fullmatch(name[:-len(".session")]))

    def _path(self, key: str) -> str:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a store key: {key!r}")
        return os.path.join(self.dir, key + ".session")

    def _get(self, key):
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                value = f.read()
            os.utime(path)  # the least recently used go first (_trim)
            return value
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreUnavailable(f"{self.where}: cannot read {path}: {e.strerror}") from None

    def _put(self, key, value, replaces):
        path = self._path(key)
        try:
            write_atomic(path, value)
        except OSError as e:
            raise StoreUnavailable(f"{self.where}: cannot write {path}: {e.strerror}") from None
        if replaces is not None:
            self._delete(replaces)
        self._trim()

    def _delete(self, key):
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(key))

    def _first_present(self, keys):
        return next((i for i, k in enumerate(keys) if os.path.exists(self._path(k))), None)

    def count(self):
        return sum(1 for n in os.listdir(self.dir) if self._is_value(n))

    def _trim(self):
        names = [n for n in os.listdir(self.dir) if self._is_value(n)]
        if len(names) <= self.max_values:
            return
        def mtime(n):
            with contextlib.suppress(FileNotFoundError):
                return os.path.getmtime(os.path.join(self.dir, n))
            return 0.0
        for name in sorted(names, key=mtime)[:len(names) - self.max_values]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.dir, name))

    def close(self):
        fcntl.flock(self._dir_lock, fcntl.LOCK_UN)
        self._dir_lock.close()
        if self.temporary:
            shutil.rmtree(self.dir, ignore_errors=True)


class RedisStore(SessionStore):
    outlives_server = True

    def __init__(self, url: str):
        super().__init__()
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ValueError(f"serve.session_store {_masked(url)} needs the redis client of the serve extra: "
                             "pip install 'mnn_h2o[serve]' (from a checkout: pip install '.[serve]')") from None
        self._errors = (redis.RedisError, OSError)
        u = _parse_redis(url)
        self.where = _masked(url)
        # One retry: the first command after Redis restarted finds its connection closed.
        self._client = redis.Redis(host=u["host"], port=u["port"], db=u["db"], password=u["password"],
                                   username=u["username"], socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
                                   socket_timeout=REDIS_TIMEOUT_S, retry=Retry(NoBackoff(), 1))
        try:
            self._client.ping()
        except self._errors as e:
            raise StoreUnavailable(f"serve.session_store {self.where}: cannot reach Redis ({e}); start it "
                                   f"(redis-server), or choose another serve.session_store") from None

    def _redis(self, fn):
        try:
            return fn()
        except self._errors as e:
            raise StoreUnavailable(f"{self.where}: {type(e).__name__}: {e}") from None

    def _get(self, key):
        return self._redis(lambda: self._client.get(REDIS_PREFIX + key))

    def _put(self, key, value, replaces):
        def write():
            with self._client.pipeline(transaction=True) as p:  # MULTI ... EXEC: both or neither
                p.set(REDIS_PREFIX + key, value)
                if replaces is not None:
                    p.delete(REDIS_PREFIX + replaces)
                p.execute()
        self._redis(write)

    def _delete(self, key):
        self._redis(lambda: self._client.delete(REDIS_PREFIX + key))

    def _first_present(self, keys):
        def ask():
            with self._client.pipeline(transaction=False) as p:  # one round trip
                for k in keys:
                    p.exists(REDIS_PREFIX + k)
                return p.execute()
        return next((i for i, n in enumerate(self._redis(ask)) if n), None)

    def close(self):
        self._client.close()


def open_store(setting: str, max_values: int) -> SessionStore:
    """The store ``serve.session_store`` names; ValueError saying what is allowed for a bad one,
    StoreUnavailable for a Redis that does not answer, StoreInUse for a directory another server holds."""
    if setting == "memory":
        return MemoryStore(max_values)
    if setting.startswith("disk:"):
        return DiskStore(setting[len("disk:"):], max_values)
    if setting.startswith("redis://"):
        return RedisStore(setting)
    raise ValueError(f"serve.session_store {setting!r}: expected memory, disk:PATH (disk: alone: a temporary "
                     f"directory) or redis://HOST:PORT/DB")


def _parse_redis(url: str) -> dict:
    def bad(why):
        return ValueError(f"serve.session_store {_masked(url)}: {why}; expected redis://HOST:PORT/DB "
                          f"(optionally redis://:PASSWORD@HOST:PORT/DB)")
    u = urllib.parse.urlsplit(url)
    if not u.hostname:
        raise bad("no host")
    try:
        port = u.port or 6379
    except ValueError:
        raise bad("the port is not a number in 0..65535") from None
    path = u.path.strip("/")
    if path and not path.isdigit():
        raise bad(f"the database {path!r} is not a number")
    if u.query or u.fragment:
        raise bad("options after ? or # are not read")
    return {"host": u.hostname, "port": port, "db": int(path or 0),
            "username": urllib.parse.unquote(u.username) if u.username else None,
            "password": urllib.parse.unquote(u.password) if u.password else None}


def _masked(url: str) -> str:
    """The URL as logs and /health show it: a password replaced by ***."""
    return re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url)
