"""Matmul of F32, F16 and BF16 weights, rounding as llama.cpp's x86 (AVX-512) CPU backend rounds.

llama.cpp rounds the activation to the weight's vec_dot_type (F32, F16 or BF16) and then, for a
batch of 2+ tokens, runs tinyBLAS: per (row, token) one accumulator of 16 f32 lanes (fma per 16
elements; BF16: vdpbf16ps per 32, each lane adding its odd then its even product), then the lanes
summed pairwise (_mm512_reduce_add_ps). For one token, or where tinyBLAS declines the shape (k not
a multiple of its step, rows not a multiple of 4), it runs ggml_vec_dot_{f32,f16,bf16}: several
accumulators by turns (F32/F16: 4 of 16 lanes, joined lanewise (0+2)+(1+3); BF16: 2 of 32
elements, each summed on its own into float64), then the leftover elements one by one (F32 in
float, F16/BF16 in float64; F32's `sumf += x[i]*y[i]` as gcc compiled it: 8 at a time an in-order sum of rounded
products (its vectorized fold-left reduction), the last (n % 64) % 8 an fma chain). `fmatmul` reproduces
both, op for op; the tests compare it with llama.cpp live (-m oracle) and with the float reference of
kernels.matmul.
"""
from __future__ import annotations

import functools
from enum import IntEnum

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvmir import half_to_float
from .naming import made_for
from .scalars import _bits_to_f32, _fma

_W = 16                      # f32 lanes


class FloatKind(IntEnum):
    """The weight's float type."""

    F32 = 0
    F16 = 1
    BF16 = 2


F32, F16, BF16 = FloatKind


def _lanes_sum(builder, v):
    """<16 x float> summed pairwise as _mm512_reduce_add_ps: halves, then halves again."""
    w = _W
    while w > 1:
        w //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), w), list(range(w))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), w), list(range(w, 2 * w))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))


def _make_fdot(kind, n_acc, joined):
    """An intrinsic (w, wo, a, ao, n) -> float64: the vector part of a row dot, w[wo:] (f32, or f16 /
    bf16 bits as u16) . a[ao:] (f32 values already rounded to the weight's type), over n elements (a
    multiple of the step: 16 x n_acc, BF16 32 x n_acc); accumulator i takes steps i, i + n_acc, ...;
    `joined`: the accumulators added lanewise (a[i] + a[i + n/2] down to one) and summed pairwise,
    else each summed pairwise and the sums added in float64."""
    per = 2 * _W if kind == BF16 else _W          # elements per accumulator step

    @intrinsic
    def _fdot(typingctx, w, wo, a, ao, n):
        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            vf = ir.VectorType(f32, _W)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
            wdata = context.make_array(sig.args[0])(context, builder, args[0]).data
            adata = context.make_array(sig.args[2])(context, builder, args[2]).data
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * _W)) for _ in range(n_acc)]

            def load(data, off, ty, count, align):
                p = builder.gep(data, [off])
                return builder.load(builder.bitcast(p, ir.VectorType(ty, count).as_pointer()), align=align)

            def bits_to_f32(h, count):               # <count x i16> bf16 / f16 bits -> <count x float>
                if kind == F16:
                    return half_to_float(context, builder, h)
                wide = builder.shl(builder.zext(h, ir.VectorType(i32, count)), ir.Constant(ir.VectorType(i32, count),
                                                                                          [16] * count))
                return builder.bitcast(wide, ir.VectorType(f32, count))

            steps = builder.udiv(args[4], ir.Constant(args[4].type, per * n_acc))
            with cgutils.for_range(builder, steps) as loop:
                for k, acc in enumerate(accs):
                    ity = loop.index.type
                    e = builder.mul(builder.add(builder.mul(loop.index, ir.Constant(ity, n_acc)), ir.Constant(ity, k)),
                                    ir.Constant(ity, per))
                    wo_e, ao_e = builder.add(args[1], e), builder.add(args[3], e)
                    if kind == F32:
                        wv = load(wdata, wo_e, f32, _W, 4)
                    else:
                        wv = bits_to_f32(load(wdata, wo_e, ir.IntType(16), per, 2), per)
                    av = load(adata, ao_e, f32, per, 4)
                    if kind == BF16:                 # lane l: elements 2l+1 then 2l (vdpbf16ps)
                        odd = ir.Constant(ir.VectorType(i32, _W), list(range(1, per, 2)))
                        even = ir.Constant(ir.VectorType(i32, _W), list(range(0, per, 2)))
                        s = builder.call(fma, [builder.shuffle_vector(wv, wv, odd), builder.shuffle_vector(av, av, odd),
                                               builder.load(acc)])
                        s = builder.call(fma, [builder.shuffle_vector(wv, wv, even),
                                               builder.shuffle_vector(av, av, even), s])
                    else:
                        s = builder.call(fma, [wv, av, builder.load(acc)])
                    builder.store(s, acc)
            vs = [builder.load(acc) for acc in accs]
            if joined:
                while len(vs) > 1:
                    h = len(vs) // 2
                    vs = [builder.fadd(vs[i], vs[h + i]) for i in range(h)]
                return builder.fpext(_lanes_sum(builder, vs[0]), ir.DoubleType())
            total = ir.Constant(ir.DoubleType(), 0.0)
            for v in vs:
                total = builder.fadd(total, builder.fpext(_lanes_sum(builder, v), ir.DoubleType()))
            return total
        want = types.float32 if kind == F32 else types.uint16
        if not all(isinstance(v, types.Array) and v.ndim == 1 and v.layout == "C" and v.dtype == d
                   for v, d in ((w, want), (a, types.float32))):       # (read-only mmap weights too)
            return None
        return types.float64(w, wo, a, ao, n), codegen
    return _fdot


