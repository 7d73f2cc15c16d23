"""A hard memory budget: charge before you allocate or read, release when done.

Every byte ramforge manages (weights read from disk, KV cache, activations, caches) is charged
here first; a charge that would cross the budget raises BudgetExceeded and changes nothing.
"""
from __future__ import annotations

import itertools
import threading

from ..errors import BudgetExceeded, InternalError, InvalidArgument
from .size import format_bytes, parse_memory_size


class Charge:
    """A named charge; use as a context manager so it is released on exit and on error."""

    __slots__ = ("budget", "name", "nbytes", "id", "released")

    def __init__(self, budget: "MemoryBudget", name: str, nbytes: int, cid: int):
        self.budget, self.name, self.nbytes, self.id, self.released = budget, name, nbytes, cid, False

    def settle(self, nbytes: int) -> None:
        """Resize to the actual bytes: shrinking always succeeds, growing is checked."""
        self.budget._resize(self, nbytes)

    def release(self) -> None:
        """Give the bytes back; idempotent."""
        self.budget._release(self)

    def __enter__(self) -> "Charge":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else format_bytes(self.nbytes)
        return f"Charge({self.name!r}, {state})"


class MemoryBudget:
    """Tracks current and peak managed bytes against a limit (None: unlimited, still tracked).

    >>> b = MemoryBudget("1M")
    >>> with b.charge("layer 0", 600_000) as c:
    ...     c.settle(500_000)
    ...     b.current
    500000
    >>> b.current, b.peak
    (0, 600000)
    """

    def __init__(self, limit: int | str | None = None):
        self.limit = None if limit is None else parse_memory_size(limit)
        if self.limit is not None and self.limit <= 0:
            raise InvalidArgument(f"memory budget must be positive, got {self.limit} B")
        self.current = 0
        self.peak = 0
        self._live: dict[int, Charge] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    @property
    def available(self) -> int | None:
        return None if self.limit is None else self.limit - self.current

    def fits(self, nbytes: int) -> bool:
        return self.limit is None or self.current + nbytes <= self.limit

    def charge(self, name: str, nbytes: int) -> Charge:
        """Reserve nbytes under name, or raise BudgetExceeded leaving the books unchanged."""
        nbytes = self._check_size(name, nbytes)
        with self._lock:
            if self.limit is not None and self.current + nbytes > self.limit:
                raise BudgetExceeded(name, nbytes, self.current, self.limit)
            c = Charge(self, name, nbytes, next(self._ids))
            self._live[c.id] = c
            self._add(nbytes)
            return c

    def charges(self) -> list[tuple[str, int]]:
        """The live charges as (name, bytes), largest first."""
        with self._lock:
            return sorted(((c.name, c.nbytes) for c in self._live.values()), key=lambda x: -x[1])

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.current

    def _check_size(self, name: str, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidArgument(f"charge {name!r}: size must be a non-negative int of bytes, got {nbytes!r}")
        return nbytes

    def _add(self, delta: int) -> None:
        self.current += delta
        if self.current > self.peak:
            self.peak = self.current

    def _resize(self, c: Charge, nbytes: int) -> None:
        nbytes = self._check_size(c.name, nbytes)
        with self._lock:
            if c.released:
                raise InternalError(f"charge {c.name!r} was already released; it cannot be settled")
            delta = nbytes - c.nbytes
            if delta > 0 and self.limit is not None and self.current + delta > self.limit:
                raise BudgetExceeded(c.name, delta, self.current, self.limit)
            c.nbytes = nbytes
            self._add(delta)

    def _release(self, c: Charge) -> None:
        with self._lock:
            if c.released:
                return
            c.released = True
            del self._live[c.id]
            self.current -= c.nbytes

    def __repr__(self) -> str:
        lim = "unlimited" if self.limit is None else format_bytes(self.limit)
        return f"MemoryBudget(current={format_bytes(self.current)}, peak={format_bytes(self.peak)}, limit={lim})"
