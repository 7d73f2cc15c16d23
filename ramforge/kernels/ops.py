"""Transformer ops as llama.cpp's CPU backend computes them: RMSNorm, RoPE, the logit soft-cap, the
scalar exp and softmax step attention uses (attention: attention.py; the GLUs: glu.py).

Each public function checks shapes and calls a private @njit kernel. Numerics follow ggml where it
matters for agreement: RMSNorm sums squares in float64, softmax sums in float64, GELU goes through
ggml's f16 table.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ..errors import RamforgeError
from ..profiling import timed
from .glu import geglu, swiglu, swiglu_oai  # noqa: F401  (re-exported: the GLUs live in glu.py)
from .vexp import _exp_sub16
from .scalars import _fma

# ---------------------------------------------------------------- RMSNorm


@njit(cache=True, inline="always")
def _rms_row(out, x, w, eps, t):
    # out[t] = (x[t] * 1/sqrt(mean(x[t]^2) + eps)) * w; out, x f32[n_tok, n], w f32[n]
    n = x.shape[1]
    s = 0.0
    for i in range(n):
        v = np.float64(x[t, i] * x[t, i])
        s += v
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(s / n) + eps))
    for i in range(n):
        out[t, i] = (x[t, i] * scale) * w[i]


@njit(cache=True, parallel=True)
def _rms_norm(out, x, w, eps):
    # out, x f32[n_tok, n]; w f32[n]: rows in parallel
    for t in prange(x.shape[0]):
        _rms_row(out, x, w, eps, t)


@njit(cache=True, nogil=True)
def _rms_norm_1(out, x, w, eps):
    # rows on the calling thread (a decode token, its heads' q/k norms: no parallel region to wake)
    for t in range(x.shape[0]):
        _rms_row(out, x, w, eps, t)


_SERIAL_VALUES = 1 << 16       # RMSNorms of up to this many values run on the calling thread


@timed("norm")
def rms_norm(out: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Row-wise RMSNorm of x (f32[..., n]) times w (f32[n]) into out (same shape as x)."""
    n = x.shape[-1]
    if w.shape != (n,) or out.shape != x.shape:
        raise RamforgeError(f"rms_norm: x {x.shape}, w {w.shape}, out {out.shape}")
    o2, x2 = out.reshape(-1, n), x.reshape(-1, n)
    (_rms_norm_1 if x2.shape[0] == 1 or x2.size <= _SERIAL_VALUES else _rms_norm)(o2, x2, w, np.float32(eps))
    return out


# ---------------------------------------------------------------- ggml's vector exp



_F = lambda h: np.float32(float.fromhex(h))  # noqa: E731
_EXP_C = (_F("0x1.8p23"), _F("0x1.715476p+0"), _F("0x1.62e4p-1"), _F("0x1.7f7d1cp-20"), _F("0x1.0e4020p-7"),
          _F("0x1.573e2ep-5"), _F("0x1.555e66p-3"), _F("0x1.fffdb6p-2"), _F("0x1.ffffecp-1"))


@njit(cache=True, inline="always")
def _expf(x):
    # exp(x) for float32 x as ggml's SIMD ggml_v_expf computes it (its AVX-512 form, per lane):
    # n = round(x*log2 e), b = x - n*ln2 (two-part ln2), a degree-5 polynomial in b, times 2^n;
    # |n| > 192 gives +inf or 0. Every step a single float32 rounding or an fma (not fastmath).
    r, l2e, ln2_hi, ln2_lo, c5, c4, c3, c2, c1 = _EXP_C
    z = _fma(x, l2e, r)
    n = z - r
    b = _fma(-n, ln2_lo, _fma(-n, ln2_hi, x))
    u = b * b
    j = _fma(_fma(_fma(c5, b, c4), u, _fma(c3, b, c2)), u, _fma(c1, b, np.float32(1.0)))
    if abs(n) > np.float32(192.0):
        return np.float32(0.0) if n <= 0 else np.float32(np.inf)
    if n != n:
        return n
    return np.float32(math.ldexp(np.float64(j), int(n)))        # j * 2^n, rounded once (scalef)


