"""Embeddings: llama.cpp's normalizations and pooling, WordPiece's words, and the recorded embeddings of
llama-cpp-python (tests/fixtures/embeddings, tools/record_embeddings.py) reproduced by the engine.

The bound: each value within BOUND_ULPS float32 ulps of the vector's largest magnitude (1024 x 2^-23,
about 1.2e-4 relative; F16 weights F16_BOUND_ULPS, one half ulp: a 1-ulp difference upstream that flips
the rounding of an F16 matmul's input to half moves that element by 8192 float32 ulps), far below what
separates two texts' vectors. Measured when recorded: every record (bert, nomic-bert, gemma-embedding in
F32 and F16, qwen3; llama and gemma3 packed), one at a time and packed, bit for bit. Two roundings made that so, both of the
encoders' attention: the no-cache KQ mask is n_tokens x n_tokens, unpadded, so ggml_vec_soft_max_f32
takes the keys after the last whole 16 through libm's expf, added one by one (kernels.encoder
._softmax_row), and P.V over fewer than 64 keys is ggml_vec_dot_f32's leftovers as gcc compiled them
(kernels/fmatmul.py); before, a 3-token text was up to ~530 ulps off (gemma-embedding, F32) and up to
~6400 with F16 weights. jina-bert-v2 (n_embd 192) added two more: ggml_norm divides its mean in float32
(sum/ne00 of a float), which differs from a float64 division rounded where n_embd is not a power of 2
(MiniLM's 384, BGE-base's 768), and ggml_tanh is libm's tanhf, which glibc does not round correctly.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ramforge.errors import InvalidArgument
from ramforge.generation.embed import Pooling, parse_pooling, pooling_of
from ramforge.kernels.pool import embd_normalize, mean_rows, ollama_normalize
from ramforge.tokenizer.wpm import words

EMBED_DIR = Path(__file__).parent / "fixtures" / "embeddings"
RECORDS = [json.loads(p.read_text()) for p in sorted(EMBED_DIR.glob("*.json"))]
BOUND_ULPS = 1024
F16_BOUND_ULPS = 4096                 # F16 weights: their inputs rounded to half (see above)
FLOAT_TYPES = {"F32", "F16"}          # written by gguf alone: no llama.cpp needed to make them
ENCODERS = {"bert", "nomic-bert", "gemma-embedding", "jina-bert-v2"}     # non-causal (WordPiece / their own tokens checked)


def _bound_ulps(rec) -> int:
    return F16_BOUND_ULPS if rec["model"]["type"] == "F16" else BOUND_ULPS


def _reference_normalize(x: np.ndarray, mode: int) -> np.ndarray:
    """common_embd_normalize written out in Python floats (float64), products of float32."""
    s = 0.0
    if mode == -1:
        s = 1.0
    elif mode == 0:
        for v in x:
            s = max(s, abs(float(v)))
        s /= 32760.0
    elif mode == 2:
        for v in x:
            s += float(np.float32(v * v))
        s = math.sqrt(s)
    else:
        for v in x:
            s += math.pow(abs(float(v)), mode)
        s = math.pow(s, 1.0 / mode)
    norm = np.float32(1.0 / s) if s > 0 else np.float32(0.0)
    return (x * norm).astype(np.float32)


@pytest.mark.parametrize("mode", [-1, 0, 1, 2, 3, 5])
def test_embd_normalize_as_llama_cpp(mode):
    rng = np.random.default_rng(mode + 7)
    x = (rng.standard_normal((3, 77)) * 3).astype(np.float32)
    got = embd_normalize(x, mode)
    for r in range(3):
        assert np.array_equal(got[r], _reference_normalize(x[r], mode)), mode
    if mode == 2:
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    if mode == 0:
        assert np.isclose(np.abs(got).max(axis=1), 32760.0, rtol=1e-6).all()
    if mode == 1:
        assert np.allclose(np.abs(got).sum(axis=1), 1.0, atol=1e-6)


def test_embd_normalize_zero_and_bad_modes():
    assert np.array_equal(embd_normalize(np.zeros(8, np.float32), 2), np.zeros(8, np.float32))
    for bad in (-2, 1.5, True, "2"):
        with pytest.raises(InvalidArgument, match="embd_normalize"):
            embd_normalize(np.ones(4, np.float32), bad)


def test_ollama_normalize_float32_sum():
    x = np.array([3.0, 4.0], np.float32)
    assert np.array_equal(ollama_normalize(x), np.array([0.6, 0.8], np.float32))
    assert np.array_equal(ollama_normalize(np.zeros(3, np.float32)), np.zeros(3, np.float32))


def test_mean_rows_is_a_mean():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((37, 64)).astype(np.float32)
    got = mean_rows(h, [(0, 37), (5, 20)])
    assert np.allclose(got[0], h.mean(0), atol=1e-6) and np.allclose(got[1], h[5:20].mean(0), atol=1e-6)


def test_pooling_from_file_and_override():
    md = {"bert.pooling_type": 2}
    assert pooling_of(md, "bert") == Pooling.CLS
    assert pooling_of({}, "qwen3") == Pooling.NONE                   # llama.cpp's default: none
    assert pooling_of(md, "bert", "mean") == Pooling.MEAN
    assert pooling_of(md, "bert", -1) == Pooling.CLS                 # unspecified: the file's
    assert pooling_of(md, "bert", 3) == Pooling.LAST
    with pytest.raises(InvalidArgument, match="pooling"):
        parse_pooling("max")
    with pytest.raises(InvalidArgument):
        parse_pooling(9)


def test_wordpiece_words():
    assert words("Hello, World!") == ["hello", ",", "world", "!"]
    assert words("Äpfel  über\tdas") == ["apfel", "uber", "das"]          # NFD's first code point: no accents
    assert words("a\x00b\u200bc") == ["ab\u200bc"] or words("a\x00b\u200bc") == ["abc"]
    assert words("数学x") == ["数", "学", "x"]                                # CJK ideographs stand alone
    assert words("") == [] and words("   ") == []


# ------------------------------------------------------------------------ llama.cpp's embeddings
def _params():
    for rec in RECORDS:
        m = rec["model"]
        marks = [] if m["type"] in FLOAT_TYPES else [pytest.mark.oracle]
        for run in rec["runs"]:
            yield pytest.param(rec, run, id=f"{m['id']}-{Pooling(run['pooling_type']).name.lower()}", marks=marks)


_ENGINES: dict = {}


def _engine(rec):
    from ramforge.engine.engine import Engine
    from tools._fixtures import sha256_file
    from tools.record_embeddings import model_file
    mid = rec["model"]["id"]
    if mid not in _ENGINES:
        path = model_file(mid)
        if sha256_file(path) != rec["model"]["sha256"]:
            pytest.skip(f"{path} differs from the recorded file")
        _ENGINES.clear()                          # one loaded at a time
        import numba
        _ENGINES[mid] = Engine.load(path, n_ctx=rec["oracle"]["n_ctx"], n_threads=min(2, numba.config.NUMBA_NUM_THREADS))
    return _ENGINES[mid]


@pytest.mark.parametrize("rec,run", list(_params()))
def test_embeddings_equal_llama_cpp(rec, run):
    from ramforge.generation.embed import Embedder
    eng = _engine(rec)
    emb = Embedder(eng, Pooling(run["pooling_type"]))
    for item in run["items"]:
        if rec["model"]["kind"] in ENCODERS and run["pooling_type"] != Pooling.RANK:
            assert eng.tokenizer.encode(item["text"]) == item["tokens"], item["text"]
        got = emb.embed_tokens(item["tokens"])
        ref = np.asarray(item.get("embedding", item.get("scores")), np.float32)
        assert got.shape == ref.shape
        bound = _bound_ulps(rec) * 2.0 ** -23 * float(np.abs(ref).max())
        d = float(np.abs(got - ref).max())
        assert d <= bound, f"{item['text']!r}: max |d| {d:.3g} > {bound:.3g}"


def _batch_params():
    for rec in RECORDS:
        for run in rec["runs"]:
            if "batch" in run:
                marks = [] if rec["model"]["type"] in FLOAT_TYPES else [pytest.mark.oracle]
                yield pytest.param(rec, run, id=f"{rec['model']['id']}-{Pooling(run['pooling_type']).name.lower()}",
                                   marks=marks)


@pytest.mark.parametrize("rec,run", list(_batch_params()))
def test_packed_embeddings_equal_llama_cpp_batch(rec, run):
    """Several documents in one batch (Embedder.embed_many) equal llama-cpp-python's embed(list), which
    packs them into one llama_decode (a causal model's in its unified KV cache, rank pooling's pairs as
    sequences of one decode), bit for bit; and equal the one-at-a-time pass within the bound, or as far
    from it as llama.cpp's packed pass is from its own alone."""
    from ramforge.generation.embed import EmbedStats, Embedder
    eng = _engine(rec)
    emb = Embedder(eng, Pooling(run["pooling_type"]))
    toks = [it["tokens"] for it in run["items"]]
    st = EmbedStats()
    got = emb.embed_many(toks, stats=st)
    n = sum(map(len, toks))
    assert (st.docs, st.passes, st.tokens) == (len(toks), emb.passes_of(n), n)
    assert st.passes == (1 if not eng.causal else -(-n // eng.plan.batch))
    exact = 0
    for g, ref, t, item in zip(got, run["batch"], toks, run["items"]):
        ref = np.asarray(ref, np.float32)
        bound = _bound_ulps(rec) * 2.0 ** -23 * float(np.abs(ref).max())
        assert float(np.abs(g - ref).max()) <= bound
        # alone and packed differ as llama.cpp's own two passes do (gemma-embedding-tiny-f16, last: ~4300 ulps)
        own = float(np.abs(ref - np.asarray(item.get("embedding", item.get("scores")), np.float32)).max())
        assert float(np.abs(g - emb.embed_tokens(t)).max()) <= max(bound, own)
        exact += bool(np.array_equal(g, ref))
    assert exact == len(toks)                    # packed arithmetic is llama.cpp's packed arithmetic


def test_packs_as_llama_cpp_python():
    """Inputs grouped in order, up to max_tokens tokens and n_seq_max sequences a batch."""
    from ramforge.generation.embed import Embedder

    class _Eng:
        causal, n_ctx = False, 512
        plan = type("P", (), {"batch": 512})()
    emb = Embedder(_Eng(), Pooling.MEAN)
    assert emb.packs([[1] * 300, [1] * 200, [1] * 13, [1] * 512, [1]]) == [[0, 1], [2], [3], [4]]
    emb.n_batch = 4                                     # n_seq_max = min(n_batch, 256)
    assert emb.packs([[1]] * 9) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


def test_hidden_batch_refusals():
    from ramforge.errors import ContextLengthExceeded, EmptyPrompt
    rec = next(r for r in RECORDS if r["model"]["id"] == "bert-tiny-f16")
    eng = _engine(rec)
    with pytest.raises(EmptyPrompt):
        eng.hidden_batch([[101, 102], []])
    with pytest.raises(ContextLengthExceeded, match="513 tokens"):
        eng.hidden_batch([[101] * 300, [101] * 213])
    h, b = eng.hidden_batch([[101, 7592, 102], [101, 102]])
    assert h.shape == (5, eng.hp.n_embd) and b.tolist() == [[0, 3], [3, 5]]
    assert np.array_equal(h[3:], eng.hidden([101, 102]))     # CLS, SEP: 2 tokens, the same lanes


def test_nomic_bert_tensors_are_nomic_embed_texts():
    """The nomic-bert record reads the tensors gguf's converter writes for nomic-embed-text
    (MODEL_TENSORS[NOMIC_BERT]), and the synthetic file has no tensor a real one would not."""
    import gguf
    from ramforge.gguf.reader import GGUFFile
    from ramforge.models import arch_of
    from ramforge.models.weights import gguf_name
    from tools.record_embeddings import model_file
    C = gguf.constants
    real = {C.TENSOR_NAMES[t].format(bid=0) for t in C.MODEL_TENSORS[C.MODEL_ARCH.NOMIC_BERT]}
    a = arch_of("nomic-bert")
    required = {gguf_name(t, 0).rsplit(".", 1)[0] for t in a.tensors if t not in a.optional}
    assert required <= real
    assert {n.rsplit(".", 1)[0] for n in a.global_vectors} <= real
    f = GGUFFile(model_file("nomic-bert-tiny-f16"))
    assert {n.rsplit(".", 1)[0].replace("blk.1.", "blk.0.") for n in f.tensors} <= real
    assert "position_embd.weight" not in f.tensors and not a.causal and a.rope_neox


def test_nomic_bert_needs_layer_norm_epsilon():
    from ramforge.errors import ModelFileError
    from ramforge.models import arch_of
    check = arch_of("nomic-bert").check_metadata
    with pytest.raises(ModelFileError, match="nomic-bert.attention.layer_norm_epsilon"):
        check({"general.architecture": "nomic-bert"})
    with pytest.raises(ModelFileError, match="encoder only"):
        check({"general.architecture": "nomic-bert", "nomic-bert.attention.layer_norm_epsilon": 1e-12,
               "nomic-bert.attention.causal": True})
    with pytest.raises(ModelFileError, match="missing: llama.cpp then runs nomic-bert with causal attention"):
        check({"general.architecture": "nomic-bert", "nomic-bert.attention.layer_norm_epsilon": 1e-12})
    check({"general.architecture": "nomic-bert", "nomic-bert.attention.layer_norm_epsilon": 1e-12,
           "nomic-bert.attention.causal": False})


def test_nomic_bert_model_embeds_with_the_files_mean_pooling():
    """Model.embed of a nomic-bert file pools as its nomic-bert.pooling_type says (mean), as
    llama-cpp-python's Llama(embedding=True).embed does; batch input packed into one pass."""
    import numba
    from ramforge.generation.api import Model
    from tools.record_embeddings import model_file
    rec = next(r for r in RECORDS if r["model"]["id"] == "nomic-bert-tiny-f32")
    run = next(r for r in rec["runs"] if r["pooling_type"] == Pooling.MEAN)
    texts = [it["text"] for it in run["items"]]
    with Model(str(model_file("nomic-bert-tiny-f32")), n_ctx=512,
               n_threads=min(2, numba.config.NUMBA_NUM_THREADS)) as m:
        one = np.asarray(m.embed(texts[1]), np.float32)
        many = np.asarray(m.embed(texts), np.float32)
    ref = np.asarray(run["items"][1]["embedding"], np.float32)
    assert one.shape == (128,) and float(np.abs(one - ref).max()) <= BOUND_ULPS * 2.0 ** -23 * float(np.abs(ref).max())
    for g, b in zip(many, run["batch"]):
        b = np.asarray(b, np.float32)
        assert float(np.abs(g - b).max()) <= BOUND_ULPS * 2.0 ** -23 * float(np.abs(b).max())


def test_nomic_bert_streamed_equals_in_ram():
    """Under a budget below its file (no layer resident: every pass streams the layers) a nomic-bert
    model's packed vectors are its in-RAM vectors bit for bit, in one weight pass."""
    import numba
    from ramforge.engine.engine import Engine
    from ramforge.generation.embed import EmbedStats, Embedder
    from ramforge.memory.budget import MemoryBudget
    from tools.record_embeddings import model_file
    rec = next(r for r in RECORDS if r["model"]["id"] == "nomic-bert-tiny-f16")
    toks = [it["tokens"] for it in _record("nomic-bert-tiny-f16", 1)["items"]]
    ram = Embedder(_engine(rec), Pooling.MEAN).embed_many(toks)
    eng = Engine.load(model_file("nomic-bert-tiny-f16"), n_ctx=512, n_threads=min(2, numba.config.NUMBA_NUM_THREADS),
                      budget=MemoryBudget(7_400_000))
    try:
        assert eng.plan.verdict == "streaming" and not eng.plan.pinned and eng.plan.min_budget <= 7_400_000
        st = EmbedStats()
        got = Embedder(eng, Pooling.MEAN).embed_many(toks, stats=st)
    finally:
        eng.close()
    assert st.passes == 1 and all(np.array_equal(a, b) for a, b in zip(got, ram))


def _jina_params():
    for rec in RECORDS:
        if rec["model"]["kind"] == "jina-bert-v2":
            marks = [] if rec["model"]["type"] in FLOAT_TYPES else [pytest.mark.oracle]
            yield pytest.param(rec, id=rec["model"]["id"], marks=marks)


@pytest.mark.parametrize("rec", list(_jina_params()))
def test_jina_bert_v2_bit_for_bit(rec):
    """jina-bert-v2 (ALiBi over 12 heads, whose slopes 8-11 are inexact; GEGLU; n_embd 192, where ggml_norm's
    float32 mean division matters; the F32 record with q/k norms, attn_norm_2 and ffn_up's bias; a
    jina-reranker-v1 head; jina-v2-code's BPE pre-tokenizer, its tokens checked by test_embeddings_equal_llama_cpp)
    equals llama.cpp's every value, alone and packed: 0 ulps."""
    from ramforge.generation.embed import Embedder
    eng = _engine(rec)
    for run in rec["runs"]:
        emb = Embedder(eng, Pooling(run["pooling_type"]))
        toks = [it["tokens"] for it in run["items"]]
        for t, item in zip(toks, run["items"]):
            ref = np.asarray(item.get("embedding", item.get("scores")), np.float32)
            assert np.array_equal(emb.embed_tokens(t), ref), (run["pooling_type"], item["text"])
        for g, ref in zip(emb.embed_many(toks) if "batch" in run else (), run.get("batch", ())):
            assert np.array_equal(g, np.asarray(ref, np.float32)), run["pooling_type"]


def test_alibi_slopes_as_ggml():
    """ggml_compute_forward_soft_max_f32's slopes: n_head_log2 = 2^floor(log2(n_head)), m0 = 2^(-8/n_head_log2),
    m1 = 2^(-4/n_head_log2), through libm's powf (called here through ctypes)."""
    import ctypes
    import ctypes.util
    from ramforge.kernels.encoder import alibi_slopes
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.powf.restype, libm.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    assert alibi_slopes(2, 8.0).tolist() == [2.0 ** -4, 2.0 ** -8]
    m1 = libm.powf(2.0, -0.5)
    got = alibi_slopes(12, 8.0)
    assert got.dtype == np.float32
    assert got.tolist() == [2.0 ** -(h + 1) for h in range(8)] + [libm.powf(m1, 2 * k + 1) for k in range(4)]


def test_jina_bert_v2_tensors_are_the_converters():
    """The jina-bert-v2 records hold only tensors gguf's converter writes for JINA_BERT_V2 (the F32 one every
    optional tensor llama.cpp reads)."""
    import gguf
    from ramforge.gguf.reader import GGUFFile
    from ramforge.models import arch_of
    from ramforge.models.weights import gguf_name
    from tools.record_embeddings import model_file
    C = gguf.constants
    real = {C.TENSOR_NAMES[t].format(bid=0) for t in C.MODEL_TENSORS[C.MODEL_ARCH.JINA_BERT_V2]}
    a = arch_of("jina-bert-v2")
    assert {gguf_name(t, 0).rsplit(".", 1)[0] for t in a.tensors} <= real and not a.causal
    src = model_file("jina-bert-v2-tiny-f32")
    f = GGUFFile(src)
    assert {n.rsplit(".", 1)[0].replace("blk.1.", "blk.0.") for n in f.tensors} <= real
    assert "blk.0.attn_norm_2.weight" in f.tensors and "blk.0.attn_q_norm.bias" in f.tensors


def test_jina_bert_v2_split_ffn_is_refused(tmp_path):
    """A file with the split FFN llama.cpp's converter no longer writes (ffn_gate, ffn_up n_ff wide) is
    refused (its ffn_gate is a tensor the forward pass does not read), not run wrong."""
    import gguf
    from ramforge.engine.engine import Engine
    from ramforge.models.weights import ModelError
    from tools.record_embeddings import model_file
    r = gguf.GGUFReader(model_file("jina-bert-v2-tiny-f32"))
    out = tmp_path / "split.gguf"
    w = gguf.GGUFWriter(out, "jina-bert-v2")
    for fld in r.fields.values():
        if not fld.name.startswith("GGUF.") and fld.name != "general.architecture":
            vt = fld.types[0]
            w.add_key_value(fld.name, fld.contents(), vt,
                            **({"sub_type": fld.types[-1]} if vt == gguf.GGUFValueType.ARRAY else {}))
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.name.endswith("ffn_up.weight"):
            n_ff = data.shape[0] // 2
            w.add_tensor(t.name.replace("ffn_up", "ffn_gate"), data[:n_ff].copy())
            w.add_tensor(t.name, data[n_ff:].copy())
        elif not t.name.endswith("ffn_up.bias"):
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match=r"blk\.0\.ffn_gate\.weight is not used by ramforge's jina-bert-v2"):
        Engine.load(out, n_ctx=512, n_threads=1)


def test_jina_bert_v2_streamed_equals_llama_cpp():
    """At its plan's minimum budget (no layer resident) the jina-bert-v2 model's packed vectors are still
    llama.cpp's, bit for bit, in one weight pass."""
    from ramforge.engine.engine import Engine
    from ramforge.generation.embed import EmbedStats, Embedder
    from ramforge.memory.budget import MemoryBudget
    from tools.record_embeddings import model_file
    run = _record("jina-bert-v2-tiny-f16", 1)
    path = model_file("jina-bert-v2-tiny-f16")
    probe = Engine.load(path, n_ctx=512, n_threads=1)
    floor = probe.plan.min_budget
    probe.close()
    eng = Engine.load(path, n_ctx=512, n_threads=1, budget=MemoryBudget(floor))
    try:
        assert eng.plan.verdict == "streaming" and not eng.plan.pinned
        st = EmbedStats()
        got = Embedder(eng, Pooling.MEAN).embed_many([it["tokens"] for it in run["items"]], stats=st)
    finally:
        eng.close()
    assert st.passes == 1
    assert all(np.array_equal(g, np.asarray(b, np.float32)) for g, b in zip(got, run["batch"]))


@pytest.mark.parametrize("mid", ["jina-bert-v2-tiny-f16", "bert-tiny-f16"])
def test_encoder_refuses_to_generate(mid):
    """An encoder has no output layer (llama.cpp's graph has no logits): a completion is refused by name
    (Unsupported), not an AttributeError."""
    from ramforge.errors import Unsupported
    from ramforge.generation.api import Model
    from tools.record_embeddings import model_file
    with Model(str(model_file(mid)), n_ctx=512, n_threads=1) as m:
        with pytest.raises(Unsupported, match="embedding model"):
            m.create_completion("Hello", max_tokens=2)
        assert len(m.embed("Hello")) == m.engine.hp.n_embd          # the model still embeds after the refusal


# ------------------------------------------------------------------------ surfaces
@pytest.fixture(scope="module")
def bert_client():
    import numba
    from fastapi.testclient import TestClient

    from ramforge.server.app import create_app
    from ramforge.server.common import ServerConfig
    from tools.record_embeddings import model_file
    app = create_app(ServerConfig(model=str(model_file("bert-tiny-f16")), n_ctx=512,
                                  n_threads=min(2, numba.config.NUMBA_NUM_THREADS)))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _record(mid: str, pooling: int) -> dict:
    rec = next(r for r in RECORDS if r["model"]["id"] == mid)
    return next(run for run in rec["runs"] if run["pooling_type"] == pooling)


def test_server_embeddings_shapes(bert_client):
    c = bert_client
    run = _record("bert-tiny-f16", 1)                      # the file's pooling: mean
    ref = np.asarray(run["items"][0]["embedding"], np.float32)
    r = c.post("/api/embed", json={"input": [run["items"][0]["text"], run["items"][1]["text"]]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["embeddings"]) == 2 and body["prompt_eval_count"] > 0
    e0 = np.asarray(body["embeddings"][0], np.float32)
    assert abs(float(np.linalg.norm(e0)) - 1.0) < 1e-5
    assert np.allclose(e0, ref / np.linalg.norm(ref), atol=1e-4)
    r = c.post("/api/embed", json={"input": "Hello world", "dimensions": 16})
    assert len(r.json()["embeddings"][0]) == 16
    r = c.post("/api/embeddings", json={"prompt": "Hello world"})
    assert np.allclose(r.json()["embedding"], ref, atol=1e-3)          # Ollama's legacy: not normalized
    r = c.post("/v1/embeddings", json={"input": ["Hello world"], "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    import base64
    v = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
    assert np.allclose(v, ref / np.linalg.norm(ref), atol=1e-4) and r.json()["usage"]["prompt_tokens"] == 4
    r = c.post("/embedding", json={"content": "Hello world", "embd_normalize": -1})
    assert np.allclose(np.asarray(r.json()[0]["embedding"][0], np.float32), ref, atol=1e-3)


@pytest.mark.parametrize("path,body,status,words", [
    ("/v1/embeddings", {"input": ""}, 400, "empty"),
    ("/v1/embeddings", {"input": ["a", ""]}, 400, "input[1]"),
    ("/api/embed", {"input": "Hello", "dimensions": 4096}, 400, "dimensions"),
    ("/api/embed", {"input": "word " * 600, "truncate": False}, 400, "tokens"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "hex"}, 400, "encoding_format"),
    ("/embedding", {"content": "a", "embd_normalize": -3}, 400, "embd_normalize"),
    ("/rerank", {"query": "q", "documents": ["a"]}, 501, "rank pooling"),
])
def test_server_embeddings_refusals(bert_client, path, body, status, words):
    r = bert_client.post(path, json=body)
    assert r.status_code == status, r.text
    assert words in r.text


def test_api_embed_shapes():
    from ramforge.generation.api import Model
    from tools.record_embeddings import model_file
    import numba
    run = _record("bert-tiny-f16", 2)
    with Model(str(model_file("bert-tiny-f16")), n_ctx=512, n_threads=min(2, numba.config.NUMBA_NUM_THREADS)) as m:
        one = m.embed("Hello world", pooling_type="cls")
        assert np.allclose(one, run["items"][0]["embedding"], atol=1e-3) and isinstance(one[0], float)
        many, n = m.embed(["Hello world", "The quick brown fox jumps over the lazy dog."], normalize=True,
                          return_count=True, pooling_type="cls")
        assert len(many) == 2 and n == 4 + len(run["items"][1]["tokens"])
        assert abs(sum(x * x for x in many[1]) - 1.0) < 1e-9
        resp = m.create_embedding("Hello world")
        assert resp["object"] == "list" and resp["data"][0]["index"] == 0 and resp["usage"]["total_tokens"] == 4


def test_rerank_orders_by_score():
    import numba
    from fastapi.testclient import TestClient

    from ramforge.server.app import create_app
    from ramforge.server.common import ServerConfig
    from tools.record_embeddings import model_file
    run = _record("bert-rank-f16", 4)
    app = create_app(ServerConfig(model=str(model_file("bert-rank-f16")), n_ctx=512,
                                  n_threads=min(2, numba.config.NUMBA_NUM_THREADS)))
    docs = [it["text"] for it in run["items"]]
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/rerank", json={"query": "what is a fox?", "documents": docs, "top_n": 3,
                                       "return_documents": True})
        assert r.status_code == 200, r.text
    res = r.json()["results"]
    ref = [it["scores"][0] for it in run["items"]]
    assert [x["index"] for x in res] == sorted(range(len(docs)), key=lambda i: -ref[i])[:3]
    for x in res:
        assert abs(x["relevance_score"] - ref[x["index"]]) <= 1e-4 * max(1.0, abs(ref[x["index"]]))
        assert x["document"]["text"] == docs[x["index"]]


@pytest.mark.parametrize("mid,pooling", [("qwen3-tiny-f16", 1), ("qwen3-rerank-f16", 4), ("llama-tiny-f16", 3),
                                         ("gemma3-linear-f16", 1)])
def test_causal_pack_in_small_chunks_equals_llama_cpp_batch(mid, pooling):
    """A causal model's packed batch computed in chunks of 16 rows (a small budget's chunk: each chunk a
    pass over the weights, the batch's keys of earlier chunks read from the KV cache) is still llama.cpp's
    one-ubatch result, bit for bit, and counts its passes: qwen3, llama (an output matrix of its own) and
    gemma3 (windows of 8 crossing the chunks and the 47-token document)."""
    import numba

    from ramforge.engine.engine import Engine
    from ramforge.generation.embed import EmbedStats, Embedder
    from tools.record_embeddings import model_file
    rec = next(r for r in RECORDS if r["model"]["id"] == mid)
    run = next(r for r in rec["runs"] if r["pooling_type"] == pooling)
    eng = Engine.load(model_file(mid), n_ctx=512, batch=16, n_threads=min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        assert eng.causal and eng.packs_causal and eng.plan.batch == 16
        toks = [it["tokens"] for it in run["items"]]
        st = EmbedStats()
        got = Embedder(eng, Pooling(pooling)).embed_many(toks, stats=st)
        n = sum(map(len, toks))
        assert (st.docs, st.passes) == (len(toks), -(-n // 16)) and st.docs_per_pass == len(toks) / st.passes
        for g, ref in zip(got, run["batch"]):
            assert np.array_equal(g, np.asarray(ref, np.float32))
        assert eng.kv.n_past == 0 and eng.tokens == []          # the pack leaves no sequence behind
    finally:
        eng.close()


def test_parallel_sequences_refuse_causal_embeddings_untouched():
    """An engine of parallel sequences (serve --parallel: their generations share its KV cells) refuses a
    causal model's embeddings by name, before it frees a cell: sequence 0's generation keeps its cache."""
    import numba

    from ramforge.engine.engine import Engine
    from ramforge.errors import NotReproduced
    from ramforge.generation.embed import Embedder
    from tools.record_embeddings import model_file
    with Engine.load(model_file("qwen3-tiny-f16"), n_ctx=512, n_seq=2,
                     n_threads=min(2, numba.config.NUMBA_NUM_THREADS)) as eng:
        want = eng.eval_batch([(0, [9707, 1879, 13]), (1, [785, 3974])])
        with pytest.raises(NotReproduced, match="2 parallel sequences"):
            Embedder(eng, Pooling.MEAN).embed_many([[9707, 1879]])
        assert eng.tokens == [9707, 1879, 13] and eng.seq_tokens[1] == [785, 3974]
        eng.seq_rm(0, -1, -1)
        eng.seq_rm(1, -1, -1)
        again = eng.eval_batch([(0, [9707, 1879, 13]), (1, [785, 3974])])
        assert all(np.array_equal(want[s], again[s]) for s in (0, 1))
