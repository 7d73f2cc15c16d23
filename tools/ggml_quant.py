"""ggml's own quantizer (`ggml_quantize_chunk`) through ctypes, with an importance matrix.

llama.cpp's `llama_model_quantize` refuses IQ1_S / IQ1_M / IQ2_XXS / IQ2_XS (and some IQ2_S / IQ3_XXS
tensors) without an imatrix, and ctypes cannot hand it one. `quantize_rows` calls the same per-type
quantizer llama-quantize calls, with a deterministic positive importance vector the caller gives.

Tools and tests only; the ramforge package never imports this.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    """libggml-base from llama-cpp-python (tools.ggml_ctypes), its quantizer's functions typed."""
    from tools.ggml_ctypes import libraries

    base = libraries()[0]
    P, c = ctypes.c_void_p, ctypes
    base.ggml_quantize_chunk.restype = c.c_size_t
    base.ggml_quantize_chunk.argtypes = [c.c_int, P, P, c.c_int64, c.c_int64, c.c_int64, P]
    base.ggml_quantize_requires_imatrix.restype = c.c_bool
    base.ggml_quantize_requires_imatrix.argtypes = [c.c_int]
    base.ggml_quantize_init.restype = None
    base.ggml_quantize_init.argtypes = [c.c_int]
    base.ggml_row_size.restype = c.c_size_t
    base.ggml_row_size.argtypes = [c.c_int, c.c_int64]
    return base


def requires_imatrix(ggml_type: int) -> bool:
    return bool(_lib().ggml_quantize_requires_imatrix(int(ggml_type)))


def row_size(ggml_type: int, n_per_row: int) -> int:
    return int(_lib().ggml_row_size(int(ggml_type), int(n_per_row)))


def importance(seed: int, n_per_row: int) -> np.ndarray:
    """A positive importance vector f32[n_per_row]: 1 + 0.5*|N(0,1)| (the true mean squared
    activations are unknown for a synthetic model)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    return (np.float32(1.0) + np.float32(0.5) * np.abs(rng.standard_normal(n_per_row, dtype=np.float32)))


def quantize_rows(x: np.ndarray, ggml_type: int, imatrix: np.ndarray | None = None) -> np.ndarray:
    """f32[rows, n_per_row] -> u8[rows, row_size] in `ggml_type`, by ggml_quantize_chunk."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize_rows wants a 2-D array, got shape {x.shape}")
    nrows, n = x.shape
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, np.float32)
        if imatrix.shape != (n,):
            raise ValueError(f"imatrix shape {imatrix.shape}, want ({n},)")
    elif requires_imatrix(ggml_type):
        raise ValueError(f"ggml type {int(ggml_type)} needs an importance matrix")
    lib = _lib()
    rs = row_size(ggml_type, n)
    out = np.zeros((nrows, rs), np.uint8)
    lib.ggml_quantize_init(int(ggml_type))
    got = lib.ggml_quantize_chunk(int(ggml_type), x.ctypes.data, out.ctypes.data, 0, nrows, n,
                                  None if imatrix is None else imatrix.ctypes.data)
    if got != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {got} B, expected {out.nbytes}")
    return out
