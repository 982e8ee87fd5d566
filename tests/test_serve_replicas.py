"""Two servers behind nginx on one Redis session store, and one server alone (the memory store)
as the yardstick, all started here on loopback (mnn_h2o/serve/replicas.py) and stopped at the
end: a conversation that alternates between the replicas answers as one server does; a kill -9 of
a replica mid-answer, a Redis restart, and a truncated or foreign value in Redis each cost a
prefill at most, never a committed turn or a crash. Slow: a 4K-token conversation is prefilled,
compressed (kvzip's pass) and answered on a replica and on the server alone."""
import json
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
redis = pytest.importorskip("redis", reason="the serve extra's redis client is not installed")

from mnn_h2o import session_file  # noqa: E402
from mnn_h2o.serve.replicas import Deployment, ServerProcess, missing_programs  # noqa: E402
from mnn_h2o.serve.session_store import REDIS_PREFIX  # noqa: E402
from mnn_h2o.tools.shared_sessions import ask, f16_bytes, settle, stored_value  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow,
              pytest.mark.skipif(bool(missing_programs()), reason=f"{' and '.join(missing_programs())} not "
                                 "installed (apt-get install redis-server nginx; scripts/setup.sh does it)")]

LONG_TOKENS = 4000      # the long conversation's first message: past eviction.trigger_min_tokens
TURNS = 10
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("replicas"))
    with Deployment(workdir, 2) as d:
        alone = ServerProcess(workdir, 9, {"serve.session_store": "memory"}).start()
        d.alone = alone
        try:
            yield d
        finally:
            alone.stop()


def all_urls(d):
    return [s.url for s in d.servers if s.running()] + [d.alone.url]


def converse(url, messages, replies, d):
    """One turn on ``url``; the answer is appended; returns it, once every server has settled
    (compressed and written what it answered)."""
    a = ask(url, messages, MAX_TOKENS, timeout=1800)
    assert a.finish_reason in ("stop", "length") and a.text, a
    messages.append(a.message)
    replies.append(a)
    settle(all_urls(d))
    return a


def follow(messages, turn):
    messages.append({"role": "user", "content": f"Question {turn}: say one more thing about it."})


def test_a_conversation_alternating_between_replicas_answers_as_one_server(deployment, tokenizer):
    """Ten turns through nginx, each served by the other replica, each continuing the conversation
    from Redis; the same ten turns on the server alone; greedy: the same answers. The session in
    Redis at about 4K tokens is over 3x smaller than f16 KV, and the turn the other replica serves
    from it starts answering in at most a tenth of a re-prefill's time."""
    from mnn_h2o.essays import essay_tokens

    d = deployment
    opening = ("Read this text; I will ask about it.\n\n"
               + tokenizer.decode(essay_tokens(tokenizer, LONG_TOKENS, 20000)))
    alone_msgs, alone = [{"role": "user", "content": opening}], []
    shared_msgs, shared = [{"role": "user", "content": opening}], []
    for turn in range(TURNS):
        converse(d.alone.url, alone_msgs, alone, d)
        converse(d.url, shared_msgs, shared, d)
        if turn == 0:
            value = stored_value(d.redis.url, shared_msgs)
            size = f16_bytes(value)
        follow(alone_msgs, turn)
        follow(shared_msgs, turn)
    assert [a.text for a in shared] == [a.text for a in alone]
    replicas = [a.replica for a in shared]
    assert all(x != y for x, y in zip(replicas, replicas[1:])), replicas  # round-robin: always the other
    assert [a.usage["session"] for a in shared] == ["new"] + ["restored"] * (TURNS - 1)
    assert [a.usage["session"] for a in alone] == ["new"] + ["continued"] * (TURNS - 1)
    print(f"session in Redis at {size['tokens']} tokens: {size['stored_bytes']} bytes, f16 KV "
          f"{size['f16_bytes']} bytes: {size['ratio']:.2f}x")
    assert size["tokens"] >= LONG_TOKENS and size["ratio"] >= 3.0, size
    # The other replica's turn 2 loaded 4K tokens from Redis; the server alone prefilled the same
    # conversation of that length at its turn 1 (the same text, what a re-prefill does).
    store_ttft, prefill_ttft = shared[1].ttft_s, alone[0].ttft_s
    print(f"time to first token: from the store {store_ttft:.3f} s, re-prefill {prefill_ttft:.3f} s")
    assert store_ttft <= 0.1 * prefill_ttft, (store_ttft, prefill_ttft)


