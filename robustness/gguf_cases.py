"""Fuzz cases for the GGUF reader, shared by tests/test_fuzz_reader.py (under hypothesis) and
robustness/fuzz.py (random.Random(seed), 10k+ cases): small valid GGUF files (tools/ggufbuild.py)
mutated field-aware and byte-wise (see tests/test_fuzz_reader.py), and run_case, which opens one
under a time limit, tracemalloc and a file-descriptor count and classifies the outcome.
One case of robustness/fuzz.py reproduces with ``case_bytes(seed, index)``.
"""
from __future__ import annotations

import math
import os
import random
import signal
import struct
import threading
import time
import tracemalloc
import traceback
from dataclasses import dataclass, field

import numpy as np

from ramforge.errors import RamforgeError
from ramforge.gguf.constants import GGML_BLOCK, GGUF_SCALAR, GGUFValueType as VT
from ramforge.gguf.reader import GGUFFile
from tools.ggufbuild import GGUFBuilder, encode_value, valid_model

TIME_LIMIT_S = 1.0            # per case: open + read every tensor
HARD_LIMIT_S = 10.0           # SIGALRM: a case still running after this is stopped and reported hung
ALLOC_LIMIT = 32 << 20        # tracemalloc peak beyond the input size

U64_MAX = 2**64 - 1
HOSTILE_U64 = [0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 255, 256, 4096, 2**16, 2**20, 2**31 - 1, 2**31,
               2**32 - 1, 2**32, 2**32 + 1, 2**40, 2**48, 2**56, 2**60, 2**61, 2**61 + 1, 2**62, 2**63 - 1,
               2**63, 2**63 + 1, 2**64 - 32, 2**64 - 8, 2**64 - 2, U64_MAX]
HOSTILE_U32 = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 14, 15, 16, 31, 32, 33, 39, 40, 64, 255, 256, 4096,
               2**16, 2**20, 2**21, 2**31 - 1, 2**31, 2**32 - 1]
HOSTILE_I64 = [0, -1, -2, -32, -(2**31), -(2**63), 1, 2, 31, 32, 33, 255, 256, 257, 2**16, 2**31 - 1, 2**31,
               2**32, 2**32 + 32, 2**40, 2**48, 2**62, 2**63 - 1]
ALIGNMENTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 4096]

_SCALARS = [vt for vt in VT if vt not in (VT.STRING, VT.ARRAY)]
GTYPES = sorted(GGML_BLOCK)
_KNOWN_KEYS = ["general.architecture", "general.alignment", "general.name", "tokenizer.ggml.model",
               "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
               "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.chat_template",
               "llama.block_count", "llama.context_length"]


# ---- random valid (or nearly valid) bases, built with GGUFBuilder ------------------------------

def _rbytes(rng, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(n))


def _rand_text(rng, max_len: int = 12) -> str:
    n = rng.randint(0, max_len)
    pools = ("abcxyz_.0123456789", "\u2581\u0120<>|/ \n\t", "\u00e9\u4e2d\u0416\U0001f999\u0301")
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def _rand_scalar(rng, vt: VT):
    fmt, size, _ = GGUF_SCALAR[vt]
    if vt == VT.BOOL:
        return rng.random() < 0.5
    if vt == VT.FLOAT32:
        return rng.choice([0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 3.0e38, 1e-40])
    if vt == VT.FLOAT64:
        return rng.choice([0.0, 3.25, -1e300, math.inf, math.nan, 5e-324])
    bits = size * 8
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if fmt[1].islower() else (0, (1 << bits) - 1)
    r = rng.random()
    return lo if r < 0.1 else hi if r < 0.2 else rng.randint(lo, hi) if r < 0.5 else rng.randint(max(lo, 0), min(hi, 64))


def _rand_array_payload(rng, depth: int = 0) -> bytes:
    """An ARRAY value payload (item type, count, items); nested arrays are written by hand."""
    item = rng.choice(_SCALARS + [VT.STRING] * 3 + ([VT.ARRAY] if depth < 2 and rng.random() < 0.3 else []))
    n = rng.randint(0, 6)
    if item == VT.ARRAY:
        return struct.pack("<IQ", VT.ARRAY, n) + b"".join(_rand_array_payload(rng, depth + 1) for _ in range(n))
    if item == VT.STRING:
        return encode_value(VT.ARRAY, [_rand_text(rng) for _ in range(n)], VT.STRING)
    return encode_value(VT.ARRAY, [_rand_scalar(rng, item) for _ in range(n)], item)


