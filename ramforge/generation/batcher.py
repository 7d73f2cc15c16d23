"""Continuous batching: several generations in one engine (Engine.load(n_seq=N)), one slot (sequence)
each, every pass over the weights one llama_decode of them all (parallel.eval_batch).

A scheduler thread builds each pass as llama-server's update_slots does: one token of every
decoding slot and the whole prompts of the joining requests, in slot order (llama.cpp's split_equal
takes consecutive sequence ids into one ubatch). The joining prompts of a pass hold at most the
engine's chunk (plan.batch) of tokens together, so that every ubatch of several sequences is one
chunk; the first waiting prompt always joins (alone, a long prompt runs in chunks). A request joins
and leaves between passes; a finished or abandoned one's cells are freed (seq_rm) and its slot taken
by the next.
A request waits at most `max_wait` seconds for a slot, then gets ServerBusy (503) with the reason.
`schedule` logs every pass's batch (seq_id, tokens), so a test can replay it through eval_batch.

No one request can stop the others: an error while serving one slot (its sampler, its grammar, a
bug) ends that request alone, with the error raised from its iterator (a typed one keeps its 4xx),
and the scheduler goes on; a failed pass ends the requests of that pass. A request whose client has
gone (ramforge.cancel: the context `generate` was called in) is dropped between passes, and a pass
whose every request is gone stops between its ubatches.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .. import cancel
from ..errors import (ClientDisconnected, ContextLengthExceeded, EmptyPrompt, InternalError, InvalidArgument,
                      RamforgeError, ServerBusy, check_token_ids)

log = logging.getLogger("ramforge.generation.batcher")


@dataclass
class _Req:
    slot: int
    prompt: list[int]
    max_tokens: int
    sampler: object
    stop_on_eog: bool
    out: queue.Queue = field(default_factory=queue.Queue)   # ids, then None (done) or an exception
    history: list = field(default_factory=list)
    next_tok: int | None = None                             # sampled, to be evaluated in the next pass
    n_gen: int = 0
    cancelled: bool = False                                 # its iterator was closed
    interrupt: Callable[[], bool] | None = None             # its client's "gone" test (ramforge.cancel)

    def gone(self) -> bool:
        return self.cancelled or (self.interrupt is not None and bool(self.interrupt()))


class Batcher:
    """>>> b = Batcher(Engine.load(path, n_ctx=1024, n_seq=4))      # doctest: +SKIP
    >>> list(b.generate(ids, 16))                                    # doctest: +SKIP"""

    def __init__(self, engine, max_wait: float = 30.0, log: bool = False):
        self.eng, self.max_wait = engine, max_wait
        self.free = list(range(engine.kv.n_seq))
        self.joining: list[_Req] = []
        self.active: dict[int, _Req] = {}
        self.cond = threading.Condition()
        self.closed = False
        self.schedule: list | None = [] if log else None
        self.thread = threading.Thread(target=self._loop, name="ramforge-batcher", daemon=True)
        self.thread.start()

    def generate(self, prompt: list[int], max_tokens: int, sampler=None, stop_on_eog: bool = True) -> Iterator[int]:
        """Yield up to max_tokens tokens after prompt (greedy when sampler is None), as Engine.generate,
        computed in the shared passes. Closing the iterator early frees the slot."""
        if not prompt:
            raise EmptyPrompt("the prompt is empty")
        check_token_ids(np.asarray(prompt, np.int64), self.eng.hp.n_vocab)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidArgument(f"max_tokens = {max_tokens!r}: at least 1")
        if len(prompt) + max_tokens > self.eng.n_ctx:
            raise ContextLengthExceeded(f"prompt of {len(prompt)} tokens + {max_tokens} exceed a slot's context "
                                        f"of {self.eng.n_ctx}")
        interrupt, deadline = cancel.INTERRUPT.get(), time.monotonic() + self.max_wait
        with self.cond:
            while not (self.free or self.closed):              # woken by every release; a gone client checked
                cancel.check()                                  # every quarter second
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerBusy(f"all {self.eng.kv.n_seq} slots stayed busy for {self.max_wait:g} s; "
                                     f"retry later")
                self.cond.wait(min(left, 0.25))
            if self.closed:
                raise ServerBusy("the model is closing; retry later")
            req = _Req(self.free.pop(0), list(prompt), max_tokens, sampler, stop_on_eog, history=list(prompt),
                       interrupt=interrupt)
            self.joining.append(req)
            self.cond.notify_all()
        return self._stream(req)

    def _stream(self, req: _Req) -> Iterator[int]:
        try:
            while True:
                item = req.out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            req.cancelled = True

    def _loop(self) -> None:
        while True:
            try:
                if not self._pass():
                    return
            except Exception as e:  # noqa: BLE001 - a bug outside any one request: end the requests it touched
                log.exception("a batched pass failed")
                self._fail_all(e)

    def _pass(self) -> bool:
        """One pass: drop the gone requests, join the waiting ones, evaluate, sample each; False once closed."""
        with self.cond:
            self.cond.wait_for(lambda: self.closed or self.joining or self.active)
            if self.closed:
                return False
            for s in [s for s, r in self.active.items() if r.gone()]:
                r = self.active.pop(s)
                self._release(r, None if r.cancelled else ClientDisconnected("the client went away"))
            batch = [(s, [r.next_tok]) for s, r in self.active.items()]
            room, first = self.eng.plan.batch, True     # prompt tokens this pass may still take
            while self.joining and (first or len(self.joining[0].prompt) <= room):
                join, first = self.joining.pop(0), False  # (the first always joins)
                room -= len(join.prompt)
                self.active[join.slot] = join
                batch.append((join.slot, join.prompt))
            batch.sort(key=lambda e: e[0])
        if not batch:
            return True
        reqs = [self.active[s] for s, _ in batch]
        token = cancel.INTERRUPT.set(lambda: all(r.gone() for r in reqs))   # stops only if all have gone
        try:
            logits = self.eng.eval_batch(batch)
        except BaseException as e:                      # every request of the pass gets the error
            with self.cond:
                for r in reqs:
                    self._release(self.active.pop(r.slot), e)
            return True
        finally:
            cancel.INTERRUPT.reset(token)
        if self.schedule is not None:
            self.schedule.append(batch)
        with self.cond:
            for r in reqs:
                try:
                    self._step(r, logits[r.slot])
                except Exception as e:  # noqa: BLE001 - this request alone ends, with its error
                    if not isinstance(e, RamforgeError):
                        log.exception("sampling slot %d failed", r.slot)
                    if self.active.get(r.slot) is r:
                        self._release(self.active.pop(r.slot), e)
        return True

    def _fail_all(self, err: BaseException) -> None:
        """End every active and joining request with err (InternalError when untyped)."""
        err = err if isinstance(err, RamforgeError) else InternalError(f"batched generation failed: "
                                                                       f"{type(err).__name__}: {err}")
        with self.cond:
            reqs, self.active, self.joining = list(self.active.values()) + self.joining, {}, []
            for r in reqs:
                self._release(r, err)

    def _step(self, r: _Req, logits: np.ndarray) -> None:
        """Sample r's next token from its logits; finish it on EOG or its max_tokens (under cond)."""
        tok = int(np.argmax(logits)) if r.sampler is None else r.sampler.sample(logits, r.history)
        if r.cancelled or (r.stop_on_eog and self.eng.tokenizer.is_eog(tok)):
            self._release(self.active.pop(r.slot), None)
            return
        r.history.append(tok)
        r.n_gen += 1
        r.out.put(tok)
        if r.n_gen >= r.max_tokens:
            self._release(self.active.pop(r.slot), None)
        else:
            r.next_tok = tok

    def _release(self, r: _Req, err) -> None:
        """Free r's cells and slot (under cond); its stream ends (with err, if any), whatever happens."""
        try:
            self.eng.seq_rm(r.slot, -1, -1)
            self.free.append(r.slot)
            self.free.sort()
        except Exception:  # noqa: BLE001 - the slot stays out of use: its cells could not be freed
            log.exception("freeing slot %d failed", r.slot)
        finally:
            r.out.put(err)
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()
        for r in list(self.active.values()) + self.joining:
            r.out.put(None)


def replay(eng, schedule: list) -> list[tuple[list[int], list[int]]]:
    """A Batcher(log=True)'s passes again through eng.eval_batch (eng loaded with as many sequences),
    greedy: [(a request's prompt, the tokens the batched decode gives it)], in the order they joined.
    A multi-token entry (or a slot's first) is a request joining that slot: its cells are freed first."""
    segs, cur = [], {}
    for batch in schedule:
        for s, t in batch:
            if len(t) > 1 or s not in cur:
                eng.seq_rm(s, -1, -1)
                cur[s] = []
                segs.append((list(t), cur[s]))
        out = eng.eval_batch(batch)
        for s, _ in batch:
            cur[s].append(int(np.argmax(out[s])))
    return segs
