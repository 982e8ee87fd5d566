"""The interactive chat of ``python -m mnn_h2o.demo`` (without --prompt): lines from stdin (a
terminal or a pipe), one Session whose history stays in the compressed cache, streamed answers.

Ctrl-C during an answer stops that answer; at the prompt, or twice within a second during an
answer, it leaves the chat (exit status 130).

An answer starts from the cache as prefilled; kvzip's pass and eviction then run on a thread of
their own while the next line is typed (Session's ``compress_after_answer``). A line sent before
they end waits for them; leaving stops them.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Callable, Optional, TextIO

from .engine import Llm, Sampling
from .errors import ContextOverflowError
from .prefill_progress import PrefillBars
from .session import Session

HELP = """commands:
  /reset        forget the conversation (the system message stays)
  /stats        tokens, KV bytes held and the whole-model ratio
  /save FILE    save the conversation with its cache (docs/session_format.md)
  /load FILE    continue a saved conversation
  /quit         leave (so does end of input, Ctrl-D)
  /help         this list
Ctrl-C stops an answer; at the prompt (or twice quickly) it leaves."""

_DOUBLE_INTERRUPT_S = 1.0


class _Interrupts:
    """SIGINT while answering: cancel the answer (a second one within a second: leave); while
    reading: leave. Leaving is a KeyboardInterrupt, which the demo turns into status 130."""

    def __init__(self):
        self.cancel: Optional[threading.Event] = None
        self.last = 0.0

    def __call__(self, signum, frame):
        now = time.monotonic()
        if self.cancel is None or (self.cancel.is_set() and now - self.last < _DOUBLE_INTERRUPT_S):
            raise KeyboardInterrupt
        self.cancel.set()
        self.last = now


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def stats_line(session: Session) -> str:
    st = session.stats()
    return (f"{st['tokens']} tokens in the conversation, {st['tokens_held']} held per layer and kv head; "
            f"KV held {_mib(st['kv_bytes_held'])} (an f16 cache of every token: {_mib(st['kv_bytes_f16'])}), "
            f"whole-model ratio {st['whole_model_ratio']:.2f}x")


class _Compressor:
    """The session's compression after an answer, on a thread of its own; an error is kept for
    the next prompt (``report``)."""

    def __init__(self):
        self.thread: Optional[threading.Thread] = None
        self.cancel = threading.Event()
        self.error: Optional[BaseException] = None

    def start(self, session: Session) -> None:
        cancel = self.cancel = threading.Event()

        def run():
            try:
                session.compress(cancel=cancel)
            except Exception as e:  # the session forgot its cache; the next turn prefills it again
                self.error = e

        self.thread = threading.Thread(target=run, name="mnn_h2o-compress", daemon=True)
        self.thread.start()

    def report(self, say: Callable[[str], None]) -> None:
        if self.error is not None:
            say(f"(the history could not be compressed: {self.error}; it is prefilled again next turn)")
            self.error = None

    def stop(self) -> None:
        """Stops a compression under way (the session forgets its cache) and waits for it."""
        if self.thread is not None:
            self.cancel.set()
            self.thread.join()
            self.thread = None


def chat(llm: Llm, cfg: dict, sampling: Sampling, max_new_tokens: int, stop, system: Optional[str] = None,
         stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    session = Session(llm, cfg, system=system, compress_after_answer=True)
    compressor = _Compressor()
    tty = stdin.isatty()
    interrupts = _Interrupts()
    bars = PrefillBars()  # on stderr, when it is a terminal: a long turn's prompt and kvzip pass
    previous = signal.signal(signal.SIGINT, interrupts)
    say: Callable[[str], None] = lambda s: print(s, file=out, flush=True)
    say(f"chatting with {llm.config.name} (KV {cfg['runtime']['kv_dtype']}, "
        f"eviction {'on' if cfg['eviction']['enabled'] else 'off'}); /help lists the commands")
    try:
        while True:
            if tty:
                out.write("> ")
                out.flush()
            line = stdin.readline()
            compressor.report(say)
            if not line:
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                cmd, _, arg = line.partition(" ")
                arg = arg.strip()
                if cmd == "/quit":
                    return 0
                if cmd == "/help":
                    say(HELP)
                elif cmd == "/reset":
                    compressor.stop()
                    session.reset()
                    say("(conversation cleared)")
                elif cmd == "/stats":
                    say(stats_line(session))
                elif cmd in ("/save", "/load") and not arg:
                    say(f"error: {cmd} needs a file name")
                elif cmd == "/save":
                    try:
                        session.save(arg)
                        say(f"(saved {len(session.messages)} messages, {len(session.token_ids)} tokens to {arg})")
                    except (ValueError, OSError) as e:
                        say(f"error: {e}")
                elif cmd == "/load":
                    try:
                        loaded = Session.load(arg, llm, compress_after_answer=True)
                    except ValueError as e:
                        say(f"error: {e}")
                    else:
                        compressor.stop()
                        session.close()
                        session = loaded
                        say(f"(loaded {arg}: {len(session.messages)} messages, {len(session.token_ids)} tokens)")
                else:
                    say(f"error: unknown command {cmd}; /help lists the commands")
                continue
            interrupts.cancel = threading.Event()
            try:
                r = session.say(line, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop,
                                on_text=lambda s: (out.write(s), out.flush()), cancel=interrupts.cancel,
                                progress=bars)
                say(" [stopped]" if r.finish_reason == "cancelled" else "")
                compressor.start(session)
            except ContextOverflowError as e:
                say(f"error: {e}")
            finally:
                bars.close()
                interrupts.cancel = None
    finally:
        signal.signal(signal.SIGINT, previous)
        compressor.stop()
        session.close()
