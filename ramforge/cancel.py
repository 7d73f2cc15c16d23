"""Stopping the work of a client that has gone: one check the loops under the model lock call between steps.

`Engine.eval` checks before each chunk (a long prefill stops within one chunk), `parallel.eval_batch`
before each ubatch, `Batcher` between passes (per request) and the server's `Job` between responses;
the other loops under the lock too: state files between layers (session.write_state_file /
load_state_file: a restore left empty), grammar compilation between phases and lowered rules
(structured.matcher.Grammar, structured.lark.to_lark), Ollama's chat truncation between renders
(server.common.fit_messages) and a chat template's render at each of its deadline ticks (chat._State).
The server sets `INTERRUPT` for each request to its client's "gone" test (server.app.Guard) and runs
every step of the request in a copy of the request's context, so the model's threads see it; outside
a server it is None and `check` is one lookup. A check raises between chunks or ubatches only, where
the KV cache holds whole chunks, so the next request reuses the evaluated prefix as any other.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Callable

from .errors import ClientDisconnected

INTERRUPT: ContextVar[Callable[[], bool] | None] = ContextVar("ramforge_interrupt", default=None)


def gone() -> bool:
    """Whether the current request's client has gone (False outside a request)."""
    test = INTERRUPT.get()
    return test is not None and bool(test())


def check() -> None:
    """ClientDisconnected if the current request's client has gone."""
    if gone():
        raise ClientDisconnected("the client went away: the work for its request was stopped")
