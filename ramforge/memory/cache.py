"""A byte-bounded LRU cache whose every entry is charged to a MemoryBudget."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable

from ..errors import InvalidArgument
from .budget import Charge, MemoryBudget


class BoundedCache:
    """Holds values up to `capacity` bytes; eviction releases exactly what the entry charged.

    `put` charges before it stores: if the budget refuses, the entry is not stored and nothing
    leaks. Pinned entries are never evicted (a fixed resident set, which a cyclic scan needs).
    """

    def __init__(self, budget: MemoryBudget, capacity: int, name: str = "cache"):
        if capacity < 0:
            raise InvalidArgument(f"cache capacity must be >= 0 bytes, got {capacity}")
        self.budget, self.capacity, self.name = budget, capacity, name
        self._entries: OrderedDict[Hashable, tuple[Any, Charge, bool]] = OrderedDict()
        self.size = 0
        self.hits = self.misses = self.evictions = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, default=None):
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return default
        self.hits += 1
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int, pin: bool = False) -> bool:
        """Store value; returns False (storing nothing) if it can never fit the capacity."""
        if key in self._entries:
            self.pop(key)
        if nbytes > self.capacity:
            return False
        while self.size + nbytes > self.capacity and self._evict_one():
            pass
        if self.size + nbytes > self.capacity:
            return False                       # only pinned entries remain
        charge = self.budget.charge(f"{self.name}:{key}", nbytes)   # may raise; nothing stored yet
        self._entries[key] = (value, charge, pin)
        self.size += nbytes
        return True

    def pop(self, key: Hashable):
        value, charge, _ = self._entries.pop(key)
        self.size -= charge.nbytes
        charge.release()
        return value

    def clear(self) -> None:
        for key in list(self._entries):
            self.pop(key)

    def _evict_one(self) -> bool:
        for key, (_, _, pinned) in self._entries.items():
            if not pinned:
                self.pop(key)
                self.evictions += 1
                return True
        return False
