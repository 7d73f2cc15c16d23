"""Repacked Q4_K, Q8_0 and Q4_0 weights (kernels.repack, kernels.gemvrep): the layout round-trips, a repacked
weight multiplies bit for bit as its rows in file order at every token count and path (and, -m oracle,
as ggml's mul_mat), and the engine repacks pinned layers (streamed ones only when asked: not mmap views)
without changing a logit."""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.engine.warmup import stand_in
from ramforge.gguf.constants import GGMLType
from ramforge.gguf.reader import GGUFFile
from ramforge.kernels import qmatmul as qm
from ramforge.kernels.batch import Batch
from ramforge.kernels import repack as rp
from ramforge.memory import MemoryBudget
from ramforge.stream.plan import plan_for_budget
from tests.test_qmatmul import _ids, weight

Q4_K, Q6_K = GGMLType.Q4_K, GGMLType.Q6_K
TYPES = [Q4_K, GGMLType.Q8_0, GGMLType.Q4_0]
SHAPES = [(48, 512), (40, 256), (64, 768), (24, 256)]      # G = 16, 8, 16, 8 (AVX-512; else 8); odd super-block counts


def _repacked(t, raw, n_out, n_in):
    rep = raw.copy()
    return rep, rp.repack(t, rep, (n_in, n_out))


def test_group_size_and_eligibility():
    # 512-bit targets group 16 rows where they can; AVX2 and others 8; Q5_K and Q6_K stay in file order
    assert [rp.repack_group(n, True) for n in (32, 48, 40, 24, 37)] == [16, 16, 8, 8, 0]
    assert [rp.repack_group(n, False) for n in (32, 48, 40, 24, 37)] == [8, 8, 8, 8, 0]
    assert rp.repackable(Q4_K, (256, 40)) and not rp.repackable(Q4_K, (256, 37))
    assert rp.repackable(GGMLType.Q8_0, (256, 40)) and rp.repackable(GGMLType.Q4_0, (256, 40))
    assert not rp.repackable(Q6_K, (256, 48)) and not rp.repackable(GGMLType.Q5_K, (256, 48))
    assert not rp.repackable(GGMLType.Q3_K, (256, 40)) and not rp.repackable(Q4_K, (256, 40, 2))


