"""Saved states: a sequence's tokens and KV cache, in memory (`save_state` / `load_state`, as
llama-cpp-python's Llama.save_state / load_state) or in a file (llama-server's slot save/restore),
and the prompt cache that keeps several of them (`PromptCache`, as llama-cpp-python's LlamaRAMCache
and llama-server's host prompt cache).

A state is what the engine needs to continue a sequence: its token ids and, for each of its layers,
the cached keys and values of those positions (the cache's own bits, so a restored sequence computes
exactly as the uninterrupted one). The file:

    magic   16 bytes  b"RAMFORGE-STATE\\x00\\x01"
    u32     n         header length (<= 64 KiB)
    n bytes           header, JSON: model_sha256, arch, layers [a, b], n_head_kv, head_dim_k / _v,
                      type_k / type_v, n_tokens, payload_sha256, ramforge version
    payload           tokens i32[n_tokens], then the cache's keys and values of those positions,
                      [layers, n_tokens, n_head_kv, row] as the cache holds them (f16 bits, or
                      quantized blocks), little-endian

It is written to a new temporary name (O_EXCL|O_NOFOLLOW, mode 0600, unique) and renamed over the
target, which may only be a state file already; only a regular file is read (a link, FIFO or device
is refused, and opening never blocks). Reading checks every field against the engine before
anything is allocated or copied, so a file for another model, shape or KV type, a damaged or
truncated one, or tokens outside the vocabulary are refused (errors.StateError) and nothing is half
restored: the engine's sequence is then empty. write_state_file / load_state_file stream between
the file and the cache a layer at a time (a spilled cache through its charged read buffers), so a
state file never needs a copy of the whole cache in RAM; their tokens are charged to the budget.
Both check ramforge.cancel between layers: a request whose client has gone stops (a save leaves no
file, a restore an empty sequence).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
import struct
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._version import __version__
from .. import cancel
from ..errors import InvalidArgument, StateError, Unsupported
from ..memory.budget import MemoryBudget

MAGIC = b"RAMFORGE-STATE\x00\x01"
MAX_HEADER = 1 << 16
_SHA: dict = {}                 # (path, size, mtime_ns) -> the model file's sha256
_SHA_LOCK = threading.Lock()


def model_sha256(path: str) -> str:
    """The model file's sha256 (hashed once per path, size and mtime)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    with _SHA_LOCK:
        if key not in _SHA:
            from ..store.transfer import hash_file

            _SHA[key] = hash_file(Path(path))[0].hexdigest()
        return _SHA[key]


@dataclass
class State:
    """One sequence: tokens i32[n] and its cache's rows, k [layers, n, n_head_kv, row_k], v likewise."""
    tokens: np.ndarray
    k: np.ndarray
    v: np.ndarray
    shape: dict                 # arch, layers, n_head_kv, head_dim_k, head_dim_v, type_k, type_v

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.k.nbytes + self.v.nbytes


def _shape(engine) -> dict:
    hp, kv = engine.hp, engine.kv
    return {"arch": hp.arch, "layers": list(engine.layers), "n_head_kv": hp.n_head_kv,
            "head_dim_k": hp.head_dim_k, "head_dim_v": hp.head_dim_v,
            "type_k": str(getattr(kv, "type_k", "f16")), "type_v": str(getattr(kv, "type_v", "f16"))}


def check_local(engine) -> None:
    if getattr(engine, "kv", None) is None:
        raise Unsupported("saved states and the prompt cache need a model in this process; a pipeline of "
                          "stages (ray=) keeps its KV caches in the stages")


def _diff(got: dict, want: dict) -> str:
    return ", ".join(f"{k}: {got.get(k)} vs {want[k]}" for k in want if got.get(k) != want[k])


def save_state(engine) -> State:
    """A copy of the engine's sequence (its tokens and their cached keys and values)."""
    check_local(engine)
    n = engine.n_past
    k, v = engine.kv.export(n)
    return State(np.asarray(engine.tokens[:n], np.int32), k, v, _shape(engine))


def load_state(engine, state: State) -> None:
    """Make state the engine's sequence; StateError (the sequence left empty) when it does not fit."""
    check_local(engine)
    engine.reset(0)
    want = _shape(engine)
    if state.shape != want:
        raise StateError(f"the state was saved for another context shape or KV type ({_diff(state.shape, want)})")
    n = state.n_tokens
    if n > engine.n_ctx:
        raise StateError(f"the state holds {n} tokens, more than the context of {engine.n_ctx}; raise --ctx")
    if n and (state.tokens.min() < 0 or state.tokens.max() >= engine.hp.n_vocab):
        bad = int(state.tokens[(state.tokens < 0) | (state.tokens >= engine.hp.n_vocab)][0])
        raise StateError(f"the state holds token id {bad}, outside the vocabulary of {engine.hp.n_vocab}")
    engine.kv.restore(state.k, state.v, n)
    engine.tokens[:] = state.tokens.tolist()


