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

It is written to a temporary name and renamed. Reading checks every field against the engine before
anything is allocated or copied, so a file for another model, shape or KV type, a damaged or
truncated one, or tokens outside the vocabulary are refused (errors.StateError) and nothing is half
restored: the engine's sequence is then empty.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._version import __version__
from .errors import InvalidArgument, StateError, Unsupported
from .memory.budget import MemoryBudget

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
            from .store.transfer import hash_file

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

def write_state(path, state: State, model_path: str) -> int:
    """Write state to path (a temporary name, then renamed); the number of bytes written."""
    path = Path(path)
    payload = [np.ascontiguousarray(a) for a in (state.tokens.astype("<i4"), state.k, state.v)]
    h = hashlib.sha256()
    for a in payload:
        h.update(memoryview(a).cast("B"))
    header = json.dumps({**state.shape, "model_sha256": model_sha256(model_path), "n_tokens": state.n_tokens,
                         "payload_sha256": h.hexdigest(), "ramforge": __version__}).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            for a in payload:
                f.write(memoryview(a).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(MAGIC) + 4 + len(header) + sum(a.nbytes for a in payload)


def read_state(path, engine) -> State:
    """The state in path, checked against the engine (StateError with the reason otherwise)."""
    check_local(engine)
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + 4)
            if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
                raise StateError(f"{path.name} is not a ramforge state file (bad magic)")
            (n_header,) = struct.unpack("<I", head[len(MAGIC):])
            if n_header > MAX_HEADER:
                raise StateError(f"{path.name}: header of {n_header} bytes is over {MAX_HEADER}: damaged")
            try:
                meta = json.loads(f.read(n_header))
                n = int(meta["n_tokens"])
            except (ValueError, KeyError, TypeError) as e:
                raise StateError(f"{path.name}: unreadable header ({e}): damaged") from None
            if meta.get("model_sha256") != model_sha256(engine.path):
                raise StateError(f"{path.name} was saved for another model (sha256 {str(meta.get('model_sha256'))[:16]}…, "
                                 f"this one is {model_sha256(engine.path)[:16]}…)")
            shape = {k: meta.get(k) for k in _shape(engine)}
            if shape != _shape(engine):
                raise StateError(f"{path.name} was saved with another context shape or KV type "
                                 f"({_diff(shape, _shape(engine))})")
            if not 0 <= n <= engine.n_ctx:
                raise StateError(f"{path.name} holds {n} tokens; this context holds {engine.n_ctx}")
            kv = engine.kv                # a slab's row: f16 bits (u16) or quantized blocks (u8)
            dims = [((n,), np.dtype("<i4"))] + [((s.shape[0], n, *s.shape[2:]), s.dtype.newbyteorder("<"))
                                               for s in (kv.k, kv.v)]
            expect = f.tell() + sum(int(np.prod(s)) * d.itemsize for s, d in dims)
            if size != expect:
                raise StateError(f"{path.name} is {size} bytes, its header describes {expect}: truncated or damaged")
            arrays, h = [], hashlib.sha256()
            for s, d in dims:
                raw = f.read(int(np.prod(s)) * d.itemsize)
                h.update(raw)
                arrays.append(np.frombuffer(raw, d).reshape(s).astype(d.newbyteorder("="), copy=True))
    except OSError as e:
        raise StateError(f"cannot read the state file {path.name}: {e.strerror or e}") from None
    if h.hexdigest() != meta.get("payload_sha256"):
        raise StateError(f"{path.name}: its contents do not match their sha256: damaged")
    return State(arrays[0].astype(np.int32), arrays[1], arrays[2], shape)


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
