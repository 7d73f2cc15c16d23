"""gemma-embedding's encoder attention (a symmetric sliding window, grouped-query heads), Qwen3-Reranker
scoring on the /rerank surface and Llama, and `ramforge serve --pooling`. The records themselves
(tests/fixtures/embeddings/gemma-embedding-*.json, qwen3-rerank-f16.json) are replayed by
tests/test_embeddings.py's record tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ramforge.kernels.encoder import encoder_attention

EMBED_DIR = Path(__file__).parent / "fixtures" / "embeddings"


def _run(mid: str, pooling: int) -> dict:
    rec = json.loads((EMBED_DIR / f"{mid}.json").read_text())
    return next(r for r in rec["runs"] if r["pooling_type"] == pooling)


def _threads() -> int:
    import numba
    return min(2, numba.config.NUMBA_NUM_THREADS)


def _reference_attention(q, k, v, bounds, window):
    """softmax(q k^T) v per sequence in float64, key head h // (H / Hk), keys within window // 2."""
    n, H, D = q.shape
    g = H // k.shape[1]
    out = np.zeros((n, H, D))
    for a, b in bounds:
        for i in range(a, b):
            lo, hi = (max(a, i - window // 2), min(b, i + window // 2 + 1)) if window else (a, b)
            for h in range(H):
                s = k[lo:hi, h // g].astype(np.float64) @ q[i, h].astype(np.float64)
                p = np.exp(s - s.max())
                out[i, h] = (p / p.sum()) @ v[lo:hi, h // g]
    return out


@pytest.mark.parametrize("window", [0, 4, 8])
def test_encoder_attention_symmetric_window_and_gqa(window):
    rng = np.random.default_rng(window)
    n, H, Hk, D = 23, 4, 2, 16
    q, k, v = (rng.standard_normal((n, h, D)).astype(np.float32) for h in (H, Hk, Hk))
    bounds = np.array([[0, 9], [9, 23]], np.int64)
    out = np.empty((n, H, D), np.float32)
    encoder_attention(out, q, k, v, bounds, 1.0, window)
    assert np.allclose(out, _reference_attention(q, k, v, bounds, window), atol=2e-5)


def test_gemma_embedding_cannot_generate():
    from ramforge.engine.engine import Engine
    from ramforge.errors import Unsupported
    from tools.record_embeddings import model_file
    eng = Engine.load(model_file("gemma-embedding-tiny-f32"), n_ctx=512, n_threads=_threads())
    assert not eng.causal and eng.arch.pooled_out is not None
    with pytest.raises(Unsupported, match="embedding model"):
        eng.eval([1, 2, 3])


def _rerank_app(**cfg):
    from fastapi.testclient import TestClient

    from ramforge.server.app import create_app
    from ramforge.server.common import ServerConfig
    from tools.record_embeddings import model_file
    app = create_app(ServerConfig(model=str(model_file("qwen3-rerank-f16")), n_ctx=512, n_threads=_threads(), **cfg))
    return TestClient(app, raise_server_exceptions=False)


def test_qwen3_reranker_scores_as_llama_cpp():
    """/v1/rerank on a Qwen3-Reranker: the file's rerank template, the last token's yes/no softmax, the
    "yes" probability as the score (llama-server's embd[0]); the order is llama.cpp's."""
    run = _run("qwen3-rerank-f16", 4)
    docs = [it["text"] for it in run["items"]]
    ref = [it["scores"][0] for it in run["items"]]
    with _rerank_app() as c:
        r = c.post("/v1/rerank", json={"query": "what is a fox?", "documents": docs})
        assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["index"] for x in res] == sorted(range(len(docs)), key=lambda i: -ref[i])
    for x in res:
        assert abs(x["relevance_score"] - ref[x["index"]]) <= 1024 * 2.0 ** -23
        assert 0.0 < x["relevance_score"] < 1.0


def test_qwen3_reranker_tokens_and_llama_embed():
    from ramforge import Llama
    from ramforge.generation.api import Model
    from tools.record_embeddings import model_file
    run = _run("qwen3-rerank-f16", 4)
    path = str(model_file("qwen3-rerank-f16"))
    with Model(path, n_ctx=512, n_threads=_threads()) as m:
        emb = m.embedder()
        assert emb.rerank_template is not None
        assert emb.rerank_tokens("what is a fox?", run["items"][0]["text"]) == run["items"][0]["tokens"]
    with Llama(path, embedding=True, pooling_type=4, n_ctx=512, n_threads=_threads(), verbose=False) as llm:
        got = llm.embed([it["tokens"] for it in run["items"]])
    for g, it in zip(got, run["items"]):
        assert np.allclose(g, it["scores"], atol=1024 * 2.0 ** -23) and abs(sum(g) - 1.0) < 1e-6


def test_serve_pooling_overrides_the_files():
    """--pooling last on a reranker file (rank pooling): /embedding answers the last token's vector, equal
    to llama.cpp's pooling-last record of qwen3-tiny-f16 (the same weights: the reranker adds only its
    head), and /rerank is refused; --pooling mean answers another vector."""
    from ramforge.cli.serve import serve
    assert any(p.name == "pooling" for p in serve.params)
    with _rerank_app(pooling="last") as c:
        r = c.post("/embedding", json={"content": "Hello world", "embd_normalize": -1})
        assert r.status_code == 200, r.text
        v = np.asarray(r.json()[0]["embedding"][0], np.float32)
        ref = np.asarray(_run("qwen3-tiny-f16", 3)["items"][0]["embedding"], np.float32)
        assert float(np.abs(v - ref).max()) <= 4096 * 2.0 ** -23 * float(np.abs(ref).max())
        r = c.post("/rerank", json={"query": "q", "documents": ["a"]})
        assert r.status_code == 501 and "rank pooling" in r.text
    with _rerank_app(pooling="mean") as c:
        w = np.asarray(c.post("/embedding", json={"content": "Hello world", "embd_normalize": -1}).json()[0]
                       ["embedding"][0], np.float32)
    assert not np.allclose(v, w)
