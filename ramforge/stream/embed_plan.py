"""The embedding plan: how many tokens one pass over the weights takes when documents are embedded.

Embedding has no decode: every token of a batch of documents goes through the layers once, and a
model that streams reads its streamed layers once per pass. So the pass (the plan's chunk of `batch`
rows) is sized from the budget: of the chunks UBATCH (llama.cpp's n_ubatch, 512) down to 1, the
one whose plan (make_plan: the activations of the chunk beside the weights, and the KV cache of one
packed batch, `pack` positions) reads the fewest streamed bytes per embedded token
(streamed_bytes_per_token / batch: a bigger chunk divides the reads, a pinned layer takes them
away); where the budget holds the model whole, the largest chunk up to RESIDENT_BATCH that keeps it
whole. An encoder (no KV cache, one sequence a pass) takes a whole ubatch or nothing. A pass ends in
the hidden states (t_embd), so the plan neither keeps nor counts the output matrix (make_plan's
logits=False; a tied one's token embedding is read a row per token, as any pass reads it).

A causal model's batch of documents is one llama_decode of at most `pack` tokens in its unified KV
cache (generation/embed.py); the engine computes it in chunks of the plan's batch, so the cache holds
`pack` positions whatever the chunk. Not even one document (the chunk of 1 token, the cache of a
whole pack) within the budget: EmbedBudgetTooSmall.

An engine loaded to generate (Model, Llama, `ramforge serve`) keeps its plan's layout and prompt chunk;
pass_chunk gives one packed batch the embedding plan's chunk where that layout streams and the budget it
leaves holds the bigger chunk's activations (engine/embedding.py charges them for the batch alone).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import BudgetTooSmall, OutOfBudget
from ..gguf.reader import GGUFFile
from ..gguf.constants import Keys
from ..models import ARCHS
from ..models.config import HParams
from .plan import BATCHES, RESIDENT_BATCH, UBATCH, Plan, Verdict, make_plan, state_bytes

EMBED_BATCHES = (UBATCH, UBATCH // 2, UBATCH // 4, *BATCHES)
DOC_TOKENS = 200            # the document length `plan` reports documents per pass for (about)


class EmbedBudgetTooSmall(BudgetTooSmall):
    """Not even one document's pass (a chunk of the fewest tokens, the KV cache of one batch) fits the budget."""

    def __init__(self, budget: int, minimum: int, pack: int):
        self.budget, self.minimum, self.pack = budget, minimum, pack
        OutOfBudget.__init__(self, f"--ram {budget:,} B cannot embed even one document: a batch of up to {pack} tokens "
                         f"needs at least {minimum:,} B (one layer's read span, the activations of the smallest "
                         f"chunk, the KV cache of {pack} positions); raise --ram to {minimum:,} B or lower --ctx")


@dataclass(frozen=True)
class EmbedBatch:
    """The embedding batch a plan was sized for: tokens per weight pass (the plan's chunk), the packed
    batch's tokens (one llama_decode), and what a pass reads."""

    tokens_per_pass: int
    pack_tokens: int
    streamed_bytes_per_pass: int
    doc_tokens: int = DOC_TOKENS

    @property
    def docs_per_pass(self) -> float:
        """Documents of doc_tokens tokens per weight pass."""
        return self.tokens_per_pass / self.doc_tokens

    @property
    def streamed_bytes_per_doc(self) -> float:
        return self.streamed_bytes_per_pass * self.doc_tokens / self.tokens_per_pass

    def to_json(self) -> dict:
        return {"tokens_per_pass": self.tokens_per_pass, "pack_tokens": self.pack_tokens,
                "streamed_bytes_per_pass": self.streamed_bytes_per_pass, "doc_tokens": self.doc_tokens,
                "docs_per_pass": self.docs_per_pass, "streamed_bytes_per_doc": self.streamed_bytes_per_doc}


