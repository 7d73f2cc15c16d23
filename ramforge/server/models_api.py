"""Ollama's model management over HTTP: /api/pull, /api/create, /api/copy, DELETE /api/delete,
HEAD/POST /api/blobs/:digest, and /api/push (501), in Ollama's shapes over ramforge's store.

- pull: `model` is a store SOURCE (`ramforge pull`'s: hf.co/ORG/REPO[:QUANT] into the Hugging Face cache
  through store.hf, an https URL (a split GGUF's shard brings its set); plain http, or an http
  HF_ENDPOINT, only with `insecure: true`), named as the store names it; progress as Ollama's NDJSON lines
  ({status, digest, total, completed}), or one answer with `stream: false`. A pull runs on a thread
  of its own, never under the model lock; a client that goes stops it (the .part stays for a resume);
  at most MAX_PULLS at once (503 beyond); one that would not fit the store's disk is refused (507).
- create: the JSON form ({model, from, files, template, system, parameters}) or the older `modelfile`
  text (FROM, PARAMETER, TEMPLATE, SYSTEM; store.modelfile); FROM a store model, an uploaded blob, or
  a GGUF file inside the directories of $RAMFORGE_CREATE_DIRS (none by default: upload it, as
  `ollama create` does). quantize, adapters, license, messages are refused by name (400).
- blobs: the body streams to a private temp file in the store's blob folder, hashed on the way and
  renamed to sha256-<hex> only when it is the digest the path names; bounded by the disk's free space
  and $RAMFORGE_MAX_BLOB (413); the app's Guard passes these bodies through unbuffered.
- delete: the name's manifest (and its blob when no other name keeps it); the model loaded as it (or
  from a blob that went) is unloaded first, its budget freed, as `ollama rm` stops it (ModelManager.forget).
A created model's TEMPLATE, SYSTEM and PARAMETERs take effect where the model is used
(server.manager loads it with its template; server.ollama applies the rest, `apply_modelfile`).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from .. import flags
from ..errors import (ClientDisconnected, InvalidArgument, ModelfileError, PathNotAllowed, RamforgeError, ServerBusy,
                      StoreFull, Unsupported, UnsupportedField, UploadRejected)
from ..store import GGUF_MAGIC, Store, expand_source, normalize_name
from ..store.modelfile import ModelConfig, check_source, checked, copy, create, parse_modelfile
from .common import MAX_NAME, error_response, log
from .manager import manager_of

router = APIRouter()
NDJSON = "application/x-ndjson"
MAX_PULLS = 4                   # pulls at once
DISK_MARGIN = 1 << 30           # free space a pull or an upload leaves on the store's disk
_pulls = threading.BoundedSemaphore(MAX_PULLS)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PullRequest(Strict):
    model: str | None = Field(None, max_length=4096)
    name: str | None = Field(None, max_length=4096)        # the older spelling
    insecure: bool | None = None
    stream: bool | None = True
    username: str | None = None                            # Ollama's registry login: unused
    password: str | None = None


class CreateRequest(Strict):
    model: str | None = Field(None, max_length=MAX_NAME)
    name: str | None = Field(None, max_length=MAX_NAME)    # the older spelling
    from_: str | None = Field(None, alias="from", max_length=4096)
    files: dict[str, str] | None = None
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] | None = None
    modelfile: str | None = None                           # the older form: the Modelfile's text
    path: str | None = Field(None, max_length=4096)        # ... or its path (refused: read by the client)
    stream: bool | None = True
    quantize: str | None = None
    adapters: dict[str, str] | None = None
    license: str | list[str] | None = None
    messages: list[dict] | None = None


class CopyRequest(Strict):
    source: str = Field(max_length=MAX_NAME)
    destination: str = Field(max_length=MAX_NAME)


class DeleteRequest(Strict):
    model: str | None = Field(None, max_length=MAX_NAME)
    name: str | None = Field(None, max_length=MAX_NAME)


# ------------------------------------------------------------------------------------ helpers

def _line(obj: dict) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _free(root: Path) -> int:
    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def create_dirs() -> list[str]:
    """The directories a create's FROM path may lie in ($RAMFORGE_CREATE_DIRS, ':'-separated)."""
    return [os.path.realpath(d) for d in (flags.CREATE_DIRS.get() or "").split(os.pathsep) if d.strip()]


