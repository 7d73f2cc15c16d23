"""One token through up to three quantized weights that share its input, in one compiled call.

A decode token's matmuls are memory-bound gemvs of a few to a few hundred µs. Run one by one, each
cost a serial call to quantize the activation, Python to pick its kernel, and a parallel region
whose end every thread waits at, the second core idle meanwhile. Here q, k and v (or gate and up, or
one weight alone) are one parallel region of one task per thread: each thread quantizes x itself
(quantize.py's _q8_0_token / _q8_k_token, the arithmetic of quantize_activation: a few µs for a few
thousand values, no barrier) and dots its share of the weights' rows, split by bytes, with the
one-token packed-row code of the qmatmul kernel (qmatmul._make_packed_one). Every row is the one
qmatmul computes, bit for bit: the same quantized activation, the same intrinsic per row.

Around the matmuls, what a layer does between them where it is elementwise or small: before, the
RMSNorm of their input (Prologue.NORM: each thread normalizes its own copy, ggml's float64 sums);
after, a residual add (Epilogue.ADD: each thread its own rows) or SwiGLU of gate and up
(Epilogue.SWIGLU: both split at the same rows, then silu(gate) * up there). models.weights'
rows_of and add_rows use them; a llama layer's decode is then four compiled matmul calls.

It applies where qmatmul would take that path for the token: the vector kernels, a weight type with
packed-row intrinsics for its one-token variant, one token that is not a row of a larger batch.
`matvecs` answers False elsewhere, and the caller runs the weights through qmatmul and the separate ops.

On a cold kernel cache a fused kernel costs seconds to compile, where the per-matrix kernels a prefill
compiles anyway cost nothing more: while warm-up workers compile them (engine.warmup.Deferral), `hold`
makes `fusable` answer None for the fused kernels not yet `ready` (the separate ops run: the same
arithmetic, bit for bit).
"""
from __future__ import annotations

import functools
from enum import IntEnum
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from ramforge.gguf.constants import GGMLType

from .batch import Batch
from .glu import _swiglu_span
from .naming import made_for
from .ops import _rms_row
from .qmatmul import VECTOR, _make_packed_one, choice
from .quantize import ACT_CODE, _token_activation
from .registry import kernels_for
from .variants import Variant

MAX_WEIGHTS = 3


class Slot(NamedTuple):
    """What a fused kernel is made for, per weight (`slot`): its one-token packed path."""

    ggml_type: GGMLType
    variant: Variant        # its one-token arithmetic
    rep: int                # rows in repack.py's groups of this many (0: in file order)
    act_code: int           # quantize.ACT_CODE of its activation
    sub: int                # elements per sub-block of the activation's sums


def slot_rows(s: Slot):
    """The inline rows function of slot s's one-token packed path (qmatmul._make_packed_one)."""
    return _make_packed_one(s.ggml_type, s.variant, s.rep)


class FusedPlan(NamedTuple):
    """A fused call's kernel (`_plan`), and each weight's bytes per row."""

    kernel: object
    row_bytes: tuple[int, ...]


class FusedArgs(NamedTuple):
    """The arguments of a `_make_fused` kernel, in its parameter order: kernel(*FusedArgs(...)). Absent
    weights (fewer than MAX_WEIGHTS) are empty arrays of one row byte; absent norm and residual, empty."""

    x: np.ndarray           # f32[1, n_in]
    y0: np.ndarray          # f32[1, n_out_i]: weight i's result ...
    raw0: np.ndarray        # u8: ... from its packed rows ...
    y1: np.ndarray
    raw1: np.ndarray
    y2: np.ndarray
    raw2: np.ndarray
    rb0: int                # ... of rb_i bytes each
    rb1: int
    rb2: int
    n_threads: int
    src: np.ndarray         # NORM: x = rms_norm(src f32[1, n_in]) * nw f32[n_in] (eps)
    nw: np.ndarray
    eps: np.float32
    res: np.ndarray         # ADD: res f32[1, n_out_0] += y0
@njit(cache=True, inline="always")
def _cut(b, start, row_bytes, n_rows, unit):
    # the first row of a weight (starting at byte `start` of the weights in a row) at or past byte b,
    # down to a multiple of unit: both threads cut at the same rows
    r = (b - start) // row_bytes
    if r <= 0:
        return 0
    if r >= n_rows:
        return n_rows
    return r // unit * unit


@njit(cache=True, inline="always")
def _overlap(a, b):
    # whether arrays a and b (C-contiguous) share a byte
    return (a.size > 0 and b.size > 0 and a.ctypes.data < b.ctypes.data + b.nbytes
            and b.ctypes.data < a.ctypes.data + a.nbytes)


