"""Matmul of float activations with compact weights, as llama.cpp's CPU backend does it.

`matmul` runs a quantized weight (every type with a registry `qdot`) through the integer-dot
kernel of kernels.qmatmul and an F32/F16/BF16 weight through kernels.fmatmul (`float_matmul`);
both reproduce llama.cpp's CPU result bit for bit (its x86 AVX-512 build), in the arithmetic it
picks for the batch the rows belong to (the `batch` argument, a kernels.batch.Batch).

`matmul_reference` is the naive float path, the tests' cross-check for both: llama.cpp rounds the
activation to its weight type's `vec_dot_type` (Q8_0, Q8_1, Q8_K, F16, BF16 or F32) before the
dot product; `round_activation` reproduces that rounding in float32, and the kernel dequantizes
each weight row into a thread-local buffer and dots it with every token in float32.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from ..errors import RamforgeError
from ..gguf.constants import GGML_BLOCK, QK_K
from .batch import Batch, batch_size
from .blocks import LAYOUTS, Layout
from .decode import _dequant_any
from .fmatmul import BF16, F16, F32, fmatmul
from .fused import matvecs
from .naming import made_for
from .qmatmul import SharedInput, qmatmul
from .registry import ActType, kernels_for
from .scalars import F16_TO_F32

__all__ = ["Batch", "SharedInput", "float_matmul", "matmul", "matmul_reference", "round_activation"]

_ROWS_PER_TASK = 16          # weight rows per parallel task


def _round_q8_0(x: np.ndarray) -> np.ndarray:
    """x (f32[n_tok, n]) through Q8_0 and back: per 32 values d = f16(amax/127), q = rint(x*127/amax)."""
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[:, None])
    return (q * d[:, None]).reshape(x.shape)


def _q8_1_sum_correction(x: np.ndarray, xr: np.ndarray, raw: np.ndarray, n_out: int, layout: Layout) -> np.ndarray:
    """Q4_1/Q5_1 dot Q8_1 adds m * s per block, where llama.cpp stores s = f16(amax/127 * sum(q)), not
    sum(x') of the rounded activation: returns that difference through m, f32[n_tok, n_out]."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=2)
    s = (np.rint(xr.reshape(xb.shape) / np.where(amax != 0, (amax / np.float32(127)).astype(np.float16)
                                                   .astype(np.float32), 1)[..., None]).sum(axis=2)
         * (amax / np.float32(127))).astype(np.float16).astype(np.float32)
    c = s - xr.reshape(xb.shape).sum(axis=2, dtype=np.float32)              # f32[n_tok, n_blocks]
    m = raw.reshape(n_out, -1, layout.nbytes)[:, :, layout.m:layout.m + 2].copy().view(np.float16)[:, :, 0]
    m = m.astype(np.float32)
    return c @ m.T


def _round_q8_k(x: np.ndarray) -> np.ndarray:
    """x through Q8_K and back: per 256 values, scale by -127/max of the signed largest-|x| value."""
    xb = x.reshape(-1, QK_K)
    big = xb[np.arange(xb.shape[0]), np.abs(xb).argmax(axis=1)]
    nz = big != 0
    iscale = np.zeros_like(big)
    iscale[nz] = np.float32(-127) / big[nz]
    q = np.minimum(np.rint(xb * iscale[:, None]), np.float32(127))
    d = np.zeros_like(big)
    d[nz] = np.float32(1) / iscale[nz]
    return (q * d[:, None]).reshape(x.shape)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """Round f32 to bf16 (nearest, ties to even), as ggml's GGML_FP32_TO_BF16, and back."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    r = np.where(np.isnan(x), (u | 0x400000) >> 16 << 16, r)      # quiet NaNs, as ggml
    return r.astype(np.uint32).view(np.float32).reshape(x.shape)


_ROUND = {
    ActType.F32: lambda x: x,
    ActType.F16: lambda x: x.astype(np.float16).astype(np.float32),
    ActType.BF16: _round_bf16,
    ActType.Q8_0: _round_q8_0,
    ActType.Q8_1: _round_q8_0,
    ActType.Q8_K: _round_q8_k,
}


_FLOAT_KIND = {ActType.F32: F32, ActType.F16: F16, ActType.BF16: BF16}


def round_activation(x: np.ndarray, act: ActType) -> np.ndarray:
    """x (f32[n_tok, n]) rounded the way llama.cpp rounds it before a dot with a weight of `act`."""
    return _ROUND[act](np.ascontiguousarray(x, dtype=np.float32))


@functools.cache
def _reference_kernel(t):
    """The float reference kernel of type t (compiled for t's dequantization alone)."""
    tid = int(t)

    @njit(parallel=True, fastmath=True, cache=True)
    def _matmul(y, x, raw, n_out, n_in, row_bytes, block_elems):
        # y f32[n_tok, n_out] = x f32[n_tok, n_in] @ W^T, W: n_out rows of row_bytes packed bytes in raw u8
        n_tok = x.shape[0]
        n_tasks = (n_out + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
        nb = n_in // block_elems
        for task in prange(n_tasks):
            row = np.empty(n_in, dtype=np.float32)
            r1 = min(n_out, (task + 1) * _ROWS_PER_TASK)
            for r in range(task * _ROWS_PER_TASK, r1):
                _dequant_any(tid, row, raw[r * row_bytes:(r + 1) * row_bytes], 0, nb)
                for t in range(n_tok):
                    s = np.float32(0.0)
                    for i in range(n_in):
                        s += row[i] * x[t, i]
                    y[t, r] = s
    return made_for(_matmul, t)


def matmul(y: np.ndarray, x: np.ndarray, ggml_type, raw: np.ndarray, n_out: int, n_in: int,
           repacked: int = 0, batch: Batch | None = None, shared: SharedInput | None = None) -> np.ndarray:
    """y[n_tok, n_out] = x[n_tok, n_in] @ W.T for a packed weight W of n_out rows of n_in elements
    (repacked: in kernels.repack's groups of that many rows), in the arithmetic llama.cpp gives the
    batch the rows belong to (batch: rows batch.offset.. of a batch of batch.n_tok; None: a batch of
    their own). shared: x's quantization shared with other matmuls of x (qmatmul.SharedInput).

    Quantized weights take the integer-dot kernel (kernels.qmatmul; a lone token, its activation
    quantized inside it: kernels.fused), float weights the float path.
    """
    k = kernels_for(ggml_type)
    if k.qdot is not None and matvecs(x, [(y, ggml_type, raw, n_out, repacked)], batch=batch):
        return y
    if k.qdot is not None:
        return qmatmul(y, x, ggml_type, raw, n_out, n_in, batch=batch, repacked=repacked, shared=shared)
    return float_matmul(y, x, ggml_type, raw, n_out, n_in, batch_size(batch, x.shape[0]))


def float_matmul(y: np.ndarray, x: np.ndarray, ggml_type, raw: np.ndarray, n_out: int, n_in: int,
                 n_batch: int) -> np.ndarray:
    """The F32/F16/BF16 matmul of kernels.fmatmul, in the arithmetic llama.cpp gives a batch of
    n_batch tokens: x rounded to the weight type, then tinyBLAS's or ggml_vec_dot's sums."""
    k = kernels_for(ggml_type)
    kind = _FLOAT_KIND.get(k.act)
    if kind is None:
        raise RamforgeError(f"{k.ggml_type.name} is not a float type")
    _check_shapes(y, x, k, raw, n_out, n_in)
    return fmatmul(y, round_activation(x, k.act), kind, raw, n_out, n_in, n_batch, F16_TO_F32)


def _check_shapes(y, x, k, raw, n_out: int, n_in: int) -> int:
    """The packed size and the shapes agree (a RamforgeError naming them if not); the row bytes."""
    be, bb = GGML_BLOCK[k.ggml_type]
    if n_in % be:
        raise RamforgeError(f"row length {n_in} is not a multiple of {k.ggml_type.name}'s block size {be}")
    row_bytes = n_in // be * bb
    if raw.dtype != np.uint8 or raw.size != n_out * row_bytes:
        raise RamforgeError(f"{k.ggml_type.name} weight of {n_out} x {n_in} needs {n_out * row_bytes:,} B, "
                            f"got {raw.size:,} ({raw.dtype})")
    if x.ndim != 2 or x.shape[1] != n_in or y.shape != (x.shape[0], n_out) or y.dtype != np.float32:
        raise RamforgeError(f"matmul shapes: x {x.shape}, y {y.shape} {y.dtype}, weight {n_out} x {n_in}")
    return row_bytes


def matmul_reference(y: np.ndarray, x: np.ndarray, ggml_type, raw: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """The float path of `matmul`, for every type: validates the shapes against the packed size,
    rounds x as llama.cpp would, then dequantizes each row and dots it in float32."""
    k = kernels_for(ggml_type)
    be = k.block_elems
    row_bytes = _check_shapes(y, x, k, raw, n_out, n_in)
    xr = round_activation(x, k.act)
    _reference_kernel(k.ggml_type)(y, xr, raw.reshape(-1), n_out, n_in, row_bytes, be)
    if k.act == ActType.Q8_1:
        y += _q8_1_sum_correction(np.ascontiguousarray(x, np.float32), xr, raw, n_out, LAYOUTS[k.ggml_type])
    return y
