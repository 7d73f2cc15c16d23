"""Naive numpy references for the elementwise and row ops (float64, the textbook formulas), and the
kernels checked against them within each op's stated error.

The kernels reproduce ggml's float32 steps (vector exp, f16 GELU table, fma-contracted rotations):
bit-exactness with llama.cpp is checked elsewhere (test_ops.py, test_inference.py). These references
say what each op computes, and would catch a kernel that is fast and exact but computes the wrong thing.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from ramforge.kernels import ops

RNG = np.random.default_rng(7)


# ---- references: float64, one line of math each -----------------------------------------------

def rms_norm_ref(x, w, eps):
    """x f[n_tok, n] / sqrt(mean(x^2) + eps) * w f[n]."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def rope_ref(x, pos, n_rot, base, neox, freq_factors=None):
    """Rotate pairs (2i, 2i+1) (neox: (i, i + n_rot/2)) of each head by pos * base^(-2i/n_rot) / ff_i."""
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    i = np.arange(half)
    inv = base ** (-2.0 * i / n_rot) / (1.0 if freq_factors is None else freq_factors.astype(np.float64))
    a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
    for t, p in enumerate(pos):
        c, s = np.cos(p * inv), np.sin(p * inv)
        row = out[t]                                    # [n_head, head_dim], a view
        x0, x1 = row[:, a].copy(), row[:, b].copy()
        row[:, a], row[:, b] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


def rope_scaled_ref(x, pos, n_rot, base, neox, s):
    """RoPE with ggml's scaling (s: ops.RopeScale): linear divides every angle by 1/freq_scale; YaRN
    (ext_factor != 0) keeps the unscaled angle for the fast pairs (i below the dim turning beta_fast times
    over n_ctx_orig), the scaled one for the slow (past beta_slow's dim), a linear ramp between, mixed by
    ext_factor, and scales cos and sin by attn_factor (1 + 0.1 ln(1/freq_scale))."""
    half = n_rot // 2
    i = np.arange(half)
    extrap = base ** (-2.0 * i / n_rot)
    mscale = s.attn_factor
    mix = np.zeros(half)
    if s.ext_factor:
        dim = lambda beta: n_rot * math.log(s.n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
        lo, hi = max(0.0, math.floor(dim(s.beta_fast))), min(n_rot - 1.0, math.ceil(dim(s.beta_slow)))
        mix = (1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)) * s.ext_factor
        mscale *= 1 + 0.1 * math.log(1 / s.freq_scale)
    inv = s.freq_scale * extrap * (1 - mix) + extrap * mix
    out = x.astype(np.float64).copy()
    a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
    for t, p in enumerate(pos):
        c, sn = np.cos(p * inv) * mscale, np.sin(p * inv) * mscale
        row = out[t]
        x0, x1 = row[:, a].copy(), row[:, b].copy()
        row[:, a], row[:, b] = x0 * c - x1 * sn, x0 * sn + x1 * c
    return out


def softmax_ref(z):
    """exp(z - max z) / sum exp(z - max z), with z - max z as float32 computes it (as ggml does)."""
    e = np.exp((z - z.max()).astype(np.float64))
    return e / e.sum()


def swiglu_ref(g, u):
    """silu(g) * u = g / (1 + exp(-g)) * u."""
    g = g.astype(np.float64)
    return g / (1.0 + np.exp(-g)) * u


def geglu_ref(g, u):
    """gelu_tanh(g) * u = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u."""
    g = g.astype(np.float64)
    return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u


# ---- the kernels against them --------------------------------------------------------------------

