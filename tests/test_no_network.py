"""Nothing at run time touches the network: load SmolLM2 and generate with sockets disabled.

A fresh interpreter replaces the socket entry points before anything else is imported (so no
module can keep a reference to the real ones), then runs the engine the way users do. Every
attempt is counted and refused; the child prints the counts as JSON. At the end it tries one
connection on purpose, to prove the guard was in place (that one must be counted and refused).
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, socket, sys

attempts = {"socket": 0, "create_connection": 0, "getaddrinfo": 0, "gethostbyname": 0, "connect": 0}

def refuse(what):
    attempts[what] += 1
    raise OSError(f"network disabled by test_no_network ({what})")

class NoSocket(socket.socket):  # a class, so modules that subclass socket.socket still import
    def __init__(self, *a, **k):
        refuse("socket")
    def connect(self, *a, **k):
        refuse("connect")

socket.socket = NoSocket
socket.create_connection = lambda *a, **k: refuse("create_connection")
socket.getaddrinfo = lambda *a, **k: refuse("getaddrinfo")
socket.gethostbyname = lambda *a, **k: refuse("gethostbyname")

sys.path.insert(0, "tests")
from conftest import make_llm

llm = make_llm(8)
gen = llm.generate("What is the capital of France?", max_new_tokens=8)
during = dict(attempts)

try:  # the guard itself: this must be refused and counted
    socket.create_connection(("example.com", 80), timeout=1)
    guard = "connected"
except OSError:
    guard = "refused"
print(json.dumps({"attempts": during, "tokens": len(gen.token_ids), "text": gen.text,
                  "guard": guard, "guard_counted": attempts["create_connection"] - during["create_connection"]}))
'''


@pytest.mark.model
def test_generation_opens_no_socket():
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print("socket attempts during load + generate:", out["attempts"], "| generated:", repr(out["text"]))
    assert out["guard"] == "refused" and out["guard_counted"] == 1, out
    assert out["tokens"] > 0, out
    assert sum(out["attempts"].values()) == 0, f"network attempted: {out['attempts']}"