@njit(cache=True)
def _softmax_exp(scores, j0, p, mx):
    # scores[j0..p] <- exp(scores - mx) (f32, _expf); returns their sum as ggml_vec_soft_max_f32 adds
    # it over a row of keys from 0: per 16 keys (masked ones 0) a pairwise float sum (the order of
    # _mm512_reduce_add_ps), accumulated in float64
    total = 0.0
    lanes = np.zeros(16, np.float32)
    for k in range(j0 - j0 % 16, p + 1, 16):
        if k >= j0 and k + 15 <= p:                  # a whole block: 16 lanes at once (vexp)
            total += np.float64(_exp_sub16(scores, k, mx))
            continue
        for i in range(16):
            j = k + i
            e = np.float32(0.0)
            if j0 <= j <= p:
                e = _expf(scores[j] - mx)
                scores[j] = e
            lanes[i] = e
        a = lanes
        total += np.float64((((a[0] + a[8]) + (a[4] + a[12])) + ((a[2] + a[10]) + (a[6] + a[14])))
                            + (((a[1] + a[9]) + (a[5] + a[13])) + ((a[3] + a[11]) + (a[7] + a[15]))))
    return total


# ---------------------------------------------------------------- RoPE


class RopeScale(NamedTuple):
    """ggml_rope_ext's scaling arguments; the defaults rotate unscaled (models.config.rope_scaling resolves a
    file's).

    freq_scale: angles times this (linear: 1/factor); ext_factor != 0 is YaRN, which mixes each pair's
    scaled and unscaled angle by a ramp between the correction dims for beta_fast and beta_slow
    (n_ctx_orig: the context trained on) and scales cos and sin by attn_factor * (1 + 0.1 ln(1/freq_scale));
    without YaRN, by attn_factor alone.
    """

    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0


UNSCALED = RopeScale()


@njit(cache=True)
def _logf(x):
    return math.log(x)                  # of a float32: libm's logf


def logf(x: float) -> np.float32:
    """libm's logf of float32(x), as libllama and ggml call it (RoPE scaling's magnitudes)."""
    return np.float32(_logf(np.float32(x)))


@njit(cache=True)
def _yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow):
    # ggml_rope_yarn_corr_dims (libggml-base: float32 steps, no fma; logf as libm's):
    # the dims where a pair turns beta times over n_ctx_orig, floored / ceiled into [0, n_rot - 1]
    f = np.float32
    two_log_base = f(2.0) * f(math.log(f(base)))
    lo = f(n_rot) * f(math.log(f(n_ctx_orig) / ((f(beta_fast) * f(2.0)) * f(math.pi)))) / two_log_base
    hi = f(n_rot) * f(math.log(f(n_ctx_orig) / ((f(beta_slow) * f(2.0)) * f(math.pi)))) / two_log_base
    return max(f(0.0), f(math.floor(lo))), min(f(n_rot - 1), f(math.ceil(hi)))


