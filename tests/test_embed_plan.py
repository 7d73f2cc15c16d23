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
            ok = [q for q in (make_plan(f, budget, 512, b) for b in EMBED_BATCHES) if q.verdict != Verdict.INSUFFICIENT]
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