# ---- files -------------------------------------------------------------------------------------

def _open_regular(path: Path):
    """path opened for reading if it is a regular file: a link (O_NOFOLLOW), a FIFO (O_NONBLOCK: the
    open never waits for a writer), a device or a directory is refused (StateError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateError(f"{path.name} is a symbolic link: only regular files are read") from None
        raise StateError(f"cannot read the state file {path.name}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StateError(f"{path.name} is not a regular file (a FIFO, device or directory): refused")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _check_target(path: Path) -> None:
    """A save may replace a state file of the same name, nothing else (StateError)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    ok = stat.S_ISREG(st.st_mode)
    if ok:
        with _open_regular(path) as f:
            ok = f.read(len(MAGIC)) == MAGIC
    if not ok:
        raise StateError(f"{path.name} exists and is not a ramforge state file: it is not replaced; choose "
                         f"another name or remove it")


def _write_file(path, header: dict, chunks) -> int:
    """Write a state file: the header (its payload_sha256 filled in once the payload is written: the
    same length), then each array chunks() yields, to a new unique temporary name (O_EXCL|O_NOFOLLOW,
    0600) renamed over path; the bytes written."""
    path = Path(path)
    _check_target(path)
    head = dict(header, payload_sha256="0" * 64)
    blob = json.dumps(head).encode()
    tmp, fd = None, -1
    for _ in range(8):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    if fd < 0:
        raise StateError(f"cannot create a temporary file beside {path.name}")
    try:
        h, n = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(blob)) + blob)
            for a in chunks():
                view = memoryview(np.ascontiguousarray(a, a.dtype.newbyteorder("<"))).cast("B")
                h.update(view)
                f.write(view)
                n += len(view)
            f.flush()
            real = json.dumps(dict(head, payload_sha256=h.hexdigest())).encode()
            assert len(real) == len(blob)
            os.pwrite(f.fileno(), real, len(MAGIC) + 4)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(MAGIC) + 4 + len(blob) + n


def _header(state_shape: dict, n: int, model_path: str) -> dict:
    return {**state_shape, "model_sha256": model_sha256(model_path), "n_tokens": n, "ramforge": __version__}


def write_state(path, state: State, model_path: str) -> int:
    """Write state to path (a new temporary file, then renamed); the number of bytes written."""
    return _write_file(path, _header(state.shape, state.n_tokens, model_path),
                       lambda: (state.tokens.astype("<i4"), state.k, state.v))


def write_state_file(path, engine) -> int:
    """Write the engine's sequence to path as write_state(save_state(engine)) would, streamed a layer at
    a time from the cache (a spilled one through its charged read buffers): no copy of the cache in
    RAM. The bytes written."""
    check_local(engine)
    kv, n = engine.kv, engine.n_past
    if hasattr(kv, "rows_out"):
        def rows(which):
            for i in range(kv.n_layer):
                cancel.check()
                with kv.rows_out(which, i, n) as r:
                    yield r
    else:
        kv.plain_again()
        if kv.celled:
            raise InvalidArgument("the cached sequence is held in shifted or shared KV cells (a context shift, "
                                  "parallel sequences): it cannot be saved as a state; reset it first")

        def rows(which):
            a = kv.k if which == "k" else kv.v
            for i in range(a.shape[0]):
                cancel.check()
                yield a[i, :n]
    with engine.budget.charge("state file: tokens", 4 * n):
        tokens = np.asarray(engine.tokens[:n], "<i4")

        def chunks():
            yield tokens
            yield from rows("k")
            yield from rows("v")
        return _write_file(path, _header(_shape(engine), n, engine.path), chunks)


def _finite(text: str) -> float:
    x = float(text)
    if x in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} is out of a float's range")
    return x


