"""Scalars at the bit level, for every kernel: little-endian integers and floats read from packed
bytes, f32 <-> f16 in both directions, bit casts and a single-rounding fma.

One copy of each: the f16 widening is llvmir.half_to_float (also the vector one of fmatmul and
ops), the f16 rounding is `_f32_to_half_bits` (quantize, ops); `half_bits` / `half_round` round whole
arrays (the KV cache's F16 rows, attention's q) with F16C where the target has it.
"""
from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .llvmir import F32, I16, I32, I64, dtypes_are, fma_fn, half_to_float, ptr, target_native_half

F16_TO_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)   # f32[65536]


@intrinsic
def _bits_to_f32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32 (no value conversion)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, I32)
        elif v.type.width < 32:
            v = builder.zext(v, I32)
        return builder.bitcast(v, F32)

    return types.float32(bits), codegen


@intrinsic
def _f32_as_bits(typingctx, f):
    """Reinterpret a float32 as its uint32 bits."""
    if not isinstance(f, types.Float) or f.bitwidth != 32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], I32)

    return types.uint32(f), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c in float32 with one rounding (llvm.fma: the instruction, or libm's fmaf)."""
    def codegen(context, builder, sig, args):
        return builder.call(fma_fn(builder, F32), list(args))
    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(cache=True, inline="always")
def _u16(raw, o):
    """Little-endian uint16 at byte o, as int64."""
    return np.int64(raw[o]) | (np.int64(raw[o + 1]) << 8)


@njit(cache=True, inline="always")
def _u32(raw, o):
    """Little-endian uint32 at byte o, as int64."""
    return _u16(raw, o) | (_u16(raw, o + 2) << 16)


@intrinsic
def _half_bits_to_f32(typingctx, h):
    """IEEE binary16 bits (the low 16 bits of an integer) -> float32, exact; NaN payload kept like numpy."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        v = builder.trunc(v, I16) if v.type.width > 16 else builder.zext(v, I16) if v.type.width < 16 else v
        return half_to_float(context, builder, v, native=False)

    return types.float32(h), codegen


def _make_f16(native):
    @intrinsic
    def _f16(typingctx, raw, o):
        """The IEEE binary16 at byte o of a uint8 array, widened exactly to float32."""
        def codegen(context, builder, sig, args):
            p = ptr(context, builder, sig.args[0], args[0], args[1], I16)
            return half_to_float(context, builder, builder.load(p, align=1), native)
        if not dtypes_are((raw,), (types.uint8,)):
            return None
        return types.float32(raw, o), codegen
    return _f16


# _f16_at: F16C / AArch64 where the target has it (it quiets signalling NaNs), for the integer dots;
# _f16_at_int: integer ops, NaN payloads kept as numpy keeps them, for dequantization (gguf-py's bits)
_f16_at, _f16_at_int = _make_f16(None), _make_f16(False)


@intrinsic
def _f32_at(typingctx, raw, o):
    """The float32 at byte o of a uint8 array."""
    def codegen(context, builder, sig, args):
        return builder.load(ptr(context, builder, sig.args[0], args[0], args[1], F32), align=1)
    if not dtypes_are((raw,), (types.uint8,)):
        return None
    return types.float32(raw, o), codegen


@njit(cache=True)
def _f32_to_half_bits(f):
    # float32 -> IEEE binary16 bits, round to nearest even, as numpy and F16C do
    b = np.int64(_f32_as_bits(np.float32(f)))
    sign = (b >> 16) & 0x8000
    e = (b >> 23) & 0xFF
    m = b & 0x7FFFFF
    if e == 0xFF:
        return sign | 0x7C00 | (0x200 if m else 0)
    ee = e - 112                             # rebias 127 -> 15
    if ee >= 31:
        return sign | 0x7C00
    if ee <= 0:                              # subnormal f16
        if ee < -10:
            return sign
        m |= 0x800000
        shift = 14 - ee
        h = m >> shift
        rem, mid = m & ((1 << shift) - 1), 1 << (shift - 1)
        if rem > mid or (rem == mid and (h & 1)):
            h += 1
        return sign | h
    h = sign | (ee << 10) | (m >> 13)
    rem = m & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (h & 1)):
        h += 1                               # may carry into the exponent: still correct
    return h


@intrinsic
def _store_u64(typingctx, dst, o, v):
    """dst[o:o+8] = the 8 little-endian bytes of the u64 v (dst: an int8 array, unaligned)."""
    def codegen(context, builder, sig, args):
        builder.store(args[2], ptr(context, builder, sig.args[0], args[0], args[1], I64), align=1)
        return context.get_dummy_value()
    if not dtypes_are((dst,), (types.int8,)) or v != types.uint64:
        return None
    return types.void(dst, o, v), codegen


# ---------------------------------------------------------------- whole arrays to f16

_HW = 16                     # lanes a call of _half16 rounds


@intrinsic
def _half16(typingctx, src, so, dst, do):
    """src[so:so+16] (f32) rounded to f16, to nearest even (`fptrunc`: F16C's vcvtps2ph), into dst[do:do+16]:
    as its bits (u16 dst) or widened back (f32 dst). Only where the target has native half (llvmir.native_half):
    elsewhere LLVM would call a runtime function numba does not link; `half_bits` / `half_round` check first."""
    def codegen(context, builder, sig, args):
        f = builder.load(ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(F32, _HW)), align=4)
        h = builder.fptrunc(f, ir.VectorType(ir.HalfType(), _HW))
        if sig.args[2].dtype == types.float32:
            v, vt, align = builder.fpext(h, ir.VectorType(F32, _HW)), ir.VectorType(F32, _HW), 4
        else:
            v, vt, align = builder.bitcast(h, ir.VectorType(I16, _HW)), ir.VectorType(I16, _HW), 2
        builder.store(v, ptr(context, builder, sig.args[2], args[2], args[3], vt), align=align)
        return context.get_dummy_value()
    if not (src == types.float32[::1] and dst in (types.uint16[::1], types.float32[::1])):
        return None
    return types.void(src, so, dst, do), codegen


@njit(cache=True)
def _to_half(x, out):
    # out[n] = x f32[n] rounded to f16 (out u16: the bits; f32: the values), 16 at a time, the tail padded
    n = x.size
    m = n - n % _HW
    for i in range(0, m, _HW):
        _half16(x, i, out, i)
    if m < n:
        tx, th = np.zeros(_HW, np.float32), np.empty(_HW, out.dtype)
        tx[:n - m] = x[m:]
        _half16(tx, 0, th, 0)
        out[m:] = th[:n - m]


def half_bits(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out (u16, x's shape, C-contiguous) = the f16 bits of x (f32), as x.astype(np.float16) rounds: to
    nearest even, subnormals and overflow to inf included (NaN stays NaN, its payload as F16C leaves it)."""
    if (x.dtype == np.float32 and out.dtype == np.uint16 and out.shape == x.shape and out.flags.c_contiguous
            and out.flags.writeable and _native()):
        _to_half(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
    else:
        out[...] = np.asarray(x, np.float32).astype(np.float16).view(np.uint16)
    return out


def half_round(x: np.ndarray) -> np.ndarray:
    """x (f32) rounded to f16 and back, a new f32 array: x.astype(np.float16).astype(np.float32)."""
    if x.dtype == np.float32 and _native():
        out = np.empty(x.shape, np.float32)
        _to_half(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
        return out
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


_native = functools.cache(target_native_half)      # (asked once)