@pytest.mark.parametrize("t", TYPES, ids=_ids(TYPES))
@pytest.mark.parametrize("n_out,n_in", SHAPES)
def test_layout_round_trips(t, n_out, n_in):
    raw = weight(t, n_out, n_in, seed=n_out)
    rep, G = _repacked(t, raw, n_out, n_in)
    assert not np.array_equal(rep, raw) and rep.size == raw.size
    rb = n_in // rp._ELEMS[rp.KINDS[t]] * rp.BLOCKS[t]
    back = np.empty(8 * rb, np.uint8)
    for r0 in range(0, n_out, 8):
        rp._unpack_rows(rp.KINDS[t], rep, r0 // G * G * rb, G, n_in // rp._ELEMS[rp.KINDS[t]], r0 % G, 8, back)
        assert np.array_equal(back, raw[r0 * rb:(r0 + 8) * rb]), r0


@pytest.mark.parametrize("n_out,n_in,G", [(48, 512, 16), (40, 256, 8), (64, 768, 16), (64, 768, 8)])
def test_q4k_fast_path_is_the_generic_layout(n_out, n_in, G):
    # repack's Q4_K path (by u32s and 8x8 transposes, for 4-aligned buffers) writes the bytes the per-byte
    # _pack_group writes
    raw = weight(Q4_K, n_out, n_in, seed=G + n_out)
    rb = n_in // 256 * 144
    slow, fast = raw.copy(), raw.copy()
    rp._repack_in_place(rp.KINDS[Q4_K], slow, n_out, rb, G)
    rp._repack_q4k_in_place(fast, fast.view(np.uint32), n_out, rb, G)
    assert not np.array_equal(fast, raw) and np.array_equal(fast, slow)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_repack_many_is_repack_of_each(n_threads):
    # several weights of every kind in one array (an expert cache's pool), repacked at once by threads that
    # split their groups, give each weight's own repack; a weight at an offset not 4-aligned too
    ws, at, parts = [], 0, []
    for i, (t, n_out, n_in) in enumerate([(Q4_K, 48, 512), (GGMLType.Q8_0, 40, 256), (Q4_K, 64, 768),
                                          (GGMLType.Q4_0, 24, 256), (Q4_K, 16, 256)]):
        raw = weight(t, n_out, n_in, seed=i)
        ws.append((t, at, (n_in, n_out)))
        parts.append(raw)
        at += raw.size + (2 if i == 1 else 0)         # the Q4_0 after it starts 2 bytes past a multiple of 4
        parts.append(np.zeros(2 if i == 1 else 0, np.uint8))
    pool = np.concatenate(parts + [np.zeros(-at % 4, np.uint8)])
    want = pool.copy()
    for t, o, dims in ws:
        n = dims[1] * (dims[0] // rp._ELEMS[rp.KINDS[t]]) * rp.BLOCKS[t]
        rp.repack(t, want[o:o + n], dims)
    rp.repack_many(pool, ws, n_threads)
    assert np.array_equal(pool, want)
    with pytest.raises(Exception, match="4-aligned"):
        rp.repack_many(pool[1:], ws[:1], n_threads)


# the portable kernels (vector=False) of Q4_K in CI, of every type with -m slow (~8 s of compiles a type)
@pytest.mark.parametrize("t,vector", [pytest.param(t, v, id=f"{t.name}-{'vector' if v else 'portable'}",
                                                   marks=[] if v or t == Q4_K else [pytest.mark.slow])
                                      for t in TYPES for v in (True, False)])
@pytest.mark.parametrize("n_out,n_in", SHAPES)
def test_repacked_equals_file_order_bit_for_bit(t, n_out, n_in, vector):
    # the gemv (1-3 tokens), the packed rows of a split batch view, and the unpacking path (4+)
    raw = weight(t, n_out, n_in, seed=n_in + n_out)
    rep, G = _repacked(t, raw, n_out, n_in)
    for n_tok in (1, 2, 3, 4, 5, 8, 9, 17):
        x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
        for batch in (None, Batch(n_tok + 4, 2)) if n_tok < 4 else (None,):
            want = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in, vector=vector,
                              batch=batch)
            got = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, rep, n_out, n_in, vector=vector,
                             batch=batch, repacked=G)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (n_tok, batch)


@pytest.mark.parametrize("t", [Q4_K, GGMLType.Q8_0, GGMLType.Q5_0, Q6_K], ids=_ids([Q4_K, GGMLType.Q8_0, GGMLType.Q5_0, Q6_K]))
def test_a_grouped_kernels_stand_in_is_bit_equal(t, monkeypatch):
    # a cold process runs a batch through the packed kernel of the same variants (qmatmul.deferred) while a
    # warm-up worker compiles the grouped one: every batch size's result the same bits, file order and repacked
    n_out, n_in = 48, 512
    raw = weight(t, n_out, n_in, seed=7)
    rep, G = _repacked(t, raw, n_out, n_in) if rp.repackable(t, (n_in, n_out)) else (raw, 0)
    subs = 0
    for w, g in ((raw, 0), (rep, G)):
        for n_tok in (4, 5, 8, 9, 17):
            x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
            want = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, w, n_out, n_in, vector=True, repacked=g)
            kernel = qm.own_kernel((t, n_out, n_in, g), n_tok, vector=True)
            sub = stand_in(kernel)
            if sub is None:
                continue
            subs += 1
            monkeypatch.setattr(qm, "deferred", {kernel: sub})
            got = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, w, n_out, n_in, vector=True, repacked=g)
            monkeypatch.setattr(qm, "deferred", {})
            assert sub.signatures and np.array_equal(got.view(np.uint32), want.view(np.uint32)), (n_tok, g)
    assert subs > 0 or t == Q6_K            # (Q6_K's batches take its tiled matmul: no packed rows in it)


@pytest.mark.oracle
@pytest.mark.parametrize("t", TYPES, ids=_ids(TYPES))
def test_repacked_gemv_is_llama_cpps(ggml, t):
    for n_out, n_in in SHAPES:
        raw = weight(t, n_out, n_in, seed=7 + n_out)
        rep, G = _repacked(t, raw, n_out, n_in)
        for n_tok in (1, 2, 3, 4, 5):
            x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
            want = ggml.matmul(t, raw, x, n_out, n_in)
            got = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, rep, n_out, n_in, repacked=G)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (n_out, n_in, n_tok)