def pack_tokens(f: GGUFFile, n_ctx: int | None) -> int:
    """The tokens of one packed batch: llama-cpp-python's n_batch (UBATCH), the context where smaller."""
    from .plan import n_vocab_of
    hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
    return min(UBATCH, hp.n_ctx_train if n_ctx is None else n_ctx)


def embed_plan(f: GGUFFile, budget: int | None, n_ctx: int | None = None, doc_tokens: int = DOC_TOKENS,
               **kw) -> tuple[Plan, EmbedBatch]:
    """The plan an embedding engine runs under (its context: one packed batch) and its EmbedBatch; kw:
    make_plan's (type_k, type_v). EmbedBudgetTooSmall where not even one document fits."""
    pack = pack_tokens(f, n_ctx)
    arch = ARCHS.get(f.metadata.get(Keys.ARCHITECTURE))
    causal = arch is None or arch.causal                   # (an inspect-only architecture: as a causal one)
    sizes = [b for b in EMBED_BATCHES if b <= pack] if causal else [pack]
    plans = [make_plan(f, budget, pack, b, logits=False, **kw) for b in sizes]
    ok = [p for p in plans if p.verdict != Verdict.INSUFFICIENT]
    if not ok:
        raise EmbedBudgetTooSmall(budget or 0, plans[-1].min_budget, pack)
    whole = [p for p in ok if p.verdict == Verdict.RESIDENT and p.batch <= RESIDENT_BATCH]
    if whole:
        p = whole[0]
    else:                          # the fewest streamed bytes per token; equal: the bigger chunk
        p = min(ok, key=lambda q: (q.streamed_bytes_per_token / q.batch, -q.batch))
    p = replace(p, min_budget=plans[-1].min_budget)
    eb = EmbedBatch(p.batch, pack, p.streamed_bytes_per_token, doc_tokens)
    return p, eb


@dataclass(frozen=True)
class PassChunk:
    """The chunk one packed embedding batch is computed in on a loaded engine (pass_chunk): its rows
    (a chunk of EMBED_BATCHES, or the plan's own), the activations it allocates (at most the batch's
    tokens), and the bytes charged beyond the plan's run state for them (0: the plan's own)."""

    batch: int
    rows: int
    extra_bytes: int = 0


def activation_bytes(hp: HParams, plan: Plan, rows: int) -> int:
    """The run state (stream.plan.state_bytes) and streamed embedding rows of chunks of `rows` tokens."""
    per_row = plan.embd_row_bytes // plan.batch if plan.embd_row_bytes else 0
    return state_bytes(hp, rows, plan.n_ctx) + rows * per_row


def pass_chunk(hp: HParams, plan: Plan, n_tokens: int, free: int | None, ubatch: int = UBATCH) -> PassChunk:
    """The chunk a packed batch of n_tokens takes on an engine loaded under `plan` (a generation plan
    or this module's): the embedding plan's rule with the layout fixed. Where weights stream each pass
    (layers not pinned, or experts apart), the largest chunk of EMBED_BATCHES (at most the ubatch)
    whose activations beyond the plan's fit `free` (the budget left; None: unlimited), as fewer passes
    read fewer bytes; the plan's own where it holds the weights (a resident plan's chunk already is the
    embedding plan's), where the batch fits one chunk of it, or where no bigger chunk fits."""
    own = PassChunk(plan.batch, plan.batch)
    reads = plan.verdict == Verdict.STREAMING and (len(plan.pinned) < len(plan.layer_bytes) or plan.experts_apart)
    if not reads or n_tokens <= plan.batch:
        return own
    base = activation_bytes(hp, plan, plan.batch)
    for b in (b for b in EMBED_BATCHES if plan.batch < b <= ubatch):
        rows = min(b, n_tokens)
        extra = activation_bytes(hp, plan, rows) - base
        if free is None or extra <= free:
            return PassChunk(b, rows, max(0, extra))
    return own
