"""python -m mnn_h2o.serve.replicas: several servers on this machine behind nginx, sharing one
Redis session store, so that any of them continues any conversation (docs/serve.md "Several
replicas"). Everything listens on loopback; Ctrl-C stops it all.

    python -m mnn_h2o.serve.replicas [--replicas 2] [--port 8080] [--config h2o.yaml] [--set KEY=VALUE]

It needs the Debian packages redis-server and nginx (scripts/replicas.sh installs them and runs
this). The tests and python -m mnn_h2o.tools.shared_sessions start the same deployment through
:class:`Deployment`: ``with Deployment(workdir, replicas=2) as d: d.url`` (nginx), ``d.servers[i]``,
``d.redis``.

Redis runs with its append-only file (appendfsync everysec), so a restart of Redis keeps what the
servers wrote; nginx hands requests round-robin to the servers and passes a request on to the next
server when one does not answer its connection (``proxy_next_upstream``), and names the server
that answered in the ``X-Replica`` response header.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Dict, List, Optional

START_TIMEOUT_S = 300    # a server's first start may export the model
STOP_TIMEOUT_S = 60
REDIS_DB = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_programs() -> List[str]:
    """Which of redis-server and nginx are not installed."""
    return [p for p in ("redis-server", "nginx") if _which(p) is None]


def _which(program: str) -> Optional[str]:
    # nginx lives in /usr/sbin, which a user's PATH may lack.
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/usr/local/sbin")


class Process:
    """A child process with its output in a log file, started and waited for until ``ready()``."""

    name = "process"

    def __init__(self, workdir: str, args: List[str]):
        self.workdir, self.args = workdir, args
        self.log_path = os.path.join(workdir, f"{self.name}.log")
        self.proc: Optional[subprocess.Popen] = None

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = START_TIMEOUT_S) -> "Process":
        with deferred_signals():
            with open(self.log_path, "a") as log:
                self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"{self.name} was not ready within {timeout:g} s:\n{self.log()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> Optional[int]:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status."""
        if not self.running():
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        """kill -9."""
        if self.running():
            self.proc.kill()
            self.proc.wait(30)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


