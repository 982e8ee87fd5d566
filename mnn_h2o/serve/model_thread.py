"""The one thread that runs the model. Requests to one model are answered one at a time, in the
order they arrived (a single-worker queue); the others wait. Sessions and the pool are only ever
touched from this thread, so no two requests can interleave their forwards on one cache.

A job's streamed text and its end reach the event loop through an asyncio queue.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Optional, Tuple

log = logging.getLogger("mnn_h2o.serve")


class ModelThread:
    def __init__(self):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnn_h2o-model")

    async def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the model thread, after the jobs queued before it."""
        return await asyncio.wrap_future(self._executor.submit(fn))

    async def stream(self, job: Callable[[Callable[[str], None]], Any],
                     after: Optional[Callable[[], None]] = None,
                     then: Optional[Callable[[], None]] = None) -> AsyncIterator[Tuple[str, Any]]:
        """Runs ``job(emit)`` on the model thread and yields ``("text", piece)`` for each
        ``emit(piece)``, then ``("done", result)`` or ``("error", exception)``. ``after()``, if
        given, runs once the end was handed over, before the jobs that came meanwhile (short work
        that should not wait for them); ``then()`` is queued behind those jobs (the long work a
        request leaves for after its answer). Their errors are logged."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def post(event):
            # The loop is gone only when the server stopped mid-answer: nobody is listening.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, event)

        def run():
            try:
                post(("done", job(lambda piece: post(("text", piece)))))
            except BaseException as e:  # handed to the request, which answers with it
                post(("error", e))
            if after is not None:
                _logged(after)
            if then is not None:
                with contextlib.suppress(RuntimeError):  # shutting down: the work is not needed
                    self._executor.submit(_logged, then)

        self._executor.submit(run)
        while True:
            event = await queue.get()
            yield event
            if event[0] != "text":
                return

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _logged(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        log.exception("work after an answer failed")
