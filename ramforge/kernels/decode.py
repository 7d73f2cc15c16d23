"""Bit-exact dequantization kernels: ggml blocks to float32, one per executable type.

Each has the form `_dequant_<type>(out, raw, first_block, n_blocks)`:
  out          float32[n_blocks * block_elems], C-contiguous, written in full
  raw          uint8[total_blocks * block_bytes], the packed tensor (or any whole-block prefix of it)
  first_block  index of the first block of `raw` to decode
  n_blocks     number of blocks to decode
Kernels do no bounds checks; dequant.dequantize validates and then calls one (the registry's).

Bit-exact against gguf-py's `gguf.quants.dequantize` (float32 numpy): each product or sum below is
one float32 op in the same order as there (e.g. Q4_K: (d*sc)*q - (dmin*m), never fused).
fastmath stays off: contraction of a*b+c into an FMA would change the rounding. The blocks are read
through blocks.py (layouts, scale decoders, quant bit fields), as the integer dots read them.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ramforge.gguf.constants import GGML_BLOCK, QK_K

from .blocks import (B_IQ4_XS, BF16, CHUNKS, F16, F32, IQ1_M, IQ1_S, IQ4_KV_F32, IQ4_NL, IQ4_XS, LAYOUTS, MXFP4, Q2_K,
                     Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Q8_K, TQ1_0, TQ2_0, _chunk_quant, _high_bit,
                     _iq4_xs_scale, _nibble, _row_scales)
from .iquants import (IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, _dequant_iq2_s, _dequant_iq2_xs, _dequant_iq2_xxs,
                      _dequant_iq3_s, _dequant_iq3_xxs)
from .lowbit import _dequant_iq1_m, _dequant_iq1_s, _dequant_mxfp4, _dequant_tq1_0
from .naming import made_for
from .scalars import _bits_to_f32, _f16_at_int, _f32_at, _u16, _u32

_f16 = _f16_at_int      # f16 -> f32 with NaN payloads kept, as numpy (gguf-py's oracle) widens


@njit(cache=True)
def _dequant_f32(out, raw, first_block, n_blocks):
    for i in range(n_blocks):
        out[i] = _f32_at(raw, 4 * (first_block + i))


@njit(cache=True)
def _dequant_f16(out, raw, first_block, n_blocks):
    for i in range(n_blocks):
        out[i] = _f16(raw, 2 * (first_block + i))


@njit(cache=True)
def _dequant_bf16(out, raw, first_block, n_blocks):
    for i in range(n_blocks):
        out[i] = _bits_to_f32(_u16(raw, 2 * (first_block + i)) << 16)


def _dequant_32(t):
    """The kernel of a 32-element type: f16 d [| f16 m] [| u32 qh] | u8 qs[16]; q = nibble [| high
    bit << 4]; w = d * (q + bias) (Q4_0, Q5_0), d*q + m (Q4_1, Q5_1), d * kv[q] (IQ4_NL)."""
    L, kv, has_m, has_qh = LAYOUTS[t], t == IQ4_NL, LAYOUTS[t].m >= 0, LAYOUTS[t].qh >= 0

    @njit(cache=True)
    def dequant(out, raw, first_block, n_blocks):
        for b in range(n_blocks):
            p = (first_block + b) * L.nbytes
            d = _f16(raw, p + L.d)
            m = _f16(raw, p + L.m) if has_m else np.float32(0.0)
            qh = _u32(raw, p + L.qh) if has_qh else np.int64(0)
            for j in range(32):
                q = _nibble(raw, p + L.qs, j) | _high_bit(qh, j)
                if kv:
                    out[b * 32 + j] = d * IQ4_KV_F32[q]
                elif has_m:
                    out[b * 32 + j] = d * np.float32(q) + m
                else:
                    out[b * 32 + j] = d * np.float32(q + L.bias)
    return made_for(dequant, t)


def _dequant_int8(t):
    """The kernel of Q8_0 (f16 d | i8 qs[32]) and Q8_K (f32 d | i8 qs[256] | i16 bsums[16]): y = q * d."""
    L, n, f32_d = LAYOUTS[t], GGML_BLOCK[t][0], t == Q8_K

    @njit(cache=True)
    def dequant(out, raw, first_block, n_blocks):
        qs = raw.view(np.int8)
        for b in range(n_blocks):
            p = (first_block + b) * L.nbytes
            d = _f32_at(raw, p + L.d) if f32_d else _f16(raw, p + L.d)
            for j in range(n):
                out[b * n + j] = np.float32(qs[p + L.qs + j]) * d
    return made_for(dequant, t)


def _dequant_k(t):
    """The kernel of a bit-packed K-quant: per sub-block of L.sub quants, sc and m its integer scale
    and min (blocks._row_scales), q its chunk bit fields (+ bias): y = (d*sc)*q - (dmin*m) (Q2_K,
    Q4_K, Q5_K), (d*sc)*q (Q3_K, Q6_K; TQ2_0: sc = 1)."""
    L, chunks, tid, has_m = LAYOUTS[t], CHUNKS[t], int(t), LAYOUTS[t].m >= 0

    @njit(cache=True)
    def dequant(out, raw, first_block, n_blocks):
        isc = np.empty(QK_K // L.sub, dtype=np.int32)           # one super-block's sub-block scales
        imn = np.zeros(QK_K // L.sub, dtype=np.int32)
        wd = np.empty(1, dtype=np.float32)                      # (unused: d is read exactly below)
        for b in range(n_blocks):
            p = (first_block + b) * L.nbytes
            _row_scales(tid, raw, p, 0, isc, imn, wd, wd)
            d = _f16(raw, p + L.d)
            dmin = _f16(raw, p + L.m) if has_m else np.float32(0.0)
            for c in range(QK_K // 32):
                f = chunks[c]
                for h in range(32 // L.sub):
                    g = c * 32 // L.sub + h
                    dl = d * np.float32(isc[g])
                    ml = dmin * np.float32(imn[g])
                    for l in range(h * L.sub, (h + 1) * L.sub):
                        q = np.float32(_chunk_quant(f, raw, p, l) + L.bias)
                        if has_m:
                            out[b * QK_K + c * 32 + l] = dl * q - ml
                        else:
                            out[b * QK_K + c * 32 + l] = dl * q
    return made_for(dequant, t)


@njit(cache=True)
def _dequant_iq4_xs(out, raw, first_block, n_blocks):
    # f16 d | scales | u8 qs[128]; sub-block s: nibbles qs[16s:16s+16], y = (d * (ls - 32)) * kv[q]
    for b in range(n_blocks):
        p = (first_block + b) * B_IQ4_XS.nbytes
        d = _f16(raw, p + B_IQ4_XS.d)
        for s in range(QK_K // 32):
            dl = d * np.float32(_iq4_xs_scale(raw, p, s))
            for j in range(32):
                out[b * QK_K + s * 32 + j] = dl * IQ4_KV_F32[_nibble(raw, p + B_IQ4_XS.qs + s * 16, j)]


_dequant_q4_0, _dequant_q4_1, _dequant_q5_0 = _dequant_32(Q4_0), _dequant_32(Q4_1), _dequant_32(Q5_0)
_dequant_q5_1, _dequant_iq4_nl = _dequant_32(Q5_1), _dequant_32(IQ4_NL)
_dequant_q8_0, _dequant_q8_k = _dequant_int8(Q8_0), _dequant_int8(Q8_K)
_dequant_q2_k, _dequant_q3_k, _dequant_q4_k = _dequant_k(Q2_K), _dequant_k(Q3_K), _dequant_k(Q4_K)
_dequant_q5_k, _dequant_q6_k = _dequant_k(Q5_K), _dequant_k(Q6_K)
_dequant_tq2_0 = _dequant_k(TQ2_0)


@njit(cache=True, inline="always")
def _dequant_any(t, out, raw, first_block, n_blocks):
    """The dequantization kernel of ggml type t, for kernels that pass t as a constant (numba keeps
    that branch alone); Python uses the registry."""
    if t == F32:
        _dequant_f32(out, raw, first_block, n_blocks)
    elif t == F16:
        _dequant_f16(out, raw, first_block, n_blocks)
    elif t == BF16:
        _dequant_bf16(out, raw, first_block, n_blocks)
    elif t == Q4_0:
        _dequant_q4_0(out, raw, first_block, n_blocks)
    elif t == Q4_1:
        _dequant_q4_1(out, raw, first_block, n_blocks)
    elif t == Q5_0:
        _dequant_q5_0(out, raw, first_block, n_blocks)
    elif t == Q5_1:
        _dequant_q5_1(out, raw, first_block, n_blocks)
    elif t == Q8_0:
        _dequant_q8_0(out, raw, first_block, n_blocks)
    elif t == IQ4_NL:
        _dequant_iq4_nl(out, raw, first_block, n_blocks)
    elif t == Q2_K:
        _dequant_q2_k(out, raw, first_block, n_blocks)
    elif t == Q3_K:
        _dequant_q3_k(out, raw, first_block, n_blocks)
    elif t == Q4_K:
        _dequant_q4_k(out, raw, first_block, n_blocks)
    elif t == Q5_K:
        _dequant_q5_k(out, raw, first_block, n_blocks)
    elif t == Q6_K:
        _dequant_q6_k(out, raw, first_block, n_blocks)
    elif t == Q8_K:
        _dequant_q8_k(out, raw, first_block, n_blocks)
    elif t == IQ4_XS:
        _dequant_iq4_xs(out, raw, first_block, n_blocks)
    elif t == MXFP4:
        _dequant_mxfp4(out, raw, first_block, n_blocks)
    elif t == TQ2_0:
        _dequant_tq2_0(out, raw, first_block, n_blocks)
    elif t == TQ1_0:
        _dequant_tq1_0(out, raw, first_block, n_blocks)
    elif t == IQ1_S:
        _dequant_iq1_s(out, raw, first_block, n_blocks)
    elif t == IQ1_M:
        _dequant_iq1_m(out, raw, first_block, n_blocks)
    elif t == IQ2_XXS:                  # the codebook types (iquants.py)
        _dequant_iq2_xxs(out, raw, first_block, n_blocks)
    elif t == IQ2_XS:
        _dequant_iq2_xs(out, raw, first_block, n_blocks)
    elif t == IQ2_S:
        _dequant_iq2_s(out, raw, first_block, n_blocks)
    elif t == IQ3_XXS:
        _dequant_iq3_xxs(out, raw, first_block, n_blocks)
    elif t == IQ3_S:
        _dequant_iq3_s(out, raw, first_block, n_blocks)
    else:
        raise ValueError("no dequantization kernel for this ggml type")