@njit(cache=True)
def _rope_cache(n_rot, freq_scale, ext_factor, attn_factor, corr_lo, corr_hi):
    # per pair i: YaRN's ramp mix (ext_factor times 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)), and
    # the magnitude of cos and sin, as ggml-cpu's rope_yarn (GCC contracts 1 + 0.1 * logf(1/freq_scale))
    f = np.float32
    one = f(1.0)
    mix = np.zeros(n_rot // 2, np.float32)
    mscale = attn_factor
    if ext_factor != 0:
        span = max(f(0.001), corr_hi - corr_lo)
        for i in range(n_rot // 2):
            y = (f(i) - corr_lo) / span
            mix[i] = (one - min(one, max(f(0.0), y))) * ext_factor
        mscale = _fma(f(0.1), f(math.log(one / freq_scale)), one) * attn_factor
    return mix, mscale


@njit(cache=True, nogil=True)
def _rope(x, pos, n_rot, base, neox, freq_factors, freq_scale, ext_factor, mix, mscale):
    # x f32[n_tok, n_head, head_dim], rotated in place; pos i32[n_tok]; freq_factors f32[n_rot/2] or empty;
    # mix f32[n_rot/2] (YaRN's, with ext_factor != 0), mscale f32: ggml-cpu's rope cache and rotate_pairs
    theta_scale = np.float32(base) ** np.float32(-2.0 / n_rot)
    half = n_rot // 2
    one = np.float32(1.0)
    for t in range(x.shape[0]):
        theta = np.float32(pos[t])
        for i in range(half):
            extrap = theta / freq_factors[i] if freq_factors.size else theta
            th = extrap * freq_scale
            if ext_factor != 0:
                th = _fma(th, one - mix[i], extrap * mix[i])       # as GCC contracts rope_yarn's mix
            c, s = np.float32(math.cos(th)) * mscale, np.float32(math.sin(th)) * mscale
            for h in range(x.shape[1]):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0, x1 = x[t, h, a], x[t, h, b]
                x[t, h, a] = _fma(x0, c, -(x1 * s))        # as GCC contracts ggml's rotate_pairs
                x[t, h, b] = _fma(x0, s, x1 * c)
            theta = theta * theta_scale


_NO_FACTORS = np.empty(0, np.float32)


@functools.lru_cache(maxsize=64)
def _rope_params(n_rot: int, base: float, scale: RopeScale) -> tuple[np.ndarray, np.float32]:
    """(YaRN's mix f32[n_rot/2], the magnitude of cos and sin) of a scaling: the same for every layer and
    token of a model, so made once (callers only read the array)."""
    f = np.float32
    if scale.ext_factor != 0 and not (scale.freq_scale > 0 and scale.n_ctx_orig > 0
                                      and scale.beta_fast > 0 and scale.beta_slow > 0):
        raise RamforgeError(f"rope: YaRN needs a positive freq_scale, betas and n_ctx_orig: {scale}")
    lo, hi = (_yarn_corr_dims(n_rot, scale.n_ctx_orig, f(base), f(scale.beta_fast), f(scale.beta_slow))
              if scale.ext_factor != 0 else (0.0, 0.0))
    mix, mscale = _rope_cache(n_rot, f(scale.freq_scale), f(scale.ext_factor), f(scale.attn_factor), f(lo), f(hi))
    return mix, f(mscale)


@timed("rope")
def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool,
         freq_factors: np.ndarray | None = None, scale: RopeScale = UNSCALED) -> np.ndarray:
    """Rotate the first n_rot dims of each head of x (f32[n_tok, n_head, head_dim]) in place.

    neox=False pairs (2i, 2i+1) as llama; neox=True pairs (i, i + n_rot/2) as qwen2/qwen3/gemma3.
    freq_factors divide pair i's angle (Llama 3's rope_freqs, LongRoPE's factors); scale: ggml_rope_ext's
    scaling (linear, YaRN).
    """
    if x.ndim != 3 or n_rot > x.shape[2] or n_rot % 2 or pos.shape != (x.shape[0],):
        raise RamforgeError(f"rope: x {x.shape}, pos {pos.shape}, n_rot {n_rot}")
    ff = _NO_FACTORS if freq_factors is None else np.ascontiguousarray(freq_factors, np.float32)
    if ff.size not in (0, n_rot // 2):
        raise RamforgeError(f"rope: {ff.size} frequency factors for n_rot {n_rot} (expected {n_rot // 2})")
    mix, mscale = _rope_params(n_rot, float(base), scale)
    f = np.float32
    _rope(x, pos.astype(np.int32, copy=False), n_rot, base, neox, ff, f(scale.freq_scale), f(scale.ext_factor),
          mix, mscale)
    return x


@njit(cache=True, parallel=True)
def _softcap(x, cap):
    # x f32[n, m] <- cap * tanhf(x * (1/cap)): ggml_scale, ggml_tanh (libm's tanhf), ggml_scale
    inv = np.float32(1.0) / cap
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] = np.float32(math.tanh(x[t, i] * inv)) * cap


@timed("softcap")
def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """Soft-cap x (f32[n, m]) in place at +-cap: cap * tanh(x / cap) (gemma2's final logits)."""
    if x.ndim != 2 or x.dtype != np.float32 or not cap > 0:
        raise RamforgeError(f"softcap: x {x.shape} {x.dtype}, cap {cap}")
    _softcap(x, np.float32(cap))
    return x
