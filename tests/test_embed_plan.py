"""The embedding plan (stream/embed_plan.py): tokens per pass over the weights sized from the budget,
`ramforge plan --embed`, the refusal where not one document fits, and an engine loaded for embedding
(streaming, its packed batches in chunks of the plan's pass) still equal to llama.cpp's packed records."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ramforge.errors import BudgetTooSmall, http_status
from ramforge.gguf.reader import GGUFFile
from ramforge.stream.embed_plan import EMBED_BATCHES, EmbedBudgetTooSmall, embed_plan
from ramforge.stream.plan import RESIDENT_BATCH, Verdict, make_plan, plan_for_budget

ROOT = Path(__file__).resolve().parents[1]
RECORDS = Path(__file__).parent / "fixtures" / "embeddings"


def _model(mid: str) -> str:
    from tools.record_embeddings import model_file
    return str(model_file(mid))


def test_embed_plan_takes_the_pass_that_reads_least_per_token():
    with GGUFFile(_model("qwen3-tiny-f16")) as f:
        whole, eb = embed_plan(f, None, 512)
        assert whole.verdict == Verdict.RESIDENT and whole.batch == RESIDENT_BATCH and eb.pack_tokens == 512
        least = whole.min_budget
        for budget in (least, least * 3 // 2, whole.resident_budget * 3 // 5, whole.resident_budget):
            p, eb = embed_plan(f, budget, 512)
            assert p.verdict != Verdict.INSUFFICIENT and p.budget == budget and p.min_budget == least
            ok = [q for q in (make_plan(f, budget, 512, b, logits=False) for b in EMBED_BATCHES)
                  if q.verdict != Verdict.INSUFFICIENT]
            if p.verdict == Verdict.RESIDENT:
                assert p.batch == max(q.batch for q in ok if q.verdict == Verdict.RESIDENT and q.batch <= RESIDENT_BATCH)
            else:           # no other chunk reads fewer bytes a token, none as few is bigger
                best = min(q.streamed_bytes_per_token / q.batch for q in ok)
                assert p.streamed_bytes_per_token / p.batch == best
                assert p.batch == max(q.batch for q in ok if q.streamed_bytes_per_token / q.batch == best)
            assert (eb.tokens_per_pass, eb.streamed_bytes_per_pass) == (p.batch, p.streamed_bytes_per_token)
            assert eb.docs_per_pass == p.batch / 200
        # a streaming budget that holds a whole ubatch's activations passes 512 tokens a pass, where the
        # generation plan's prompt chunk stops at 64
        mid, _ = embed_plan(f, whole.resident_budget * 3 // 5, 512)
        assert mid.verdict == Verdict.STREAMING and mid.batch == 512
        assert plan_for_budget(f, whole.resident_budget * 3 // 5, 512).batch == 64
        # the smallest budget that plans at all: a 1-token pass
        assert embed_plan(f, least, 512)[0].batch == 1
        # a context under 512 tokens packs only that many
        assert embed_plan(f, None, 100)[1].pack_tokens == 100


def test_embed_plan_refuses_when_not_one_document_fits():
    with GGUFFile(_model("qwen3-tiny-f16")) as f:
        least = embed_plan(f, None, 512)[0].min_budget
        with pytest.raises(EmbedBudgetTooSmall, match=f"needs at least {least:,} B") as e:
            embed_plan(f, least - 1, 512)
    assert e.value.minimum == least and e.value.pack == 512
    assert isinstance(e.value, BudgetTooSmall) and http_status(e.value) == 507


def _plan_cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(ROOT))
    env.pop("RAMFORGE_KV_TYPE", None)
    return subprocess.run([sys.executable, "-m", "ramforge", "plan", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_plan_cli_reports_the_embedding_batch():
    tiny, rerank = _model("qwen3-tiny-f16"), _model("qwen3-rerank-f16")
    gen = json.loads(_plan_cli(tiny, "--ram", "50M", "--json").stdout)
    assert "embed" not in gen and gen["batch"] == 64                       # a generating model: asked only
    emb = json.loads(_plan_cli(tiny, "--ram", "50M", "--json", "--embed", "--doc-tokens", "100").stdout)
    assert emb["embed"]["tokens_per_pass"] == emb["batch"] == 512 and emb["embed"]["docs_per_pass"] == 5.12
    auto = json.loads(_plan_cli(rerank, "--ram", "50M", "--json").stdout)  # a pooling type: always
    assert auto["embed"]["tokens_per_pass"] == auto["batch"]
    text = _plan_cli(tiny, "--ram", "50M", "--embed").stdout
    assert "embedding: 512 tokens per pass over the weights, about 2.56 documents of 200 tokens" in text
    bad = _plan_cli(tiny, "--ram", "1M", "--embed")
    assert bad.returncode != 0 and "cannot embed even one document" in bad.stderr


def test_engine_loaded_for_embedding_streams_and_stays_bit_exact():
    """A Qwen3-Reranker under a budget that streams it: the plan's pass of 64 tokens, the 376 tokens of
    the four pairs one llama_decode in 6 passes, each pair's scores llama.cpp's packed ones bit for bit."""
    import numba

    from ramforge.engine.engine import Engine
    from ramforge.generation.embed import EmbedStats, Embedder, Pooling
    from ramforge.memory import MemoryBudget
    path = _model("qwen3-rerank-f16")
    with GGUFFile(path) as f:
        budget = embed_plan(f, None, 512)[0].min_budget * 3 // 2
        want = embed_plan(f, budget, 512)[0]
    assert want.verdict == Verdict.STREAMING and want.batch == 64
    run = next(r for r in json.loads((RECORDS / "qwen3-rerank-f16.json").read_text())["runs"] if r["pooling_type"] == 4)
    toks = [it["tokens"] for it in run["items"]]
    with Engine.load(path, n_ctx=512, budget=MemoryBudget(budget), embed=True,
                     n_threads=min(2, numba.config.NUMBA_NUM_THREADS)) as eng:
        assert eng.plan.batch == 64 and eng.plan.verdict == Verdict.STREAMING and eng.packs_causal
        st = EmbedStats()
        got = Embedder(eng, Pooling.RANK).embed_many(toks, stats=st)
    n = sum(map(len, toks))
    assert (st.docs, st.tokens, st.passes) == (4, n, -(-n // 64))
    for g, ref in zip(got, run["batch"]):
        assert np.array_equal(g, np.asarray(ref, np.float32))


# ---- the output matrix an embedding pass never reads --------------------------------------------
def test_embed_plan_leaves_the_output_matrix_out():
    """llama-tiny-f16 has its own output matrix (16 MB of its 38): an embedding pass never reads it, so
    the embedding plan neither keeps it resident nor counts it among the bytes a pass streams, and holds
    the model whole with that much less (the generation plan still counts it)."""
    with GGUFFile(_model("llama-tiny-f16")) as f:
        out = f.tensors["output.weight"].nbytes
        whole = embed_plan(f, None, 512)[0]
        gen = make_plan(f, None, 512, whole.batch)
        assert out > 0 and "output.weight" not in whole.resident and "output.weight" in gen.resident
        assert not whole.logits and gen.logits
        assert whole.resident_budget == gen.resident_budget - out
        assert whole.active_bytes_per_token == gen.active_bytes_per_token - out
        # a pipeline's middle stage computes with its layers and the norms, neither the output nor the embedding
        middle = make_plan(f, None, 512, 64, layers=(1, 2))
        assert middle.active_bytes_per_token == sum(t.nbytes for n, t in f.tensors.items() if n.startswith("blk.1.")) \
            + f.tensors["output_norm.weight"].nbytes
        # a budget the generation plan streams the output matrix under (every layer pinned) holds the
        # embedding plan whole; below it, a pass streams its unpinned layers and embedding rows, no output
        mid = (whole.resident_budget + gen.resident_budget) // 2
        g = plan_for_budget(f, mid, 512)
        assert g.verdict == Verdict.STREAMING and g.streamed_bytes_per_token >= out
        assert embed_plan(f, mid, 512)[0].verdict == Verdict.RESIDENT
        p = embed_plan(f, whole.resident_budget // 4, 512)[0]
        assert p.verdict == Verdict.STREAMING
        lb = dict(zip(range(*p.layers), p.layer_bytes))
        rows = f.tensors["token_embd.weight"].nbytes // 32000 if "token_embd.weight" not in p.resident else 0
        assert p.streamed_bytes_per_token == sum(b for i, b in lb.items() if i not in p.pinned) + rows


def test_engine_loaded_for_embedding_refuses_logits():
    """An engine loaded under the embedding plan holds no output matrix: it embeds (llama.cpp's packed
    record, bit for bit) and refuses to compute logits by name."""
    import numba

    from ramforge.engine.engine import Engine
    from ramforge.errors import Unsupported
    from ramforge.generation.embed import Embedder, Pooling
    from ramforge.memory import MemoryBudget
    path = _model("llama-tiny-f16")
    with GGUFFile(path) as f:
        budget = embed_plan(f, None, 512)[0].resident_budget
        assert make_plan(f, budget, 512, RESIDENT_BATCH).verdict == Verdict.STREAMING   # (counting the output)
    run = next(r for r in json.loads((RECORDS / "llama-tiny-f16.json").read_text())["runs"] if r["pooling_type"] == 1)
    with Engine.load(path, n_ctx=512, budget=MemoryBudget(budget), embed=True,
                     n_threads=min(2, numba.config.NUMBA_NUM_THREADS)) as eng:
        assert eng.plan.verdict == Verdict.RESIDENT and eng.weights.output is None
        got = Embedder(eng, Pooling.MEAN).embed_many([it["tokens"] for it in run["items"]])
        for g, ref in zip(got, run["batch"]):
            assert np.array_equal(g, np.asarray(ref, np.float32))
        with pytest.raises(Unsupported, match="loaded for embeddings"):
            eng.eval([1, 2, 3])


# ---- a model loaded to generate embeds in the embedding plan's chunk where the budget allows ---------
def _hp(f):
    from ramforge.models.config import HParams
    from ramforge.stream.plan import n_vocab_of
    return HParams.from_metadata(f.metadata, n_vocab_of(f))


def _growing_budget(path: str, n: int) -> int:
    """A budget under which the generation plan streams layers in 64-token chunks and leaves room for a
    bigger chunk for a packed batch of n tokens (its KV cells fill the 512-position cache: the budget
    left is the plan's peak's rest), found on the plans' own arithmetic."""
    from ramforge.stream.embed_plan import pass_chunk
    with GGUFFile(path) as f:
        hp = _hp(f)
        lo, hi = plan_for_budget(f, 10 ** 6, 512).min_budget, plan_for_budget(f, None, 512).resident_budget
        for b in range(lo, hi, 125_000):
            p = plan_for_budget(f, b, 512)
            if p.batch == 64 and len(p.pinned) < len(p.layer_bytes) and \
                    pass_chunk(hp, p, n, b - p.planned_peak).batch > 64:
                return b
    raise AssertionError("no budget lets a packed batch take a bigger chunk")


