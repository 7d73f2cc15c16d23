"""The app factory: one resident model under the budget, served one request at a time.

- `ModelManager` owns the model: located by name (store names only, so a request cannot name an
  arbitrary file), loaded lazily (or at startup), swapped when a request names another model or
  another num_ctx (the old one is closed first, so one model at a time stays under the budget),
  unloaded when its keep_alive runs out. Every call into the model runs on one worker thread
  (numba's thread count is per thread, and the engine is not thread-safe); an asyncio lock makes
  requests take turns, and a streaming response holds it until its last chunk or a disconnect.
- `Job` is one generation holding the lock: it loads, renders and tokenizes, and runs the first
  step (prompt evaluation) before any response starts, so that errors there get a real status.
- `BrowserGate` (server.browser, outermost): 403 for a Host that is not local on a loopback
  connection (DNS rebinding) and for an Origin that is not allowed; then Starlette's CORSMiddleware
  (preflights, CORS headers for the allowed origins); then `Guard` (pure ASGI, before any route): the
  API key, the request body size limit, a browser's body must be JSON, and the client's "gone" test
  for ramforge.cancel.
- Errors map to HTTP statuses by exception type (`error_status`), never by message; bodies are
  Ollama's `{"error": "..."}`, or OpenAI's `{"error": {"message": ..., "type": ...}}` under /v1.
`ModelManager` lives in server.manager, `Job` in server.jobs; limits, config, errors and helpers in server.common.
"""
from __future__ import annotations

import asyncio
import hmac
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from .. import cancel
from .._version import __version__
from ..errors import RamforgeError
from .browser import CORS_METHODS, DEFAULT_ORIGINS, BrowserGate, origin_regex, send_error as _send_error
from .common import (MAX_JSON_DEPTH, OPEN_PATHS, ServerConfig, body_error, error_response, error_status, json_depth,
                     loading_response, log, validation_message)
from .manager import ModelManager


# -------------------------------------------------------------------------------- middleware

def _json_type(value: bytes | None) -> bool:
    """application/json or application/*+json, whatever its parameters (FastAPI's rule)."""
    kind = (value or b"").split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))


class Guard:
    """Pure ASGI: the API key (401), the body limit (413), a browser's body type (415) and a body
    nesting deeper than MAX_JSON_DEPTH (400), before any route runs; then the app, with the client's "gone" test as ramforge.cancel.INTERRUPT.

    The body is read here (at most `max_body` bytes) and replayed to the app, so chunked bodies
    are limited too; an oversized body is drained (up to 16x the limit) before the 413 goes out,
    so a client still sending gets the answer instead of a reset connection. Every route takes
    JSON. A body from a browser (a request with `Origin`, which the Fetch standard puts on every
    POST) must say application/json: 415 otherwise (its origin passed BrowserGate, so the fix is
    the type, not the origin). Without `Origin` the body is parsed as JSON whatever its type, as
    Ollama does, so `curl -d '{...}'` (a form type) works as in Ollama's documentation.

    Once the body is in, one task waits for the client's `http.disconnect` (ASGI delivers it only
    to a waiting `receive`) and sets the request's `gone` event at once: the model's loops check it
    between steps (ramforge.cancel), and the app's own `receive` gets the disconnect from it."""

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
        if path.startswith("/api/blobs/"):       # a model's bytes: streamed to the route, which bounds them
            return await self.app(scope, receive, send)
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
        if body and b"origin" in headers and not _json_type(headers.get(b"content-type")):
            kind = (headers.get(b"content-type") or b"none").decode("latin-1")[:100]
            return await _send_error(send, path, 415, f"a request body from a browser must be application/json, "
                                                      f"not {kind}")
        depth = json_depth(body) if body else 0
        if depth > MAX_JSON_DEPTH:  # Python's JSON parser recurses per level: refused before it runs
            return await _send_error(send, path, 400, f"the request body nests arrays and objects {depth:,} deep, "
                                                      f"deeper than the {MAX_JSON_DEPTH} levels the server reads")
        if body:   # every route takes JSON: read it so whatever the Content-Type (curl -d sends a form type)
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
                         + [(b"content-type", b"application/json")])
        gone = threading.Event()
        watcher = asyncio.ensure_future(receive())      # http.disconnect: the client went (or the response ended)
        watcher.add_done_callback(lambda _: gone.set())

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            try:
                return await asyncio.shield(watcher)
            except Exception:  # noqa: BLE001 - a receive that failed: the client is as good as gone
                return {"type": "http.disconnect"}

        token = cancel.INTERRUPT.set(gone.is_set)
        try:
            await self.app(scope, replay, send)
        finally:
            cancel.INTERRUPT.reset(token)
            watcher.cancel()

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


# ---------------------------------------------------------------------------------------- app

def create_app(cfg: ServerConfig | None = None, **kwargs) -> FastAPI:
    """The FastAPI app (Ollama routes under /api, OpenAI's under /v1, /health), wrapped in `Guard`.

    `app.state.manager` is the ModelManager; call `manager.preload()` before serving to load the
    startup model eagerly (what `ramforge serve MODEL` does)."""
    from . import embeddings, llamaserver, models_api, ollama, openai, responses, slots

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
        why = body_error(exc.__cause__) if exc.status_code == 400 else None     # FastAPI's generic parse error
        return error_response(request, exc.status_code, why or str(exc.detail), getattr(exc, "headers", None))

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
        if manager.warming:     # llama-server's answer while it loads; Ollama's / and /api/version answer at once
            return loading_response()
        cur = manager.current
        return {"status": "ok", "model": cur.name if cur else None, "busy": manager.lock.locked(),
                "waiting": manager.waiting, "generating": manager.busy}

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root():
        return PlainTextResponse("ramforge is running (Ollama API under /api, OpenAI API under /v1)")

    app.include_router(models_api.router)      # before ollama's: its /api/{verb} answers the verbs it lacks
    app.include_router(embeddings.router)       # /api/embed, /v1/embeddings, /embedding, /rerank (before ollama's /api/{verb})
    app.include_router(ollama.router)
    app.include_router(openai.router)
    app.include_router(responses.router)        # /v1/responses over openai's chat path
    app.include_router(slots.router)
    app.include_router(llamaserver.router)      # llama-server's endpoints (/tokenize, /props, /completion, ...)
    # outermost last: BrowserGate, then CORSMiddleware (preflights answered before the API key), then Guard
    app.add_middleware(Guard, api_key=cfg.api_key, max_body=cfg.max_body)
    app.add_middleware(CORSMiddleware, allow_origin_regex=origin_regex(DEFAULT_ORIGINS + tuple(cfg.origins)),
                       allow_methods=CORS_METHODS, allow_headers=["*"], allow_private_network=True, max_age=43200)
    app.add_middleware(BrowserGate, origins=DEFAULT_ORIGINS + tuple(cfg.origins))
    return app