def test_kill_9_of_a_replica_mid_answer_loses_no_committed_turn(deployment):
    d = deployment
    msgs, replies = [{"role": "user", "content": "Name three large animals."}], []
    ref_msgs, ref = [{"role": "user", "content": "Name three large animals."}], []
    converse(d.url, msgs, replies, d)
    follow(msgs, 1)
    # Turn 2 streams from one replica: kill -9 it after its first pieces of text.
    body = json.dumps({"messages": msgs, "max_tokens": 200, "temperature": 0, "stream": True}).encode()
    import urllib.request
    req = urllib.request.Request(d.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=600)
    victim = d.server_at(r.headers["X-Replica"])
    for line in r:
        if b'"content":"' in line and b'"content":""' not in line:
            break
    victim.kill()
    with pytest.raises(Exception):  # the stream is cut: the client sees the failure
        for _ in r:
            pass
    r.close()
    # The client asks again: nginx passes it to the survivor, which continues turn 1.
    retry = converse(d.url, msgs, replies, d)
    assert retry.replica != f"127.0.0.1:{victim.port}"
    assert retry.usage["prompt_tokens_details"]["cached_tokens"] >= replies[0].usage["total_tokens"] - 1
    # The replica comes back with nothing in memory and continues from Redis.
    victim.start()
    follow(msgs, 2)
    back = ask(victim.url, msgs, MAX_TOKENS)
    msgs.append(back.message)
    assert back.usage["session"] == "restored"
    assert back.usage["prompt_tokens_details"]["cached_tokens"] >= retry.usage["total_tokens"] + \
        retry.usage["prompt_tokens_details"]["cached_tokens"] - 1
    # Every answer is the one the server alone gives.
    for turn in range(3):
        converse(d.alone.url, ref_msgs, ref, d)
        follow(ref_msgs, turn + 1)
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == [a.text for a in ref]


def test_a_redis_restart_costs_prefills_shows_in_health_and_keeps_every_written_turn(deployment):
    d = deployment
    msgs, replies = [{"role": "user", "content": "Name a cold country."}], []
    first = converse(d.url, msgs, replies, d)
    committed = stored_value(d.redis.url, msgs)
    d.redis.stop()  # Redis goes away (a clean stop: its append-only file is written)
    follow(msgs, 1)
    down = ask(d.url, msgs, MAX_TOKENS)  # the other replica: Redis unreachable, it prefills
    msgs.append(down.message)
    assert down.replica != first.replica and down.usage["session"] == "new"
    h = d.server_at(down.replica).health()
    assert h["store"]["available"] is False and h["store_failed"] >= 1 and h["store"]["writes_pending"] == 1
    d.redis.start()
    assert stored_value(d.redis.url, msgs[:2]) == committed  # the turn written before is still there
    settle(all_urls(d))  # the waiting turn is written once Redis is back
    assert all(s.health()["store"]["available"] for s in d.servers)
    follow(msgs, 2)
    after = ask(d.url, msgs, MAX_TOKENS)
    assert after.replica == first.replica and after.usage["session"] == "restored"
    assert after.usage["prompt_tokens_details"]["cached_tokens"] >= down.usage["total_tokens"] - 1


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_damaged_or_foreign_value_in_redis_is_refused_and_prefilled_again(deployment, damage):
    d = deployment
    msgs, replies = [{"role": "user", "content": f"Name a river ({damage})."}], []
    first = converse(d.url, msgs, replies, d)
    value = stored_value(d.redis.url, msgs)
    with redis.Redis.from_url(d.redis.url) as r:
        (key,) = [k for k in r.scan_iter(REDIS_PREFIX + "*") if r.get(k) == value]
        if damage == "truncated":
            r.set(key, value[:len(value) // 2])
        else:  # well formed, checksums right, another model's
            meta, cache = session_file.decode(value)
            meta["model"] = dict(meta["model"], source_sha256="0" * 64, name="another")
            r.set(key, session_file.encode(meta, cache))
    other = next(s for s in d.servers if f"127.0.0.1:{s.port}" != first.replica)
    failed = other.health()["restore_failed"]
    follow(msgs, 1)
    again = ask(d.url, msgs, MAX_TOKENS)
    assert f"127.0.0.1:{other.port}" == again.replica and again.usage["session"] == "new", again
    assert again.finish_reason in ("stop", "length") and again.text
    assert other.health()["restore_failed"] == failed + 1 and all(s.running() for s in d.servers)
    with redis.Redis.from_url(d.redis.url) as r:
        assert r.get(key) is None  # the refused value is gone; the new turn replaces it
    settle(all_urls(d))