def test_pass_chunk_rule():
    from ramforge.stream.embed_plan import PassChunk, activation_bytes, pass_chunk
    with GGUFFile(_model("qwen3-rerank-f16")) as f:
        hp = _hp(f)
        b = _growing_budget(f.path, 376)
        p = plan_for_budget(f, b, 512)
        base = activation_bytes(hp, p, 64)
        assert pass_chunk(hp, p, 376, None) == PassChunk(512, 376, activation_bytes(hp, p, 376) - base)
        assert pass_chunk(hp, p, 100, None).rows == 100                 # never more rows than the batch
        need256 = activation_bytes(hp, p, 256) - base
        assert pass_chunk(hp, p, 376, need256) == PassChunk(256, 256, need256)
        assert pass_chunk(hp, p, 376, need256 - 1).batch == 128
        assert pass_chunk(hp, p, 376, 0) == PassChunk(64, 64)            # no room: the plan's own
        assert pass_chunk(hp, p, 64, None) == PassChunk(64, 64)          # one chunk of it already
        assert pass_chunk(hp, p, 376, None, ubatch=128).batch == 128     # never past the ubatch
        whole = plan_for_budget(f, None, 512)                           # resident: the plan's (RESIDENT_BATCH)
        assert pass_chunk(hp, whole, 376, None) == PassChunk(whole.batch, whole.batch)
        pinned = plan_for_budget(f, whole.resident_budget - 1, 512)     # every layer pinned: a pass reads nothing
        assert pinned.verdict == Verdict.STREAMING and len(pinned.pinned) == len(pinned.layer_bytes)
        assert pass_chunk(hp, pinned, 376, None) == PassChunk(64, 64)


