"""The routes: OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus /health and
the chat page at /. Bodies are read and checked here (validation.py), answered on the model
thread (service.py via model_thread.py) and shaped by responses.py.

A streamed answer's HTTP status is sent with its first piece of text, so an error found before
any text (context overflow, a failed restore) is still an HTTP error, not an event in a 200.
A client that disconnects cancels its answer (or its place in the queue).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from importlib import resources
from typing import AsyncIterator, Callable, Tuple

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import responses as out
from .model_thread import ModelThread
from .service import Outcome, Service
from .validation import ApiError, parse_chat, parse_completion, parse_json

log = logging.getLogger("mnn_h2o.serve")

_DISCONNECT_POLL_S = 0.5


def create_app(service: Service, model_id: str, serve_cfg: dict, created: int) -> FastAPI:
    model_thread = ModelThread()
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    limit = serve_cfg["max_tokens_limit"]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # A clean stop saves every conversation in memory (pool.py: what survives).
        await model_thread.run(service.close)
        model_thread.shutdown()

    app = FastAPI(title="mnn_h2o", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return JSONResponse(ApiError(f"{request.method} {request.url.path}: {e.detail}", None, code,
                                     e.status_code).body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):
        log.exception("request failed")
        return JSONResponse(ApiError(f"internal error: {type(e).__name__}: {e}", None, None, 500,
                                     "server_error").body(), status_code=500)

    def model_card() -> dict:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "mnn_h2o"}

    def check_model(name):
        if name is not None and name != model_id:
            raise ApiError(f"The model `{name}` does not exist; this server serves `{model_id}`",
                           "model", "model_not_found", 404)

    async def read_json(request: Request) -> dict:
        cap = serve_cfg["max_body_bytes"]
        size = request.headers.get("content-length", "")
        too_big = ApiError(f"the request body exceeds serve.max_body_bytes ({cap} bytes)", None, "request_too_large")
        if size.isdigit() and int(size) > cap:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cap:
                raise too_big
        return parse_json(bytes(body))

    @app.get("/", response_class=HTMLResponse)
    async def chat_page():
        return HTMLResponse(page)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_id, **service.stats()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        check_model(name)
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse_chat(await read_json(request), limit)
        check_model(req.model)
        head = out.Head(model_id, "chatcmpl")
        cancel = threading.Event()
        events = model_thread.stream(lambda emit: service.chat(req, emit, cancel), after=service.write_turns,
                                     then=service.after_answer)
        if not req.stream:
            return out.chat_completion(head, await _outcome(request, events, cancel))
        first = await _first_event(events, cancel)

        def pieces(text: str):
            return out.chat_chunk(head, {"content": text}, None, req.include_usage)

        def ending(o: Outcome):
            yield out.chat_chunk(head, {}, o.finish_reason, req.include_usage)
            if req.include_usage:
                yield out.usage_chunk(head, o, "chat.completion.chunk")

        start = out.chat_chunk(head, {"role": "assistant", "content": ""}, None, req.include_usage)
        return _sse(first, events, cancel, start, pieces, ending)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = parse_completion(await read_json(request), limit)
        check_model(req.model)
        head = out.Head(model_id, "cmpl")
        cancel = threading.Event()
        events = model_thread.stream(lambda emit: service.complete(req, emit, cancel))
        if not req.stream:
            return out.completion(head, await _outcome(request, events, cancel))
        first = await _first_event(events, cancel)

        def ending(o: Outcome):
            yield out.completion_chunk(head, "", o.finish_reason, req.include_usage)
            if req.include_usage:
                yield out.usage_chunk(head, o, "text_completion")

        return _sse(first, events, cancel, None, lambda t: out.completion_chunk(head, t, None, req.include_usage),
                    ending)

    return app


Events = AsyncIterator[Tuple[str, object]]


async def _outcome(request: Request, events: Events, cancel: threading.Event) -> Outcome:
    """The whole answer; the client's disconnect cancels it."""
    async def watch():
        while not cancel.is_set():
            if await request.is_disconnected():
                cancel.set()
            await asyncio.sleep(_DISCONNECT_POLL_S)

    watcher = asyncio.ensure_future(watch())
    try:
        async for kind, value in events:
            if kind == "error":
                raise value
            if kind == "done":
                return value
    finally:
        watcher.cancel()


async def _first_event(events: Events, cancel: threading.Event):
    """The first event of a streamed answer: an error raises here, before the status is sent."""
    try:
        kind, value = await events.__anext__()
    except BaseException:
        cancel.set()
        raise
    if kind == "error":
        raise value
    return kind, value


def _sse(first, events: Events, cancel: threading.Event, start, piece: Callable, ending: Callable):
    async def body():
        try:
            if start is not None:
                yield out.sse(start)
            event = first
            while True:
                kind, value = event
                if kind == "text":
                    yield out.sse(piece(value))
                elif kind == "done":
                    for chunk in ending(value):
                        yield out.sse(chunk)
                    yield out.SSE_DONE
                    return
                else:  # an error after the status was sent: an error event, then the end
                    body = value.body() if isinstance(value, ApiError) else ApiError(
                        f"internal error: {type(value).__name__}: {value}", None, None, 500, "server_error").body()
                    if not isinstance(value, ApiError):
                        log.error("streamed answer failed", exc_info=value)
                    yield out.sse(body)
                    return
                event = await events.__anext__()
        finally:
            cancel.set()  # the client left (or the answer ended): stop generating

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