def _add_tokenizer(rng, b: GGUFBuilder) -> None:
    n = rng.randint(1, 8)
    toks = [f"<t{i}>" if i < 3 else _rand_text(rng, 6) or f"[{i}]" for i in range(n)]
    b.add("tokenizer.ggml.model", VT.STRING, rng.choice(["llama", "gpt2", "bert", ""]))
    b.add("tokenizer.ggml.tokens", VT.ARRAY, toks, VT.STRING)
    if rng.random() < 0.8:
        b.add("tokenizer.ggml.scores", VT.ARRAY, [-float(i) for i in range(n)], VT.FLOAT32)
    if rng.random() < 0.8:
        b.add("tokenizer.ggml.token_type", VT.ARRAY, [rng.randint(0, 7) for _ in range(n)], VT.INT32)
    if rng.random() < 0.5:
        b.add("tokenizer.ggml.merges", VT.ARRAY, [f"{toks[0]} {toks[-1]}"], VT.STRING)


def random_builder(rng) -> GGUFBuilder:
    """A small random file: any value types, arrays (some nested), tokenizer keys, tensors of any type."""
    if rng.random() < 0.25:
        b = valid_model()
        b.version = rng.choice([2, 3, 3])
        return b
    align = rng.choice(ALIGNMENTS) if rng.random() < 0.6 else 32
    b = GGUFBuilder(version=rng.choice([2, 3, 3]), alignment=align)
    keys: list = []
    if align != 32 or rng.random() < 0.5:
        keys.append("general.alignment")
    keys += [rng.choice(_KNOWN_KEYS) if rng.random() < 0.3 else f"k{i}.{_rand_text(rng, 5)}" for i in range(rng.randint(0, 6))]
    tokenizer = rng.random() < 0.3
    seen = set()
    for key in keys:
        if key in seen or key.startswith("tokenizer.ggml.t") or key == "tokenizer.ggml.scores":
            continue
        seen.add(key)
        if key == "general.alignment":
            b.add(key, VT.UINT32, align)
            continue
        vt = rng.choice(_SCALARS + [VT.STRING, VT.STRING, VT.ARRAY, VT.ARRAY])
        if vt == VT.STRING:
            b.add(key, VT.STRING, _rand_text(rng, 40))
        elif vt == VT.ARRAY:
            b.kv_raw(key, VT.ARRAY, _rand_array_payload(rng))
        else:
            b.add(key, vt, _rand_scalar(rng, vt))
    if tokenizer:
        _add_tokenizer(rng, b)
    names = set()
    for i in range(rng.randint(0, 4)):
        gtype = rng.choice(GTYPES)
        block, _ = GGML_BLOCK[gtype]
        n_dims = rng.randint(1, 4)
        dims = [block * rng.randint(1, 2 if block > 32 else 4)] + [rng.randint(1, 3) for _ in range(n_dims - 1)]
        name = rng.choice([f"blk.{i}.w", "token_embd.weight", "x" * rng.randint(1, 63), f"t{i}"])
        if name in names:
            name = f"t{i}"
        names.add(name)
        b.tensor(name, dims, gtype)
    return b


# ---- field-aware mutation ----------------------------------------------------------------------

@dataclass(frozen=True)
class FieldAt:
    offset: int
    width: int
    kind: str
    value: int


def field_map(data: bytes, limit: int = 4000) -> list[FieldAt]:
    """Offsets of the integer fields of a (mostly) well-formed GGUF; stops quietly where it isn't."""
    out: list[FieldAt] = []
    pos = 0

    def take(fmt: str, kind: str) -> int:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        out.append(FieldAt(pos, struct.calcsize(fmt), kind, v))
        pos += struct.calcsize(fmt)
        if len(out) > limit:
            raise ValueError("too many fields")
        return v

    def skip_str(kind: str) -> bytes:
        nonlocal pos
        n = take("<Q", kind)
        if n > len(data) - pos:
            raise ValueError("string past the end")
        pos += n
        return data[pos - n:pos]

    def value(vt: int, key: bytes) -> None:
        if vt == VT.STRING:
            skip_str("str_len")
        elif vt == VT.ARRAY:
            item = take("<I", "arr_type")
            count = take("<Q", "arr_count")
            if count > len(data):
                raise ValueError("array count")
            for _ in range(count):
                value(item, key)
        else:
            fmt = GGUF_SCALAR[VT(vt)][0]
            take(fmt, "alignment" if key == b"general.alignment" else "value")

    try:
        pos = 4
        take("<I", "version")
        n_tensors = take("<Q", "n_tensors")
        n_kv = take("<Q", "n_kv")
        for _ in range(min(n_kv, limit)):
            key = skip_str("key_len")
            value(take("<I", "vtype"), key)
        for _ in range(min(n_tensors, limit)):
            skip_str("tname_len")
            nd = take("<I", "n_dims")
            for _ in range(min(nd, 8)):
                take("<q", "dim")
            take("<I", "ggml_type")
            take("<Q", "toffset")
    except (struct.error, ValueError, KeyError):
        pass
    return out