def _not_a_number(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _parse_header(raw: bytes, path: Path) -> dict:
    """A state file's header: a flat JSON object (values: scalars or lists of them) whose n_tokens is an
    integer; numbers finite (no 1e999, NaN or Infinity), integers within Python's digit limit, nesting
    within the recursion limit. StateError (damaged) otherwise, never another exception."""
    try:
        meta = json.loads(raw, parse_float=_finite, parse_constant=_not_a_number)
    except (ValueError, RecursionError, UnicodeDecodeError) as e:   # JSONDecodeError, digits, 1e999; too deep
        why = "nested too deep" if isinstance(e, RecursionError) else str(e)[:200]
        raise StateError(f"{path.name}: unreadable header ({why}): damaged") from None
    if not isinstance(meta, dict) or any(isinstance(v, (dict, list)) and any(isinstance(x, (dict, list)) for x in v)
                                         for v in meta.values()):
        raise StateError(f"{path.name}: the header is not a flat JSON object: damaged")   # (its values print safely)
    n = meta.get("n_tokens")
    if not isinstance(n, int) or isinstance(n, bool):
        raise StateError(f"{path.name}: the header's n_tokens is {str(n)[:40]}, not a number of tokens: damaged")
    return meta


def _read_header(f, path: Path, engine) -> tuple[dict, int, list]:
    """(meta, n_tokens, [(shape, dtype)] of tokens, K, V) of an open state file, each field checked
    against the engine, the file's size against them (StateError)."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(len(MAGIC) + 4)
    if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
        raise StateError(f"{path.name} is not a ramforge state file (bad magic)")
    (n_header,) = struct.unpack("<I", head[len(MAGIC):])
    if n_header > MAX_HEADER:
        raise StateError(f"{path.name}: header of {n_header} bytes is over {MAX_HEADER}: damaged")
    meta = _parse_header(f.read(n_header), path)
    n = meta["n_tokens"]
    if meta.get("model_sha256") != model_sha256(engine.path):
        raise StateError(f"{path.name} was saved for another model (sha256 {str(meta.get('model_sha256'))[:16]}…, "
                         f"this one is {model_sha256(engine.path)[:16]}…)")
    shape = {k: meta.get(k) for k in _shape(engine)}
    if shape != _shape(engine):
        raise StateError(f"{path.name} was saved with another context shape or KV type "
                         f"({_diff(shape, _shape(engine))})")
    if not 0 <= n <= engine.n_ctx:
        raise StateError(f"{path.name} holds {n} tokens; this context holds {engine.n_ctx}")
    kv = engine.kv                # [layers, rows, n_head_kv, row]: f16 bits (u16) or quantized blocks (u8)
    dims = [((n,), np.dtype("<i4"))] + [((s.shape[0], n, *s.shape[2:]), s.dtype.newbyteorder("<"))
                                       for s in (kv.k, kv.v)]
    expect = f.tell() + sum(int(np.prod(s)) * d.itemsize for s, d in dims)
    if size != expect:
        raise StateError(f"{path.name} is {size} bytes, its header describes {expect}: truncated or damaged")
    return meta, n, dims


def _read_into(f, path: Path, out: np.ndarray, h) -> None:
    """Fill out (contiguous) from f, hashing the file's bytes; a native array on a big-endian host swapped."""
    view = memoryview(out).cast("B")
    if f.readinto(view) != len(view):
        raise StateError(f"{path.name} ended early: truncated while it was read")
    h.update(view)
    if sys.byteorder == "big" and out.dtype.byteorder == "=" and out.dtype.itemsize > 1:
        out.byteswap(inplace=True)


def _check_tokens(tokens: np.ndarray, n_vocab: int) -> None:
    if tokens.size and (tokens.min() < 0 or tokens.max() >= n_vocab):
        bad = int(tokens[(tokens < 0) | (tokens >= n_vocab)][0])
        raise StateError(f"the state holds token id {bad}, outside the vocabulary of {n_vocab}")


def read_state(path, engine) -> State:
    """The state in path, checked against the engine (StateError with the reason otherwise)."""
    check_local(engine)
    path = Path(path)
    try:
        with _open_regular(path) as f:
            meta, n, dims = _read_header(f, path, engine)
            arrays, h = [], hashlib.sha256()
            for s, d in dims:
                a = np.empty(s, d)
                _read_into(f, path, a, h)
                arrays.append(a.astype(d.newbyteorder("="), copy=False))
    except OSError as e:
        raise StateError(f"cannot read the state file {path.name}: {e.strerror or e}") from None
    if h.hexdigest() != meta.get("payload_sha256"):
        raise StateError(f"{path.name}: its contents do not match their sha256: damaged")
    return State(arrays[0].astype(np.int32), arrays[1], arrays[2], {k: meta.get(k) for k in _shape(engine)})


def load_state_file(engine, path) -> int:
    """Make the state in path the engine's sequence, streamed from the file into the cache a layer at a
    time (a spilled cache: through its charged read buffers; a cache in RAM: straight into its slabs,
    charged for the positions first), the sha256 checked as it goes; the bytes read. StateError (or
    KVBudgetExceeded) leaves the sequence empty, never half restored."""
    check_local(engine)
    path = Path(path)
    engine.reset(0)
    kv = engine.kv
    spilled = hasattr(kv, "rows_in")
    try:
        with _open_regular(path) as f:
            meta, n, dims = _read_header(f, path, engine)
            h = hashlib.sha256()
            with engine.budget.charge("state file: tokens", 4 * n):
                tokens = np.empty(n, "<i4")
                _read_into(f, path, tokens, h)
                _check_tokens(tokens, engine.hp.n_vocab)
                if spilled:
                    kv.begin_restore()
                else:
                    if kv.celled and (kv.cell_pos[kv.n_ctx_seq:] >= 0).any():
                        raise InvalidArgument("other sequences hold KV cells: a state restores into a "
                                              "single-sequence cache")
                    kv.n_past, kv.celled = 0, False
                    kv.reserve(n)
                for which, (s, d) in zip("kv", dims[1:]):
                    for i in range(s[0]):
                        cancel.check()          # a gone client stops the restore between layers: left empty
                        if spilled:
                            with kv.rows_in(which, i, n) as rows:
                                _read_into(f, path, rows, h)
                        else:
                            _read_into(f, path, (kv.k if which == "k" else kv.v)[i, :n], h)
                if h.hexdigest() != meta.get("payload_sha256"):
                    raise StateError(f"{path.name}: its contents do not match their sha256: damaged")
                (kv.end_restore if spilled else lambda m: setattr(kv, "n_past", m))(n)
                engine.tokens[:] = tokens.tolist()
                return f.tell()
    except BaseException as e:
        kv.n_past = 0
        if spilled:
            kv.end_restore(0)
        else:
            kv.shrink(0)
        engine.reset(0)
        if isinstance(e, OSError):
            raise StateError(f"cannot read the state file {path.name}: {e.strerror or e}") from None
        raise


# ---- the prompt cache ----------------------------------------------------------------------------

class PromptCache:
    """Saved sequences in a budget of their own, least recently used dropped first: a new prompt
    resumes from the state sharing its longest prefix (llama-cpp-python's LlamaRAMCache, llama-server's
    --cache-ram). capacity: bytes (a size string such as "2G" is accepted)."""

    def __init__(self, capacity):
        self.budget = MemoryBudget(capacity)
        if not self.budget.limit:
            raise InvalidArgument(f"the prompt cache's capacity must be positive, got {capacity!r}")
        self._states: OrderedDict = OrderedDict()       # tuple(tokens) -> (State, Charge)
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._states)

    @property
    def nbytes(self) -> int:
        return self.budget.current

    def put(self, state: State) -> bool:
        """Keep state (replacing one of the same tokens), dropping the oldest to make room; False when
        it alone is larger than the capacity."""
        key = tuple(state.tokens.tolist())
        for old in [k for k in self._states if key[:len(k)] == k]:    # itself, or a prefix it extends
            self._states.pop(old)[1].release()
        if state.nbytes > self.budget.limit or not key:
            return False
        while self.budget.available < state.nbytes:
            self._states.popitem(last=False)[1][1].release()
        self._states[key] = (state, self.budget.charge("prompt cache state", state.nbytes))
        return True

    def best(self, prompt) -> tuple[State | None, int]:
        """The state sharing the longest prefix with prompt, and that prefix's length."""
        best, n_best = None, 0
        for key, (st, _) in self._states.items():
            n = _common(key, prompt)
            if n > n_best:
                best, n_best = key, n
        if best is None:
            return None, 0
        self._states.move_to_end(best)
        return self._states[best][0], n_best

    def resume(self, engine, prompt) -> int:
        """Before evaluating prompt: the engine's sequence, where prompt leaves it, is saved here; the
        cached state sharing a longer prefix with prompt than the engine's, if any, is loaded. The
        prefix length resumed."""
        prompt = list(prompt)
        mine = _common(engine.tokens, prompt)
        st, n = self.best(prompt)
        if engine.n_past > mine:                        # the prompt would cut the sequence: keep it
            engine.kv.plain_again()
            if not engine.kv.celled:                    # (a context-shifted one cannot be saved: KVCache.export)
                self.put(save_state(engine))
        if st is None or n <= mine:
            self.hits += mine > 0
            self.misses += mine == 0
            return mine
        load_state(engine, st)
        self.hits += 1
        return n

    def close(self) -> None:
        while self._states:
            self._states.popitem()[1][1].release()


def _common(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