# (kind, tinyBLAS?) -> the vector part of a dot; steps of 16 (BF16: 32) x accumulators
_f32_tb, _f32_vd = _make_fdot(F32, 1, True), _make_fdot(F32, 4, True)
_f16_tb, _f16_vd = _make_fdot(F16, 1, True), _make_fdot(F16, 4, True)
_bf16_tb, _bf16_vd = _make_fdot(BF16, 1, True), _make_fdot(BF16, 2, False)


@njit(cache=True, inline="always")
def _widen(kind, w16, i, f16):
    # f16 / bf16 weight bits at i as float32
    if kind == F16:
        return f16[w16[i]]
    return _bits_to_f32(np.int64(w16[i]) << 16)


@njit(cache=True, inline="always")
def _row_dot(kind, tb, w32, w16, wo, a, ao, n, f16):
    """One row . one token (weights in w32 for F32, else the bits in w16): the vector part through
    the intrinsic of (kind, tb), then llama.cpp's leftovers (tinyBLAS has none: whole steps only).
    Kernels pass kind and tb as constants: numba keeps that intrinsic alone."""
    if kind == F32:
        s = _f32_tb(w32, wo, a, ao, n) if tb else _f32_vd(w32, wo, a, ao, n)
    elif kind == F16:
        s = _f16_tb(w16, wo, a, ao, n) if tb else _f16_vd(w16, wo, a, ao, n)
    elif kind == BF16:
        s = _bf16_tb(w16, wo, a, ao, n) if tb else _bf16_vd(w16, wo, a, ao, n)
    else:
        raise ValueError("no float matmul for this weight kind")
    if tb:
        return np.float32(s)
    step = 64
    if kind == F32:                                  # gcc's leftovers: see the module docstring
        r = np.float32(s)
        cut = n - n % 8
        for i in range(n - n % step, cut):
            r = r + w32[wo + i] * a[ao + i]
        for i in range(max(cut, n - n % step), n):
            r = _fma(w32[wo + i], a[ao + i], r)
        return r
    for i in range(n - n % step, n):                 # float64 sum of float products
        s += np.float64(_widen(kind, w16, wo + i, f16) * a[ao + i])
    return np.float32(s)


@functools.cache
def _kernel(kind: FloatKind, tb: bool):
    """The matmul kernel of one weight kind in tinyBLAS's (tb) or ggml_vec_dot's arithmetic."""
    k, t = int(kind), bool(tb)

    @njit(parallel=True, cache=True)
    def _fmatmul(y, w32, w16, a, n_out, n_in, f16, n_chunks):
        # y f32[n_tok, n_out] = a f32[n_tok, n_in] (rounded to the weight type) . W^T, W: n_out rows of
        # n_in in w32 (F32) or as bits in w16 (F16, BF16; the other array empty)
        n_tok = y.shape[0]
        af = a.reshape(-1)
        for c in prange(n_chunks):
            for r in range(c * n_out // n_chunks, (c + 1) * n_out // n_chunks):
                for tok in range(n_tok):
                    y[tok, r] = _row_dot(k, t, w32, w16, r * n_in, af, tok * n_in, n_in, f16)
    return made_for(_fmatmul, kind, "tinyblas" if tb else "vec_dot")


def fmatmul(y: np.ndarray, x: np.ndarray, kind: int, raw: np.ndarray, n_out: int, n_in: int, n_batch: int,
            f16_table: np.ndarray) -> np.ndarray:
    """y f32[n_tok, n_out] = x f32[n_tok, n_in] (already rounded to the weight type) . W^T for raw (u8)
    holding n_out rows of F32/F16/BF16 weights (`kind`); n_batch: the batch llama.cpp would see
    (1: ggml_vec_dot; 2+: tinyBLAS where the shape allows). Shapes are the caller's to check."""
    step = 32 if kind == BF16 else 16
    tb = n_batch >= 2 and n_in % step == 0 and n_out % 4 == 0
    w = raw.reshape(-1)
    w32 = w.view(np.float32) if kind == F32 else np.empty(0, np.float32)
    w16 = w.view(np.uint16) if kind != F32 else np.empty(0, np.uint16)
    out = y if y.flags.c_contiguous and y.flags.writeable else np.empty_like(y)
    n_chunks = max(1, min(n_out, 8 * numba.get_num_threads()))
    _kernel(FloatKind(kind), tb)(out, w32, w16, np.ascontiguousarray(x, dtype=np.float32), n_out, n_in, f16_table,
                                 n_chunks)
    if out is not y:
        y[...] = out
    return y
