"""Memory accounting: sizes, the budget, and budget-charged caches."""
from .budget import Charge, MemoryBudget
from .cache import BoundedCache
from .size import format_bytes, parse_memory_size

__all__ = ["BoundedCache", "Charge", "MemoryBudget", "format_bytes", "parse_memory_size"]
