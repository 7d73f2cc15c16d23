"""The app factory: one resident model under the budget, served one request at a time.

- `ModelManager` owns the model: located by name (store names only, so a request cannot name an
  arbitrary file), loaded lazily (or at startup), swapped when a request names another model or
  another num_ctx (the old one is closed first, so one model at a time stays under the budget),
  unloaded when its keep_alive runs out. Every call into the model runs on one worker thread
  (numba's thread count is per thread, and the engine is not thread-safe); an asyncio lock makes
  requests take turns, and a streaming response holds it until its last chunk or a disconnect.
- `Job` is one generation holding the lock: it loads, renders and tokenizes, and runs the first
  step (prompt evaluation) before any response starts, so that errors there get a real status.
- `Guard` (pure ASGI, before any route): the API key, then the request body size limit.
- Errors map to HTTP statuses by exception type (`error_status`), never by message; bodies are
  Ollama's `{"error": "..."}`, or OpenAI's `{"error": {"message": ..., "type": ...}}` under /v1.
`ModelManager` and `Job` live in server.manager; limits, config, errors and helpers in server.common.
"""
from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._version import __version__
from ..errors import RamforgeError
from .common import (OPEN_PATHS, ServerConfig, error_body, error_response, error_status, log,
                     validation_message)
from .manager import ModelManager


# -------------------------------------------------------------------------------- middleware

class Guard:
    """Pure ASGI: the API key (401), then the body limit (413), before any route runs.

    The body is read here (at most `max_body` bytes) and replayed to the app, so chunked bodies
    are limited too; an oversized body is drained (up to 16x the limit) before the 413 goes out,
    so a client still sending gets the answer instead of a reset connection. A body is parsed as
    JSON whatever its Content-Type, as Ollama does (`curl -d '{...}'` sends a form type)."""

    def __init__(self, app, api_key: str | None, max_body: int):
        self.app, self.api_key, self.max_body = app, api_key, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        if self.api_key and path not in OPEN_PATHS and not self._authorized(headers.get(b"authorization")):
            return await _send_error(send, path, 401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                     [(b"www-authenticate", b"Bearer")])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                declared = int(declared)
            except ValueError:
                return await _send_error(send, path, 400, "invalid Content-Length header")
        too_big = f"request body over the limit of {self.max_body:,} bytes"
        if declared is not None and declared > self.max_body:
            await self._drain(receive, 0)
            return await _send_error(send, path, 413, too_big, [(b"connection", b"close")])
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max_body:
                if msg.get("more_body"):
                    await self._drain(receive, size)
                return await _send_error(send, path, 413, too_big, [(b"connection", b"close")])
            chunks.append(body)
            if not msg.get("more_body"):
                break
        body, replayed = b"".join(chunks), False
        if body:   # every route takes JSON: read it so whatever the Content-Type (curl -d sends a form type)
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
                         + [(b"content-type", b"application/json")])

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()          # then http.disconnect, when the client goes

        await self.app(scope, replay, send)

    def _authorized(self, value: bytes | None) -> bool:
        if not value:
            return False
        scheme, _, token = value.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def _drain(self, receive, size: int) -> None:
        while size <= 16 * self.max_body:
            msg = await receive()
            if msg["type"] != "http.request" or not msg.get("more_body"):
                return
            size += len(msg.get("body", b""))


async def _send_error(send, path: str, status: int, message: str, extra: list | None = None) -> None:
    body = json.dumps(error_body(path, status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------------------------------- app

def create_app(cfg: ServerConfig | None = None, **kwargs) -> FastAPI:
    """The FastAPI app (Ollama routes under /api, OpenAI's under /v1, /health), wrapped in `Guard`.

    `app.state.manager` is the ModelManager; call `manager.preload()` before serving to load the
    startup model eagerly (what `ramforge serve MODEL` does)."""
    from . import ollama, openai, slots

    cfg = cfg or ServerConfig(**kwargs)
    manager = ModelManager(cfg)

    @asynccontextmanager
    async def lifespan(app):
        reaper = asyncio.create_task(manager.reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            await manager.shutdown()

    app = FastAPI(title="ramforge", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.manager = manager
    app.state.config = cfg

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return error_response(request, 400, validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(request, exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RamforgeError)
    async def _ramforge(request: Request, exc: RamforgeError):
        status = error_status(exc)
        if status >= 500:
            log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(request, status, str(exc))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(request, 500, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health():
        cur = manager.current
        return {"status": "ok", "model": cur.name if cur else None, "busy": manager.lock.locked(),
                "waiting": manager.waiting}

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root():
        return PlainTextResponse("ramforge is running (Ollama API under /api, OpenAI API under /v1)")

    app.include_router(ollama.router)
    app.include_router(openai.router)
    app.include_router(slots.router)
    app.add_middleware(Guard, api_key=cfg.api_key, max_body=cfg.max_body)   # before routing, after nothing
    return app
