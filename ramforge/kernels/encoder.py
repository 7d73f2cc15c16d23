"""An encoder's (BERT's) ops in llama.cpp's float steps: LayerNorm with bias, GELU, tanh, and attention
without a KV cache over float32 keys and values, each token seeing every token of its own sequence.

Attention is build_attn_mha's graph on the CPU backend: KQ = mul_mat(k, q) (q permuted, not
contiguous: ggml_vec_dot_f32 per key), soft_max_ext with the mask over a row of every key of the batch
(n_kv = n_tokens, unpadded: -inf outside the sequence; _softmax_row), KQV = mul_mat(v^T, kq) over every key of
the batch (tinyBLAS where n_kv is a multiple of 16 and the batch has 2+ tokens, else ggml_vec_dot_f32). With ALiBi
(jina-bert-v2) the mask holds -|p0 - p1| and soft_max adds slope_h * mask to each scaled score with one
fma, as ggml's CPU soft_max is compiled (`alibi_slopes`: its per-head slopes, from libm's powf).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from .fmatmul import _row_dot
from .glu import _GELU
from .ops import _softmax_exp
from .scalars import F16_TO_F32, _f32_to_half_bits, _fma


@njit(cache=True, parallel=True)
def _layer_norm(out, x, w, b, eps):
    # ggml_norm (the mean: a float64 sum rounded to float32, then divided in float32 (ggml_vec_sum_f32, sum/ne00);
    # the variance as ggml_vec_cvar_f32), then * w, + b: separate float32 ops
    n = x.shape[1]
    for t in prange(x.shape[0]):
        s = 0.0
        for i in range(n):
            s += np.float64(x[t, i])
        mean = np.float32(s) / np.float32(n)
        s2 = 0.0                             # ggml_vec_cvar_f32: 16 lanes summed pairwise, then the rest
        lanes = np.empty(16, np.float32)
        i = 0
        while i + 15 < n:
            for j in range(16):
                v = x[t, i + j] - mean
                out[t, i + j] = v
                lanes[j] = v * v
            h = 8
            while h >= 1:
                for j in range(h):
                    lanes[j] = lanes[j] + lanes[j + h]
                h //= 2
            s2 += np.float64(lanes[0])
            i += 16
        for i in range(i, n):
            v = x[t, i] - mean
            out[t, i] = v
            s2 += np.float64(v * v)
        var = np.float32(s2 / n)
        scale = np.float32(1.0) / np.float32(math.sqrt(var + eps))
        for i in range(n):
            out[t, i] = (out[t, i] * scale) * w[i] + b[i]


def layer_norm(out: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """out f32[n, d] = LayerNorm(x) * w + b (llama.cpp's LLM_NORM with a bias)."""
    _layer_norm(out, np.ascontiguousarray(x), w, b, np.float32(eps))
    return out


@njit(cache=True, parallel=True)
def _gelu(x, table):
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            g = x[t, i]
            if g <= -10.0:
                x[t, i] = 0.0
            elif g < 10.0:
                x[t, i] = table[_f32_to_half_bits(g)]


def gelu(x: np.ndarray) -> np.ndarray:
    """In place: ggml_gelu through its f16 table (ggml_vec_gelu_f32)."""
    _gelu(x, _GELU)
    return x


@njit(cache=True)
def _softmax_row(p, a, b, n, mx):
    # p[a:b] <- exp(p - mx) for the unmasked keys [a, b) of a row of n keys (the rest masked: exp 0); returns
    # their sum as ggml_vec_soft_max_f32 adds it over the row: per whole block of 16 keys ggml's vector exp,
    # the lanes summed pairwise (_mm512_reduce_add_ps, masked lanes exact zeros) into a float64 sum; the
    # n % 16 keys after the last whole block through libm's expf, added one by one (the no-cache mask is
    # n x n, unpadded: a lone short sequence is all tail)
    n16 = n - n % 16
    total = _softmax_exp(p, a, min(b, n16) - 1, mx)          # the whole blocks' keys (ops: a KV row's rule)
    for j in range(max(a, n16), b):
        e = math.exp(p[j] - mx)                 # a float32 argument: libm's expf, as ggml's scalar tail
        p[j] = e
        total += np.float64(e)
    return total


@functools.cache
def _attention_kernel(tb: bool):
    @njit(cache=True, parallel=True)
    def _attend(out, qf, kf, vt, seq_of, bounds, n, H, Hk, D, kq_scale, half, f16, slopes):
        # out f32[n, H, D]; qf: q f32[n, H, D] flat; kf: k f32[n, Hk, D] flat; vt: v as f32[Hk, D, n] flat;
        # seq_of i64[n]; query head h reads key head h // (H / Hk) (ggml's broadcast); half >= 0: keys
        # within half positions of the query only (a symmetric window; positions are rows from the
        # sequence's start), the rest masked as outside the sequence; slopes f32[H] (ALiBi) or empty
        e16 = np.empty(0, np.uint16)
        g = H // Hk
        for job in prange(H * n):
            h, i = job // n, job % n
            hk = h // g
            a, b = bounds[seq_of[i], 0], bounds[seq_of[i], 1]
            if half >= 0:
                a, b = max(a, i - half), min(b, i + half + 1)
            p = np.zeros(n, np.float32)
            mx = -np.inf
            for j in range(a, b):
                s = _row_dot(0, False, kf, e16, (j * Hk + hk) * D, qf, (i * H + h) * D, D, f16) * kq_scale
                if slopes.size:                 # wp += slope * mask, mask = -|p0 - p1|: one fma
                    s = _fma(slopes[h], np.float32(-abs(i - j)), s)
                p[j] = s
                mx = max(mx, s)
            total = _softmax_row(p, a, b, n, np.float32(mx))
            inv = np.float32(1.0 / total)
            for j in range(a, b):
                p[j] = p[j] * inv
            for d in range(D):
                out[i, h, d] = _row_dot(0, tb, vt, e16, (hk * D + d) * n, p, 0, n, f16)
    return _attend


def encoder_attention(out: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, bounds: np.ndarray,
                      kq_scale: float, window: int = 0, slopes: np.ndarray | None = None) -> np.ndarray:
    """out f32[n, H, D] = softmax(q k^T * kq_scale, masked to each token's sequence) v, for q f32[n, H, D],
    k, v f32[n, Hk, D] (H a multiple of Hk: grouped-query heads) and bounds i64[n_seq, 2]: the sequences'
    rows [a, b). window > 0: llama.cpp's symmetric sliding window (LLAMA_SWA_TYPE_SYMMETRIC), each token
    seeing the keys at most window // 2 positions away on either side. slopes f32[H]: ALiBi's per-head
    slopes (alibi_slopes), each score biased by -slope * its distance from the query."""
    n, H, D = q.shape
    Hk = k.shape[1]
    if H % Hk:
        raise ValueError(f"{H} query heads are not a multiple of {Hk} key heads")
    seq_of = np.empty(n, np.int64)
    for s, (a, b) in enumerate(bounds):
        seq_of[a:b] = s
    vt = np.ascontiguousarray(v.transpose(1, 2, 0)).reshape(-1)
    tb = n >= 2 and n % 16 == 0 and D % 4 == 0
    _attention_kernel(tb)(out, np.ascontiguousarray(q).reshape(-1), np.ascontiguousarray(k).reshape(-1), vt,
                          seq_of, np.asarray(bounds, np.int64), n, H, Hk, D, np.float32(kq_scale),
                          window // 2 if window > 0 else -1, F16_TO_F32,
                          np.empty(0, np.float32) if slopes is None else np.ascontiguousarray(slopes, np.float32))
    return out


@njit(cache=True)
def _powf(x, y):
    return math.pow(x, y)               # of float32s: libm's powf, as ggml calls it


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """f32[n_head]: ALiBi's per-head slopes as ggml's soft_max computes them (ggml_compute_forward_soft_max_f32:
    m0, m1 from n_head_log2 = 2^floor(log2(n_head)); head h < n_head_log2: m0^(h+1), else m1^(2(h - n_head_log2) + 1))."""
    f = np.float32
    log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = f(_powf(f(2.0), f(-f(max_bias)) / f(log2)))
    m1 = f(_powf(f(2.0), f(-(f(max_bias) / f(2.0))) / f(log2)))
    return np.array([_powf(m0, f(h + 1)) if h < log2 else _powf(m1, f(2 * (h - log2) + 1))
                     for h in range(n_head)], np.float32)


@njit(cache=True)
def _tanh(x):
    for i in range(x.size):
        x.flat[i] = math.tanh(x.flat[i])          # of a float32: libm's tanhf, as ggml_vec_tanh_f32


def tanh(x: np.ndarray) -> np.ndarray:
    """In place: libm's tanhf, as ggml_tanh calls it (glibc 2.36's is not correctly rounded: a float64 tanh
    rounded to float32 differs from it in ~1/4 of the values, by an ulp)."""
    _tanh(x)
    return x
