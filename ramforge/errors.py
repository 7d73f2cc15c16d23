"""Typed errors, and the one table of their HTTP statuses. A leaf: imports nothing of ramforge.

Every error ramforge raises on purpose is a `RamforgeError`, and every one a request or a file
can trigger derives from one of the categories of `HTTP_STATUS` below; the servers answer with
that status, the CLI prints the message as one line. Messages carry the numbers and, where there
is one, the fix. Errors of one module that no other module needs (the store's, the sampler's, the
tokenizer's metadata errors, the chat template's) live beside that module, derived from these.

    category                 status  what
    ModelFileError           500     the model file, or the store's record of it, is broken (not the request)
    ModelNotFound            404     a name that is no file, no store name and not `default`
    ContextLengthExceeded    400     the prompt (plus what to generate) does not fit the context
    InvalidArgument          400     a value out of its range or of the wrong type (a sampler
                                     parameter, a size, a token id, an empty prompt, a model name)
    OutOfBudget              507     the memory budget cannot hold the model or a charge
    Unsupported              501     an architecture, type or tokenizer ramforge cannot execute, an API route
    ServerBusy               503     the server's queue for the model is full
    ClusterError             503     a Ray cluster's stage failed, was refused, or the cluster is unreachable
    ClientDisconnected       499     the client went away mid-generation (nginx's code; nobody reads it)
    RamforgeError            500     anything else: an invariant broke (a bug), or a failed download

A request field asking for something ramforge does not do (images, logprobs, ...) is an
UnsupportedField: an InvalidArgument (400), as Ollama and OpenAI answer such requests.
"""
from __future__ import annotations

from typing import Iterable


class RamforgeError(Exception):
    """Base of every error ramforge raises on purpose; the CLI prints it as one line."""


# ---------------------------------------------------------------------------------- categories

class InvalidArgument(RamforgeError, ValueError):
    """A value a caller passed (a request field, a CLI option, a library argument) is out of its range."""


class ModelFileError(RamforgeError):
    """The model file (or the store's record of it) is malformed or inconsistent: no request can fix it."""


class ModelNotFound(RamforgeError):
    """A MODEL argument names no file and no known model."""


class OutOfBudget(RamforgeError):
    """The memory budget cannot hold what was asked."""


class Unsupported(RamforgeError):
    """Something ramforge cannot execute (it may still be inspected)."""


class ContextLengthExceeded(InvalidArgument):
    """A prompt (plus generation) does not fit the context window."""


class NotReproduced(Unsupported):
    """A computation llama.cpp does in a way ramforge does not reproduce bit for bit (refused, not approximated)."""


class ServerBusy(RamforgeError):
    """The server's queue for the model is full; retry later."""


class ClientDisconnected(RamforgeError):
    """The client closed the connection while its request ran."""


class ClusterError(RamforgeError):
    """A pipeline on Ray (ramforge.cluster) cannot serve: `stage` names the stage at fault (None: the
    cluster itself). Built from the message alone, so it crosses a process boundary by pickle."""

    def __init__(self, message: str, stage: int | None = None):
        super().__init__(message)
        self.stage = stage


# ------------------------------------------------------------------------------------ specific

class GGUFError(ModelFileError):
    """A GGUF file is malformed: names the field, the value, the byte offset and what was expected."""

    def __init__(self, field: str, value, offset: int | None, expected: str, path: str | None = None):
        self.field, self.value, self.offset, self.expected, self.path = field, value, offset, expected, path
        where = f" at byte {offset}" if offset is not None else ""
        src = f"{path}: " if path else ""
        super().__init__(f"{src}GGUF field {field} = {value!r}{where}: expected {expected}")


class UnsupportedType(Unsupported):
    """A ggml tensor type ramforge cannot execute (it may still be inspected)."""


class UnsupportedArch(Unsupported):
    """An architecture ramforge cannot execute."""


class UnsupportedField(InvalidArgument):
    """A request field that asks for a feature ramforge lacks (images, logprobs, JSON mode, ...)."""


class GrammarError(InvalidArgument):
    """A grammar (GBNF) or JSON schema that cannot constrain generation: the parser's message, with
    the position, or the schema feature that is not supported (ramforge.structured)."""


class StateError(InvalidArgument):
    """A saved state (session file) that is damaged or made for another model, shape or KV type."""


class MemorySizeError(InvalidArgument):
    """A memory size string such as '8G' could not be parsed."""


class EmptyPrompt(InvalidArgument):
    """A prompt with no tokens: at least one (e.g. BOS) is needed."""


class TokenizerInputError(InvalidArgument):
    """Input that llama.cpp itself cannot tokenize (it would abort)."""


class TokenIdError(TokenizerInputError, IndexError):
    """A token id outside the vocabulary (an IndexError too). Raised by `check_token_ids` only."""

    def __init__(self, token_id: int, n_vocab: int):
        self.token_id, self.n_vocab = token_id, n_vocab
        super().__init__(f"token id {token_id} is out of range for a vocabulary of {n_vocab} tokens "
                         f"(ids are 0..{n_vocab - 1})")


def check_token_ids(ids: Iterable[int], n_vocab: int) -> None:
    """The token-id check: TokenIdError naming the first id of `ids` outside [0, n_vocab)."""
    if getattr(ids, "ndim", 0) == 1 and ids.size and ids.min() >= 0 and ids.max() < n_vocab:
        return                                          # a numpy array in range: two vectorised passes
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise TokenIdError(int(bad), int(n_vocab))