def allow_path(path: Path) -> None:
    """PathNotAllowed unless path (symlinks resolved) lies inside one of create_dirs()."""
    real, dirs = os.path.realpath(path), create_dirs()
    if not any(os.path.commonpath([d, real]) == d for d in dirs):
        where = ", ".join(dirs) if dirs else "none: $RAMFORGE_CREATE_DIRS is unset"
        raise PathNotAllowed(f"FROM {str(path)!r}: the server reads model files only inside its create directories "
                             f"({where}); upload the file (`ollama create` does: POST /api/blobs/sha256:...) or "
                             f"start the server with RAMFORGE_CREATE_DIRS set")


async def _progress_stream(work: Callable[[Callable], list[dict]], stream: bool, first: dict | None = None):
    """Run work(report) on a thread; its report({...}) lines stream as NDJSON (Ollama's progress), or
    with stream false the last line is the answer. A client that goes stops the work at its next report."""
    if not stream:
        return (await anyio.to_thread.run_sync(lambda: work(lambda d: None)))[-1]
    loop, queue, stop = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

    def report(d: dict) -> None:
        if stop.is_set():
            raise ClientDisconnected("the client went away; the pull stops (its .part is kept for a resume)")
        loop.call_soon_threadsafe(queue.put_nowait, d)

    def run():
        try:
            for d in work(report):
                loop.call_soon_threadsafe(queue.put_nowait, d)
        except RamforgeError as e:
            loop.call_soon_threadsafe(queue.put_nowait, {"error": str(e)})
        except Exception as e:  # noqa: BLE001 - reported in the stream: the status line went out already
            log.exception("model management failed")
            loop.call_soon_threadsafe(queue.put_nowait, {"error": f"internal error: {type(e).__name__}: {e}"})
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    async def body():
        task = asyncio.ensure_future(anyio.to_thread.run_sync(run))
        try:
            if first:
                yield _line(first)
            while (d := await queue.get()) is not None:
                yield _line(d)
        finally:
            stop.set()                  # the thread stops at its next report
            del task

    return StreamingResponse(body(), media_type=NDJSON)


# --------------------------------------------------------------------------------------- pull

@router.post("/api/pull")
async def pull(req: PullRequest):
    from ..store import hf as hfs

    source = req.model or req.name
    if not source:
        raise InvalidArgument("model is required: the SOURCE to pull (hf.co/ORG/REPO[:QUANT], an https URL or "
                              "hf.co/ORG/REPO/FILE.gguf)")
    ref = hfs.parse_source(source)                           # InvalidSource: 400 before any stream starts
    if ref is None:
        expand_source(source)
    store = Store()

    def work(report) -> list[dict]:
        if not _pulls.acquire(blocking=False):
            raise ServerBusy(f"{MAX_PULLS} pulls are running; retry when one is done")
        try:
            free, last = _free(store.root) - DISK_MARGIN, [0, -1]

            def progress(phase: str, done: int, total: int | None) -> None:
                if (total or done) > free:
                    raise StoreFull(f"pulling {source}: {total or done:,} B do not fit the {max(free, 0):,} B free on "
                                    f"the store's disk ({store.root}) less a {DISK_MARGIN >> 20} MiB margin")
                if phase.startswith("retry"):
                    return report({"status": phase})
                pct = done * 100 // total if total else done >> 24
                if pct != last[1] or done == total:               # a line per percent (per 16 MiB unsized)
                    last[1] = pct
                    report({"status": f"pulling {source}" if phase == "download" else phase,
                            **({"total": total} if total else {}), "completed": done})

            report({"status": "pulling manifest"})
            if ref is not None:                              # the Hugging Face cache, as `ramforge pull` does
                m = hfs.pull(ref, store, insecure=bool(req.insecure), progress=progress)
            else:
                m = store.pull(source, progress=progress, insecure=bool(req.insecure))
        finally:
            _pulls.release()
        return [{"status": "verifying sha256 digest", "digest": m.digest, "total": m.total_size,
                 "completed": m.total_size},
                {"status": "writing manifest"}, {"status": "success", "model": m.name}]

    return await _progress_stream(work, req.stream is not False)