def _hostile_value(rng, f: FieldAt, size: int) -> int:
    """A value for field f chosen to trap a parser: edge values, off-by-ones, sizes near the file's."""
    left = max(size - f.offset - f.width, 0)
    near = [f.value + d for d in (-2, -1, 1, 2, 8, 32)] + [f.value * 2, left, left + 1, left // 8, left // 8 + 1,
                                                          left // 4 + 1, size, size * 2]
    kind = f.kind
    if kind in ("version", "vtype", "arr_type", "ggml_type", "n_dims", "alignment"):
        pools = {"version": [0, 1, 2, 3, 4, 0x03000000, 0x02000000],
                 "vtype": list(range(14)), "arr_type": list(range(14)),
                 "ggml_type": list(range(42)) + [255, 1000],
                 "n_dims": [0, 1, 2, 3, 4, 5, 6, 8],
                 "alignment": [0, 1, 2, 3, 8, 16, 24, 31, 32, 48, 64, 2**20, 2**20 + 1, 2**21, 2**31]}[kind]
        v = rng.choice(pools if rng.random() < 0.7 else HOSTILE_U32)
    elif kind == "dim":
        v = rng.choice(HOSTILE_I64 if rng.random() < 0.7 else [f.value * 2, f.value + 1, f.value - 1, -f.value])
    elif kind == "value":
        v = rng.getrandbits(8 * f.width)
    else:   # counts, lengths, offsets
        r = rng.random()
        v = rng.choice(HOSTILE_U64) if r < 0.5 else rng.choice(near) if r < 0.85 else rng.getrandbits(64)
    return v % (1 << (8 * f.width))


def put_field(data: bytearray, f: FieldAt, v: int) -> None:
    data[f.offset:f.offset + f.width] = v.to_bytes(f.width, "little")


BYTE_OPS = ("truncate", "flip", "insert", "delete", "splice", "u64", "u32", "pad")


def mutate(rng, data: bytes, n_ops: int | None = None) -> bytes:
    """Field overwrites first (offsets known), then byte-level operations that shift content."""
    if n_ops is None:
        r = rng.random()
        n_ops = 0 if r < 0.08 else 1 if r < 0.5 else 2 if r < 0.75 else rng.randint(3, 8)
    fields = field_map(data)
    buf = bytearray(data)
    n_field = sum(rng.random() < 0.6 for _ in range(n_ops)) if fields else 0
    for _ in range(n_field):
        f = rng.choice(fields)
        put_field(buf, f, _hostile_value(rng, f, len(buf)))
    for _ in range(n_ops - n_field):
        op = rng.choice(BYTE_OPS)
        n = len(buf)
        if op == "truncate":
            del buf[rng.randint(0, n) if rng.random() < 0.5 else rng.randint(max(0, n - 64), n):]
        elif op == "flip" and n:
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(n)
                buf[i] ^= (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randint(1, 255)
        elif op == "insert":
            i = rng.randint(0, n)
            buf[i:i] = _rbytes(rng, rng.randint(1, 16)) if rng.random() < 0.5 else bytes(rng.choice([1, 4, 8]))
        elif op == "delete" and n:
            i = rng.randrange(n)
            del buf[i:i + rng.randint(1, 16)]
        elif op == "splice" and n:
            i, j = rng.randrange(n), rng.randrange(n)
            buf[j:j] = buf[i:i + rng.randint(1, 64)]
        elif op in ("u64", "u32") and n >= 8:
            w = 8 if op == "u64" else 4
            i = rng.randrange(n - w + 1) if rng.random() < 0.5 else rng.randrange(0, n - w + 1, w)
            v = rng.choice(HOSTILE_U64 if w == 8 else HOSTILE_U32) % (1 << (8 * w))
            buf[i:i + w] = v.to_bytes(w, "little")
        elif op == "pad":
            k = rng.choice([1, 7, 32, 4096, 65536, 1 << 18])
            buf += bytes(k) if rng.random() < 0.7 else _rbytes(rng, min(k, 4096))
    return bytes(buf)


def gen_case(rng) -> bytes:
    """One fuzz input: a random small GGUF, usually mutated; sometimes random bytes after a header."""
    r = rng.random()
    if r < 0.03:
        head = b"GGUF" + struct.pack("<IQQ", rng.choice([2, 3]), rng.choice(HOSTILE_U64), rng.choice(HOSTILE_U64))
        return head + _rbytes(rng, rng.randint(0, 256))
    b = random_builder(rng)
    if rng.random() < 0.1:       # builder-level malformations
        kw = {}
        if rng.random() < 0.5:
            kw["n_tensors"] = rng.choice(HOSTILE_U64)
        else:
            kw["n_kv"] = rng.choice(HOSTILE_U64)
        return b.build(**kw)
    return mutate(rng, b.build())


def case_bytes(seed: int, index: int) -> bytes:
    """Case `index` of robustness/fuzz.py's reader run with `seed` (each case has its own Random)."""
    return gen_case(random.Random(f"reader:{seed}:{index}"))


# ---- running one case --------------------------------------------------------------------------

class Hung(BaseException):
    """Raised by SIGALRM inside a case that ran past HARD_LIMIT_S."""


def _on_alarm(signum, frame):
    raise Hung()


@dataclass
class Outcome:
    status: str                     # "ok" | "refused" | "crashed" | "hung"
    exc: str | None = None          # exception class (refused/crashed)
    detail: str = ""
    elapsed: float = 0.0             # CPU seconds of the reading thread
    peak: int = 0                   # tracemalloc peak during the case, bytes
    size: int = 0
    n_tensors: int = 0
    problems: list = field(default_factory=list)   # failed checks: crash, slow, over allocation, fd leak

    @property
    def failed(self) -> bool:
        return bool(self.problems)


def _check_parsed(f: GGUFFile) -> int:
    """Descriptor invariants of an accepted file; every tensor readable. Returns the tensor count."""
    assert f.version in (2, 3)
    md = f.metadata
    assert len(md) == len(f.fields)
    end_prev = f.data_offset
    for t in sorted(f.tensors.values(), key=lambda t: t.offset):
        block, bsize = GGML_BLOCK[t.ggml_type]
        assert 1 <= len(t.dims) <= 4 and all(d > 0 for d in t.dims)
        assert t.nbytes == t.n_elements // block * bsize > 0
        assert t.offset >= end_prev and t.offset % f.alignment == 0 and t.offset + t.nbytes <= f.size
        end_prev = t.offset + t.nbytes
        raw = f.read_tensor(t)
        assert raw.dtype == np.uint8 and raw.shape == (t.nbytes,)
    return len(f.tensors)


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def run_case(data: bytes, path: str, time_limit: float = TIME_LIMIT_S, alloc_limit: int = ALLOC_LIMIT,
             hard_limit: float = HARD_LIMIT_S) -> Outcome:
    """Write data to path, open it with GGUFFile and read every tensor, under time/allocation watch."""
    with open(path, "wb") as fh:
        fh.write(data)
    out = Outcome("ok", size=len(data))
    alarm = threading.current_thread() is threading.main_thread()
    if alarm:
        old = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, hard_limit)
    fds = _open_fds()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    t0 = time.thread_time()      # the reader's CPU time: a busy machine does not make a case "slow"
    try:
        with GGUFFile(path) as f:
            out.n_tensors = _check_parsed(f)
    except Hung:
        out.status = "hung"
    except RamforgeError as e:
        out.status, out.exc, out.detail = "refused", type(e).__name__, str(e)[-300:]
    except BaseException as e:   # noqa: BLE001 - anything else is the finding
        if isinstance(e, KeyboardInterrupt):
            raise
        out.status, out.exc = "crashed", type(e).__name__
        out.detail = "".join(traceback.format_exception(e))[-2000:]
    finally:
        out.elapsed = time.thread_time() - t0
        out.peak = max(tracemalloc.get_traced_memory()[1] - base, 0)
        if started:
            tracemalloc.stop()
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    if out.status == "crashed":
        out.problems.append(f"crashed with {out.exc}")
    if out.status == "hung" or out.elapsed > time_limit:
        out.problems.append(f"took {out.elapsed:.2f} s (limit {time_limit} s)")
    if out.peak > len(data) + alloc_limit:
        out.problems.append(f"allocated {out.peak:,} B peak for a {len(data):,}-byte input")
    if fds >= 0 and _open_fds() != fds:
        out.problems.append("leaked a file descriptor")
    return out


def describe(out: Outcome, data: bytes) -> str:
    head = data[:96].hex(" ")
    return (f"{'; '.join(out.problems)}\ninput ({len(data)} bytes) starts {head}\n"
            f"status {out.status} {out.exc or ''} after {out.elapsed:.3f} s, peak {out.peak:,} B\n{out.detail}")


# ---- pytest --------------------------------------------------------------------------------