@contextlib.contextmanager
def deferred_signals():
    """Ctrl-C and SIGTERM held back until the block is done, then delivered: one arriving inside
    Popen, or before its result is kept, would leave a child nobody stops (it has its own session:
    a Ctrl-C reaches us only). Recorded by a handler, not masked: a child inherits a signal mask,
    and a Redis started with SIGTERM blocked never stops. Signal handlers belong to the main thread:
    elsewhere nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in pending:
            signal.raise_signal(s)


class RedisServer(Process):
    name = "redis"

    def __init__(self, workdir: str, port: Optional[int] = None, maxmemory: str = ""):
        self.port = port or free_port()
        self.dir = os.path.join(workdir, "redis")
        os.makedirs(self.dir, exist_ok=True)
        args = [_which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
                "--dir", self.dir, "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                "--protected-mode", "yes", "--daemonize", "no"]
        if maxmemory:  # a cache of conversations: the least recently used go first
            args += ["--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru"]
        super().__init__(workdir, args)
        self.url = f"redis://127.0.0.1:{self.port}/{REDIS_DB}"

    def ready(self) -> bool:
        import redis  # the serve extra's client, as the servers use it

        try:
            with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1) as r:
                return bool(r.ping())
        except (redis.RedisError, OSError):
            return False


class ServerProcess(Process):
    """``python -m mnn_h2o.serve`` on a loopback port."""

    def __init__(self, workdir: str, index: int, settings: Dict[str, str], config: Optional[str] = None,
                 port: Optional[int] = None):
        self.name = f"server{index}"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "mnn_h2o.serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--log-level", "warning"]
        if config:
            args += ["--config", config]
        for k, v in settings.items():
            args += ["--set", f"{k}={v}"]
        super().__init__(workdir, args)

    def ready(self) -> bool:
        try:
            self.health()
            return True
        except OSError:
            return False

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
            return json.load(r)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> Optional[int]:
        """Like Ctrl-C: a clean stop, which writes what the store lacks."""
        if self.running():
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return None if self.proc is None else self.proc.returncode


NGINX_CONF = """\
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream replicas {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 0;              # the servers check serve.max_body_bytes themselves
        client_body_buffer_size {body_buffer};  # a request body stays in memory, never in a temp file
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;             # streamed answers pass through as they come
            proxy_read_timeout 3600s;        # a long prefill sends nothing for a while
            # A server that refuses the connection (stopped, killed) passes the request on: the
            # request was not sent, so repeating it elsewhere is safe.
            proxy_next_upstream error timeout non_idempotent;
            proxy_next_upstream_tries 2;
            add_header X-Replica $upstream_addr always;
        }}
    }}
}}
"""


class Nginx(Process):
    name = "nginx"

    def __init__(self, workdir: str, upstream_ports: List[int], port: Optional[int] = None,
                 body_buffer: str = "8m"):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = os.path.join(workdir, "nginx")
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in upstream_ports)
        self.conf = os.path.join(self.dir, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(NGINX_CONF.format(dir=self.dir, servers=servers, port=self.port, body_buffer=body_buffer))
        # -e: the error log before the config is read (else nginx opens its compiled-in path).
        super().__init__(workdir, [_which("nginx") or "nginx", "-e", os.path.join(self.dir, "nginx-error.log"),
                                   "-p", self.dir, "-c", self.conf, "-g", "daemon off;"])

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> Optional[int]:
        if self.running():
            self.proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return None if self.proc is None else self.proc.returncode


class Deployment:
    """Redis, ``replicas`` servers on it and nginx in front, in ``workdir``; a context manager
    that stops everything it started, whatever happens."""

    def __init__(self, workdir: str, replicas: int = 2, settings: Optional[Dict[str, str]] = None,
                 config: Optional[str] = None, port: Optional[int] = None, redis_maxmemory: str = ""):
        missing = missing_programs()
        if missing:
            raise RuntimeError(f"{' and '.join(missing)} not installed: apt-get install -y redis-server nginx "
                               f"(scripts/replicas.sh does it)")
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.redis = RedisServer(workdir, maxmemory=redis_maxmemory)
        settings = dict(settings or {}, **{"serve.session_store": self.redis.url})
        self.servers = [ServerProcess(workdir, i, settings, config) for i in range(replicas)]
        self.nginx = Nginx(workdir, [s.port for s in self.servers], port)
        self.url = self.nginx.url

    def start(self) -> "Deployment":
        try:
            self.redis.start()
            for s in self.servers:  # each loads the model; one at a time keeps a first export single
                s.start()
            self.nginx.start()
        except BaseException:
            self.stop()
            raise
        return self

    def server_at(self, address: str) -> ServerProcess:
        """The server nginx names in X-Replica (``127.0.0.1:PORT``)."""
        port = int(address.rsplit(":", 1)[1])
        return next(s for s in self.servers if s.port == port)

    def restart_redis(self) -> None:
        """A clean restart: Redis writes its append-only file and reads it back."""
        self.redis.stop()
        self.redis.start()

    def stop(self) -> None:
        for p in [self.nginx, *self.servers, self.redis]:
            try:
                p.stop()
            except Exception:
                p.kill()

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_on_sigterm() -> None:
    """SIGTERM (kill, a CI's timeout) as Ctrl-C: the caller's ``finally`` then stops every process it
    started, where Python's default would end it and leave Redis, nginx and the servers running."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)


def main(argv=None) -> int:
    stop_on_sigterm()
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.serve.replicas", description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=2, help="servers behind nginx (default 2)")
    ap.add_argument("--port", type=int, default=8080, help="nginx's port on 127.0.0.1 (default 8080)")
    ap.add_argument("--config", help="the servers' YAML config (docs/config.md)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a config key for every server (repeatable); serve.session_store is the Redis")
    ap.add_argument("--dir", default="replicas", help="logs, Redis's data and nginx's config (default ./replicas)")
    ap.add_argument("--redis-maxmemory", default="", metavar="BYTES",
                    help="bound Redis's memory (e.g. 2gb); beyond it the least recently used conversations go")
    args = ap.parse_args(argv)
    if args.replicas < 1:
        ap.error("--replicas must be at least 1")
    settings = dict(a.split("=", 1) for a in args.set)
    d = None
    try:
        d = Deployment(os.path.abspath(args.dir), args.replicas, settings, args.config, args.port, args.redis_maxmemory)
        print(f"starting Redis ({d.redis.url}), {args.replicas} servers and nginx (logs in {d.workdir}) ...",
              file=sys.stderr)
        d.start()  # a Ctrl-C from here on (nginx may answer before its readiness poll is back) stops all
        print(f"serving on {d.url} (nginx) -> " + ", ".join(s.url for s in d.servers) +
              f"; sessions in {d.redis.url}. Ctrl-C stops everything.", file=sys.stderr)
        while all(p.running() for p in (d.redis, d.nginx, *d.servers)):
            time.sleep(1)
        print("a process ended (see its log); stopping the others", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        if d is not None:
            d.stop()


if __name__ == "__main__":
    sys.exit(main())
