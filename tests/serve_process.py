"""A `python -m mnn_h2o.serve` process for the server's tests: started on a free loopback port,
waited for, measured (RSS from /proc), stopped cleanly or killed."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT_S = 300  # the first start may export the model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def post(url: str, body: bytes, timeout: float = 120):
    """(status, parsed JSON) of a raw POST, errors included."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


class Server:
    """``with Server(tmp_path, {"serve.kv_budget_bytes": 1 << 20}) as s: s.url``"""

    def __init__(self, workdir, settings=None, port=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(str(workdir), f"server-{self.port}-{time.monotonic_ns()}.log")
        self.args = [sys.executable, "-m", "mnn_h2o.serve", "--port", str(self.port), "--log-level", "warning"]
        # The server's own temporary directory would outlive a kill -9: keep it under workdir.
        settings = {"serve.session_store": "disk:" + os.path.join(str(workdir), f"sessions-{self.port}"),
                    **(settings or {})}
        for k, v in settings.items():
            self.args += ["--set", f"{k}={v}"]
        self.proc = None

    def start(self) -> "Server":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                get_json(self.url + "/health", timeout=2)
                return self
            except OSError:
                time.sleep(0.25)
        self.kill()
        raise RuntimeError(f"the server did not answer /health within {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def memory_kib(self) -> dict:
        """VmRSS (now), VmHWM (peak), RssAnon and RssFile (now) of the server process, in KiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}

    def stop(self, timeout: float = 120) -> int:
        """Ctrl-C: a clean stop, which saves the conversations in memory."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        """kill -9: no clean-up at all."""
        self.proc.kill()
        self.proc.wait(30)
        self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.kill()
        else:
            self._log.close()