# ------------------------------------------------------------------------------------- create

def _create_args(req: CreateRequest) -> tuple[str, str, ModelConfig]:
    """(name, FROM, config) of a create request, every refusal a 400 naming the field."""
    name = req.model or req.name
    if not name:
        raise InvalidArgument("model is required: the name of the model to create")
    normalize_name(name)                                     # InvalidModelName: 400
    for field, value, why in (("quantize", req.quantize, "ramforge runs GGUF files as they are quantized; quantize "
                               "with llama.cpp's llama-quantize first"),
                              ("adapters", req.adapters, "LoRA adapters are not supported"),
                              ("license", req.license, "only FROM, TEMPLATE, SYSTEM and PARAMETER are kept"),
                              ("messages", req.messages, "only FROM, TEMPLATE, SYSTEM and PARAMETER are kept"),
                              ("path", req.path, "send the Modelfile's text as `modelfile`, or the JSON form")):
        if value:
            raise UnsupportedField(f"{field}: {why}")
    if req.modelfile is not None:
        if req.from_ or req.files:
            raise InvalidArgument("give either modelfile or from / files, not both")
        mf = parse_modelfile(req.modelfile)
        config = checked(req.template, req.system, req.parameters or {}).over(mf.config)
        return name, mf.source, config
    config = checked(req.template, req.system, req.parameters or {})
    if req.files:
        ggufs = {k: v for k, v in req.files.items() if k.lower().endswith(".gguf")}
        if len(req.files) != 1 or len(ggufs) != 1:
            raise ModelfileError(f"files: one .gguf file, got {sorted(req.files)[:8]} (split models and adapters "
                                 f"are not taken by create)")
        if req.from_:
            raise InvalidArgument("give either from or files, not both")
        return name, next(iter(ggufs.values())), config
    if not req.from_:
        raise InvalidArgument("from (a model's name) or files ({\"model.gguf\": \"sha256:...\"}) is required")
    return name, req.from_, config


@router.post("/api/create")
async def create_model(req: CreateRequest):
    name, source, config = _create_args(req)
    store = Store()
    await anyio.to_thread.run_sync(check_source, store, source, allow_path)     # 4xx before the stream starts

    def work(report) -> list[dict]:
        def progress(phase, done, total):
            if done == total or done % (256 << 20) < (1 << 20):
                report({"status": f"{phase} {source}", "total": total, "completed": done})

        m = create(store, name, source, config, allow_path=allow_path, progress=progress)
        return [{"status": f"using existing layer {m.digest}"}, {"status": "writing manifest"}, {"status": "success"}]

    return await _progress_stream(work, req.stream is not False, {"status": "parsing modelfile"})


# --------------------------------------------------------------------------------- copy, delete

@router.post("/api/copy")
async def copy_model(req: CopyRequest):
    await anyio.to_thread.run_sync(copy, Store(), req.source, req.destination)
    return Response(status_code=200)


@router.delete("/api/delete")
async def delete_model(req: DeleteRequest, request: Request):
    """Remove a name from the store; the model loaded as it is unloaded (ModelManager.forget), under the
    model lock so that no generation starts on it meanwhile."""
    name = req.model or req.name
    if not name:
        raise InvalidArgument("model is required")
    m = manager_of(request)
    await m.acquire()
    try:
        removed = await anyio.to_thread.run_sync(Store().remove, name)     # NotInStore: 404
        if await m.forget(removed["name"]):
            log.info("deleted %s: unloaded", removed["name"])
    finally:
        m.lock.release()
    return Response(status_code=200)


