"""The gated FFN activations as ggml's CPU backend computes them: SwiGLU (ggml_vec_swiglu_f32, with
ggml's vector exp: vexp.py), GeGLU (through ggml's f16 GELU table) and gpt-oss's clamped SwiGLU
(ggml_swiglu_oai, libm's expf). Re-exported by ops.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..errors import RamforgeError
from ..profiling import timed
from .scalars import F16_TO_F32, _f32_to_half_bits
from .vexp import _swiglu16


def _gelu_table() -> np.ndarray:
    """ggml's GELU table, f16(gelu_tanh(x)) for every f16 x, as float32.

    Matches llama.cpp's ggml_table_gelu_f16 bit for bit: the inner 1 + a*x*x is fused (as GCC
    contracts it), and tanh is computed in float64 then rounded, as glibc's tanhf rounds.
    """
    f = np.float32
    x = F16_TO_F32
    with np.errstate(all="ignore"):
        ax = (f(0.044715) * x).astype(np.float64)
        inner = (f(0.7978845608028654) * x) * (ax * x + 1.0).astype(np.float32)
        g = f(0.5) * x * (f(1) + np.tanh(inner.astype(np.float64)).astype(np.float32))
    return g.astype(np.float16).astype(np.float32)


_GELU = _gelu_table()


_GLU_BLOCK = 1024       # elements per parallel task of the GLUs (geglu's one token spreads over the threads too)


@njit(cache=True, parallel=True)
def _geglu(out, gate, up, table):
    n = gate.shape[1]
    nb = (n + _GLU_BLOCK - 1) // _GLU_BLOCK
    for k in prange(gate.shape[0] * nb):
        t, i0 = k // nb, k % nb * _GLU_BLOCK
        for i in range(i0, min(n, i0 + _GLU_BLOCK)):
            g = gate[t, i]
            if g <= -10.0:
                out[t, i] = 0.0
            elif g >= 10.0:
                out[t, i] = g * up[t, i]
            else:
                out[t, i] = table[_f32_to_half_bits(g)] * up[t, i]


@njit(cache=True, inline="always")
def _swiglu_span(out, gate, up, o, i0, i1, n16):
    # elements o+i0 .. o+i1 of out, gate, up f32[...] (i0 a multiple of 16), as ggml_vec_swiglu_f32:
    # silu(g) = g / (1 + exp(-g)) with ggml's vector exp for whole blocks of 16 below n16 (vexp), libm's
    # past it; times up
    for i in range(i0, min(i1, n16), 16):
        _swiglu16(out, o + i, gate, o + i, up, o + i)
    for i in range(max(i0, n16), i1):
        g = gate[o + i]
        out[o + i] = (g / (np.float32(1.0) + np.float32(math.exp(-g)))) * up[o + i]


@njit(cache=True, inline="always")
def _swiglu_block(out, gate, up, n, t, i0):
    # elements i0.. of row t (one _GLU_BLOCK) of out, gate, up f32[n_tok * n] (rows of n)
    _swiglu_span(out, gate, up, t * n, i0, min(n, i0 + _GLU_BLOCK), n - n % 16)


@njit(cache=True, parallel=True)
def _swiglu(out, gate, up, n_tok, n):
    # out, gate, up f32[n_tok * n] (rows of n), blocks of a row in parallel
    nb = (n + _GLU_BLOCK - 1) // _GLU_BLOCK
    for k in prange(n_tok * nb):
        _swiglu_block(out, gate, up, n, k // nb, k % nb * _GLU_BLOCK)


@njit(cache=True, nogil=True)
def _swiglu_1(out, gate, up, n_tok, n):
    # one row on the calling thread (a decode token: vexp makes it a few microseconds, less than
    # waking a parallel region)
    for i0 in range(0, n, _GLU_BLOCK):
        _swiglu_block(out, gate, up, n, 0, i0)


@njit(cache=True, parallel=True)
def _swiglu_oai(out, gate, up, alpha, limit):
    # as ggml_compute_forward_swiglu_oai_f32 (scalar, libm's expf): x = min(g, limit),
    # y = clamp(u, -limit, limit), out = x / (1 + expf(alpha * -x)) * (y + 1)
    one = np.float32(1.0)
    n = gate.shape[1]
    nb = (n + _GLU_BLOCK - 1) // _GLU_BLOCK
    for k in prange(gate.shape[0] * nb):
        t, i0 = k // nb, k % nb * _GLU_BLOCK
        for i in range(i0, min(n, i0 + _GLU_BLOCK)):
            x = min(gate[t, i], limit)
            y = min(max(up[t, i], -limit), limit)
            out[t, i] = (x / (one + math.exp(alpha * -x))) * (y + one)


@timed("glu")
def swiglu_oai(out: np.ndarray, gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """out = gpt-oss's clamped SwiGLU of gate and up, f32[n_tok, n_ff] (ggml_swiglu_oai)."""
    if not (gate.shape == up.shape == out.shape) or gate.ndim != 2 or not limit > 0:
        raise RamforgeError(f"swiglu_oai: gate {gate.shape}, up {up.shape}, out {out.shape}, limit {limit}")
    _swiglu_oai(out, gate, up, np.float32(alpha), np.float32(limit))
    return out


@timed("glu")
def geglu(out: np.ndarray, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """out = gelu(gate) * up (gemma3's FFN), f32[n_tok, n_ff]."""
    _geglu(out, gate, up, _GELU)
    return out


@timed("glu")
def swiglu(out: np.ndarray, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """out = silu(gate) * up (llama/qwen FFN), f32[n_tok, n_ff]."""
    if not (gate.shape == up.shape == out.shape) or gate.ndim != 2:
        raise RamforgeError(f"swiglu: gate {gate.shape}, up {up.shape}, out {out.shape}")
    o = out if out.flags.c_contiguous else np.empty_like(out)
    kernel = _swiglu_1 if gate.shape[0] == 1 else _swiglu
    kernel(o.reshape(-1), np.ascontiguousarray(gate).reshape(-1), np.ascontiguousarray(up).reshape(-1), gate.shape[0],
           gate.shape[1])
    if o is not out:
        out[...] = o
    return out
