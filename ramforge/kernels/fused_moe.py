"""One token's mixture of experts as two compiled calls: every picked expert's gate and up (with SwiGLU),
then every picked expert's down with the slot-ordered weighted sum.

A decode token routed to k experts (Qwen3-30B-A3B: 8 of 128) runs 3k small gemvs of a few hundred KiB
each. Run one by one (kernels.moe.expert_matmul), each cost a Python dispatch, a serial quantization of
its input and a parallel region whose end both threads wait at: 48 regions a layer. Here

  up:    one parallel region; each thread quantizes x itself (as kernels.fused does) and dots its share of
         the k experts' gate and up rows (split by bytes over all of them, at the same rows of gate and
         up), then SwiGLU on those rows: ge[j] = silu(gate_j . x) * (up_j . x)
  down:  one parallel region; each thread quantizes the k rows of ge itself and takes the same output
         rows of every expert (ex[j, a:b] = down_j . ge[j]), then out[a:b] = ex[0]*w0 + ex[1]*w1 + ...

Every row is computed by the one-token packed-row code of qmatmul (_make_packed_one) from the activation
quantize_activation gives, so bit for bit what expert_matmul computes for one row (mul_mat_id's vec_dot or
repacked gemv arithmetic), and the sum is kernels.moe.weighted_sum's, slot by slot, each product rounded.

The weights are addressed by byte offsets into one array per tensor (offs[j]: where slot j's expert's
rows start): the 3-D expert tensor of a resident layer (offset = expert id x an expert's bytes), or an
expert cache's pool of slots.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from ..errors import InternalError
from ..gguf.constants import GGMLType
from .fused import Slot, _cut, slot, slot_rows
from .glu import _swiglu_span
from .naming import made_for
from .qmatmul import VECTOR, _quantized
from .quantize import ACT_CODE, _token_activation
from .registry import ActType, kernels_for
from .variants import TILED_FROM

_UNIT = 16              # rows cut in whole 16s: _make_packed_one's 8-row groups, SwiGLU's 16-lane exp


def _make_up(sg: Slot, su: Slot):
    """The gate/up kernel for weights of slots sg, su (fused.Slot)."""
    rows_g, rows_u = slot_rows(sg), slot_rows(su)
    cg, sbg, cu, sbu = sg.act_code, sg.sub, su.act_code, su.sub
    own_u = (cu, sbu) != (cg, sbg)

    @njit(parallel=True, cache=True)
    def _up(x, graw, uraw, offs_g, offs_u, ge, ue, rbg, rbu, n_threads):
        # x f32[1, n_in]; ge, ue f32[k, n_ff]; graw, uraw u8: slot j's expert's n_ff rows of rbg (rbu)
        # bytes start at offs_g[j] (offs_u[j]). ge[j] = silu(gate_j . x) * (up_j . x); ue: scratch
        k, n_ff = ge.shape
        n_in = x.shape[1]
        per = n_ff * (rbg + rbu)                                 # one expert's bytes, gate and up
        n16 = n_ff - n_ff % 16
        for c in prange(n_threads):
            lo, hi = k * per * c // n_threads, k * per * (c + 1) // n_threads
            qg, dg, mg, bg = _token_activation(cg, sbg, x)
            qu, du, mu, bu = _token_activation(cu, sbu, x) if own_u else (qg, dg, mg, bg)
            for j in range(k):
                a = _cut(lo, j * per, rbg + rbu, n_ff, _UNIT)
                b = _cut(hi, j * per, rbg + rbu, n_ff, _UNIT)
                if a >= b:
                    continue
                og, ou = offs_g[j], offs_u[j]
                rows_g(ge[j:j + 1], qg, dg, mg, bg, graw[og:og + n_ff * rbg], a, b, n_in, rbg)
                rows_u(ue[j:j + 1], qu, du, mu, bu, uraw[ou:ou + n_ff * rbu], a, b, n_in, rbu)
                _swiglu_span(ge[j], ge[j], ue[j], 0, a, b, n16)
    return made_for(_up, *("_".join(str(getattr(p, "name", p)) for p in s) for s in (sg, su)))


def _make_down(sd: Slot):
    """The down-and-sum kernel for a weight of slot sd."""
    rows_d = slot_rows(sd)
    cd, sbd = sd.act_code, sd.sub

    @njit(parallel=True, cache=True)
    def _down(ge, draw, offs_d, wts, ex, out, rbd, n_threads):
        # ge f32[k, n_ff]; draw u8: slot j's expert's n_embd rows of rbd bytes start at offs_d[j];
        # ex f32[k, n_embd] = down_j . ge[j]; out f32[1, n_embd] = ex[0]*wts[0] + ex[1]*wts[1] + ...
        k, n_ff = ge.shape
        n_embd = ex.shape[1]
        for c in prange(n_threads):
            a = _cut(n_embd * rbd * c // n_threads, 0, rbd, n_embd, _UNIT)
            b = _cut(n_embd * rbd * (c + 1) // n_threads, 0, rbd, n_embd, _UNIT)
            if a >= b:
                continue
            for j in range(k):
                q, d, m, bs = _token_activation(cd, sbd, ge[j:j + 1])
                od = offs_d[j]
                rows_d(ex[j:j + 1], q, d, m, bs, draw[od:od + n_embd * rbd], a, b, n_ff, rbd)
            for i in range(a, b):                                # ggml_mul, then one ggml_add per slot
                out[0, i] = ex[0, i] * wts[0]
            for j in range(1, k):
                w = wts[j]
                for i in range(a, b):
                    p = ex[j, i] * w
                    out[0, i] = out[0, i] + p
    return made_for(_down, "_".join(str(getattr(p, "name", p)) for p in sd))


@njit(cache=True, inline="always")
def _gathered(aq, ad, am, bs, n_tok, toks):
    # the quantized activations (aq i8, ad, am f32, bs i32: n_tok tokens' blocks one after another) of the
    # tokens toks i64[c], as new arrays of c tokens one after another (am is ad where it is ad)
    c = toks.shape[0]
    sq, sd, sm, sb = aq.shape[0] // n_tok, ad.shape[0] // n_tok, am.shape[0] // n_tok, bs.shape[0] // n_tok
    q = np.empty(c * sq, dtype=np.int8)
    d = np.empty(c * sd, dtype=np.float32)
    m = np.empty(c * sm, dtype=np.float32)
    b = np.empty(c * sb, dtype=np.int32)
    for i in range(c):
        t = toks[i]
        q[i * sq:(i + 1) * sq] = aq[t * sq:(t + 1) * sq]
        d[i * sd:(i + 1) * sd] = ad[t * sd:(t + 1) * sd]
        m[i * sm:(i + 1) * sm] = am[t * sm:(t + 1) * sm]
        b[i * sb:(i + 1) * sb] = bs[t * sb:(t + 1) * sb]
    return q, d, m, b


def _make_up_n(sg: Slot, su: Slot):
    """The gate/up kernel of a batch: every picked expert's rows for the tokens routed to it, each token in
    the one-token arithmetic (mul_mat_id's per-row gemv or vec_dot: see ExpertKernels.batchable)."""
    rows_g, rows_u = slot_rows(sg), slot_rows(su)

    @njit(parallel=True, cache=True)
    def _up_n(aq, ad, am, bs, n_tok, graw, uraw, offs_g, offs_u, start, toks, ge, ue, rbg, rbu, n_threads):
        # aq, ad, am, bs: the n_tok tokens' activation quantized for gate and up (quantize_activation's flat
        # arrays). Expert i's pairs are p = start[i]..start[i+1], of tokens toks[p]; its rows start at offs_g[i]
        # (offs_u[i]). ge[p] = silu(gate_i . x[toks[p]]) * (up_i . x[toks[p]]); ue: scratch. Each thread takes
        # the same rows of every expert
        n_ff, n_in = ge.shape[1], aq.shape[0] // n_tok
        n16 = n_ff - n_ff % 16
        for c in prange(n_threads):
            a = _cut(n_ff * c // n_threads, 0, 1, n_ff, _UNIT)
            b = _cut(n_ff * (c + 1) // n_threads, 0, 1, n_ff, _UNIT)
            for i in range(start.shape[0] - 1):
                p0, p1 = start[i], start[i + 1]
                if a >= b or p0 == p1:
                    continue
                qx, dx, mx, bx = _gathered(aq, ad, am, bs, n_tok, toks[p0:p1])
                og, ou = offs_g[i], offs_u[i]
                rows_g(ge[p0:p1], qx, dx, mx, bx, graw[og:og + n_ff * rbg], a, b, n_in, rbg)
                rows_u(ue[p0:p1], qx, dx, mx, bx, uraw[ou:ou + n_ff * rbu], a, b, n_in, rbu)
                for p in range(p0, p1):
                    _swiglu_span(ge[p], ge[p], ue[p], 0, a, b, n16)
    return made_for(_up_n, *("_".join(str(getattr(p, "name", p)) for p in s) for s in (sg, su)))


def _make_down_n(sd: Slot):
    """The down kernel of a batch: every picked expert's rows for its pairs' SwiGLU outputs, into their
    (token, slot) places."""
    rows_d = slot_rows(sd)

    @njit(parallel=True, cache=True)
    def _down_n(aq, ad, am, bs, n_pairs, draw, offs_d, lo, hi, dest, ex, rbd, n_threads):
        # aq, ad, am, bs: n_pairs ge rows quantized for down (pair p's blocks after pair p-1's); expert i's
        # pairs are p = lo[i]..hi[i], its rows at offs_d[i]; ex f32[n_tok * k, n_embd]: ex[dest[p]] = down_i . ge[p]
        n_embd = ex.shape[1]
        n_ff = aq.shape[0] // n_pairs
        sd_, sm_, sb_ = ad.shape[0] // n_pairs, am.shape[0] // n_pairs, bs.shape[0] // n_pairs
        for c in prange(n_threads):
            a = _cut(n_embd * c // n_threads, 0, 1, n_embd, _UNIT)
            b = _cut(n_embd * (c + 1) // n_threads, 0, 1, n_embd, _UNIT)
            for i in range(lo.shape[0]):
                p0, p1 = lo[i], hi[i]
                if a >= b or p0 == p1:
                    continue
                y = np.empty((p1 - p0, n_embd), dtype=np.float32)
                od = offs_d[i]
                rows_d(y, aq[p0 * n_ff:p1 * n_ff], ad[p0 * sd_:p1 * sd_], am[p0 * sm_:p1 * sm_],
                       bs[p0 * sb_:p1 * sb_], draw[od:od + n_embd * rbd], a, b, n_ff, rbd)
                for p in range(p0, p1):
                    ex[dest[p], a:b] = y[p - p0, a:b]
    return made_for(_down_n, "_".join(str(getattr(p, "name", p)) for p in sd))


@functools.lru_cache(maxsize=1024)
def _kernel(make, *slots: tuple):
    """make(*slots) once per process: one of the four kernel factories above, for weights of these slots."""
    return make(*slots)


def _rows_limit(ggml_type, n_out: int) -> int:
    """The most rows of one expert that mul_mat_id computes each in the one-token arithmetic: every count
    for a type llama.cpp repacks (one gemv per row) or without a tiled matmul, else below TILED_FROM."""
    qd = kernels_for(ggml_type).qdot
    repacked = qd.repack is not None and n_out % 8 == 0
    return TILED_FROM - 1 if qd.tiled and not repacked else 1 << 62


class ExpertKernels(NamedTuple):
    """The two kernels of one layer shape, and the byte sizes they address experts by."""

    up: object                 # _up kernel (gate and up of every slot, SwiGLU)
    down: object               # _down kernel (down of every slot, the weighted sum)
    row_gate: int              # bytes of one row of gate, up, down
    row_up: int
    row_down: int
    n_embd: int
    n_ff: int
    types: str                 # "gate+up+down" type names, for --profile
    up_n: object               # the batch kernels (_up_n, _down_n) ...
    down_n: object
    up_rows: int               # ... for experts of at most this many rows in gate and up (see _rows_limit)
    down_rows: int             # ... and in down
    up_act: tuple              # (ActType, sub) of gate and up's activation, or None where they differ
    down_act: tuple            # (ActType, sub) of down's

    @property
    def expert_bytes(self) -> tuple[int, int, int]:
        """One expert's bytes in gate, up, down."""
        return self.n_ff * self.row_gate, self.n_ff * self.row_up, self.n_embd * self.row_down


@functools.lru_cache(maxsize=1024)
def plan(gate_type, up_type, down_type, n_embd: int, n_ff: int, reps: tuple = (0, 0, 0),
         vec: bool | None = None) -> ExpertKernels | None:
    """The kernels for experts of these types and shape (gate, up: n_ff rows of n_embd; down: n_embd rows
    of n_ff; reps: each weight's repacked group, 0 in file order), or None where one weight does not take
    the packed one-token path (the caller then runs expert by expert)."""
    vec = VECTOR if vec is None else bool(vec)
    if not vec or n_ff % _UNIT or n_embd % _UNIT or any(_UNIT % r for r in reps if r):
        return None
    g, u, d = slot(gate_type, n_ff, n_embd, reps[0], vec), slot(up_type, n_ff, n_embd, reps[1], vec), \
        slot(down_type, n_embd, n_ff, reps[2], vec)
    if None in (g, u, d):
        return None
    act = {code: a for a, code in ACT_CODE.items()}
    (g, rb_g), (u, rb_u), (d, rb_d) = g, u, d          # (fused.Slot, row bytes) of each
    same = (g.act_code, g.sub) == (u.act_code, u.sub)
    return ExpertKernels(_kernel(_make_up, g, u), _kernel(_make_down, d), rb_g, rb_u, rb_d, n_embd, n_ff,
                         "+".join(GGMLType(t).name for t in (gate_type, up_type, down_type)),
                         _kernel(_make_up_n, g, u), _kernel(_make_down_n, d),
                         min(_rows_limit(gate_type, n_ff), _rows_limit(up_type, n_ff)) if same else 0,
                         _rows_limit(down_type, n_embd), (act[g.act_code], g.sub) if same else None,
                         (act[d.act_code], d.sub))


@njit(cache=True)
def _within(offs, nbytes, size):
    """Whether every expert offs i64[k] + nbytes lies within size bytes (one call: NumPy's min and max on a
    few offsets cost more than the check)."""
    for o in offs:
        if o < 0 or o + nbytes > size:
            return False
    return True


def _check(name: str, raw: np.ndarray, offs: np.ndarray, nbytes: int) -> None:
    if raw.dtype != np.uint8 or raw.ndim != 1 or not raw.flags.c_contiguous:
        raise InternalError(f"experts: {name} must be contiguous u8, got {raw.dtype}{raw.shape}")
    if offs.dtype != np.int64 or offs.ndim != 1 or not _within(offs, nbytes, raw.size):
        raise InternalError(f"experts: {name} offsets {offs} past its {raw.size:,} B (an expert is {nbytes:,} B)")


def run(kern: ExpertKernels, x: np.ndarray, raws: tuple, offs: tuple, wts: np.ndarray, ge: np.ndarray,
        ue: np.ndarray, ex: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out f32[1, n_embd] = sum over slots j of wts[j] * down_j(silu(gate_j(x)) * up_j(x)), x f32[1, n_embd].
    raws: (gate, up, down) u8 arrays; offs: (gate, up, down) i64[k], where slot j's expert starts in each;
    wts f32[k]; scratch ge, ue f32[k, n_ff], ex f32[k, n_embd]."""
    k = wts.shape[0]
    if (x.shape != (1, kern.n_embd) or out.shape != (1, kern.n_embd) or ge.shape != (k, kern.n_ff)
            or ue.shape != ge.shape or ex.shape != (k, kern.n_embd)):
        raise InternalError(f"experts: x {x.shape}, out {out.shape}, scratch {ge.shape} {ue.shape} {ex.shape} "
                            f"for {k} experts of {kern.n_embd} x {kern.n_ff}")
    for name, raw, o, nb in zip(("gate", "up", "down"), raws, offs, kern.expert_bytes):
        _check(name, raw, o, nb)
    n = numba.get_num_threads()
    kern.up(x, raws[0], raws[1], offs[0], offs[1], ge, ue, kern.row_gate, kern.row_up, n)
    kern.down(ge, raws[2], offs[2], wts, ex, out, kern.row_down, n)
    return out


def _activation(x: np.ndarray, act: tuple) -> tuple:
    """x quantized for weights of act (ActType, sub), as qmatmul hands it to its kernels (flat arrays)."""
    return _quantized(x, act[0], act[1], 0, act[0] is ActType.Q8_1)


def run_batch(kern: ExpertKernels, x: np.ndarray, raws: tuple, offs: tuple, start: np.ndarray, toks: np.ndarray,
              dest: np.ndarray, ge: np.ndarray, ue: np.ndarray, ex: np.ndarray, down_alone=None) -> None:
    """For n tokens x f32[n, n_embd] and their (token, slot) pairs grouped by expert: expert i's pairs
    p = start[i]..start[i+1] (no more than kern.up_rows: the caller runs larger experts alone), of tokens
    toks[p]; ex f32[n * k, n_embd][dest[p]] = down_i(silu(gate_i(x_t)) * up_i(x_t)). raws: (gate, up, down)
    u8; offs: (gate, up, down) i64[experts], where expert i's rows start; scratch ge, ue f32[>= pairs, n_ff].
    An expert of more than kern.down_rows rows takes down's other arithmetic: down_alone(i, g) returns
    f32[c, n_embd] for its SwiGLU rows g f32[c, n_ff] (the tiled matmul), written to its places."""
    n, n_pairs = x.shape[0], toks.shape[0]
    if (x.shape[1] != kern.n_embd or ex.shape[1] != kern.n_embd or ge.shape[0] < n_pairs or ue.shape != ge.shape
            or ge.shape[1] != kern.n_ff or start.size != offs[0].size + 1 or start[-1] != n_pairs or n_pairs == 0
            or dest.shape != toks.shape or dest.max() >= ex.shape[0] or toks.max() >= n):
        raise InternalError(f"experts: x {x.shape}, {n_pairs} pairs, scratch {ge.shape} {ex.shape}")
    counts = np.diff(start)
    if kern.up_act is None or counts.max() > kern.up_rows:
        raise InternalError(f"experts: {counts.max()} rows of one expert are past the batch kernels' {kern.up_rows}")
    for name, raw, o, nb in zip(("gate", "up", "down"), raws, offs, kern.expert_bytes):
        _check(name, raw, o, nb)
    nt = numba.get_num_threads()
    g, u = ge[:n_pairs], ue[:n_pairs]
    kern.up_n(*_activation(x, kern.up_act), n, raws[0], raws[1], offs[0], offs[1], start, toks,
              g, u, kern.row_gate, kern.row_up, nt)
    small = counts <= kern.down_rows
    if small.any():
        kern.down_n(*_activation(g, kern.down_act), n_pairs, raws[2], offs[2][small],
                    start[:-1][small], start[1:][small], dest, ex, kern.row_down, nt)
    for i in np.flatnonzero(~small):
        if down_alone is None:
            raise InternalError(f"experts: expert slot {i} has {counts[i]} rows, past down's {kern.down_rows}")
        p0, p1 = start[i], start[i + 1]
        ex[dest[p0:p1]] = down_alone(int(i), g[p0:p1])


def signatures() -> tuple[tuple, tuple]:
    """The argument types run calls the up and down kernels with."""
    f2, f1 = numba.typeof(np.empty((1, 1), np.float32)), numba.typeof(np.empty(1, np.float32))
    u8, i8 = numba.typeof(np.empty(1, np.uint8)), numba.typeof(np.empty(1, np.int64))
    i = numba.int64
    return (f2, u8, u8, i8, i8, f2, f2, i, i, i), (f2, u8, i8, f1, f2, f2, i, i)


def warm(shapes) -> int:
    """Compile, or load from the disk cache, the kernels for shapes (gate type, up type, down type,
    n_embd, n_ff); returns how many."""
    up_sig, down_sig = signatures()
    made = 0
    for shape in set(shapes):
        kern = plan(*shape)
        if kern is not None:
            kern.up.compile(up_sig)
            kern.down.compile(down_sig)
            made += 2
    return made
