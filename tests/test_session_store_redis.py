"""The Redis session store against a real redis-server on loopback (Debian package redis-server;
skipped where it is missing): a conversation's new turn replaces its previous one in one
transaction, lookups take one round trip, an unreachable Redis is a clear error at start and a
visible, recoverable one later, and a restart keeps what was written (append-only file)."""
import shutil
import time

import pytest

redis = pytest.importorskip("redis", reason="the serve extra's redis client is not installed")
pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from mnn_h2o.serve import session_store  # noqa: E402
from mnn_h2o.serve.replicas import RedisServer, free_port  # noqa: E402
from mnn_h2o.serve.session_store import REDIS_PREFIX, RedisStore, StoreUnavailable, open_store  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (apt-get install redis-server)")

K1, K2, K3 = ("1" * 64, "2" * 64, "3" * 64)


@pytest.fixture
def server(tmp_path):
    s = RedisServer(str(tmp_path)).start(timeout=30)
    yield s
    s.kill()


def test_values_keys_and_a_new_turn_replacing_the_last(server):
    store = open_store(server.url, 10)
    assert isinstance(store, RedisStore) and store.outlives_server
    assert store.get(K1) is None and store.first_present([K1, K2]) is None
    store.put(K1, b"turn 1")
    store.put(K3, b"another conversation")
    assert store.get(K1) == b"turn 1" and store.first_present([K2, K1]) == 1
    store.put(K2, b"turn 2", replaces=K1)
    assert (store.get(K1), store.get(K2), store.get(K3)) == (None, b"turn 2", b"another conversation")
    with redis.Redis(port=server.port) as r:  # the keys are the store's own, under its prefix
        assert sorted(r.keys("*")) == sorted((REDIS_PREFIX + k).encode() for k in (K2, K3))
    store.delete(K2)
    assert store.get(K2) is None and store.count() is None  # shared: no count of its own
    assert store.health() == {"where": server.url, "available": True, "error": None, "failures": 0}
    store.close()


def test_a_large_value_round_trips(server):
    store = open_store(server.url, 10)
    value = bytes(range(256)) * (64 << 12)  # 64 MiB: a long conversation's session
    store.put(K1, value)
    assert store.get(K1) == value
    store.close()


def test_an_unreachable_redis_at_start_is_a_clear_error():
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreUnavailable, match=r"cannot reach Redis .*start it \(redis-server\)"):
        open_store(url, 10)


def test_a_restarted_redis_keeps_what_was_written_and_the_store_says_when_it_was_down(server, monkeypatch):
    monkeypatch.setattr(session_store, "RETRY_AFTER_S", 0.2)
    store = open_store(server.url, 10)
    store.put(K1, b"committed")
    server.stop()  # a clean stop writes the append-only file
    with pytest.raises(StoreUnavailable, match="Connection"):
        store.get(K1)
    h = store.health()
    assert h["available"] is False and h["failures"] == 1 and "Connection" in h["error"]
    with pytest.raises(StoreUnavailable, match="retried"):  # not tried again at once
        store.put(K2, b"later")
    server.start(timeout=30)
    time.sleep(0.25)
    assert store.get(K1) == b"committed"
    assert store.health()["available"] is True
    store.close()