class BudgetExceeded(OutOfBudget):
    """A charge would take the managed total over the budget."""

    def __init__(self, name: str, request: int, current: int, budget: int):
        self.name, self.request, self.current, self.budget = name, request, current, budget
        super().__init__(
            f"memory budget exceeded: charge {name!r} of {request:,} B with {current:,} B already charged "
            f"would total {current + request:,} B, over the budget of {budget:,} B; raise --ram or lower --ctx"
        )


class KVTypeError(InvalidArgument):
    """An unknown KV cache type, or one whose blocks a model's head size cannot be split into."""


class KVBudgetExceeded(BudgetExceeded):
    """The KV cache could not grow to hold the next positions: the budget holds `position` of them."""

    def __init__(self, position: int, wanted: int, request: int, current: int, budget: int):
        self.position, self.wanted = position, wanted
        BudgetExceeded.__init__(self, "kv cache", request, current, budget)
        self.args = (f"memory budget exceeded growing the KV cache at position {position:,} (to hold {wanted:,} "
                     f"positions): {request:,} B more with {current:,} B already charged would pass the budget "
                     f"of {budget:,} B; raise --ram, lower --ctx, or use a quantized cache (--kv-type q8_0)",)


class KVSpillError(RamforgeError):
    """The KV cache's spill directory cannot be used: not writable, or the disk cannot hold the spill
    files (`path`, `needed` and `free` bytes, where known)."""

    def __init__(self, message: str, path: str, needed: int | None = None, free: int | None = None):
        self.path, self.needed, self.free = path, needed, free
        super().__init__(message)


class BudgetTooSmall(OutOfBudget):
    """The budget cannot hold even one layer plus the working set."""

    def __init__(self, budget: int, minimum: int, n_ctx: int):
        self.budget, self.minimum = budget, minimum
        super().__init__(f"--ram {budget:,} B is below this model's minimum of {minimum:,} B at context {n_ctx} "
                         f"(one layer + KV cache + activations); raise --ram to at least {minimum:,} B or lower "
                         f"--ctx (`ramforge plan` shows the same figure)")


class StageBudgetTooSmall(OutOfBudget):
    """A pipeline stage's budget cannot hold its layer range: names the stage and its minimum."""

    def __init__(self, message: str, stage: int | None = None, minimum: int | None = None):
        super().__init__(message)
        self.stage, self.minimum = stage, minimum


class ClusterUnreachable(ClusterError):
    """The Ray address did not answer within the connect timeout."""


class StageMismatch(ClusterError):
    """A stage refused at start: its model file (sha256) or its ramforge differs from the driver's."""


class StageFailed(ClusterError):
    """A stage died or failed mid-request; the request is aborted and the other stages reset."""


class MissingExtra(RamforgeError):
    """An optional dependency is not installed; the message names the pip extra that brings it."""


class InternalError(RamforgeError):
    """An invariant ramforge keeps broke: a bug (the message says which)."""


class InexactWarning(UserWarning):
    """A computation that can round differently from llama.cpp's, and why (issued once per engine)."""


# --------------------------------------------------------------------------------- the table

# Checked in order, first match wins: most specific first. A broken chat template is both a
# ModelFileError and (as every ChatTemplateError) an InvalidArgument: the file's fault wins.
HTTP_STATUS: tuple[tuple[type[RamforgeError], int], ...] = (
    (ModelFileError, 500),
    (ModelNotFound, 404),
    (ContextLengthExceeded, 400),
    (InvalidArgument, 400),
    (OutOfBudget, 507),               # Insufficient Storage: the budget, not the request, is too small
    (Unsupported, 501),
    (ServerBusy, 503),
    (ClusterError, 503),
    (ClientDisconnected, 499),
    (KVSpillError, 507),              # the spill directory's disk, not the request
    (RamforgeError, 500),
)


def http_status(exc: BaseException) -> int:
    """The HTTP status of an exception, by its type (never by its message); 500 for anything untyped."""
    for cls, status in HTTP_STATUS:
        if isinstance(exc, cls):
            return status
    return 500


# ------------------------------------------------------------------- request limits (400)

class RequestTooLarge(InvalidArgument):
    """A request value over a server limit (a grammar's size or nesting, a JSON schema's depth,
    the number of chat messages): the message names the limit and the size asked."""


# ------------------------------------------------------------------------ split models (gguf-split)

class SplitShardMissing(ModelNotFound):
    """A shard of a split GGUF (NAME-0000k-of-0000N.gguf) is not there: names the shard and its path."""

    def __init__(self, path: str, no: int, count: int, first: str):
        self.path, self.no, self.count = path, no, count
        super().__init__(f"{path}: shard {no} of {count} of the split model {first} is missing; every "
                         f"shard NAME-0000k-of-{count:05d}.gguf must lie beside the first one "
                         f"(`gguf-split --merge` makes one file of them)")


class SplitMismatch(ModelFileError):
    """A shard that does not belong to its split GGUF (another split count, shard number, architecture
    or tensor count, a tensor in two shards), or a split file whose shards cannot be found by name."""

    def __init__(self, path: str, why: str):
        self.path, self.why = path, why
        super().__init__(f"{path}: {why}")


# ------------------------------------------------------------ model management (Ollama's /api/create)

class ModelfileError(InvalidArgument):
    """A Modelfile (or /api/create's JSON form) ramforge does not take: names the line and the command."""


class PathNotAllowed(InvalidArgument):
    """A path a request named that lies outside the directories the server may read."""


class UploadRejected(InvalidArgument):
    """A blob upload whose bytes are not its digest, or over the size limit; nothing of it is kept."""

    def __init__(self, message: str, status: int = 400):
        self.status = status
        super().__init__(message)


class StoreFull(OutOfBudget):
    """A pull or an upload would not fit the free space of the store's disk (507)."""
