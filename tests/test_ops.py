"""The transformer ops' kernels against plain numpy references (ops.py)."""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.kernels import attention as attn
from ramforge.kernels import ops


@pytest.mark.parametrize("widen", ["auto", "integer"])
def test_f16_widening_intrinsic_is_exact_for_every_bit_pattern(widen):
    from numba import njit

    fn = attn._widen16_auto if widen == "auto" else attn._widen16_int

    @njit
    def widen_all(src, dst):
        for i in range(0, src.size, 16):
            fn(src, i, dst, i)
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(1 << 16, np.float32)
    widen_all(bits, got)
    want = attn.F16_TO_F32
    nan = np.isnan(want)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)) and np.isnan(got[nan]).all()


def attention_reference(q, k16, v16, pos0, scale, window, softcap=0.0):
    """float64 causal attention with llama.cpp's roundings: q and the probabilities to f16; softcap > 0
    caps the logits q.k at +-softcap (softcap tanh(q.k / softcap)) before the scale."""
    n_tok, n_head, _ = q.shape
    gqa = n_head // k16.shape[1]
    k, v = k16.astype(np.float64), v16.astype(np.float64)
    qr = q.astype(np.float16).astype(np.float64)
    out = np.zeros((n_tok, n_head, v.shape[2]))
    for t in range(n_tok):
        p = pos0 + t
        j0 = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_head):
            s = k[j0:p + 1, h // gqa] @ qr[t, h]
            s = (softcap * np.tanh(s / softcap) if softcap else s) * scale
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
    attn.attention(out, q, k16.view(np.uint16), v16.view(np.uint16), pos0, scale, window)
    want = attention_reference(q, k16, v16, pos0, scale, window)
    np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("n_tok,softcap", [(1, 5.0), (9, 5.0), (9, 50.0)])
def test_softcapped_attention_matches_reference(n_tok, softcap):
    rng = np.random.default_rng(n_tok)
    hd, n_ctx = 64, 32
    k16 = (rng.standard_normal((n_ctx, 2, hd)) * 1.5).astype(np.float16)
    v16 = rng.standard_normal((n_ctx, 2, hd)).astype(np.float16)
    q = (rng.standard_normal((n_tok, 4, hd)) * 1.5).astype(np.float32)       # |q.k| up to ~50: capped
    out = np.full((n_tok, 4, hd), np.nan, np.float32)
    attn.attention(out, q, k16.view(np.uint16), v16.view(np.uint16), 10, 0.5, 0, softcap)
    np.testing.assert_allclose(out, attention_reference(q, k16, v16, 10, 0.5, 0, softcap), rtol=2e-3, atol=2e-3)
    plain = np.empty_like(out)
    attn.attention(plain, q, k16.view(np.uint16), v16.view(np.uint16), 10, 0.5, 0)
    assert np.abs(plain - out).max() > 0.05                              # the cap changed the attention


def test_softcap_is_cap_tanh_x_over_cap():
    x = np.linspace(-100, 100, 4001, dtype=np.float32).reshape(1, -1)
    got = ops.softcap(x.copy(), 30.0)
    np.testing.assert_allclose(got, 30 * np.tanh(x.astype(np.float64) / 30), rtol=2e-7, atol=1e-6)
    assert np.abs(got).max() <= 30.0
    with pytest.raises(ops.RamforgeError):
        ops.softcap(x, 0.0)


@pytest.mark.parametrize("n_tok,window,hd", [(1, 0, 128), (1, 0, 72), (5, 0, 64), (3, 4, 64)])
def test_short_attention_on_the_calling_thread_is_the_parallel_one(n_tok, window, hd):
    # below _SERIAL_WORK attention runs serially (_attention_1): the same arithmetic, bit for bit
    rng = np.random.default_rng(n_tok + hd)
    kc, vc = (rng.standard_normal((40, 2, hd)).astype(np.float16).view(np.uint16) for _ in range(2))
    q = rng.standard_normal((n_tok, 4, hd)).astype(np.float32).astype(np.float16).astype(np.float32)
    outs = [np.full((n_tok, 4, hd), np.nan, np.float32) for _ in range(2)]
    for out, kernel in zip(outs, (attn._attention, attn._attention_1)):
        kernel(out, q, kc, vc, 20, n_tok, np.float32(0.125), window, 2, attn.F16_TO_F32, n_tok == 1, np.float32(0),
               attn._NO_SINKS)
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    assert 1 * 4 * 21 * (2 * 128) < attn._SERIAL_WORK                    # (a decode token at this size: serial)


def test_attention_refuses_bad_shapes():
    k = np.zeros((8, 3, 16), np.uint16)
    with pytest.raises(ops.RamforgeError):
        attn.attention(np.zeros((1, 4, 16), np.float32), np.zeros((1, 4, 16), np.float32), k, k, 0, 1.0)
    k = np.zeros((8, 2, 16), np.uint16)
    with pytest.raises(ops.RamforgeError):
        attn.attention(np.zeros((1, 4, 16), np.float32), np.zeros((1, 4, 16), np.float32), k, k, 8, 1.0)


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


def test_vector_exp_equals_the_scalar_one_bit_for_bit():
    # vexp's 16 lanes in IR against ops._expf lane by lane: normal, subnormal and overflowing results,
    # the |n| > 192 cut, signed zeros, infinities and NaN; and its sum in _mm512_reduce_add_ps's order
    from numba import njit

    from ramforge.kernels.vexp import _exp_sub16

    @njit
    def both(x, mx, want, sums):
        for k in range(0, x.size, 16):
            for i in range(16):
                want[k + i] = ops._expf(x[k + i] - mx)
            sums[k // 16] = _exp_sub16(x, k, mx)
    rng = np.random.default_rng(5)
    x = np.concatenate([np.linspace(-120, 100, 160_000, dtype=np.float32),
                        (rng.standard_normal(16_000) * 40).astype(np.float32),
                        np.array([0.0, -0.0, 1e-30, -1e-30, 88.7, 88.8, -87.3, -103.9, -104.0, -149.0, 200.0, -300.0,
                                  -np.inf, np.inf, np.nan, -np.nan], np.float32)])
    for mx in (np.float32(0.0), np.float32(3.5)):
        got, want, sums = x.copy(), np.empty_like(x), np.empty(x.size // 16, np.float32)
        both(got, mx, want, sums)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        a = want.reshape(-1, 16)
        c = (a[:, :8] + a[:, 8:])
        c = c[:, :4] + c[:, 4:]
        ref = (c[:, 0] + c[:, 2]) + (c[:, 1] + c[:, 3])
        np.testing.assert_array_equal(sums, ref)          # (a NaN's sign in a sum: not compared)


def test_swiglu_is_silu_with_ggmls_vector_exp_bit_for_bit():
    # whole blocks of 16 through vexp, the tail through libm's expf; a strided (non-contiguous) gate too
    from numba import njit

    @njit
    def scalar(g, u, n16):
        out = np.empty_like(g)
        for t in range(g.shape[0]):
            for i in range(g.shape[1]):
                e = ops._expf(-g[t, i]) if i < n16 else np.float32(np.exp(-g[t, i]))
                out[t, i] = (g[t, i] / (np.float32(1.0) + e)) * u[t, i]
        return out
    rng = np.random.default_rng(6)
    for n_tok, n in ((1, 2048), (3, 1000), (2, 2050)):
        g = (rng.standard_normal((n_tok, 2 * n)) * 12).astype(np.float32)[:, :n]
        u = rng.standard_normal((n_tok, n)).astype(np.float32)
        want = scalar(np.ascontiguousarray(g), u, n - n % 16)
        got = ops.swiglu(np.empty((n_tok, n), np.float32), g, u)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------- RoPE against ggml_rope_ext, live

class _GGMLRope:
    """ggml_rope_ext from llama-cpp-python's libggml (ctypes), computed on ggml's CPU backend."""

    def __init__(self):
        import ctypes as c

        from tools.ggml_ctypes import P, Params, fn, libraries
        pytest.importorskip("llama_cpp")
        try:
            base, cpu = libraries()
        except OSError as e:
            pytest.skip(f"ggml libraries not loadable: {e}")
        if not (cpu.ggml_cpu_has_fma() and cpu.ggml_cpu_has_avx512()):
            pytest.skip("llama.cpp build without FMA / AVX-512: not the arithmetic ops.rope reproduces")
        self.c, self.Params = c, Params
        self.init = fn(base, "ggml_init", P, [Params])
        self.new1 = fn(base, "ggml_new_tensor_1d", P, [P, c.c_int, c.c_int64])
        self.new3 = fn(base, "ggml_new_tensor_3d", P, [P, c.c_int, c.c_int64, c.c_int64, c.c_int64])
        self.rope_ext = fn(base, "ggml_rope_ext", P, [P, P, P, P, c.c_int, c.c_int, c.c_int] + [c.c_float] * 6)
        self.new_graph = fn(base, "ggml_new_graph", P, [P])
        self.build = fn(base, "ggml_build_forward_expand", None, [P, P])
        self.data = fn(base, "ggml_get_data", P, [P])
        self.free = fn(base, "ggml_free", None, [P])
        self.compute = fn(cpu, "ggml_graph_compute_with_ctx", c.c_int, [P, P, c.c_int])

    def _put(self, t, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        self.c.memmove(self.data(t), a.ctypes.data, a.nbytes)

    def rope(self, x, pos, n_rot, base, neox, ff, s: ops.RopeScale) -> np.ndarray:
        n_tok, n_head, hd = x.shape
        ctx = self.init(self.Params(64 << 20, None, False))
        try:
            a, p = self.new3(ctx, 0, hd, n_head, n_tok), self.new1(ctx, 26, n_tok)       # F32, I32
            self._put(a, x.astype(np.float32))
            self._put(p, pos.astype(np.int32))
            f = None
            if ff is not None:
                f = self.new1(ctx, 0, ff.size)
                self._put(f, ff.astype(np.float32))
            y = self.rope_ext(ctx, a, p, f, n_rot, 2 if neox else 0, s.n_ctx_orig, base, s.freq_scale,
                              s.ext_factor, s.attn_factor, s.beta_fast, s.beta_slow)
            g = self.new_graph(ctx)
            self.build(g, y)
            assert self.compute(ctx, g, 2) == 0
            out = np.empty(x.shape, np.float32)
            self.c.memmove(out.ctypes.data, self.data(y), out.nbytes)
            return out
        finally:
            self.free(ctx)


ROPE_SCALES = {
    "none": ops.UNSCALED,
    "linear-4": ops.RopeScale(freq_scale=0.25),
    "linear-8-attn": ops.RopeScale(freq_scale=0.125, attn_factor=1.25),
    # Qwen3 / Qwen2.5 long context: factor 4 over 32768; attn_factor as llama.cpp's context derives it
    "yarn-4": ops.RopeScale(0.25, 1.0, 0.878126, 32.0, 1.0, 32768),
    # gpt-oss: factor 32 over 4096
    "yarn-32": ops.RopeScale(1 / 32, 1.0, 0.7425, 32.0, 1.0, 4096),
    "yarn-partial-mix": ops.RopeScale(0.5, 0.7, 1.1, 16.0, 2.0, 2048),
    "yarn-unit-scale": ops.RopeScale(1.0, 1.0, 1.0, 32.0, 1.0, 512),
}


@pytest.mark.oracle
@pytest.mark.parametrize("name", list(ROPE_SCALES))
@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_rope_is_bit_identical_to_ggml(name, neox):
    g = _GGMLRope()
    s = ROPE_SCALES[name]
    rng = np.random.default_rng(len(name) + neox)
    pos = np.array([0, 1, 2, 7, 100, 511, 2047, 4096, 40000, 131071], np.int32)
    for hd, n_rot in ((64, 64), (128, 128), (128, 64)):
        x = (rng.standard_normal((pos.size, 3, hd)) * 2).astype(np.float32)
        for base in (10000.0, 1e6, 150000.0):
            for ff in (None, (1 + 7 * rng.random(n_rot // 2)).astype(np.float32)):
                want = g.rope(x, pos, n_rot, base, neox, ff, s)
                got = ops.rope(x.copy(), pos, n_rot, base, neox, ff, s)
                same = got.view(np.uint32) == want.view(np.uint32)
                assert same.all(), (f"{name} hd {hd} n_rot {n_rot} base {base} ff {ff is not None}: "
                                    f"{np.count_nonzero(~same)} of {same.size} differ")


def test_rope_refuses_bad_yarn_arguments():
    x = np.zeros((1, 1, 8), np.float32)
    for s in (ops.RopeScale(0.0, 1.0), ops.RopeScale(0.5, 1.0, n_ctx_orig=0),
              ops.RopeScale(0.5, 1.0, 1.0, 0.0, 1.0, 64)):
        with pytest.raises(ops.RamforgeError, match="YaRN"):
            ops.rope(x, np.zeros(1, np.int32), 8, 10000.0, True, None, s)