class Prologue(IntEnum):
    NONE = 0              # x as given
    NORM = 1              # x = rms_norm(src) * w, each thread its own (the first writes x)


class Epilogue(IntEnum):
    NONE = 0
    ADD = 1               # res += y0 (a residual), each thread its rows
    SWIGLU = 2            # y0 = silu(y0) * y1, weights 0 and 1 split at the same rows


def _make_fused(slots: tuple, pro: Prologue, epi: Epilogue):
    """The kernel of 1-3 weights, slots[i] the Slot of weight i: x quantized
    once per distinct (act code, sub) in each thread, then each weight's rows of the thread's bytes;
    pro and epi: what it does before (NONE, NORM) and after (NONE, ADD, SWIGLU)."""
    n = len(slots)
    full = slots + (slots[0],) * (MAX_WEIGHTS - n)           # (absent weights: no rows)
    rows0, rows1, rows2 = (slot_rows(f) for f in full)
    (c0, s0), (c1, s1), (c2, s2) = ((f.act_code, f.sub) for f in full)
    u0, u1, u2 = (f.rep if f.rep else 8 for f in full)
    own1 = (c1, s1) != (c0, s0)                               # weight 1 quantizes x its own way
    src2 = 0 if (c2, s2) == (c0, s0) else 1 if (c2, s2) == (c1, s1) else 2
    w1, w2 = n > 1, n > 2
    norm, add, paired = pro == Prologue.NORM, epi == Epilogue.ADD, epi == Epilogue.SWIGLU
    upair = max(u0, u1, 16)                 # (whole 16s of the row for the vector exp)

    @njit(parallel=True, cache=True)
    def _fused(x, y0, raw0, y1, raw1, y2, raw2, rb0, rb1, rb2, n_threads, src, nw, eps, res):
        # (FusedArgs) y_i = x . weight i's rows. NORM: each thread its own x, written by the first;
        # ADD: res += y0; SWIGLU: y0 = silu(y0) * y1 (n_out_0 = n_out_1)
        n_in = x.shape[1]
        e0 = y0.shape[1] * rb0                                  # where each weight ends, in bytes
        e1 = e0 + y1.shape[1] * rb1
        e2 = e1 + y2.shape[1] * rb2
        # what every thread reads (x, or src under NORM) written by one of them: one task, in the order
        # of the separate ops (norm, quantization, each weight, its epilogue): no thread reads a half-written row
        rd = src if norm else x
        if (_overlap(rd, y0) or _overlap(rd, y1) or _overlap(rd, y2) or norm and _overlap(rd, x)
                or add and (_overlap(rd, res) or _overlap(res, y0))):
            n_threads = 1
        for c in prange(n_threads):
            lo, hi = e2 * c // n_threads, e2 * (c + 1) // n_threads
            xt = x
            if norm:
                xt = np.empty((1, n_in), dtype=np.float32)
                _rms_row(xt, src, nw, eps, 0)
                if c == 0:
                    x[0, :] = xt[0, :]
            if paired:                                          # rows a..b of weights 0 and 1
                a0 = a1 = _cut(lo, 0, rb0 + rb1, y0.shape[1], upair)
                b0 = b1 = _cut(hi, 0, rb0 + rb1, y0.shape[1], upair)
            else:
                a0, b0 = _cut(lo, 0, rb0, y0.shape[1], u0), _cut(hi, 0, rb0, y0.shape[1], u0)
                a1, b1 = _cut(lo, e0, rb1, y1.shape[1], u1), _cut(hi, e0, rb1, y1.shape[1], u1)
            q0, d0, m0, bs0 = _token_activation(c0, s0, xt)    # (q, d, m, bsum)
            rows0(y0, q0, d0, m0, bs0, raw0, a0, b0, n_in, rb0)
            if add:
                for r in range(a0, b0):
                    res[0, r] += y0[0, r]
            if w1:
                q1, d1, m1, bs1 = _token_activation(c1, s1, xt) if own1 else (q0, d0, m0, bs0)
                rows1(y1, q1, d1, m1, bs1, raw1, a1, b1, n_in, rb1)
                if paired:
                    g = y0[0]
                    _swiglu_span(g, g, y1[0], 0, a0, b0, g.size - g.size % 16)
            if w2:
                q2, d2, m2, bs2 = (q0, d0, m0, bs0) if src2 == 0 else (q1, d1, m1, bs1) if src2 == 1 else \
                    _token_activation(c2, s2, xt)
                rows2(y2, q2, d2, m2, bs2, raw2, _cut(lo, e1, rb2, y2.shape[1], u2), _cut(hi, e1, rb2, y2.shape[1], u2),
                      n_in, rb2)
    tags = ("_".join(str(getattr(p, "name", p)) for p in s) for s in slots)
    return made_for(_fused, *tags, f"p{int(pro)}e{int(epi)}")


