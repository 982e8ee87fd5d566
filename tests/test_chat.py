"""The interactive chat of ``python -m mnn_h2o.demo`` on the real model, driven through a pipe:
turns, /stats, /save, /load, /quit; Ctrl-C stops an answer, then at the prompt leaves with 130."""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(*args):
    return subprocess.Popen([sys.executable, "-m", "mnn_h2o.demo", *args], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)


def test_chat_through_a_pipe(tmp_path):
    path = tmp_path / "chat.session"
    lines = ["What is the capital of France?", "/stats", f"/save {path}", f"/load {path}",
             "And of Spain?", "/help", "/quit", "never read"]
    p = _start("--max-new-tokens", "8")
    out, err = p.communicate("\n".join(lines) + "\n", timeout=600)
    assert p.returncode == 0, err
    assert "tokens in the conversation" in out and "whole-model ratio" in out and "KV held" in out
    assert f"(saved 2 messages" in out and f"(loaded {path}: 2 messages" in out
    assert "/save FILE" in out  # /help
    assert path.stat().st_size > 0


def test_ctrl_c_stops_the_answer_then_leaves_at_the_prompt():
    p = _start("--max-new-tokens", "400")
    chunks = queue.Queue()
    threading.Thread(target=lambda: [chunks.put(c) for c in iter(lambda: p.stdout.read(1), "")],
                     daemon=True).start()
    seen = ""

    def wait_for(pred, timeout=300):
        nonlocal seen
        end = time.monotonic() + timeout
        while not pred(seen):
            seen += chunks.get(timeout=max(0.01, end - time.monotonic()))

    try:
        wait_for(lambda s: "/help lists the commands\n" in s)
        p.stdin.write("Write a very long story about a dragon.\n")
        p.stdin.flush()
        banner = len(seen)
        wait_for(lambda s: len(s) > banner + 5)   # the answer is streaming
        p.send_signal(signal.SIGINT)
        wait_for(lambda s: "[stopped]\n" in s)
        p.stdin.write("/stats\n")
        p.stdin.flush()
        wait_for(lambda s: "whole-model ratio" in s)  # still chatting
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)                  # at the prompt: leave
        assert p.wait(timeout=60) == 130
        assert p.stderr.read().strip().splitlines()[-1] == "interrupted"
    finally:
        if p.poll() is None:
            p.kill()


def test_the_history_is_compressed_after_the_answer():
    """The chat answers first and compresses on a thread of its own while the next line comes
    (docs/sessions.md "Compression after the answer"): /stats, which waits for it, already sees
    the history evicted (the trigger at 0 so that a short conversation is)."""
    p = _start("--max-new-tokens", "8", "--set", "eviction.policy=kvzip", "--set", "eviction.trigger_min_tokens=0",
               "--set", "eviction.sink_tokens=4", "--set", "eviction.recent_tokens=8")
    out, err = p.communicate("What is the capital of France?\n/stats\n/quit\n", timeout=600)
    assert p.returncode == 0, err
    ratio = float(out.split("whole-model ratio ")[1].split("x")[0])
    assert ratio > 2.0, out  # q8 rows alone: 1.88