def _rerank_run() -> dict:
    return next(r for r in json.loads((RECORDS / "qwen3-rerank-f16.json").read_text())["runs"] if r["pooling_type"] == 4)


def test_generation_engine_packs_in_the_embedding_chunk_without_leaking():
    """A Qwen3-Reranker loaded to generate (its prompt chunk 64 tokens) under a budget that streams its
    layers: the four pairs' 376 tokens take chunks of 128 (3 passes over the weights, not 6), their
    activations charged for the batch and given back, every score llama.cpp's packed one bit for bit."""
    import numba

    from ramforge.engine.engine import Engine
    from ramforge.generation.embed import EmbedStats, Embedder, Pooling
    from ramforge.memory import MemoryBudget
    path = _model("qwen3-rerank-f16")
    run = _rerank_run()
    toks = [it["tokens"] for it in run["items"]]
    n = sum(map(len, toks))
    budget = MemoryBudget(_growing_budget(path, n))
    with Engine.load(path, n_ctx=512, budget=budget, n_threads=min(2, numba.config.NUMBA_NUM_THREADS)) as eng:
        assert eng.plan.batch == 64 and eng.plan.verdict == Verdict.STREAMING and eng.plan.logits
        emb = Embedder(eng, Pooling.RANK)
        for _ in range(2):                                   # the second batch finds the books as the first left them
            before = budget.charges()
            st = EmbedStats()
            got = emb.embed_many(toks, stats=st)
            assert eng.last_pack.chunk > 64 and st.chunk == eng.last_pack.chunk
            assert st.passes == -(-n // eng.last_pack.chunk) < -(-n // 64)
            for g, ref in zip(got, run["batch"]):
                assert np.array_equal(g, np.asarray(ref, np.float32))
            after = budget.charges()
            assert "embedding activations" not in dict(after) and dict(after).keys() == dict(before).keys()
            assert eng.state.x.shape[0] == 64 and budget.peak <= budget.limit
        state, books, run_chunk = eng.state, budget.charges(), eng.run_chunk

        def fails_second(inp, c, embd=False):                 # a pass that fails mid-batch gives all back
            if c.start:
                raise RuntimeError("a failed pass")
            return run_chunk(inp, c, embd)
        eng.run_chunk = fails_second
        with pytest.raises(RuntimeError, match="a failed pass"):
            emb.embed_many(toks)
        del eng.run_chunk
        assert eng.state is state and budget.charges() == books and eng.kv.n_past == 0
        eng.reset()
        assert eng.eval(toks[0]).shape == (1, eng.hp.n_vocab)    # and still generates in its own chunk


def test_served_rerank_and_model_take_the_embedding_chunk():
    """`ramforge serve --ram` and Model(ram=) on the same budget: /v1/rerank and Model.embed pack in the
    bigger chunk (Engine.last_pack), llama.cpp's packed scores bit for bit, nothing left charged."""
    import numba
    from fastapi.testclient import TestClient

    from ramforge.generation.api import Model
    from ramforge.server.app import create_app
    from ramforge.server.common import ServerConfig
    path = _model("qwen3-rerank-f16")
    run = _rerank_run()
    n = sum(len(it["tokens"]) for it in run["items"])
    ram = _growing_budget(path, n)
    threads = min(2, numba.config.NUMBA_NUM_THREADS)
    app = create_app(ServerConfig(model=path, n_ctx=512, n_threads=threads, ram=ram))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/rerank", json={"query": "what is a fox?", "documents": [it["text"] for it in run["items"]]})
        assert r.status_code == 200, r.text
        eng = app.state.manager.current.model.engine
        assert eng.plan.batch == 64 and eng.last_pack.chunk > 64 and eng.last_pack.tokens == n
        assert "embedding activations" not in dict(eng.budget.charges())
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert got == {i: float(np.float32(ref[0])) for i, ref in enumerate(run["batch"])}
    with Model(path, ram=ram, n_ctx=512, n_threads=threads) as m:
        vecs = m.embed([it["tokens"] for it in run["items"]], pooling_type="rank")
        assert m.engine.last_pack.chunk > 64 and "embedding activations" not in dict(m.budget.charges())
    for v, ref in zip(vecs, run["batch"]):
        assert np.array_equal(np.asarray(v, np.float32), np.asarray(ref, np.float32))


def test_mixture_streaming_its_experts_packs_in_the_bigger_chunk():
    """qwen3moe streaming its experts (a 64-token prompt chunk): a packed batch takes one pass of a whole
    ubatch where the budget left holds its activations, its vectors those of an engine whose chunk is the
    whole ubatch, bit for bit."""
    import numba

    from ramforge.engine.engine import Engine
    from ramforge.generation.embed import EmbedStats, Embedder, Pooling
    from ramforge.memory import MemoryBudget
    from ramforge.stream.embed_plan import pass_chunk
    from tools.make_models import ensure_model
    path = str(ensure_model("qwen3moe", "F16"))
    rec = json.loads((RECORDS / "qwen3-tiny-f16.json").read_text())            # (qwen3moe shares its vocabulary)
    toks = [it["tokens"] for it in rec["runs"][1]["items"]] * 3
    n = sum(map(len, toks))
    with GGUFFile(path) as f:
        hp = _hp(f)
        budget = next(b for b in range(plan_for_budget(f, 10 ** 6, 512).min_budget, 10 ** 9, 500_000)
                      if (p := plan_for_budget(f, b, 512)).batch == 64 and p.experts_apart
                      and pass_chunk(hp, p, n, b - p.planned_peak).rows == n)
    threads = min(2, numba.config.NUMBA_NUM_THREADS)
    out = []
    for kw in (dict(budget=MemoryBudget(budget)), dict(batch=512)):
        with Engine.load(path, n_ctx=512, n_threads=threads, **kw) as eng:
            st = EmbedStats()
            out.append(Embedder(eng, Pooling.MEAN).embed_many(toks, stats=st))
            assert st.passes == 1 and eng.last_pack.chunk == 512
            assert "embedding activations" not in dict(eng.budget.charges())
            if "budget" in kw:
                assert eng.plan.batch == 64 and eng.plan.experts_apart
    for a, b in zip(*out):
        assert np.array_equal(a, b)
