"""Typed errors. Every message carries the numbers and, where there is one, the fix."""
from __future__ import annotations


class RamforgeError(Exception):
    """Base of every error ramforge raises on purpose; the CLI prints it as one line."""


class GGUFError(RamforgeError):
    """A GGUF file is malformed: names the field, the value, the byte offset and what was expected."""

    def __init__(self, field: str, value, offset: int | None, expected: str, path: str | None = None):
        self.field, self.value, self.offset, self.expected, self.path = field, value, offset, expected, path
        where = f" at byte {offset}" if offset is not None else ""
        src = f"{path}: " if path else ""
        super().__init__(f"{src}GGUF field {field} = {value!r}{where}: expected {expected}")


class UnsupportedType(RamforgeError):
    """A ggml tensor type ramforge cannot execute (it may still be inspected)."""


class UnsupportedArch(RamforgeError):
    """An architecture ramforge cannot execute."""


class ModelNotFound(RamforgeError):
    """A MODEL argument names no file and no known model."""


class MemorySizeError(RamforgeError, ValueError):
    """A memory size string such as '8G' could not be parsed."""


class BudgetExceeded(RamforgeError):
    """A charge would take the managed total over the budget."""

    def __init__(self, name: str, request: int, current: int, budget: int):
        self.name, self.request, self.current, self.budget = name, request, current, budget
        super().__init__(
            f"memory budget exceeded: charge {name!r} of {request:,} B with {current:,} B already charged "
            f"would total {current + request:,} B, over the budget of {budget:,} B; raise --ram or lower --ctx"
        )


class BudgetTooSmall(RamforgeError):
    """The budget cannot hold even one layer plus the working set."""

    def __init__(self, budget: int, minimum: int, n_ctx: int):
        self.budget, self.minimum = budget, minimum
        super().__init__(f"--ram {budget:,} B is below this model's minimum of {minimum:,} B at context {n_ctx} "
                         f"(one layer + KV cache + activations); raise --ram to at least {minimum:,} B or lower "
                         f"--ctx (`ramforge plan` shows the same figure)")


class ContextLengthExceeded(RamforgeError):
    """A prompt (plus generation) does not fit the context window."""