@pytest.mark.parametrize("n_tok,n", [(1, 64), (5, 640), (3, 1000)])
def test_rms_norm_is_the_textbook_formula(n_tok, n):
    x = (RNG.standard_normal((n_tok, n)) * 3).astype(np.float32)
    w = RNG.standard_normal(n).astype(np.float32)
    out = np.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    np.testing.assert_allclose(out, rms_norm_ref(x, w, 1e-6), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot,hd", [(64, 64), (32, 64)])
def test_rope_is_a_rotation_by_the_position_angle(neox, n_rot, hd):
    pos = np.array([0, 1, 7, 100, 511], np.int32)
    x = RNG.standard_normal((len(pos), 3, hd)).astype(np.float32)
    ff = (1.0 + RNG.random(n_rot // 2)).astype(np.float32)
    for factors in (None, ff):
        got = ops.rope(x.copy(), pos, n_rot, 10000.0, neox, factors)
        # ggml steps theta by repeated float32 products (theta *= theta_scale): the angle's error
        # grows with pos and i, so compare with an absolute bound of that size
        np.testing.assert_allclose(got, rope_ref(x, pos, n_rot, 10000.0, neox, factors), atol=5e-4 * 4, rtol=0)
        np.testing.assert_array_equal(got[..., n_rot:], x[..., n_rot:])      # the rest is untouched
        np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


@pytest.mark.parametrize("scale", [ops.RopeScale(freq_scale=0.25), ops.RopeScale(freq_scale=0.125, attn_factor=1.25),
                                   ops.RopeScale(0.25, 1.0, 0.878126, 32.0, 1.0, 32768),
                                   ops.RopeScale(1 / 32, 1.0, 0.7425, 32.0, 1.0, 4096),
                                   ops.RopeScale(0.5, 0.7, 1.1, 16.0, 2.0, 2048)],
                         ids=["linear-4", "linear-8-attn", "yarn-4", "yarn-32", "yarn-partial-mix"])
@pytest.mark.parametrize("neox", [False, True])
def test_scaled_rope_is_the_yarn_formula(scale, neox):
    pos = np.array([0, 1, 7, 100, 511, 4000], np.int32)
    x = RNG.standard_normal((len(pos), 3, 128)).astype(np.float32)
    got = ops.rope(x.copy(), pos, 128, 1e6, neox, None, scale)
    ref = rope_scaled_ref(x, pos, 128, 1e6, neox, scale)
    # as the unscaled test: float32 angles stepped by repeated products, an error growing with pos
    # (here up to 4000: ~4e-4 rad), times the magnitude (|x| ~ 4 at most, mscale <= 1.25)
    np.testing.assert_allclose(got, ref, atol=2.5e-3, rtol=0)
    plain = ops.rope(x.copy(), pos, 128, 1e6, neox)
    assert np.abs(got - plain).max() > 0.1                     # the scaling changed the rotation


@pytest.mark.parametrize("n", [1, 15, 16, 33, 300])
def test_softmax_exp_and_sum_are_the_textbook_ones(n):
    z = (RNG.standard_normal(n) * 4).astype(np.float32)
    mx = z.max()
    e = z.copy()
    total = ops._softmax_exp(e, 0, n - 1, mx)
    ref = np.exp((z - mx).astype(np.float64))                          # the f32 difference, as ggml
    np.testing.assert_allclose(e, ref, rtol=3e-7)                      # ggml's exp: within ~2 ulp
    assert abs(total - ref.sum()) <= 1e-6 * ref.sum()
    np.testing.assert_allclose(e / total, softmax_ref(z), rtol=1e-6)


@pytest.mark.parametrize("n", [16, 40, 768])
def test_swiglu_is_silu_times_up(n):
    g = (RNG.standard_normal((4, n)) * 4).astype(np.float32)
    u = RNG.standard_normal((4, n)).astype(np.float32)
    out = np.empty_like(g)
    ops.swiglu(out, g, u)
    np.testing.assert_allclose(out, swiglu_ref(g, u), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("n", [16, 40, 768])
def test_geglu_is_gelu_tanh_times_up(n):
    g = (RNG.standard_normal((4, n)) * 4).astype(np.float32)
    g[0, :3] = (-12.0, 12.0, 0.0)                                       # the table's clamps
    u = RNG.standard_normal((4, n)).astype(np.float32)
    out = np.empty_like(g)
    ops.geglu(out, g, u)
    # ggml looks GELU up in an f16 table indexed by f16(g): two f16 roundings (~2^-11 relative each)
    ref = geglu_ref(g, u)
    bound = 2e-3 * np.abs(u) * (1 + np.abs(g)) + 1e-6
    assert np.all(np.abs(out - ref) <= bound), float(np.max(np.abs(out - ref) / bound))
