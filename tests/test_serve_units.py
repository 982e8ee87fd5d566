"""The server's request validation, its session pool (prefix match, LRU offload to the session
store, restore, restart, replicas sharing a store, a store that is down) and the stores without
Redis, over a fake session: no model, fast. tests/test_session_store_redis.py has the Redis store."""
import os
import platform
import re
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from mnn_h2o import session_file  # noqa: E402
from mnn_h2o.errors import SessionFileError  # noqa: E402
from mnn_h2o.serve import pool as pool_module  # noqa: E402
from mnn_h2o.serve import session_store  # noqa: E402
from mnn_h2o.serve.pool import SessionPool, conversation_keys  # noqa: E402
from mnn_h2o.serve.session_store import (DiskStore, MemoryStore, StoreInUse, StoreUnavailable,  # noqa: E402
                                         open_store)
from mnn_h2o.serve.validation import ApiError, parse_chat, parse_completion, parse_json  # noqa: E402

LIMIT = 256


# --- validation ----------------------------------------------------------------------------------
def user(text):
    return {"role": "user", "content": text}


def test_a_chat_request_is_read_with_openai_defaults():
    r = parse_chat({"model": "smollm2", "messages": [{"role": "system", "content": "Be terse."}, user("Hi")]}, LIMIT)
    assert r.messages == [{"role": "system", "content": "Be terse."}, user("Hi")]
    assert (r.max_tokens, r.stream, r.include_usage, r.stop) == (None, False, False, [])
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.seed) == (1.0, 1.0, None)


def test_chat_parameters_map_to_sampling_and_stops():
    r = parse_chat({"messages": [user("Hi"), {"role": "assistant", "content": [{"type": "text", "text": "He"},
                                                                                 {"type": "text", "text": "llo"}]},
                                 user("Again")],
                    "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3, "seed": 11,
                    "stop": "\n", "stream": True, "stream_options": {"include_usage": True},
                    "n": 1, "presence_penalty": 0, "user": "someone"}, LIMIT)
    assert r.messages[1]["content"] == "Hello"
    assert (r.max_tokens, r.stop, r.stream, r.include_usage) == (7, ["\n"], True, True)
    s = r.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.0, 0.5, 3, 11)


