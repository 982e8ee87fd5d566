"""Two servers behind nginx on one Redis session store, and one server alone (the memory store)
as the yardstick, all started here on loopback (mnn_h2o/serve/replicas.py) and stopped at the
end: a conversation that alternates between the replicas answers as one server does, through a
kill -9 of a replica mid-answer and a Redis restart; Redis down during a turn, and a truncated or
foreign value in Redis, each cost a prefill, never a committed turn or a crash. Slow: a 4K-token
conversation is prefilled, compressed (kvzip's pass) and answered on a replica and on the server
alone."""
import http.client
import json
import os
import urllib.request

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
KILL_TURN = 4
REDIS_TURN = 7
MAX_TOKENS = 12
TIMEOUT_S = 900         # any request, or a server's work after it (a 4K-token prefill, a kvzip pass)


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
    a = ask(url, messages, MAX_TOKENS, timeout=TIMEOUT_S)
    assert a.finish_reason in ("stop", "length") and a.text, a
    messages.append(a.message)
    replies.append(a)
    settle(all_urls(d), timeout=TIMEOUT_S)
    return a


def follow(messages, turn):
    messages.append({"role": "user", "content": f"Question {turn}: say one more thing about it."})


def ask_and_kill(d, messages):
    """A turn streamed through nginx whose replica is killed (kill -9) after its first piece of
    text; the client sees the answer cut. Returns the replica killed."""
    body = json.dumps({"messages": messages, "max_tokens": 200, "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(d.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        victim = d.server_at(r.headers["X-Replica"])
        for line in r:
            if line.startswith(b"data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break
        victim.kill()
        rest = []
        try:
            rest = [json.loads(line[6:]) for line in r if line.startswith(b"data: {")]
        except (http.client.HTTPException, OSError):
            pass  # cut at the socket; nginx may as well end the stream early
    # Either way the answer never ended: no finish_reason (nor [DONE]).
    assert not [c for chunk in rest for c in chunk.get("choices", ()) if c.get("finish_reason")], rest
    return victim


def test_ten_turns_alternating_between_replicas_answer_as_one_server_through_a_kill_and_a_redis_restart(
        deployment, tokenizer):
    """Ten greedy turns through nginx, each served by the replica nginx picks (the other one, but
    after the kill), continuing the conversation from Redis; the same ten turns on the server
    alone: the same answers. At turn KILL_TURN the replica answering is killed mid-answer and the
    client asks again (the other one continues from the last completed turn; the killed one comes
    back with nothing in memory); before turn REDIS_TURN Redis restarts (it keeps what was
    written). The session in Redis at about 4K tokens is over 3x smaller than f16 KV, and the turn
    the other replica serves from it starts answering in at most a tenth of a re-prefill's time."""
    from mnn_h2o.essays import essay_tokens

    d = deployment
    opening = ("Read this text; I will ask about it.\n\n"
               + tokenizer.decode(essay_tokens(tokenizer, LONG_TOKENS, 20000)))
    alone_msgs, alone = [{"role": "user", "content": opening}], []
    shared_msgs, shared = [{"role": "user", "content": opening}], []
    killed = None
    for turn in range(TURNS):
        converse(d.alone.url, alone_msgs, alone, d)
        if turn == KILL_TURN:
            killed = ask_and_kill(d, shared_msgs)
        if turn == REDIS_TURN:
            d.restart_redis()
        converse(d.url, shared_msgs, shared, d)
        if turn == KILL_TURN:
            assert shared[-1].replica != f"127.0.0.1:{killed.port}"
            killed.start()
        if turn == 0:
            size = f16_bytes(stored_value(d.redis.url, shared_msgs))
        follow(alone_msgs, turn)
        follow(shared_msgs, turn)
    assert [a.text for a in shared] == [a.text for a in alone]
    ways = [a.usage["session"] for a in shared]
    assert [a.usage["session"] for a in alone] == ["new"] + ["continued"] * (TURNS - 1)
    # Nothing was prefilled again: every turn continued the last one, most of them from Redis.
    assert ways[0] == "new" and "new" not in ways[1:] and ways.count("restored") >= TURNS // 2, ways
    after_kill = [a for a in shared[KILL_TURN + 1:] if a.replica == f"127.0.0.1:{killed.port}"]
    assert after_kill and after_kill[0].usage["session"] == "restored", ways
    print(f"session in Redis at {size['tokens']} tokens: {size['stored_bytes']} bytes, f16 KV "
          f"{size['f16_bytes']} bytes: {size['ratio']:.2f}x")
    assert size["tokens"] >= LONG_TOKENS and size["ratio"] >= 3.0, size
    # Turn 2 on the other replica loaded the 4K-token conversation from Redis; the server alone
    # prefilled the same conversation at its turn 1 (what a re-prefill of it costs).
    assert shared[1].usage["session"] == "restored"
    store_ttft, prefill_ttft = shared[1].ttft_s, alone[0].ttft_s
    print(f"time to first token: from the store {store_ttft:.3f} s, re-prefill {prefill_ttft:.3f} s")
    assert store_ttft <= 0.1 * prefill_ttft, (store_ttft, prefill_ttft)


def test_a_redis_restart_costs_prefills_shows_in_health_and_keeps_every_written_turn(deployment):
    d = deployment
    x, y = d.servers  # asked directly: which replica answers is the point here
    msgs, replies = [{"role": "user", "content": "Name a cold country."}], []
    converse(x.url, msgs, replies, d)
    committed = stored_value(d.redis.url, msgs)
    d.redis.stop()  # Redis goes away (a clean stop: its append-only file is written)
    follow(msgs, 1)
    down = ask(y.url, msgs, MAX_TOKENS, timeout=TIMEOUT_S)  # Redis unreachable: y prefills the conversation
    msgs.append(down.message)
    assert down.usage["session"] == "new" and down.text
    h = y.health()
    assert h["store"]["available"] is False and h["store_failed"] >= 1 and h["store"]["writes_pending"] == 1
    d.redis.start()
    assert stored_value(d.redis.url, msgs[:2]) == committed  # the turn written before is still there
    settle(all_urls(d), timeout=TIMEOUT_S)  # the waiting turn is written once Redis is back
    assert all(s.health()["store"]["available"] for s in d.servers)
    follow(msgs, 2)
    after = ask(x.url, msgs, MAX_TOKENS, timeout=TIMEOUT_S)  # x held turn 1; Redis has y's turn 2
    assert after.usage["session"] == "restored"
    assert after.usage["prompt_tokens_details"]["cached_tokens"] >= down.usage["total_tokens"] - 1


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_damaged_or_foreign_value_in_redis_is_refused_and_prefilled_again(deployment, damage):
    d = deployment
    x, y = d.servers
    msgs, replies = [{"role": "user", "content": f"Name a river ({damage})."}], []
    converse(x.url, msgs, replies, d)
    value = stored_value(d.redis.url, msgs)
    with redis.Redis.from_url(d.redis.url) as r:
        (key,) = [k for k in r.scan_iter(REDIS_PREFIX + "*") if r.get(k) == value]
        if damage == "truncated":
            r.set(key, value[:len(value) // 2])
        else:  # well formed, checksums right, another model's
            meta, cache = session_file.decode(value)
            meta["model"] = dict(meta["model"], source_sha256="0" * 64, name="another")
            r.set(key, session_file.encode(meta, cache))
    failed = y.health()["restore_failed"]
    follow(msgs, 1)
    again = ask(y.url, msgs, MAX_TOKENS, timeout=TIMEOUT_S)
    assert again.usage["session"] == "new" and again.finish_reason in ("stop", "length") and again.text
    assert y.health()["restore_failed"] == failed + 1 and all(s.running() for s in d.servers)
    with redis.Redis.from_url(d.redis.url) as r:
        assert r.get(key) is None  # the refused value is gone
    settle(all_urls(d), timeout=TIMEOUT_S)


def test_the_recipe_starts_everything_on_loopback_and_ctrl_c_stops_it_all(tmp_path):
    """python -m mnn_h2o.serve.replicas (what scripts/replicas.sh runs): nginx answers on the port
    given, for a server on Redis; Ctrl-C leaves no process of it behind."""
    import signal
    import subprocess
    import sys
    import time

    from mnn_h2o.serve.replicas import free_port
    from mnn_h2o.tools.shared_sessions import health

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "mnn_h2o.serve.replicas", "--replicas", "1", "--port", str(port),
                          "--dir", str(tmp_path)], cwd=root, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert p.poll() is None, p.stderr.read()
            try:
                h = health(f"http://127.0.0.1:{port}")
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not answer"
                time.sleep(0.2)
        assert h["status"] == "ok" and h["store"]["where"].startswith("redis://127.0.0.1:")
        p.send_signal(signal.SIGINT)
        assert p.wait(120) == 0
    finally:
        if p.poll() is None:
            p.kill()
    # Nothing of it is left: Redis and nginx name the directory, the server names the Redis.
    assert not processes_naming(str(tmp_path), *redis_names(h["store"]["where"]))


def test_ctrl_c_while_the_processes_start_stops_them_all(tmp_path):
    """A Ctrl-C before nginx is up (here: as soon as the recipe says it starts) is a clean stop too:
    exit 0, nothing left running."""
    import re
    import signal
    import subprocess
    import sys

    from mnn_h2o.serve.replicas import free_port

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.Popen([sys.executable, "-m", "mnn_h2o.serve.replicas", "--replicas", "1", "--port", str(free_port()),
                          "--dir", str(tmp_path)], cwd=root, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        redis_url = re.search(r"\((redis://[^)]+)\)", line)
        assert line.startswith("starting") and redis_url, line
        p.send_signal(signal.SIGINT)
        assert p.wait(120) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert not processes_naming(str(tmp_path), *redis_names(redis_url.group(1)))


def redis_names(url: str) -> tuple:
    """What names a Redis server in a command line: its URL (the servers' --set), and the
    HOST:PORT redis-server shows as its title (it drops its arguments from /proc/PID/cmdline)."""
    return url, url.split("://", 1)[1].split("/", 1)[0]


def processes_naming(*marks: str) -> list:
    """Command lines of the running processes that contain any of ``marks``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in marks):
            found.append(cmd)
    return found
