"""Embedding pooling and normalization, in llama.cpp's float steps.

`embd_normalize` is common_embd_normalize (llama.cpp's common/common.cpp, which llama-server's
`embd_normalize` option selects): the norm summed in float64 over float32 products, its reciprocal
rounded to float32, each value times it in float32. `ollama_normalize` is Ollama's server-side
normalize (float32 sum of squares). `mean_rows` is llama.cpp's mean pooling: a ggml_mul_mat of the
transposed hidden states with a row of 1/n (kernels.matmul's float path, so the sums round as ggml's).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..errors import InvalidArgument
from ..gguf.constants import GGMLType
from .matmul import float_matmul
from .moe import _softmax

NORM_NONE, NORM_MAX_ABS, NORM_TAXICAB, NORM_EUCLIDEAN = -1, 0, 1, 2


@njit(cache=True)
def _embd_normalize(out, x, mode):
    # out, x f32[m, n]: each row as common_embd_normalize(x, out, n, mode)
    for r in range(x.shape[0]):
        s = 0.0
        if mode == -1:
            s = 1.0
        elif mode == 0:
            for i in range(x.shape[1]):
                a = np.float64(abs(x[r, i]))
                if s < a:
                    s = a
            s /= 32760.0
        elif mode == 2:
            for i in range(x.shape[1]):
                s += np.float64(x[r, i] * x[r, i])
            s = math.sqrt(s)
        else:                                   # p-norm (1: taxicab; pow(|x|, 1) is |x|)
            p = np.float64(mode)
            for i in range(x.shape[1]):
                s += math.pow(np.float64(abs(x[r, i])), p)
            s = math.pow(s, 1.0 / p)
        norm = np.float32(1.0 / s) if s > 0.0 else np.float32(0.0)
        for i in range(x.shape[1]):
            out[r, i] = x[r, i] * norm


def embd_normalize(x: np.ndarray, mode: int = NORM_EUCLIDEAN) -> np.ndarray:
    """A new f32 array of x's rows (f32[n] or f32[m, n]) normalized as llama.cpp's common_embd_normalize:
    -1 none, 0 max-abs scaled to the int16 range (32760), 1 taxicab, 2 Euclidean, p > 2 the p-norm."""
    if isinstance(mode, bool) or not isinstance(mode, (int, np.integer)) or mode < -1:
        raise InvalidArgument(f"embd_normalize = {mode!r}: -1 (none), 0 (max absolute, int16 range), "
                              f"1 (taxicab), 2 (Euclidean) or an integer p > 2 (p-norm)")
    a = np.ascontiguousarray(x, np.float32)
    rows = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
    out = np.empty_like(rows)
    _embd_normalize(out, rows, int(mode))
    return out.reshape(a.shape)


@njit(cache=True)
def _ollama_normalize(out, x):
    for r in range(x.shape[0]):
        s = np.float32(0.0)
        for i in range(x.shape[1]):
            s += x[r, i] * x[r, i]
        norm = np.float32(1.0 / max(math.sqrt(np.float64(s)), 1e-12))
        for i in range(x.shape[1]):
            out[r, i] = x[r, i] * norm


def ollama_normalize(x: np.ndarray) -> np.ndarray:
    """A new f32 array of x's rows scaled to unit length as Ollama's server does it (float32 sum)."""
    a = np.ascontiguousarray(x, np.float32)
    rows = a.reshape(-1, a.shape[-1])
    out = np.empty_like(rows)
    _ollama_normalize(out, rows)
    return out.reshape(a.shape)


def mean_rows(h: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
    """f32[len(bounds), n_embd]: the mean of h's rows a..b for each (a, b), as llama.cpp's mean pooling:
    ggml_mul_mat(cont(transpose(h)), inp_mean), inp_mean[s, t] = 1/n_s on sequence s's tokens, 0 elsewhere."""
    n_tok, n_embd = h.shape
    inp_mean = np.zeros((len(bounds), n_tok), np.float32)
    for s, (a, b) in enumerate(bounds):
        inp_mean[s, a:b] = np.float32(1.0) / np.float32(b - a)
    ht = np.ascontiguousarray(np.asarray(h, np.float32).T)        # n_embd rows of n_tok
    y = np.empty((len(bounds), n_embd), np.float32)
    return float_matmul(y, inp_mean, GGMLType.F32, ht.view(np.uint8).reshape(-1), n_embd, n_tok, len(bounds))


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max of each row of x f32[k, n] (kernels.moe's, the router's: ggml_vec_soft_max_f32)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        _softmax(out[r], x[r])
    return out
