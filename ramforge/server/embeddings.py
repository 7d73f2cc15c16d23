"""Embeddings and reranking over HTTP: Ollama's /api/embed and /api/embeddings, OpenAI's /v1/embeddings,
llama-server's /embedding (/embeddings) and /rerank (/v1/rerank, /v1/reranking).

Each request holds the model lock while it embeds (generation/embed.py on the model's worker thread);
its inputs are bounded (MAX_INPUTS, each cut to the model's batch or refused without truncate).
"""
from __future__ import annotations

import base64
import time
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from ..errors import EmptyPrompt, InvalidArgument, RequestTooLarge
from ..kernels.pool import embd_normalize, ollama_normalize
from .common import parse_keep_alive
from .manager import manager_of

router = APIRouter()
MAX_INPUTS = 2048            # inputs in one request (OpenAI's limit)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class OllamaEmbed(_Body):
    model: str | None = None
    input: str | list[str] | None = None
    truncate: bool = True
    dimensions: int | None = None
    keep_alive: Any = None
    options: dict | None = None


class OllamaEmbeddings(_Body):
    model: str | None = None
    prompt: str | None = None
    keep_alive: Any = None
    options: dict | None = None


class OpenAIEmbed(_Body):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None
    encoding_format: str = "float"
    dimensions: int | None = None


class LlamaEmbed(_Body):
    content: str | list[str] | list[int] | list[list[int]] | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None
    embd_normalize: int = 2


class Rerank(_Body):
    model: str | None = None
    query: str
    documents: list[str] | None = None
    texts: list[str] | None = None
    top_n: int | None = None
    return_documents: bool = False


def _inputs(value, what: str, empty_ok: bool = False) -> list:
    """A request's inputs as a list of texts or token lists, bounded and never empty."""
    if value is None or value == "" or value == []:
        if empty_ok:
            return []
        raise EmptyPrompt(f"{what} is empty: give a string, a list of strings or of token ids")
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(t, int) for t in value)):
        items = [value]
    else:
        items = list(value)
    if len(items) > MAX_INPUTS:
        raise RequestTooLarge(f"{what} has {len(items)} inputs; at most {MAX_INPUTS} in one request")
    for i, it in enumerate(items):
        if it == "" or it == []:
            raise EmptyPrompt(f"{what}[{i}] is empty")
    return items


async def _run(request: Request, name: str | None, keep_alive, fn):
    """fn(model) on the model's worker thread, holding the model lock; (result, load seconds)."""
    mgr = manager_of(request)
    target = await anyio.to_thread.run_sync(mgr.resolve, name)   # once, before it queues: an unknown name is 404
    await mgr.acquire()
    try:
        loaded, load_s = await mgr.ensure(target)
        return await mgr.call(fn, loaded.model), load_s, loaded.name
    finally:
        await mgr.release(parse_keep_alive(keep_alive) if keep_alive is not None else None)


def _embed_all(model, items, truncate: bool, pooled_for: str | None, normalize: int = -1):
    emb = model.embedder()
    if pooled_for:
        emb.require_pooled(pooled_for)
    toks = [emb.tokens(it, truncate) for it in items]       # every input checked before any is embedded
    return emb.embed_many(toks, normalize), sum(len(t) for t in toks), emb.n_embd


def _dimensions(vecs: list, dims: int | None, n_embd: int) -> list:
    """Ollama's `dimensions`: the first d values of each vector, normalized again."""
    if dims is None or dims == n_embd:
        return vecs
    if isinstance(dims, bool) or not 1 <= dims <= n_embd:
        raise InvalidArgument(f"dimensions = {dims!r}: this model's embeddings have {n_embd}; give 1 to {n_embd}")
    return [ollama_normalize(v[:dims]) for v in vecs]


@router.post("/api/embed")
async def ollama_embed(req: OllamaEmbed, request: Request):
    t0 = time.perf_counter()
    items = _inputs(req.input, "input", empty_ok=True)
    if not items:                                    # Ollama's way to load a model: no input, no vectors
        _, load_s, name = await _run(request, req.model, req.keep_alive, lambda m: None)
        return {"model": req.model or name, "embeddings": []}

    def work(model):
        vecs, n, n_embd = _embed_all(model, items, req.truncate, "/api/embed")
        vecs = [ollama_normalize(v) for v in vecs]
        return _dimensions(vecs, req.dimensions, n_embd), n
    (vecs, n), load_s, name = await _run(request, req.model, req.keep_alive, work)
    return {"model": req.model or name, "embeddings": [v.tolist() for v in vecs],
            "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": int(load_s * 1e9),
            "prompt_eval_count": n}


@router.post("/api/embeddings")
async def ollama_embeddings(req: OllamaEmbeddings, request: Request):
    if not req.prompt:
        await _run(request, req.model, req.keep_alive, lambda m: None)
        return {"embedding": []}
    (vecs, _, _), _, _ = await _run(request, req.model, req.keep_alive,
                                    lambda m: _embed_all(m, [req.prompt], True, "/api/embeddings"))
    return {"embedding": vecs[0].tolist()}


@router.post("/v1/embeddings")
async def openai_embeddings(req: OpenAIEmbed, request: Request):
    if req.encoding_format not in ("float", "base64"):
        raise InvalidArgument(f"encoding_format = {req.encoding_format!r}: 'float' or 'base64'")
    items = _inputs(req.input, "input")

    def work(model):
        vecs, n, n_embd = _embed_all(model, items, True, "/v1/embeddings (pooling none is not OpenAI-compatible)", 2)
        return _dimensions(vecs, req.dimensions, n_embd), n
    (vecs, n), _, name = await _run(request, req.model, None, work)

    def enc(v):
        return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() if req.encoding_format == "base64" \
            else v.tolist()
    return {"object": "list", "model": req.model or name,
            "data": [{"object": "embedding", "index": i, "embedding": enc(v)} for i, v in enumerate(vecs)],
            "usage": {"prompt_tokens": n, "total_tokens": n}}


@router.post("/embedding")
@router.post("/embeddings")
async def llama_embedding(req: LlamaEmbed, request: Request):
    items = _inputs(req.input if req.input is not None else req.content, "content")
    embd_normalize(np.zeros(1, np.float32), req.embd_normalize)          # a bad mode refused before the lock
    (vecs, _, _), _, _ = await _run(request, None, None, lambda m: _embed_all(m, items, False, None, req.embd_normalize))
    return [{"index": i, "embedding": (v if v.ndim == 2 else v[None]).tolist()} for i, v in enumerate(vecs)]


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank(req: Rerank, request: Request):
    docs = req.documents if req.documents is not None else req.texts
    if not req.query:
        raise EmptyPrompt("query is empty")
    docs = _inputs(docs, "documents")
    if not all(isinstance(d, str) for d in docs):
        raise InvalidArgument("documents must be strings")
    if req.top_n is not None and req.top_n < 1:
        raise InvalidArgument(f"top_n = {req.top_n}: at least 1")
    scores, _, name = await _run(request, req.model, None, lambda m: m.embedder().rerank(req.query, docs))
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:req.top_n or len(docs)]
    results = [{"index": i, "relevance_score": scores[i]} | ({"document": {"text": docs[i]}} if req.return_documents
                                                          else {}) for i in order]
    return {"model": req.model or name, "object": "list", "results": results, "usage": {}}