@pytest.fixture(scope="module")
def ggml():
    from tests.test_qmatmul import _GGML

    return _GGML()


@pytest.fixture(scope="module")
def q8_model():
    """A synthetic llama Q8_0 with its own (untied) output matrix, Q8_0 too (a Q4_K_M's is Q6_K, kept in file
    order): building it needs llama.cpp's quantizer."""
    from tools.make_models import ensure_model, llama_cpp_or_none

    if llama_cpp_or_none() is None:
        pytest.skip("building the synthetic Q8_0 model needs llama.cpp's quantizer (llama-cpp-python)")
    return ensure_model("llama", "Q8_0")


PROMPT = [1, 415, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366]


def _run(path, **kw):
    with Engine.load(path, n_ctx=64, **kw) as e:
        reps = {n: t.repacked for L in e.weights.pinned.values() for n, t in L.tensors.items()}
        return e.eval(PROMPT, all_logits=True, aligned=True), list(e.generate(PROMPT, 6)), reps


@pytest.mark.parametrize("streamed_too", [False, True])
def test_engine_repacks_pinned_and_streamed_layers_alike(default_model, streamed_too, monkeypatch):
    # gemma-3-270m Q4_K_M (Q4_K, Q6_K, Q8_0 matrices): pinned, streamed (repacked or in file order) and
    # mmap views (never repacked) give the same logits and tokens
    import ramforge.stream.weights as sw
    monkeypatch.setattr(sw, "REPACK_STREAMED", streamed_too)          # RAMFORGE_REPACK_STREAMED=1
    pinned = _run(default_model)
    assert any(pinned[2].values()), "no matrix was repacked"
    with GGUFFile(default_model) as f:
        lo = plan_for_budget(f, None, 64).min_budget
    for kw in ({"budget": MemoryBudget(lo)}, {"io": "mmap"}):
        other = _run(default_model, **kw)
        assert np.array_equal(other[0], pinned[0]) and other[1] == pinned[1], kw
        if "io" in kw:
            assert not any(other[2].values())                         # file views stay in file order


@pytest.mark.parametrize("streamed_too", [False, True])
def test_output_matrix_is_repacked_resident_and_streamed(q8_model, streamed_too, monkeypatch):
    # the output projection (its own tensor, not a tied embedding) repacks resident, and per streamed
    # chunk when asked (RAMFORGE_REPACK_STREAMED=1)
    import ramforge.stream.weights as sw
    monkeypatch.setattr(sw, "REPACK_STREAMED", streamed_too)
    with GGUFFile(q8_model) as f:
        t = f.tensors.get("output.weight")
        full = plan_for_budget(f, None, 64)
    if t is None or not rp.repackable(t.ggml_type, t.dims):
        pytest.skip("this model's output matrix is tied or of a type without a repacked layout")
    with Engine.load(q8_model, n_ctx=64) as e:
        assert e.weights.output is not None and e.weights.output.repacked
        want = e.eval(PROMPT, all_logits=True, aligned=True)
    with Engine.load(q8_model, n_ctx=64, budget=MemoryBudget(full.min_budget)) as e:
        assert e.weights.output is None                                  # streamed in row chunks
        assert np.array_equal(e.eval(PROMPT, all_logits=True, aligned=True), want)


def test_warm_readies_every_kernel_a_batch_without_a_view_takes():
    # qmatmul.warm (a server's load): afterwards each token count of these shapes finds its kernel
    # holding the call's signature, and the call compiles or loads nothing more
    shapes = [(Q4_K, 48, 512, 0), (Q4_K, 48, 512, 16), (GGMLType.Q4_0, 40, 256, 8)]
    assert qm.warm(shapes) >= 4
    sig = qm.kernel_signature()
    for t, n_out, n_in, rep in shapes:
        raw = weight(t, n_out, n_in, seed=3)
        if rep:
            rp.repack(t, raw, (n_in, n_out))
        for n_tok in range(1, 18):
            kernel = qm._plan(t, n_out, n_in, n_tok, n_tok, 0, qm.numba.get_num_threads(), qm.VECTOR, rep).kernel
            assert sig in kernel.overloads, (t.name, rep, n_tok)
            before = len(kernel.overloads)
            x = np.ones((n_tok, n_in), np.float32)
            qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in, repacked=rep)
            assert len(kernel.overloads) == before, (t.name, rep, n_tok)