@functools.lru_cache(maxsize=256)
def _fused_kernel(slots: tuple, pro: Prologue, epi: Epilogue):
    return _make_fused(slots, pro, epi)


@functools.lru_cache(maxsize=4096)
def _plan(shapes: tuple, vec: bool, pro: Prologue, epi: Epilogue) -> FusedPlan | None:
    """The plan for weights of shapes ((type, n_out, n_in, rep), ...) and one token, or None where one
    of them does not take the packed one-variant path."""
    if (epi == Epilogue.ADD and len(shapes) != 1
            or epi == Epilogue.SWIGLU and (len(shapes) != 2 or shapes[0][1] != shapes[1][1])):
        return None
    slots = [slot(*shape, vec) for shape in shapes]
    if None in slots:
        return None
    return FusedPlan(_fused_kernel(tuple(s for s, _ in slots), pro, epi), tuple(rb for _, rb in slots))


@functools.lru_cache(maxsize=4096)
def slot(ggml_type, n_out: int, n_in: int, rep: int, vec: bool) -> tuple[Slot, int] | None:
    """(Slot, row bytes) of a weight whose one-token rows take the packed one-variant path
    (_make_packed_one), else None."""
    k = kernels_for(ggml_type)
    if k.qdot is None or n_in % k.block_elems:              # (qmatmul refuses the latter by name)
        return None
    c = choice(ggml_type, n_out, n_in, 1, 1, 0, vec)
    if not c.packed or c.lo != c.hi or c.pos_ties or c.act not in ACT_CODE or rep % 8 or n_out % (rep or 1):
        return None
    return Slot(c.ggml_type, c.hi, rep, ACT_CODE[c.act], c.sub), c.row_bytes


_NONE_Y = np.empty((1, 0), dtype=np.float32)
_NONE_W = np.empty(0, dtype=np.uint8)
_NONE_V = np.empty(0, dtype=np.float32)


def _row(a, n: int, write: bool = False) -> bool:
    # a is f32[1, n], C-contiguous (and writable)
    return (isinstance(a, np.ndarray) and a.shape == (1, n) and a.dtype == np.float32 and a.flags.c_contiguous
            and (a.flags.writeable or not write))


def fusable(x: np.ndarray, outs: list, vector: bool | None = None, norm: tuple | None = None,
            epi: Epilogue = Epilogue.NONE, res: np.ndarray | None = None,
            batch: Batch | None = None) -> FusedPlan | None:
    """The plan to run outs (see matvecs) as one call, or None where some weight, x, y or the prologue's or
    epilogue's arrays do not allow it, or x is a row of a larger batch (its arithmetic is another)."""
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[0] != 1:
        return None
    vec = VECTOR if vector is None else bool(vector)
    if not vec or not 0 < len(outs) <= MAX_WEIGHTS or batch not in (None, Batch(1, 0)):
        return None
    n_in = x.shape[1]
    if not _row(x, n_in, norm is not None):
        return None
    if norm is not None and not (_row(norm[0], n_in) and isinstance(norm[1], np.ndarray) and norm[1].shape == (n_in,)
                                 and norm[1].dtype == np.float32 and norm[1].flags.c_contiguous):
        return None
    if epi == Epilogue.ADD and not _row(res, outs[0][3], True):
        return None
    plan = _plan(tuple((t, n_out, n_in, rep) for _, t, _, n_out, rep in outs), vec,
                 Prologue.NONE if norm is None else Prologue.NORM, epi)
    if plan is None or _held and held(plan.kernel):
        return None
    for (y, _, raw, n_out, _), rb in zip(outs, plan.row_bytes):
        if (not _row(y, n_out, True) or not isinstance(raw, np.ndarray) or raw.dtype != np.uint8
                or raw.size != n_out * rb or not raw.flags.c_contiguous):
            return None
    return plan


def run(plan: FusedPlan, x: np.ndarray, outs: list, norm: tuple | None = None, res: np.ndarray | None = None) -> None:
    """outs computed by the plan fusable gave for them (and the same norm and res)."""
    ws = [(y, raw.reshape(-1), rb) for (y, _, raw, _, _), rb in zip(outs, plan.row_bytes)]
    ws += [(_NONE_Y, _NONE_W, 1)] * (MAX_WEIGHTS - len(ws))
    (y0, w0, r0), (y1, w1, r1), (y2, w2, r2) = ws
    src, nw, eps = norm if norm is not None else (_NONE_Y, _NONE_V, 0.0)
    plan.kernel(*FusedArgs(x, y0, w0, y1, w1, y2, w2, r0, r1, r2, numba.get_num_threads(), src, nw, np.float32(eps),
                           res if res is not None else _NONE_Y))