@router.post("/api/push")
async def push(request: Request):
    raise Unsupported("/api/push is not supported: ramforge has no registry to push to; copy the GGUF file "
                      "(`ramforge list` shows where each model's blob lies) or publish it on Hugging Face")


# -------------------------------------------------------------------------------------- blobs

def _blob_hex(digest: str) -> str:
    hx = digest.lower().removeprefix("sha256:") if digest.lower().startswith("sha256:") else None
    if hx is None or len(hx) != 64 or any(c not in "0123456789abcdef" for c in hx):
        raise InvalidArgument(f"digest {digest[:80]!r}: expected sha256: and 64 hex digits")
    return hx


def max_blob() -> int | None:
    env = flags.MAX_BLOB.get()
    if not env:
        return None
    from ..memory.size import parse_memory_size

    return parse_memory_size(env)


@router.head("/api/blobs/{digest}")
async def blob_exists(digest: str):
    path = Store().blob_path(_blob_hex(digest))
    return Response(status_code=200 if await anyio.to_thread.run_sync(path.is_file) else 404)


@router.post("/api/blobs/{digest}")
async def upload_blob(digest: str, request: Request):
    hx = _blob_hex(digest)
    store = Store()
    target = store.blob_path(hx)
    try:
        declared = int(request.headers.get("content-length", "-1"))
    except ValueError:
        raise InvalidArgument("invalid Content-Length header") from None
    free = await anyio.to_thread.run_sync(_free, store.root) - DISK_MARGIN
    limit = min(free, max_blob() or free)
    if declared > limit:
        return error_response(request, 413, f"the blob of {declared:,} B is over the {limit:,} B this server takes "
                                            f"(the store's free disk less {DISK_MARGIN >> 20} MiB, $RAMFORGE_MAX_BLOB)")
    if await anyio.to_thread.run_sync(target.is_file):         # Ollama answers an existing blob with 201 too
        return Response(status_code=201)
    await anyio.to_thread.run_sync(store._ensure)
    fd, tmp = tempfile.mkstemp(prefix=".upload.", suffix=".tmp", dir=store.blobs)
    h, size, head, kept = hashlib.sha256(), 0, b"", False
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise UploadRejected(f"the blob is over the {limit:,} B this server takes", 413)
                if len(head) < 4:
                    head += chunk[:4 - len(head)]
                h.update(chunk)
                await anyio.to_thread.run_sync(f.write, chunk)
            await anyio.to_thread.run_sync(f.flush)
            await anyio.to_thread.run_sync(os.fsync, f.fileno())
        if h.hexdigest() != hx:
            raise UploadRejected(f"digest mismatch: the body's sha256 is {h.hexdigest()}, the path says {hx}")
        if head != GGUF_MAGIC:
            raise UploadRejected(f"the blob is not a GGUF file (it starts with {head!r}); ramforge stores GGUF models")
        await anyio.to_thread.run_sync(os.replace, tmp, target)
        kept = True
    except UploadRejected as e:
        return error_response(request, e.status, str(e))
    finally:
        if not kept:
            Path(tmp).unlink(missing_ok=True)
    return Response(status_code=201)


# ------------------------------------------------------------------- a created model in use

def apply_modelfile(req, config: ModelConfig, options_type, message_type) -> None:
    """Ollama's rules for a created model on /api/generate and /api/chat: its PARAMETERs under the
    request's options, its SYSTEM where the request has none (generate: `system`; chat: the first
    message not a system one). Runs before the request's own checks."""
    if config.parameters:
        given = req.options.model_dump(exclude_none=True) if req.options is not None else {}
        req.options = options_type.model_validate({**config.parameters, **given})
    if not config.system:
        return
    if hasattr(req, "messages"):
        if req.messages and req.messages[0].role != "system":
            req.messages.insert(0, message_type(role="system", content=config.system))
    elif not req.system and (req.prompt or req.context) and not req.raw:
        req.system = config.system
