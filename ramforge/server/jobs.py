"""The generations that take turns on the resident model: `Job` (a request's generation, holding the
model lock or a slot while it steps), `Steps` (its iterator, stepped on threads and closed safely) and
`stream_job` (a job as a streamed response). The model itself: server.manager.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, AsyncIterator, Callable

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse

from .. import cancel
from ..errors import ClientDisconnected, ContextLengthExceeded, EmptyPrompt, RamforgeError, check_token_ids
from .common import Runner, log
from .manager import Loaded, ModelManager, Target


class Steps:
    """A generation's iterator, stepped on threads one `step` at a time and closed safely from any thread.

    A generator cannot be closed while another thread runs its next() ("generator already executing"),
    and with --parallel a step runs on any thread of anyio's pool, while a cancelled request closes its
    job from another. So `close` during a step only sets the stop flag: the step runs with it added to
    the request's ramforge.cancel test, so the engine, the batcher or the wait for a slot sees the
    client as gone and the step ends within a chunk; the thread that ran it then closes the iterator,
    and `close` waits for that. `close` between steps closes it at once; a step after it raises."""

    def __init__(self, it):
        self.it = it
        self._lock = threading.Lock()
        self._running = False
        self._stop = threading.Event()
        self._closed = threading.Event()

    def step(self):
        """next(it, None), in the caller's thread."""
        outer = cancel.INTERRUPT.get()
        with self._lock:
            if self._stop.is_set():
                raise ClientDisconnected("the generation was closed")
            self._running = True
        token = cancel.INTERRUPT.set(lambda: self._stop.is_set() or (outer is not None and bool(outer())))
        try:
            return next(self.it, None)
        finally:
            cancel.INTERRUPT.reset(token)
            with self._lock:
                self._running = False
                closing = self._stop.is_set()
            if closing:                             # close() came during this step: closed here, by its thread
                self._close_now()

    def _close_now(self) -> None:
        try:
            self.it.close()
        finally:
            self._closed.set()

    def close(self) -> None:
        """Stop and close the iterator (blocking: call it on a thread); idempotent."""
        with self._lock:
            self._stop.set()
            running = self._running
        if running:
            self._closed.wait()                     # the step's own thread closes it when the step ends
        elif not self._closed.is_set():
            self._close_now()


class Job:
    """One generation holding the model lock, from loading to the last token."""

    def __init__(self, manager: ModelManager, keep_alive: float | None):
        self.m, self.keep_alive = manager, keep_alive
        self.t0 = time.perf_counter()
        self.loaded: Loaded | None = None
        self.load_s = 0.0
        self.ids: list[int] = []
        self.it = None
        self.steps: Steps | None = None     # it, stepped and closed safely (Steps)
        self.first = None
        self.closed = False
        self.shared = False        # --parallel: the lock is let go once the request has its slot's stream

    @classmethod
    async def start(cls, manager: ModelManager, *, model: str | None | Target, num_ctx: int | None,
                    keep_alive: float | None, build: Callable, max_tokens: int | None, clamp: bool,
                    sampling: dict, stop: list[str], chat: bool = False, runner: Runner | None = None,
                    length_finish: bool = False, shift: bool = True) -> "Job":
        """Take the lock, load, build the prompt ids (`build(model)` on the worker), and evaluate the
        prompt. max_tokens None or < 0: until the context is full or an end-of-generation token;
        clamp: cut max_tokens to the room left (Ollama), else a prompt + max_tokens over the
        context is a ContextLengthExceeded (OpenAI), or with length_finish cut to the room left (llama-server:
        the answer then ends with finish_reason "length"). chat: the model's reasoning goes to each
        Response's `thinking` (Model.split_reasoning). runner: the request's load-time knobs. shift False
        (Ollama's): cut to the room left even where the server shifts the context. model: the Target the
        request resolved (ModelManager.resolve: once per request), or a name resolved here."""
        job = cls(manager, keep_alive)
        # A bad or unknown name is refused (400 / 404) before the request queues for the model: it must
        # not wait behind generations, take a queue place, or be answered 503 when the queue is full.
        target = model if isinstance(model, Target) else await anyio.to_thread.run_sync(manager.resolve, model)
        await manager.acquire()
        try:
            cancel.check()                          # gone while it queued: nothing to load or evaluate
            job.loaded, job.load_s = await manager.ensure(target, num_ctx, runner)
            mdl = job.loaded.model
            job.ids = ids = list(await manager.call(build, mdl))
            if not ids:
                raise EmptyPrompt("the prompt is empty: it has no tokens")
            check_token_ids(ids, mdl.engine.hp.n_vocab)
            room = mdl.n_ctx - len(ids)
            if room <= 0:
                raise ContextLengthExceeded(f"the prompt of {len(ids)} tokens leaves no room in the context of "
                                            f"{mdl.n_ctx}; shorten it or raise num_ctx / --ctx")
            if max_tokens is None or max_tokens < 0:
                max_tokens = room
            elif (clamp or length_finish) and (not mdl.context_shift or not shift):
                max_tokens = min(max_tokens, room)
            job.it = mdl.stream(ids, max_tokens, stop=stop or None, **sampling)
            if chat:
                job.it = mdl.split_reasoning(job.it)
            job.steps = Steps(job.it)
            if getattr(mdl, "batcher", None) is not None:   # --parallel: the others join the shared passes
                job.shared = True
                manager.busy += 1
                manager.lock.release()
                job.first = await anyio.to_thread.run_sync(job.steps.step)
            else:
                job.first = await manager.call(job.steps.step)
        except BaseException:
            await job.close()
            raise
        return job

    @property
    def model(self):
        return self.loaded.model

    async def responses(self, request: Request | None = None) -> AsyncIterator:
        """The Responses of Model.stream, each step on the worker. A client that has gone stops the
        generation: checked before each step where the server's Guard set ramforge.cancel's test (and
        by the engine within a step), else, with `request`, polled every quarter second."""
        r, polled = self.first, time.monotonic()
        while r is not None:
            if r.done:
                self.m.stats.add(r)
            yield r
            if r.done:
                return
            cancel.check()
            if request is not None and cancel.INTERRUPT.get() is None and time.monotonic() - polled > 0.25:
                polled = time.monotonic()
                if await request.is_disconnected():
                    raise ClientDisconnected("client disconnected")
            step = anyio.to_thread.run_sync if self.shared else self.m.call      # --parallel: off the worker
            r = await step(self.steps.step)

    async def collect(self, request: Request | None = None):
        """The final Response with the whole text (non-streaming requests); closes the job."""
        try:
            parts, thoughts, steps, last = [], [], [], None
            async for r in self.responses(request):
                parts.append(r.text)
                thoughts.append(r.thinking)
                steps += r.logprobs or []
                last = r
            last.text, last.thinking = "".join(parts), "".join(thoughts)
            last.logprobs = steps if last.logprobs is not None else None
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
                if self.steps is not None:      # (a step still running on another thread: stopped, then closed)
                    await (anyio.to_thread.run_sync(self.steps.close) if self.shared else self.m.call(self.steps.close))
            except Exception:  # noqa: BLE001 - never keep the lock over a failed close
                log.exception("closing a generation failed")
            finally:
                if self.shared:                     # the lock is not held; keep_alive for the reaper
                    self.m.busy -= 1
                    ka = self.m.cfg.keep_alive if self.keep_alive is None else self.keep_alive
                    if self.m.current is not None:
                        self.m.current.keep(max(ka, 0.0))
                else:
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
