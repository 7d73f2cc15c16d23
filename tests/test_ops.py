"""The transformer ops' kernels against plain numpy references (ops.py)."""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.kernels import ops


@pytest.mark.parametrize("widen", ["auto", "integer"])
def test_f16_widening_intrinsic_is_exact_for_every_bit_pattern(widen):
    from numba import njit

    fn = ops._widen16_auto if widen == "auto" else ops._widen16_int

    @njit
    def widen_all(src, dst):
        for i in range(0, src.size, 16):
            fn(src, i, dst, i)
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(1 << 16, np.float32)
    widen_all(bits, got)
    want = ops.F16_TO_F32
    nan = np.isnan(want)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)) and np.isnan(got[nan]).all()


def attention_reference(q, k16, v16, pos0, scale, window):
    """float64 causal attention with llama.cpp's roundings: q and the probabilities to f16."""
    n_tok, n_head, _ = q.shape
    gqa = n_head // k16.shape[1]
    k, v = k16.astype(np.float64), v16.astype(np.float64)
    qr = q.astype(np.float16).astype(np.float64)
    out = np.zeros((n_tok, n_head, v.shape[2]))
    for t in range(n_tok):
        p = pos0 + t
        j0 = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_head):
            s = k[j0:p + 1, h // gqa] @ qr[t, h] * scale
            e = np.exp(s - s.max())
            pr = (e / e.sum()).astype(np.float16).astype(np.float64)
            out[t, h] = pr @ v[j0:p + 1, h // gqa]
    return out


@pytest.mark.parametrize("hd", [64, 72, 256])                # 72: a tail past the 16-lane vectors
@pytest.mark.parametrize("pos0,n_tok,window", [(0, 9, 0), (5, 1, 0), (30, 7, 8), (0, 40, 16)])
def test_attention_matches_reference(hd, pos0, n_tok, window):
    rng = np.random.default_rng(hd + pos0 + n_tok)
    n_head, n_kv, n_ctx = 4, 2, 64
    k16 = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    v16 = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    out = np.full((n_tok, n_head, hd), np.nan, np.float32)
    scale = 1 / np.sqrt(hd)
    ops.attention(out, q, k16.view(np.uint16), v16.view(np.uint16), pos0, scale, window)
    want = attention_reference(q, k16, v16, pos0, scale, window)
    np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3)


def test_attention_refuses_bad_shapes():
    k = np.zeros((8, 3, 16), np.uint16)
    with pytest.raises(ops.RamforgeError):
        ops.attention(np.zeros((1, 4, 16), np.float32), np.zeros((1, 4, 16), np.float32), k, k, 0, 1.0)
    k = np.zeros((8, 2, 16), np.uint16)
    with pytest.raises(ops.RamforgeError):
        ops.attention(np.zeros((1, 4, 16), np.float32), np.zeros((1, 4, 16), np.float32), k, k, 8, 1.0)


def test_ggml_vector_exp_is_within_its_stated_error():
    # ggml_v_expf's own bound is 1.45 ulp + 0.5 (measured here: 2.18 at most); past float32's range
    # inf, below ~-103.97 zero
    from numba import njit

    @njit
    def all_exp(x, out):
        for i in range(x.size):
            out[i] = ops._expf(x[i])
    x = np.concatenate([np.linspace(-103, 88, 400_001, dtype=np.float32),
                        np.array([0.0, -0.0, 1e-30, -1e-30, 89.0, 200.0, -110.0, -np.inf, np.inf], np.float32)])
    got = np.empty_like(x)
    all_exp(x, got)
    want = np.exp(x.astype(np.float64))
    finite = np.abs(x) < 88
    ulp = np.spacing(want[finite].astype(np.float32)).astype(np.float64)
    assert (np.abs(got[finite] - want[finite]) <= 2.5 * ulp).all()
    tail = dict(zip(x[-9:].tolist(), got[-9:].tolist()))
    assert tail[0.0] == 1.0 and tail[89.0] == np.inf and tail[200.0] == np.inf
    assert tail[-110.0] == 0.0 and tail[-np.inf] == 0.0 and tail[np.inf] == np.inf
    nan = np.empty(1, np.float32)
    all_exp(np.array([np.nan], np.float32), nan)
    assert np.isnan(nan[0])