def matvecs(x: np.ndarray, outs: list, vector: bool | None = None, norm: tuple | None = None,
            epi: Epilogue = Epilogue.NONE, res: np.ndarray | None = None, batch: Batch | None = None) -> bool:
    """y = x @ W^T for each (y, type, raw, n_out, repacked) in outs (1 to MAX_WEIGHTS weights of one
    input x f32[1, n_in]; y f32[1, n_out] C-contiguous; raw u8 packed rows, in repack.py's groups of
    `repacked` rows where not 0) in one compiled call, if every weight takes the fused path; else
    False, nothing computed. norm (src f32[1, n_in], w f32[n_in], eps): x = rms_norm(src) * w first.
    epi: Epilogue.ADD, res f32[1, n_out] += y (one weight); SWIGLU, y0 = silu(y0) * y1 (two weights, as many
    rows). batch: the llama.cpp batch x is a row of, where not a batch of its own (then False unless
    it is a batch of one)."""
    plan = fusable(x, outs, vector, norm, epi, res, batch)
    if plan is None:
        return False
    run(plan, x, outs, norm, res)
    return True


# what the forward passes run fused, by layer tensor: groups of one input (and their prologue and
# epilogue), and the single matrices that add their product to the residual stream (weights.add_rows)
_QKV, _GU = ("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up")
_GROUPS = ((_QKV, Prologue.NORM, Epilogue.NONE), (_QKV, Prologue.NONE, Epilogue.NONE),
           (_GU, Prologue.NORM, Epilogue.SWIGLU), (_GU, Prologue.NORM, Epilogue.NONE),     # (gemma's GeGLU: after)
           (_GU, Prologue.NONE, Epilogue.NONE),
           (("ffn_gate_shexp", "ffn_up_shexp"), Prologue.NONE, Epilogue.NONE))
_ADDED = ("attn_output", "ffn_down")
GROUPED = tuple(dict.fromkeys(names for names, _, _ in _GROUPS))    # matrices of one input, decoded together


def signature() -> tuple:
    """The argument types of FusedArgs, as `run` calls the kernels."""
    f2, f1 = numba.typeof(np.empty((1, 1), np.float32)), numba.typeof(np.empty(1, np.float32))
    u8 = numba.typeof(np.empty(1, np.uint8))
    return (f2, f2, u8, f2, u8, f2, u8) + (numba.int64,) * 4 + (f2, f1, numba.float32, f2)


def kernels(layers, vector: bool | None = None) -> set:
    """The fused kernels (numba dispatchers, not compiled) a decode token of these layers takes (layers:
    per layer, {tensor suffix: (type, n_out, n_in, repacked)} of its matrices; a dict {"output": ...}
    for the output matrix)."""
    vec = VECTOR if vector is None else bool(vector)
    plans = set()
    for d in layers:
        for names, pro, epi in _GROUPS:
            if all(n in d for n in names) and len({d[n][2] for n in names}) == 1:
                plans.add(_plan(tuple(d[n] for n in names), vec, pro, epi))
        for name, shape in d.items():
            plans.add(_plan((shape,), vec, Prologue.NONE, Epilogue.NONE))
            if name in _ADDED:
                plans.add(_plan((shape,), vec, Prologue.NONE, Epilogue.ADD))
    return {p.kernel for p in plans if p is not None}


def warm(layers, vector: bool | None = None) -> int:
    """Compile, or load from numba's disk cache, the fused kernels of `kernels(layers, vector)`; returns
    how many. See qmatmul.warm."""
    ks = kernels(layers, vector)
    for k in ks:
        k.compile(signature())
    return len(ks)


# while warm-up workers compile the fused kernels (a cold cache, engine.warmup.Deferral): which may run
_held = False               # holding: only the kernels in _ready, or compiled here already, run
_ready: set = set()


def hold() -> None:
    """From now on fusable answers None (the separate ops run instead: the same arithmetic, bit for bit)
    for any fused kernel this process has not compiled or loaded yet and `ready` has not named, until
    `unhold`: a cold process leaves their compilation to a worker and goes on meanwhile."""
    global _held
    _ready.clear()
    _held = True


def ready(ks) -> None:
    """These kernels (from `kernels`) may run again: their next call loads each from the disk cache,
    where the worker has put it (or compiles it, where the worker did not)."""
    _ready.update(ks)


def unhold() -> None:
    """Every fused kernel may run again (as before `hold`)."""
    global _held
    _held = False
    _ready.clear()


def held(kernel) -> bool:
    """Whether fusable leaves this kernel out now."""
    if not _held or kernel in _ready:
        return False
    if kernel.signatures:               # compiled or loaded in this process already
        _ready.add(kernel)
        return False
    return True
