"""Embeddings and reranking, as llama.cpp computes them.

    hidden = engine.hidden(tokens)                 # t_embd f32[n, n_embd] (engine/engine.py)
    vec = pool(hidden, Pooling.MEAN)               # llama.cpp's build_pooling
    vec = embd_normalize(vec, 2)                   # common_embd_normalize (kernels/pool.py)

The pooling comes from the file (`{arch}.pooling_type`, absent: none) or an override, as llama.cpp's
context resolves it: none (a vector per token), mean, cls (the first token), last, rank (the first
token through the architecture's classifier head: a reranker's scores). Each input is its own
sequence evaluated from position 0.

`embed_many` packs inputs as llama-cpp-python's `Llama.embed(list)` does: in order, into batches of at
most n_batch tokens and N_SEQ_MAX sequences, each batch one llama_decode (Engine.hidden_batch): an
encoder's one pass over the weights, a causal model's one ubatch in its unified KV cache (each token
seeing its own sequence's earlier tokens), computed in chunks of the plan's batch, each chunk a pass
over the weights (stream.embed_plan sizes it from the budget: an engine loaded for embedding by its plan,
one loaded to generate by the budget its plan leaves, for the batch: engine/embedding.py). A packed
input's vector is llama.cpp's for that batch, not bit for bit the one of the input alone: the batch's
attention (P.V over the batch's keys, zeros outside the sequence: a key's lane is its row in the
batch) and mean pooling (a dot over the batch's tokens) sum in other lanes, and a 1-token input's
matmuls take tinyBLAS in a batch (vec_dot alone); tests/test_embeddings.py holds both to llama.cpp's
records, bit for bit. `embed_tokens` is the one-input pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from ..errors import ContextLengthExceeded, EmptyPrompt, InvalidArgument, Unsupported
from ..kernels.pool import embd_normalize, mean_rows


class Pooling(IntEnum):
    """llama_pooling_type."""

    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4


POOLING_KEY = "{arch}.pooling_type"
N_SEQ_MAX = 256              # llama_max_parallel_sequences(): llama-cpp-python's n_seq_max for embeddings


@dataclass
class EmbedStats:
    """What embed_many did: inputs, their tokens, and the passes over the weights they took."""

    docs: int = 0
    tokens: int = 0
    passes: int = 0
    chunk: int = 0               # the largest chunk (tokens a pass over the weights can take) a batch took

    @property
    def docs_per_pass(self) -> float:
        return self.docs / self.passes if self.passes else 0.0

    def add(self, other: "EmbedStats") -> None:
        self.docs, self.tokens, self.passes = self.docs + other.docs, self.tokens + other.tokens, \
            self.passes + other.passes
        self.chunk = max(self.chunk, other.chunk)


class NoEmbeddings(Unsupported):
    """A request for pooled embeddings (or rerank scores) from a model whose pooling does not give them."""


def pooling_of(metadata: dict, arch: str, override=None) -> Pooling:
    """The pooling llama.cpp's context takes: `override` (a Pooling, its llama.cpp id, or its name;
    None or -1: unspecified), else {arch}.pooling_type, else none."""
    if override is not None and not (isinstance(override, int) and not isinstance(override, bool) and override == -1):
        return parse_pooling(override)
    v = metadata.get(POOLING_KEY.format(arch=arch))
    if v is None:
        return Pooling.NONE
    try:
        return Pooling(int(v))
    except (TypeError, ValueError):
        raise Unsupported(f"{POOLING_KEY.format(arch=arch)} = {v!r} is not a pooling type ramforge knows "
                          f"({', '.join(f'{p.value} {p.name.lower()}' for p in Pooling)})") from None


def parse_pooling(value) -> Pooling:
    if isinstance(value, Pooling):
        return value
    if isinstance(value, str):
        try:
            return Pooling[value.strip().upper()]
        except KeyError:
            pass
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) in Pooling._value2member_map_:
        return Pooling(int(value))
    raise InvalidArgument(f"pooling {value!r}: one of none, mean, cls, last, rank (or llama.cpp's ids 0-4)")


def _rank_rows(engine, bounds) -> np.ndarray:
    """The rows rank pooling reads (llm_graph_input_cls): each sequence's first token, a causal model's
    last (a Qwen3-Reranker's)."""
    return bounds[:, 1] - 1 if engine.causal else bounds[:, 0]


def _rank(engine, rows: np.ndarray) -> list[np.ndarray]:
    head = engine.arch.rank_head
    if head is None:
        raise NoEmbeddings(f"rank pooling needs a classifier head, and ramforge's {engine.hp.arch} has none")
    return list(head(engine, np.ascontiguousarray(rows)))


def _projected(engine, vecs: list[np.ndarray]) -> list[np.ndarray]:
    """llama.cpp's build_dense_out after pooling (Arch.pooled_out): the batch's pooled vectors as one
    matrix (t_embd_pooled), or with pooling none each sequence's token rows (t_embd's)."""
    own = engine.arch.pooled_out
    if own is None or not vecs:
        return vecs
    if vecs[0].ndim == 2:
        return [own(engine, v) for v in vecs]
    return list(own(engine, np.stack(vecs)))


def pool_batch(engine, hidden: np.ndarray, bounds: np.ndarray, pooling: Pooling) -> list[np.ndarray]:
    """A packed batch's hidden states f32[n, n_embd] pooled per sequence (bounds i64[n_seq, 2]), as
    llama.cpp's build_pooling over a batch of sequences: mean as one matmul over the batch's tokens, cls
    and last as rows, rank the first rows (a causal model's last) through the head together; then the
    architecture's projections (build_dense_out)."""
    if pooling == Pooling.NONE:
        return _projected(engine, [hidden[a:b] for a, b in bounds])
    if pooling == Pooling.MEAN:
        return _projected(engine, list(mean_rows(hidden, [(int(a), int(b)) for a, b in bounds])))
    if pooling == Pooling.CLS:
        return _projected(engine, [hidden[a].copy() for a, _ in bounds])
    if pooling == Pooling.LAST:
        return _projected(engine, [hidden[b - 1].copy() for _, b in bounds])
    return _rank(engine, hidden[_rank_rows(engine, np.asarray(bounds))])


def pool(engine, hidden: np.ndarray, pooling: Pooling) -> np.ndarray:
    """One sequence's hidden states f32[n, n_embd] pooled: f32[n_embd] (rank: the classifier's scores;
    none: the hidden states themselves, f32[n, n_embd])."""
    return pool_batch(engine, hidden, np.array([[0, hidden.shape[0]]], np.int64), pooling)[0]


@dataclass
class Embedder:
    """Embeddings of texts or token lists from a loaded engine (generation/api.py's Model.embed, the servers)."""

    engine: object
    pooling: Pooling
    n_batch: int = 512           # llama-cpp-python's n_batch: an input's tokens are cut to it (truncate)
    rerank_template: str | None = None   # tokenizer.chat_template.rerank (Qwen3-Reranker's), {query} {document}

    @property
    def n_embd(self) -> int:
        return self.engine.hp.n_embd

    @property
    def max_tokens(self) -> int:
        """The most tokens one input may have: the batch, the context, and one pass (an encoder's) or
        ubatch (a causal model's, packed: llama.cpp's n_ubatch)."""
        e = self.engine
        cap = min(self.n_batch, e.n_ctx)
        if not e.causal:
            return min(cap, e.plan.batch)
        return min(cap, e.ubatch) if e.packs_causal else cap

    def tokens(self, item, truncate: bool = True, add_special: bool = True) -> list[int]:
        """An input (text, or a list of token ids) as tokens, as llama-cpp-python's tokenize(text) (BOS as
        the vocabulary adds it); longer than max_tokens: cut to it (truncate) or refused."""
        if isinstance(item, (bytes, str)):
            toks = self.engine.tokenizer.encode(item, add_special=add_special, parse_special=False)
        elif isinstance(item, (list, tuple)) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                     for t in item):
            toks = [int(t) for t in item]
        else:
            raise InvalidArgument(f"an embedding input is a string or a list of token ids, not {type(item).__name__}")
        if not toks:
            raise EmptyPrompt("an embedding input is empty (no tokens)")
        if len(toks) > self.max_tokens:
            if not truncate:
                raise ContextLengthExceeded(f"input of {len(toks)} tokens exceeds the {self.max_tokens} one "
                                            f"embedding can take (the batch and context); truncate it, or pass "
                                            f"truncate=true")
            toks = toks[:self.max_tokens]
        return toks

    def embed_tokens(self, toks: list[int], normalize: int = -1, pooling: Pooling | None = None) -> np.ndarray:
        """One sequence's embedding f32[n_embd] (pooling none: f32[n, n_embd]), normalized as
        common_embd_normalize(normalize) (-1: not)."""
        pooling = self.pooling if pooling is None else pooling
        vec = pool(self.engine, self.engine.hidden(toks), pooling)
        return vec if normalize == -1 else embd_normalize(vec, normalize)

    @property
    def n_seq_max(self) -> int:
        return min(self.n_batch, N_SEQ_MAX)

    def passes_of(self, n_tokens: int) -> int:
        """The passes over the weights one batch of n_tokens takes in chunks of the plan's batch: an
        encoder's one, a causal model's one per chunk (a packed batch may take bigger chunks where the
        budget allows: Engine.last_pack)."""
        return 1 if not self.engine.causal else -(-n_tokens // self.engine.plan.batch)

    def packs(self, token_lists: list[list[int]]) -> list[list[int]]:
        """The inputs' indices grouped into batches as llama-cpp-python's embed groups them: in order, a
        batch closed when the next input would pass max_tokens or it holds n_seq_max inputs."""
        out, cur, n = [], [], 0
        for i, t in enumerate(token_lists):
            if cur and (n + len(t) > self.max_tokens or len(cur) >= self.n_seq_max):
                out.append(cur)
                cur, n = [], 0
            cur.append(i)
            n += len(t)
        return out + [cur] if cur else out

    def embed_many(self, token_lists: list[list[int]], normalize: int = -1, pooling: Pooling | None = None,
                   stats: EmbedStats | None = None) -> list[np.ndarray]:
        """Each input's embedding (as embed_tokens), the inputs packed several to a batch (packs), each
        batch one llama_decode (Engine.hidden_batch); a causal model on an engine that cannot pack
        (Engine.packs_causal) one at a time. stats, if given, counts the docs, tokens and weight passes."""
        pooling = self.pooling if pooling is None else pooling
        st = EmbedStats()
        out: list = [None] * len(token_lists)
        e = self.engine
        if e.causal and not e.packs_causal:
            for i, t in enumerate(token_lists):
                out[i] = self.embed_tokens(t, normalize, pooling)
                st.passes += self.passes_of(len(t))
                st.chunk = e.plan.batch
        else:
            for pack in self.packs(token_lists):
                hidden, bounds = e.hidden_batch([token_lists[i] for i in pack])
                for i, v in zip(pack, pool_batch(e, hidden, bounds, pooling)):
                    out[i] = v if normalize == -1 else embd_normalize(v, normalize)
                st.passes += e.last_pack.passes
                st.chunk = max(st.chunk, e.last_pack.chunk)
        st.docs, st.tokens = len(token_lists), sum(len(t) for t in token_lists)
        if stats is not None:
            stats.add(st)
        return out

    def require_pooled(self, what: str = "this endpoint") -> None:
        """Refused where the model gives a vector per token (pooling none) but one per input is asked."""
        if self.pooling == Pooling.NONE:
            arch = self.engine.hp.arch
            raise NoEmbeddings(f"{what} needs one vector per input, and this model's pooling is none "
                               f"({POOLING_KEY.format(arch=arch)} absent: llama.cpp gives a vector per token); "
                               f"load it with a pooling type (mean, cls, last) or use llama-server's /embedding")

    def rerank_tokens(self, query: str, doc: str) -> list[int]:
        """llama-server's format_prompt_rerank: the file's "rerank" chat template with {query} and {document}
        replaced, tokenized with special tokens parsed and none added; else [BOS] query [EOS] [SEP] doc
        [EOS] (EOS falling back to SEP), each part as the vocabulary adds it, the texts tokenized without
        special tokens."""
        tok = self.engine.tokenizer
        if self.rerank_template is not None:
            prompt = self.rerank_template.replace("{query}", query).replace("{document}", doc)
            return tok.encode(prompt, add_special=False, parse_special=True)
        v = tok.vocab
        q = tok.encode(query, add_special=False)
        d = tok.encode(doc, add_special=False)
        eos = v.special["eos"] if v.special["eos"] is not None else v.special["sep"]
        out = [v.special["bos"]] if v.add_bos else []
        out += q
        if v.add_eos:
            out.append(eos)
        if v.add_sep:
            out.append(v.special["sep"])
        out += d
        if v.add_eos:
            out.append(eos)
        return [t for t in out if t is not None]

    def rerank(self, query: str, docs: list[str]) -> list[float]:
        """The relevance score of each document for the query (rank pooling: the classifier's first output)."""
        if self.pooling != Pooling.RANK:
            raise NoEmbeddings(f"reranking needs rank pooling (a reranker model: {POOLING_KEY.format(arch=self.engine.hp.arch)}"
                               f" = 4), and this model's pooling is {self.pooling.name.lower()}")
        toks = [self.rerank_tokens(query, d)[:self.max_tokens] for d in docs]
        return [float(v[0]) for v in self.embed_many(toks)]


# ---- api.Model's embedding methods (llama-cpp-python's Llama.embed / create_embedding) ---------
RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


def model_embedder(model, pooling_type=None) -> Embedder:
    """An Embedder of an api.Model: pooling from pooling_type, else the model's `pooling` (the server's
    --pooling), else the file's ({arch}.pooling_type); the file's rerank template."""
    from ..gguf.reader import GGUFFile
    if getattr(model, "_pooling_md", None) is None:
        with GGUFFile(model.path) as f:
            model._pooling_md = {k: v for k, v in f.metadata.items()
                                 if k.endswith(".pooling_type") or k == RERANK_TEMPLATE_KEY}
    if pooling_type is None:
        pooling_type = getattr(model, "pooling", None)
    template = model._pooling_md.get(RERANK_TEMPLATE_KEY)
    return Embedder(model.engine, pooling_of(model._pooling_md, model.engine.hp.arch, pooling_type),
                    rerank_template=template if isinstance(template, str) else None)


def embed_inputs(model, input, normalize: bool = False, truncate: bool = True, return_count: bool = False,
                 pooling_type=None):
    """Model.embed: a list of floats for a string, a list of them for a list (pooling none: a list per
    token); normalize: each vector scaled to unit length as llama-cpp-python does (float64); truncate:
    inputs cut to the batch (512 tokens)."""
    emb = model.embedder(pooling_type)
    inputs = [input] if isinstance(input, (str, bytes)) else list(input)
    out, toks = [], [emb.tokens(item, truncate) for item in inputs]
    total = sum(len(t) for t in toks)
    for v in emb.embed_many(toks):              # packed several to a pass, as llama-cpp-python's embed
        rows = v.reshape(-1, v.shape[-1]).tolist()
        if normalize:
            rows = [r if (n := float(np.linalg.norm(r))) == 0.0 else [x / n for x in r] for r in rows]
        out.append(rows if v.ndim == 2 else rows[0])
    out = out[0] if isinstance(input, (str, bytes)) else out
    return (out, total) if return_count else out


def create_embedding(model, input, model_name: str | None = None, pooling_type=None) -> dict:
    """Model.create_embedding: OpenAI's list of embedding objects, with usage."""
    data, total = model.embed(input if isinstance(input, list) else [input], return_count=True,
                              pooling_type=pooling_type)
    return {"object": "list", "model": model_name if model_name is not None else model.path,
            "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(data)],
            "usage": {"prompt_tokens": total, "total_tokens": total}}
