"""Embeddings and reranking, as llama.cpp computes them.

    hidden = engine.hidden(tokens)                 # t_embd f32[n, n_embd] (engine/engine.py)
    vec = pool(hidden, Pooling.MEAN)               # llama.cpp's build_pooling
    vec = embd_normalize(vec, 2)                   # common_embd_normalize (kernels/pool.py)

The pooling comes from the file (`{arch}.pooling_type`, absent: none) or an override, as llama.cpp's
context resolves it: none (a vector per token), mean, cls (the first token), last, rank (the first
token through the architecture's classifier head: a reranker's scores). Each input is its own
sequence evaluated from position 0, so an input's vector equals what llama-cpp-python's
`Llama(embedding=True).embed(text)` gives for that text alone; llama-cpp-python packs a list of
texts into one llama_decode, whose larger batch rounds the matmuls otherwise (within float rounding).
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


def pool(engine, hidden: np.ndarray, pooling: Pooling) -> np.ndarray:
    """One sequence's hidden states f32[n, n_embd] pooled: f32[n_embd] (rank: the classifier's scores;
    none: the hidden states themselves, f32[n, n_embd])."""
    if pooling == Pooling.NONE:
        return hidden
    if pooling == Pooling.MEAN:
        return mean_rows(hidden, [(0, hidden.shape[0])])[0]
    if pooling == Pooling.CLS:
        return hidden[0].copy()
    if pooling == Pooling.LAST:
        return hidden[-1].copy()
    head = engine.arch.rank_head
    if head is None:
        raise NoEmbeddings(f"rank pooling needs a classifier head, and ramforge's {engine.hp.arch} has none")
    return head(engine, hidden[:1])[0]


@dataclass
class Embedder:
    """Embeddings of texts or token lists from a loaded engine (generation/api.py's Model.embed, the servers)."""

    engine: object
    pooling: Pooling
    n_batch: int = 512           # llama-cpp-python's n_batch: an input's tokens are cut to it (truncate)

    @property
    def n_embd(self) -> int:
        return self.engine.hp.n_embd

    @property
    def max_tokens(self) -> int:
        """The most tokens one input may have: the batch, the context, and an encoder's one pass."""
        e = self.engine
        cap = min(self.n_batch, e.n_ctx)
        return cap if e.causal else min(cap, e.plan.batch)

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

    def require_pooled(self, what: str = "this endpoint") -> None:
        """Refused where the model gives a vector per token (pooling none) but one per input is asked."""
        if self.pooling == Pooling.NONE:
            arch = self.engine.hp.arch
            raise NoEmbeddings(f"{what} needs one vector per input, and this model's pooling is none "
                               f"({POOLING_KEY.format(arch=arch)} absent: llama.cpp gives a vector per token); "
                               f"load it with a pooling type (mean, cls, last) or use llama-server's /embedding")

    def rerank_tokens(self, query: str, doc: str) -> list[int]:
        """llama.cpp's format_rerank: [BOS] query [EOS] [SEP] doc [EOS] (EOS falling back to SEP), each part
        as the vocabulary adds it, the texts tokenized without special tokens."""
        tok = self.engine.tokenizer
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
        out = []
        for d in docs:
            toks = self.rerank_tokens(query, d)[:self.max_tokens]
            out.append(float(self.embed_tokens(toks)[0]))
        return out
