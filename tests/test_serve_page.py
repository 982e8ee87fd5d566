"""The chat page at / in headless Chromium against the live server: a message typed into the
page streams an answer, and the turn shows its tokens and KV memory.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
ended by NUL on file descriptors 3 and 4), so no extra Python package is needed. Chromium is the
Debian package `chromium` (apt-get install -y chromium)."""
import json
import os
import shutil
import subprocess
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from serve_process import Server  # noqa: E402

pytestmark = pytest.mark.model

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ANSWER_TIMEOUT_S = 300


class Browser:
    """Headless Chromium and one page, over the DevTools protocol."""

    def __init__(self, profile_dir):
        to_child, self._cmd = os.pipe()    # we write commands, Chromium reads fd 3
        self._evt, from_child = os.pipe()  # Chromium writes fd 4, we read

        def fds_3_and_4():
            a, b = os.dup(to_child), os.dup(from_child)  # above 4, so dup2 cannot clobber them
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--disable-extensions", "--disable-background-networking",
             f"--user-data-dir={profile_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds_3_and_4, close_fds=False)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0
        self.session = None

    def call(self, method, session=True, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd, json.dumps(msg).encode() + b"\0")
        while True:  # events and other replies are skipped
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self):
        while b"\0" not in self._buf:
            chunk = os.read(self._evt, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def open(self, url):
        target = self.call("Target.createTarget", url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression}")

    def type_and_send(self, text):
        """Keyboard input as a user gives it: the text into the focused box, then Enter."""
        self.js("document.getElementById('input').focus()")
        self.call("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                      windowsVirtualKeyCode=13, nativeVirtualKeyCode=13)

    def close(self):
        try:
            self.call("Browser.close", session=False)
            self.proc.wait(30)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(30)
        os.close(self._cmd)
        os.close(self._evt)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)")
def test_the_chat_page_streams_an_answer_with_its_kv_figures(tmp_path):
    with Server(tmp_path) as server:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(server.url + "/?max_tokens=12")
            browser.wait_for("document.getElementById('model')?.textContent === 'smollm2'", 60)
            turns = []
            for question in ("What is the capital of France?", "And of Italy?"):
                browser.type_and_send(question)
                state = browser.wait_for("['done', 'error'].includes(document.body.dataset.state) && "
                                         "document.querySelectorAll('.assistant, .error').length === "
                                         f"{len(turns) + 1} && document.body.dataset.state", ANSWER_TIMEOUT_S)
                answers = browser.js("[...document.querySelectorAll('.assistant')].map(e => e.textContent)")
                stats = browser.js("[...document.querySelectorAll('.stats')].map(e => e.textContent)")
                assert state == "done", browser.js("document.getElementById('log').innerText")
                assert len(answers) == len(turns) + 1 and answers[-1].strip()
                turns.append(stats[-1])
            assert browser.js("document.querySelectorAll('.user')[1].textContent") == "And of Italy?"
        finally:
            browser.close()
    # Each turn shows its tokens and KV memory; the second one reused the first one's cache.
    for s in turns:
        assert "tokens prefilled" in s and "generated" in s and "KV held" in s and "MiB" in s, s
    first_prefill = int(turns[0].split("prompt ")[1].split(" tokens")[0])
    second_prefill = int(turns[1].split("prompt ")[1].split(" tokens")[0])
    reused = int(turns[1].split("(")[1].split(" reused")[0])
    assert second_prefill < first_prefill and reused >= first_prefill, turns