@pytest.mark.parametrize("body, param, code", [
    ({}, "messages", "missing_required_parameter"),
    ({"messages": []}, "messages", "empty_array"),
    ({"messages": "Hi"}, "messages", "invalid_type"),
    ({"messages": ["Hi"]}, "messages[0]", "invalid_type"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"content": "Hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0]", "invalid_value"),
    ({"messages": [user("Hi")], "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"messages": [user("Hi")], "max_tokens": LIMIT + 1}, "max_tokens", "invalid_value"),
    ({"messages": [user("Hi")], "max_tokens": "5"}, "max_tokens", "invalid_type"),
    ({"messages": [user("Hi")], "max_tokens": 5.0}, "max_tokens", "invalid_type"),
    ({"messages": [user("Hi")], "max_tokens": True}, "max_tokens", "invalid_type"),
    ({"messages": [user("Hi")], "temperature": 2.5}, "temperature", "invalid_value"),
    ({"messages": [user("Hi")], "temperature": "hot"}, "temperature", "invalid_type"),
    ({"messages": [user("Hi")], "top_p": 0}, "top_p", "invalid_value"),
    ({"messages": [user("Hi")], "seed": -1}, "seed", "invalid_value"),
    ({"messages": [user("Hi")], "stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"messages": [user("Hi")], "stop": [1]}, "stop", "invalid_type"),
    ({"messages": [user("Hi")], "stream": "yes"}, "stream", "invalid_type"),
    ({"messages": [user("Hi")], "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({"messages": [user("Hi")], "n": 2}, "n", "unsupported_parameter"),
    ({"messages": [user("Hi")], "tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
    ({"messages": [user("Hi")], "logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"messages": [user("Hi")], "presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
    ({"messages": [user("Hi")], "response_format": {"type": "json_object"}}, "response_format",
     "unsupported_parameter"),
    ({"messages": [user("Hi")], "model": 3}, "model", "invalid_type"),
])
def test_bad_chat_requests_name_the_parameter(body, param, code):
    with pytest.raises(ApiError) as e:
        parse_chat(body, LIMIT)
    err = e.value.body()["error"]
    assert (e.value.status, err["param"], err["code"], err["type"]) == (400, param, code, "invalid_request_error")
    assert err["message"]


def test_a_completion_request_takes_a_plain_prompt():
    r = parse_completion({"prompt": ["The capital of France is"], "max_tokens": 4}, LIMIT)
    assert (r.prompt, r.max_tokens) == ("The capital of France is", 4)
    assert parse_completion({"prompt": "x"}, LIMIT).max_tokens == 16  # OpenAI's default
    assert parse_completion({"prompt": "x"}, 8).max_tokens == 8
    for body, param in (({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": [1, 2]}, "prompt"),
                        ({"prompt": "x", "echo": True}, "echo"), ({"prompt": "x", "max_tokens": 10**6}, "max_tokens")):
        with pytest.raises(ApiError) as e:
            parse_completion(body, LIMIT)
        assert e.value.param == param


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b"null", b'"text"', b"[" * 100000])
def test_bad_json_bodies(raw):
    with pytest.raises(ApiError) as e:
        parse_json(raw)
    assert e.value.code == "invalid_json" and e.value.status == 400


# --- the pool, over fake sessions -----------------------------------------------------------------
BYTES_PER_MESSAGE = 1000
NAMESPACE = "test-model"


class FakeSession:
    """What the pool uses of mnn_h2o.session.Session: a conversation whose 'cache' grows with it,
    saved in the saved-session container (so the store's values are CRC-checked as real ones)."""
    closed = 0

    # Like Session's compress_after_answer: an answer leaves the cache HELD_FACTOR times its
    # compressed size until compress().
    HELD_FACTOR = 3

    def __init__(self, messages=None, compress_after_answer=False):
        self._messages = list(messages or [])
        self.open = True
        self.compress_after_answer = compress_after_answer
        self.held = False

    @property
    def messages(self):
        return [dict(m) for m in self._messages]

    def reply(self, messages):
        assert self.open
        assert messages[:len(self._messages)] == self._messages and len(messages) > len(self._messages)
        self.compress()  # a turn runs what the last one left first
        self._messages = list(messages) + [{"role": "assistant", "content": f"answer {len(messages)}"}]
        self.held = self.compress_after_answer
        return self._messages[-1]["content"]

    def compress(self):
        ran, self.held = self.held, False
        return ran

    def stats(self):
        return {"kv_bytes_held": BYTES_PER_MESSAGE * len(self._messages) * (self.HELD_FACTOR if self.held else 1),
                "compression_held": self.held}

    def saved(self):
        assert self.open
        return {"fake_session": self._messages}, b"cache"

    @classmethod
    def from_bytes(cls, data, where, compress_after_answer=False):
        meta, _ = session_file.decode(data, where)
        if "fake_session" not in meta:
            raise SessionFileError(f"{where} was saved with another model")
        return cls(meta["fake_session"], compress_after_answer)

    def close(self):
        self.open = False
        FakeSession.closed += 1


class SharedMemoryStore(MemoryStore):
    """A memory store that the pools of one test share as replicas share a Redis store."""
    where = "shared memory"
    outlives_server = True


def make_pool(store, budget=10**9, max_sessions=100, compress_after_answer=False):
    return SessionPool(lambda: FakeSession(compress_after_answer=compress_after_answer),
                       lambda data, where: FakeSession.from_bytes(data, where, compress_after_answer),
                       store, NAMESPACE, budget, max_sessions)


def turn(pool, messages):
    """One request and the work after its answer; returns (the conversation after it, how many
    messages were reused, restored)."""
    with pool.checkout(messages) as co:
        co.session.reply(messages)
        result = co.session.messages, co.reused_messages, co.restored
    pool.write_back()
    writes_done(pool)
    return result


def writes_done(pool, timeout=10):
    deadline = time.monotonic() + timeout
    while pool.stats()["store"]["writes_pending"]:
        assert time.monotonic() < deadline, "the writer thread did not finish"
        time.sleep(0.01)


def stored_keys(store):
    return list(store._values) if isinstance(store, MemoryStore) else \
        sorted(f[:-len(".session")] for f in os.listdir(store.dir) if f.endswith(".session"))


@pytest.fixture(params=["memory", "disk"])
def store(request, tmp_path):
    """The two stores of one server alone: values written only when a session leaves memory."""
    s = MemoryStore(100) if request.param == "memory" else DiskStore("", 100)
    yield s
    s.close()


def test_keys_are_digests_of_the_message_prefixes():
    msgs = [user("a"), {"role": "assistant", "content": "b"}]
    keys = conversation_keys(NAMESPACE, msgs)
    assert len(keys) == 3 and len(set(keys)) == 3 and all(re.fullmatch("[0-9a-f]{64}", k) for k in keys)
    assert conversation_keys(NAMESPACE, msgs[:1]) == keys[:2]
    assert conversation_keys("another-model", msgs)[2] != keys[2]
    # Role and content are both part of it, unambiguously.
    assert conversation_keys(NAMESPACE, [{"role": "assistant", "content": "a"}])[1] != keys[1]
    assert conversation_keys(NAMESPACE, [user('a"], ["user", "b')])[1] != \
        conversation_keys(NAMESPACE, [user("a"), user("b")])[2]


def test_a_follow_up_continues_the_session_that_holds_its_history(store):
    pool = make_pool(store)
    conv, reused, _ = turn(pool, [user("a")])
    assert reused == 0 and len(conv) == 2
    conv, reused, _ = turn(pool, conv + [user("b")])
    assert reused == 2 and len(conv) == 4
    # Another conversation, and an edited history: neither extends a session, both start new ones.
    assert turn(pool, [user("x")])[1] == 0
    assert turn(pool, [user("a"), {"role": "assistant", "content": "edited"}, user("b")])[1] == 0
    # The same history twice: the second request does not extend the first session's conversation
    # (it already holds an answer to the last message), so it gets its own.
    assert turn(pool, [user("a")])[1] == 0
    assert pool.stats()["sessions_in_memory"] == 4
    assert stored_keys(store) == []  # a store of one server alone gets sessions only when they leave memory


def test_the_longest_matching_history_wins(store):
    pool = make_pool(store)
    short, _, _ = turn(pool, [user("a")])
    longer, _, _ = turn(pool, short + [user("b")])
    other, _, _ = turn(pool, [user("a")])  # a new session holding [a, answer]
    assert other == short
    _, reused, _ = turn(pool, longer + [user("c")])
    assert reused == 4


def test_over_budget_the_least_recently_used_idle_session_goes_to_the_store_and_comes_back(store):
    # Each conversation after one turn holds 2 messages = 2000 bytes; the budget holds two of them.
    pool = make_pool(store, budget=4000)
    a, _, _ = turn(pool, [user("a")])
    b, _, _ = turn(pool, [user("b")])
    assert pool.stats()["sessions_saved"] == 0
    c, _, _ = turn(pool, [user("c")])  # a is the least recently used: offloaded
    st = pool.stats()
    assert (st["sessions_in_memory"], st["sessions_saved"], st["offloaded"], st["kv_bytes_held"]) == (2, 1, 1, 4000)
    assert stored_keys(store) == [conversation_keys(NAMESPACE, a)[-1]]
    # a's follow-up restores it (its value goes: it lives in memory again), b goes out.
    a2, reused, restored = turn(pool, a + [user("a2")])
    assert (reused, restored, len(a2)) == (2, True, 4)
    st = pool.stats()
    assert (st["restored"], st["offloaded"], st["sessions_saved"]) == (1, 3, 2)  # b and c out: a holds 4000
    assert conversation_keys(NAMESPACE, a)[-1] not in stored_keys(store)
    # The session in use is never offloaded, even alone over the budget.
    assert st["kv_bytes_held"] == 4000 and st["sessions_in_memory"] == 1
    a3, _, _ = turn(pool, a2 + [user("a3")])
    assert pool.stats()["sessions_in_memory"] == 1 and pool.stats()["kv_bytes_held"] == 6000
    # Every conversation continues, restored or not.
    for conv in (b, c):
        _, reused, restored = turn(pool, conv + [user("more")])
        assert (reused, restored) == (2, True)
    assert pool.stats()["restore_failed"] == 0


def test_at_most_max_sessions_are_kept():
    store = MemoryStore(2)
    pool = make_pool(store, budget=2000, max_sessions=2)
    a, _, _ = turn(pool, [user("a")])
    turn(pool, [user("b")])
    turn(pool, [user("c")])
    turn(pool, [user("d")])  # a, b, c went to the store, which keeps two: a is gone
    assert pool.stats()["sessions_saved"] == 2 and pool.stats()["sessions_in_memory"] == 1
    assert turn(pool, a + [user("again")])[1] == 0  # a prefills its history again
    # In memory too: with room for all, the least recently used beyond max_sessions are dropped.
    pool = make_pool(MemoryStore(10), max_sessions=2)
    for t in "xyz":
        turn(pool, [user(t)])
    assert pool.stats()["sessions_in_memory"] == 2 and pool.stats()["dropped"] == 1


def test_compression_after_the_answer_brings_the_pool_back_within_its_budget(store):
    """A session's answer leaves its cache uncompressed (3x here) and counted as such; the work the
    model thread runs after the answer compresses it, and only what is still over the budget then
    goes to the store."""
    pool = make_pool(store, budget=4000, compress_after_answer=True)
    a, _, _ = turn(pool, [user("a")])
    st = pool.stats()
    assert (st["kv_bytes_held"], st["sessions_compression_held"], st["offloaded"]) == (6000, 1, 0)  # alone: kept
    assert pool.compress_held() == 1
    st = pool.stats()
    assert (st["kv_bytes_held"], st["sessions_compression_held"], st["compressed_after_answer"]) == (2000, 0, 1)
    assert pool.compress_held() == 0  # nothing left to do
    turn(pool, [user("b")])  # b held (6000) + a (2000) over 4000: a, the idle one, goes to the store
    st = pool.stats()
    assert (st["kv_bytes_held"], st["offloaded"]) == (6000, 1)
    pool.compress_held()
    turn(pool, a + [user("a2")])  # a comes back (4 messages, held: 12000), b (2000) goes out
    assert pool.stats()["offloaded"] == 2 and pool.stats()["kv_bytes_held"] == 12000
    pool.compress_held()
    assert pool.stats()["kv_bytes_held"] == 4000 <= pool.budget


def test_a_failed_first_turn_keeps_nothing(store):
    pool = make_pool(store)
    with pytest.raises(RuntimeError):
        with pool.checkout([user("a")]):
            raise RuntimeError("context overflow, say")
    assert pool.stats()["sessions_in_memory"] == 0


def test_a_disk_store_gets_every_turn_so_a_crash_loses_nothing_written(tmp_path):
    pool = make_pool(DiskStore(str(tmp_path), 100))
    assert pool.write_every_turn
    a, _, _ = turn(pool, [user("a")])
    a2, _, _ = turn(pool, a + [user("a2")])
    b, _, _ = turn(pool, [user("b")])
    # One value per conversation: a's second turn replaced its first.
    assert stored_keys(pool.store) == sorted(conversation_keys(NAMESPACE, c)[-1] for c in (a2, b))
    assert pool.stats()["stored_turns"] == 3
    pool.store._dir_lock.close()  # the crash: the process is gone, its lock with it; nothing else runs
    pool = make_pool(DiskStore(str(tmp_path), 100))
    assert pool.stats()["sessions_saved"] == 2 and pool.stats()["sessions_in_memory"] == 0
    assert [turn(pool, c + [user("next")])[1:] for c in (a2, b)] == [(4, True), (2, True)]


def test_a_clean_stop_writes_what_the_store_lacks_and_a_restart_continues_it(tmp_path):
    pool = make_pool(DiskStore(str(tmp_path), 100))
    with pool.checkout([user("a")]) as co:  # answered, and the server stops before the write after it
        co.session.reply([user("a")])
        a = co.session.messages
    assert stored_keys(pool.store) == []
    pool.close()
    pool.store.close()
    pool = make_pool(DiskStore(str(tmp_path), 100))
    assert turn(pool, a + [user("next")])[1:] == (2, True)


def test_a_temporary_disk_store_is_removed_at_stop():
    store = DiskStore("", 100)
    pool = make_pool(store, budget=1)
    turn(pool, [user("a")])
    turn(pool, [user("b")])
    assert not pool.write_every_turn and store.count() == 1
    pool.close()
    store.close()
    assert not os.path.exists(store.dir)


def test_one_server_per_disk_store(tmp_path):
    store = DiskStore(str(tmp_path), 100)
    with pytest.raises(StoreInUse, match="in use by another server"):
        DiskStore(str(tmp_path), 100)
    store.close()
    DiskStore(str(tmp_path), 100).close()


def test_a_disk_store_removes_cut_writes_and_leaves_other_files_alone(tmp_path):
    (tmp_path / ("a" * 64 + ".session.tmp1234")).write_text("partial")
    (tmp_path / "0123.json").write_text("an older server's index")
    store = DiskStore(str(tmp_path), 100)
    assert store.ignored == ["0123.json"] and store.count() == 0
    assert sorted(os.listdir(tmp_path)) == [".lock", "0123.json"]
    store.close()


def _damage(value, how):
    if how == "truncated":
        return value[:len(value) // 2]
    if how == "garbage":
        return b"garbage"
    meta, cache = session_file.decode(value)  # well formed, CRCs right: another model's session
    return session_file.encode({"not": "ours"}, cache)


@pytest.mark.parametrize("how", ["truncated", "garbage", "foreign"])
def test_a_damaged_or_foreign_value_is_refused_deleted_and_the_conversation_prefills_again(store, how):
    pool = make_pool(store, budget=2000)
    a, _, _ = turn(pool, [user("a")])
    turn(pool, [user("b")])  # a goes to the store
    key = conversation_keys(NAMESPACE, a)[-1]
    store.put(key, _damage(store.get(key), how))
    assert turn(pool, a + [user("a2")])[1:] == (0, False)
    st = pool.stats()
    assert (st["restore_failed"], st["restored"]) == (1, 0)
    assert key not in stored_keys(store)


def test_a_value_whose_messages_are_not_its_keys_is_refused(store):
    pool = make_pool(store, budget=2000)
    a, _, _ = turn(pool, [user("a")])
    b, _, _ = turn(pool, [user("b")])
    turn(pool, [user("c")])  # a and b in the store
    ka, kb = (conversation_keys(NAMESPACE, c)[-1] for c in (a, b))
    store.put(ka, store.get(kb))  # b's session under a's key
    assert turn(pool, a + [user("a2")])[1:] == (0, False)
    assert pool.stats()["restore_failed"] == 1


# --- replicas: pools sharing one store ------------------------------------------------------------
def test_replicas_continue_each_others_conversations_turn_by_turn():
    shared = SharedMemoryStore(100)
    replicas = [make_pool(shared), make_pool(shared)]
    conv = [user("q0")]
    ways = []
    for i in range(6):
        conv, reused, restored = turn(replicas[i % 2], conv)
        ways.append((reused, restored))
        # The store holds the conversation's last turn only.
        assert stored_keys(shared) == [conversation_keys(NAMESPACE, conv)[-1]]
        conv = conv + [user(f"q{i + 1}")]
    # Each turn after the first continued the other replica's last turn from the store, and a
    # replica's own older session gave way to it.
    assert ways == [(0, False)] + [(2 * i, True) for i in range(1, 6)]
    assert [r.stats()["sessions_in_memory"] for r in replicas] == [1, 1]
    assert replicas[0].stats()["dropped"] == 2 and replicas[0].stats()["stored_turns"] == 3


def test_a_turn_is_written_by_the_writer_thread_not_on_the_way_to_the_next_answer():
    class SlowStore(SharedMemoryStore):
        release = threading.Event()

        def _put(self, *a):
            assert self.release.wait(10)
            super()._put(*a)

    store = SlowStore(100)
    pool = make_pool(store)
    with pool.checkout([user("a")]) as co:
        co.session.reply([user("a")])
        a = co.session.messages
    assert pool.write_back() == 1
    assert pool.stats()["store"]["writes_pending"] == 1
    with pool.checkout(a + [user("a2")]) as co:  # answered while the write waits
        co.session.reply(a + [user("a2")])
        assert co.reused_messages == 2
        a2 = co.session.messages
    pool.write_back()
    store.release.set()
    writes_done(pool)
    # The second turn is what the store holds: written after the first, or in its place when the
    # first was still waiting (only a session's newest snapshot waits).
    assert stored_keys(store) == [conversation_keys(NAMESPACE, a2)[-1]] and pool.stats()["stored_turns"] in (1, 2)


def test_a_store_that_is_down_costs_a_prefill_shows_in_health_and_gets_the_turns_once_back(monkeypatch):
    monkeypatch.setattr(session_store, "RETRY_AFTER_S", 0.05)
    monkeypatch.setattr(pool_module, "RETRY_AFTER_S", 0.05)

    class FlakyStore(SharedMemoryStore):
        down = False

        def _call(self, fn, *args):
            def maybe(*a):
                if self.down:
                    raise StoreUnavailable("shared memory: down")
                return fn(*a)
            return super()._call(maybe, *args)

    store = FlakyStore(100)
    a_replica, b_replica = make_pool(store), make_pool(store)
    conv, _, _ = turn(a_replica, [user("a")])
    store.down = True
    # The other replica cannot look the conversation up: it prefills it, and says so.
    with b_replica.checkout(conv + [user("a2")]) as co:
        co.session.reply(conv + [user("a2")])
        assert (co.reused_messages, co.restored) == (0, False)
        conv2 = co.session.messages
    b_replica.write_back()
    health = b_replica.stats()
    assert health["store"]["available"] is False and "down" in health["store"]["error"]
    assert health["store_failed"] >= 1 and health["store"]["writes_pending"] == 1
    store.down = False  # back: the waiting turn is written
    writes_done(b_replica)
    assert b_replica.stats()["store"]["available"] is True
    assert stored_keys(store)[-1] == conversation_keys(NAMESPACE, conv2)[-1]
    assert turn(a_replica, conv2 + [user("a3")])[1:] == (4, True)


def test_store_settings():
    assert isinstance(open_store("memory", 5), MemoryStore)
    for bad, says in [("mem", "expected memory, disk:PATH"), ("redis://", "no host"),
                      ("redis://h:99999/0", "port"), ("redis://h:6379/x", "database 'x'"),
                      ("redis://:secret@h:6379/0?a=1", "redis://:***@h")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            open_store(bad, 5)


def test_the_old_session_dir_setting_reads_as_a_disk_store():
    from mnn_h2o import config

    assert config.validate({"serve": {"session_dir": "/srv/s"}})["serve"]["session_store"] == "disk:/srv/s"
    assert config.validate({"serve": {"session_dir": ""}})["serve"]["session_store"] == "disk:"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_server_keeps_large_buffers_mapped():
    """The server fixes glibc's mmap threshold (freed session buffers go back to the system);
    tests/test_serve_load.py checks the memory bound it keeps."""
    from mnn_h2o.serve.__main__ import keep_large_buffers_mapped

    assert keep_large_buffers_mapped() is True


def test_the_work_after_an_answer_runs_before_or_behind_the_requests_that_came_meanwhile():
    """ModelThread.stream's ``after`` (the server's snapshot of a turn for the store) runs right
    after the job, before a request already waiting; its ``then`` (the compression after an
    answer) is queued behind it. Their errors are logged, not raised."""
    import asyncio

    from mnn_h2o.serve.model_thread import ModelThread

    order = []
    started = threading.Event()
    release = threading.Event()

    def first(emit):
        started.set()
        release.wait(10)
        order.append("first")

    def failing(name):
        def run():
            order.append(name)
            raise RuntimeError("logged, not raised")
        return run

    async def main():
        mt = ModelThread()
        events = mt.stream(first, after=failing("after"), then=failing("then"))
        pending = asyncio.ensure_future(events.__anext__())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        waiting = asyncio.ensure_future(mt.run(lambda: order.append("second")))  # queued during `first`
        await asyncio.sleep(0)  # the coroutine runs, so `second` is submitted before `first` ends
        release.set()
        assert (await pending)[0] == "done"
        await waiting
        await mt.run(lambda: None)  # behind `then`
        mt.shutdown()

    asyncio.run(main())
    assert order == ["first", "after", "second", "then"]


def test_a_turn_whose_compression_waits_is_written_once_compressed():
    store = SharedMemoryStore(100)
    pool = make_pool(store, compress_after_answer=True)
    with pool.checkout([user("a")]) as co:
        co.session.reply([user("a")])
        a = co.session.messages
    assert pool.write_back() == 0 and pool.stats()["store"]["writes_pending"] == 1  # held: not yet
    pool.compress_held()
    assert pool.write_back() == 1
    writes_done(pool)
    assert stored_keys(store) == [conversation_keys(NAMESPACE, a)[-1]]


@pytest.mark.parametrize("settings, says", [
    (["serve.session_store=redis://127.0.0.1:{port}/0"], "cannot reach Redis"),
    (["serve.session_store=redis://127.0.0.1:6379/x"], "the database 'x' is not a number"),
    (["serve.session_store=ftp://host"], "expected memory, disk:PATH"),
    (["serve.session_store=disk:{tmp}", "lossless.mode=store"], "with lossless.mode store they cannot be saved"),
])
def test_the_server_refuses_a_bad_or_unreachable_store_before_loading_the_model(settings, says, tmp_path):
    import subprocess
    import sys

    from mnn_h2o.serve.replicas import free_port

    args = [sys.executable, "-m", "mnn_h2o.serve", "--port", str(free_port())]
    for s in settings:
        args += ["--set", s.format(port=free_port(), tmp=tmp_path)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_sigterm_stops_what_a_replicas_tool_started(tmp_path):
    """serve.replicas.stop_on_sigterm: a kill (SIGTERM) of the tool runs its ``finally``, which
    stops Redis, nginx and the servers, where Python's default would leave them running."""
    import signal
    import subprocess
    import sys

    done = tmp_path / "stopped"
    code = ("import sys, time\n"
            "from mnn_h2o.serve.replicas import stop_on_sigterm\n"
            "stop_on_sigterm()\n"
            "try:\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n"
            "except KeyboardInterrupt:\n"
            "    pass\n"
            "finally:\n"
            f"    open({str(done)!r}, 'w').write('yes')\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", code], cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        p.kill()
    assert done.read_text() == "yes"
