"""The memory plan: what stays resident, what streams, and the smallest budget that works.

The engine allocates exactly what the plan says, so `ramforge plan` is the runtime's own rule:
- fixed: the KV cache at n_ctx (layers x n_ctx x n_head_kv x the bytes of a K and a V row of the cache
  types: F16 2 B an element, Q8_0 34 B and Q4_0 18 B a block of 32; charged as the context fills), the run
  state for a chunk of `batch` tokens, and the small persistent tensors (norms, rope factors);
- if the whole model fits beside the fixed part, everything is resident;
- otherwise a pool of 2 buffers (1 when only one fits) of the largest layer's read span streams the
  layers; of the headroom left, up to half keeps the output projection (then the token embedding)
  resident, and the rest pins whole layers, first to last. A streamed output projection goes through
  the pool in row chunks; a streamed token embedding is read a row per token.
- the minimum budget is the fixed part plus one buffer.
- the KV cache is charged as the context fills (kv.cache); where the budget cannot hold it
  for n_ctx, the plan is made for the positions it holds (kv_positions, whole chunks of 256), and
  growing past them fails with a budget error naming the position. max_ctx: the longest context
  the budget holds at all (smallest chunk, nothing pinned).
- where the budget cannot hold the KV cache for n_ctx (or when asked), the cache spills to storage
  (stream.kv_spill): the fixed part holds a tail of recent positions per layer and two read buffers of
  one layer's cache at n_ctx instead of the whole cache; each token reads the older positions back
  (kv_read_bytes_per_token at a full context). A budget that holds neither plans for the positions
  it holds, as above.
A mixture of experts that does not fit whole streams its experts apart from their layers: a layer's
read span holds its dense tensors (attention, norms, router, shared expert); each expert (its rows
of gate, up and down: three aligned segments) is read alone into an expert cache of whole slots,
at least one layer's top-k (the minimum budget counts them), then what the headroom left after
pinning dense layers allows.

make_plan runs pure steps, records in and a record out, then builds the frozen Plan once:
stream.layout's classify_tensors (the tensor table -> Tensors: per layer, persistent, what the range
reads) and layer_layout (-> Layout: read spans, whole and streamed, the experts' slots); here
fixed_costs (-> Fixed: the KV cache, its spill, run state, small tensors), needs (-> Needs: the
minimum and the fully resident budget) and residency (a budget -> Residency: the verdict, what is
resident, pinned and streamed). plan_for_budget picks the prompt chunk and the KV cache's form.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum

from ..errors import InvalidArgument, ModelFileError
from ..flags import DEFAULT_CTX, N_UBATCH as UBATCH
from ..gguf.constants import Keys
from ..gguf.reader import GGUFFile
from ..models import ARCHS, is_executable, layer_windows
from ..models.config import HParams
from ..kv.cells import kv_rows
from ..kv.types import CHUNK, SpillLayout, bytes_per_position, kv_type, spill_layout
from .layout import EMBD, OUTPUT, Layout, Tensors, classify_tensors, layer_layout

DEFAULT_BATCH = 64          # prompt tokens per forward chunk
PERSISTENT_SHARE = 0.5      # of the streaming headroom, at most this much for resident persistent tensors


class Verdict(StrEnum):
    RESIDENT = "resident"           # everything fits beside the fixed part
    STREAMING = "streaming"         # layers (a mixture's experts apart) stream through buffers
    INSUFFICIENT = "insufficient"   # below the minimum budget


def n_vocab_of(f: GGUFFile) -> int:
    tokens = f.metadata.get(Keys.TOKENS)
    if tokens is not None:
        return len(tokens)
    embd = f.tensors.get(EMBD)
    if embd is None or len(embd.dims) < 2:
        raise ModelFileError(f"{f.path}: cannot tell the vocabulary size (no {Keys.TOKENS} and no {EMBD})")
    return embd.dims[1]


def state_shapes(hp: HParams, batch: int) -> dict[str, tuple[int, ...]]:
    """state.State's buffers (4-byte elements: float32, the expert ids int32) for chunks of `batch` tokens."""
    b, d, k = batch, hp.n_embd, hp.n_expert_used
    shapes = {
        "x": (b, d), "xb": (b, d), "q": (b, hp.n_head, hp.head_dim_k), "k": (b, hp.n_head_kv, hp.head_dim_k),
        "v": (b, hp.n_head_kv, hp.head_dim_v), "att": (b, hp.n_head, hp.head_dim_v),
        "gate": (b, hp.n_ff_dense), "up": (b, hp.n_ff_dense), "hn": (b, d),
        "prompt_logits": (hp.n_vocab,),
    }
    if hp.arch in ARCHS and ARCHS[hp.arch].fused_projections:  # a fused QKV or gate-up matmul's output (phi3)
        shapes["fused"] = (b * max(hp.n_head * hp.head_dim_k + hp.n_head_kv * (hp.head_dim_k + hp.head_dim_v),
                                   2 * hp.n_ff),)
    if hp.n_expert:                   # the mixture (models.moe): router, routing, one expert's rows, the slots
        f = hp.n_ff_exp
        # (ge, ue: a row per (token, slot), every expert's rows at once: kernels.fused_moe)
        shapes |= {"router": (b, hp.n_expert), "sel": (b, k), "wts": (b, k), "xe": (b, d), "ge": (b * k, f),
                   "ue": (b * k, f), "ye": (b, d), "ex": (b, k, d), "shgate": (b, 1 if hp.n_ff_shexp else 0)}
    return shapes


def state_bytes(hp: HParams, batch: int, n_ctx: int) -> int:
    """Run state for `batch` tokens (state.State, see state_shapes) plus matmul and attention scratch."""
    state = sum(math.prod(s) for s in state_shapes(hp, batch).values())
    # matmul activations; per head: attention scores and up to 64 accumulator lanes; per token of a
    # routed batch its sorted experts (index, probability, sort stack)
    widest = max(hp.n_embd, hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp, hp.n_head * hp.head_dim_k)
    # (a mixture's batch kernels: per thread, one expert's gathered activations and outputs, up to 2 threads' worth)
    scratch = (2 * batch * widest + hp.n_head * (n_ctx + 64 * hp.head_dim_v) + batch * 8 * hp.n_expert
               + (2 * batch * (hp.n_embd + hp.n_embd // 4) if hp.n_expert else 0))
    return 4 * (state + scratch)


# ---- the steps ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """What a plan is made for (make_plan's arguments, checked)."""

    n_ctx: int
    batch: int
    layers: tuple[int, int]                       # the contiguous range [first, last) this plan runs
    type_k: str = "f16"
    type_v: str = "f16"
    kv_spill: bool = False
    kv_tail: int | None = None
    n_seq: int = 1
    hit_rate: float | None = None


def request_of(hp: HParams, n_ctx: int | None, batch: int, layers: tuple[int, int] | None, **kw) -> Request:
    """The request, its context defaulted (DEFAULT_CTX, capped by the model's) and checked."""
    n_ctx = min(hp.n_ctx_train, DEFAULT_CTX) if n_ctx is None else n_ctx
    if n_ctx <= 0 or batch <= 0:
        raise InvalidArgument(f"context length and batch must be positive, got {n_ctx} and {batch}")
    a, b = layers or (0, hp.n_layer)
    if not 0 <= a < b <= hp.n_layer:
        raise InvalidArgument(f"layer range [{a}, {b}) is not within the model's {hp.n_layer} layers")
    return Request(n_ctx, batch, (a, b), **kw)


@dataclass(frozen=True)
class Fixed:
    """What the plan charges whatever streams (fixed_costs)."""

    kv_bytes: int                                 # the KV cache at n_ctx (spilled: its tails and read buffers)
    kv_bytes_per_pos: int
    state_bytes: int
    small_bytes: int
    spill: SpillLayout | None = None              # the spilled cache's layout
    kv_spill_file_bytes: int = 0
    kv_read_bytes_per_token: int = 0

    @property
    def total(self) -> int:
        return self.kv_bytes + self.state_bytes + self.small_bytes


def fixed_costs(hp: HParams, req: Request, t: Tensors) -> Fixed:
    a, b = req.layers
    kv_pos = bytes_per_position(b - a, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, req.type_k, req.type_v)
    state = state_bytes(hp, req.batch, req.n_ctx)
    if not req.kv_spill:               # n_seq > 1: its streams' cells, each padded (kv.cells)
        return Fixed(kv_rows(req.n_ctx, req.n_seq) * kv_pos, kv_pos, state, t.small_bytes)
    # the tails and the read buffers (stream.kv_spill)
    lay = spill_layout(req.n_ctx, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, req.type_k, req.type_v,
                       req.batch, req.kv_tail)
    pos0 = req.n_ctx - 1                                 # a decode token at a full context
    read = sum(lay.read_bytes(pos0, 1, lay.spilled_at(pos0, 1), w) for w in layer_windows(hp, (a, b)))
    return Fixed(lay.charged(b - a), kv_pos, state, t.small_bytes, lay, (b - a) * lay.buffer_bytes, read)


@dataclass(frozen=True)
class Needs:
    """The least budget that runs the range, and the least that holds it whole."""

    min_budget: int
    resident_budget: int


def needs(fx: Fixed, t: Tensors, lay: Layout, batch: int) -> Needs:
    """Minimum: the fixed part, one buffer of the largest streamed span, the least expert slots, the
    predictors and a chunk's embedding rows. Resident: the fixed part, every layer, the big tensors."""
    ex = lay.experts
    rows = batch * t.embd_row_bytes if t.embeds else 0
    return Needs(fx.total + lay.max_span + ex.min_slots * ex.slot_bytes + ex.predictor_bytes + rows,
                 fx.total + sum(s.nbytes for s in lay.spans) + sum(t.persistent[n] for n in t.big))


@dataclass(frozen=True)
class Residency:
    """What a budget keeps resident and what streams (residency)."""

    verdict: Verdict
    layer_bytes: tuple[int, ...]                  # read-span bytes of each layer in the range
    resident: tuple[str, ...] = ()
    pinned: tuple[int, ...] = ()
    n_buffers: int = 0
    buffer_bytes: int = 0
    embd_row_bytes: int = 0
    expert_slots: int = 0
    streamed_bytes_per_token: int = 0
    expected_bytes_per_token: int = 0
    expert_hit_rate: float = 0.0


def residency(budget: int | None, fx: Fixed, t: Tensors, lay: Layout, need: Needs, batch: int,
              hit_rate: float | None = None) -> Residency:
    """All resident where the budget holds it (or there is none), nothing below the minimum, else
    streaming: buffers, then the big tensors, the embedding's rows, pinned layers, expert slots."""
    if budget is None or budget >= need.resident_budget:
        return Residency(Verdict.RESIDENT, tuple(s.nbytes for s in lay.spans), t.big,
                         tuple(range(*t.layers)))
    if budget < need.min_budget:
        return Residency(Verdict.INSUFFICIENT, tuple(s.nbytes for s in lay.spans))
    ex, max_span = lay.experts, lay.max_span
    avail = budget - fx.total - ex.min_slots * ex.slot_bytes - ex.predictor_bytes
    n_buffers = 2 if avail >= 2 * max_span + (batch * t.embd_row_bytes if t.embeds else 0) else 1
    head = avail - n_buffers * max_span
    # every token reads the output projection and every dense layer, an expert only k/n_expert of
    # the time: a mixture keeps the output resident before its expert cache; the embedding, one row a
    # token, only if it is the output
    share = head if ex.apart else int(head * PERSISTENT_SHARE)
    resident = []
    for n in (t.big if not ex.apart else [n for n in t.big if n == t.out_name]):
        if t.persistent[n] <= share:
            resident.append(n)
            share -= t.persistent[n]
            head -= t.persistent[n]
    embd_rows = batch * t.embd_row_bytes if t.embeds and EMBD not in resident else 0
    head -= embd_rows
    pinned = []
    for s in lay.stream_spans:                # dense layers first: every token needs all of them
        if s.nbytes <= head:
            pinned.append(s.index)
            head -= s.nbytes
    streamed = [s.nbytes for s in lay.stream_spans if s.index not in pinned]
    if t.logits and t.out_name in t.persistent and t.out_name not in resident:
        streamed.append(t.persistent[t.out_name])
    buffer_bytes = max_span
    if not streamed:                          # everything that streams is a row of the embedding
        head += n_buffers * buffer_bytes
        n_buffers = buffer_bytes = 0
    slots = min(ex.min_slots + head // ex.slot_bytes, ex.count) if ex.apart else 0   # in whole slots
    misses = (t.layers[1] - t.layers[0]) * ex.k * ex.slot_bytes if ex.apart and slots < ex.count else 0
    dense = sum(streamed) + (t.embd_row_bytes if embd_rows else 0)
    hit = (slots / ex.count if hit_rate is None else hit_rate) if ex.apart else 0.0
    expected = dense + round(misses * (1.0 - hit)) if ex.apart else dense + misses
    return Residency(Verdict.STREAMING, tuple(s.nbytes for s in lay.stream_spans), tuple(resident), tuple(pinned),
                     n_buffers, buffer_bytes, embd_rows, slots, dense + misses, expected, hit)


def active_bytes(t: Tensors, lay: Layout) -> int:
    """Weights one token computes with: every dense tensor of the range, k of n_expert experts, the
    persistent tensors, the output projection (a range that computes logits) and an embedding row (the
    first range)."""
    ex = lay.experts
    outside = sum(v for n, v in t.persistent.items() if n not in (EMBD, OUTPUT))     # norms, rope factors
    return (sum(x.nbytes for ts in t.by_layer.values() for x in ts) - ex.total_bytes
            + (ex.total_bytes * ex.k // ex.n_expert if ex.n_expert else 0) + outside
            + (t.persistent.get(t.out_name, 0) if t.logits else 0) + (t.embd_row_bytes if t.embeds else 0))


@dataclass(frozen=True)
class Plan:
    """A memory plan, built once (make_plan; plan_for_budget derives others with dataclasses.replace)."""

    path: str
    arch: str
    executable: bool
    n_ctx: int
    batch: int
    budget: int | None
    layers: tuple[int, int]                       # the contiguous range [first, last) this plan runs
    model_bytes: int
    persistent: Mapping[str, int]                 # tensor name -> bytes (outside the layers)
    layer_bytes: tuple[int, ...]                  # read-span bytes of each layer in the range
    kv_bytes: int
    state_bytes: int
    small_bytes: int
    verdict: Verdict                              # resident, streaming or insufficient
    min_budget: int
    resident_budget: int
    resident: tuple[str, ...] = ()                # big persistent tensors kept resident
    pinned: tuple[int, ...] = ()                  # layers kept resident
    n_buffers: int = 0
    buffer_bytes: int = 0
    embd_row_bytes: int = 0                       # scratch for streamed embedding rows
    experts_apart: bool = False                   # experts are read one by one into the expert cache
    expert_slot_bytes: int = 0                    # one expert's read span (largest over layers and experts)
    expert_slots: int = 0                         # the expert cache's capacity, in experts
    expert_count: int = 0                         # experts in the layer range (layers x n_expert)
    predictor_bytes: int = 0                      # each layer's router and ffn_norm, resident to predict its experts
    streamed_bytes_per_token: int = 0             # at most (every expert a miss)
    active_bytes_per_token: int = 0               # weights one token computes with: all dense, k experts a layer
    expert_hit_rate: float = 0.0                  # the cache hit rate the expectation below assumes
    expected_bytes_per_token: int = 0             # streamed per token at expert_hit_rate
    notes: tuple[str, ...] = ()
    type_k: str = "f16"                           # KV cache types (kv.cache)
    type_v: str = "f16"
    kv_bytes_per_pos: int = 0                     # the KV cache's bytes per position (kv_bytes: its rows times this)
    max_ctx: int | None = None                    # the longest context the budget holds (None: no budget)
    n_ctx_train: int = 0                          # the model's trained context
    kv_positions: int = 0                         # the positions kv_bytes holds: n_ctx, or fewer where the
                                                  # budget holds only those (growth past them fails)
    kv_spill: bool = False                        # the KV cache spills to storage (kv_bytes: its tails and buffers)
    kv_tail: int = 0                              # positions of each layer in RAM (the most recent ones)
    kv_spill_file_bytes: int = 0                  # the spill files on disk (all layers)
    kv_read_bytes_per_token: int = 0              # K/V read back per decode token at a full context
    logits: bool = True                           # its passes compute logits (False: embeddings, no output matrix)

    def noted(self, note: str) -> Plan:
        """This plan with one more note."""
        return replace(self, notes=self.notes + (note,))

    @property
    def kv_bytes_per_1k(self) -> int:
        """The KV cache's bytes per 1,000 positions."""
        return 1000 * self.kv_bytes_per_pos

    @property
    def persistent_bytes(self) -> int:
        return sum(self.persistent.values())

    @property
    def largest_layer(self) -> tuple[int, int]:
        if not self.layer_bytes:
            return -1, 0
        i = max(range(len(self.layer_bytes)), key=self.layer_bytes.__getitem__)
        return self.layers[0] + i, self.layer_bytes[i]

    @property
    def planned_peak(self) -> int:
        """Every byte the engine charges once the context is full: the managed peak. The KV cache is
        charged as positions fill (in chunks, kv.cache), so below n_ctx the engine holds less;
        the layout (what is pinned, what streams) sets the full cache's kv_bytes aside all the same."""
        lb = dict(zip(range(*self.layers), self.layer_bytes))
        return (self.kv_bytes + self.state_bytes + self.small_bytes + self.n_buffers * self.buffer_bytes
                + sum(self.persistent[n] for n in self.resident) + sum(lb[i] for i in self.pinned)
                + self.embd_row_bytes + self.expert_slots * self.expert_slot_bytes + self.predictor_bytes)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(persistent=dict(self.persistent), persistent_bytes=self.persistent_bytes,
                 planned_peak=self.planned_peak, kv_bytes_per_1k=self.kv_bytes_per_1k,
                 largest_layer={"index": self.largest_layer[0], "bytes": self.largest_layer[1]})
        return d


def make_plan(f: GGUFFile, budget: int | None, n_ctx: int | None = None, batch: int = DEFAULT_BATCH,
              layers: tuple[int, int] | None = None, hit_rate: float | None = None, type_k: str = "f16",
              type_v: str = "f16", kv_spill: bool = False, kv_tail: int | None = None, n_seq: int = 1,
              logits: bool = True) -> Plan:
    """The plan of one prompt chunk size: the steps above, the Plan built from their records.
    hit_rate: the expert cache hit rate for expected_bytes_per_token; by default the share of all
    experts the cache holds (what routing spread evenly over the experts would hit). logits=False:
    passes that end in the hidden states (stream.embed_plan), the output matrix neither kept nor read."""
    hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
    req = request_of(hp, n_ctx, batch, layers, type_k=type_k, type_v=type_v, kv_spill=kv_spill, kv_tail=kv_tail,
                     n_seq=n_seq, hit_rate=hit_rate)
    t = classify_tensors(f.tensors, hp.n_layer, req.layers, logits)
    lay = layer_layout(hp, t)
    fx = fixed_costs(hp, req, t)
    need = needs(fx, t, lay, req.batch)
    r = residency(budget, fx, t, lay, need, req.batch, hit_rate)
    streaming = r.verdict == Verdict.STREAMING
    ex = lay.experts
    return Plan(
        path=f.path, arch=hp.arch, executable=is_executable(hp.arch), n_ctx=req.n_ctx, batch=req.batch,
        budget=budget, layers=req.layers, model_bytes=t.model_bytes, persistent=t.persistent,
        layer_bytes=r.layer_bytes, kv_bytes=fx.kv_bytes, state_bytes=fx.state_bytes, small_bytes=fx.small_bytes,
        verdict=r.verdict, min_budget=need.min_budget, resident_budget=need.resident_budget,
        resident=r.resident, pinned=r.pinned, n_buffers=r.n_buffers, buffer_bytes=r.buffer_bytes,
        embd_row_bytes=r.embd_row_bytes, experts_apart=streaming and ex.apart,
        expert_slot_bytes=ex.slot_bytes if streaming else 0, expert_slots=r.expert_slots, expert_count=ex.count,
        predictor_bytes=ex.predictor_bytes if streaming else 0,
        streamed_bytes_per_token=r.streamed_bytes_per_token, active_bytes_per_token=active_bytes(t, lay),
        expert_hit_rate=r.expert_hit_rate, expected_bytes_per_token=r.expected_bytes_per_token,
        notes=() if is_executable(hp.arch) else (f"architecture {hp.arch} can be inspected and planned but not executed",),
        type_k=kv_type(type_k), type_v=kv_type(type_v), kv_bytes_per_pos=fx.kv_bytes_per_pos,
        n_ctx_train=hp.n_ctx_train, kv_positions=req.n_ctx, kv_spill=fx.spill is not None,
        kv_tail=fx.spill.tail if fx.spill is not None else 0, kv_spill_file_bytes=fx.kv_spill_file_bytes,
        kv_read_bytes_per_token=fx.kv_read_bytes_per_token, logits=t.logits)



# ---- the prompt chunk and the KV cache's form for a budget ------------------------------------------

BATCHES = (64, 32, 16, 8, 4, 2, 1)
# A mixture's chunk may grow to a whole ubatch (UBATCH: llama.cpp's n_ubatch): llama.cpp's mul_mat_id
# picks an expert's arithmetic by the rows the whole ubatch routes to it, so chunks shorter than the
# ubatch can round a long prompt's expert rows differently. Taken when the run state stays within
# 1/MOE_STATE_SHARE of the budget.
MOE_BATCHES = (UBATCH, UBATCH // 2, UBATCH // 4)
MOE_STATE_SHARE = 8
# A dense model the budget holds whole takes prompt chunks of this many tokens: a batch reads repacked
# rows back into row order once per chunk, and 128 tokens share that (1B Q6_K prefill +20% over 64).
# Chunks are computed as rows of their ubatch, so the logits are the same for any chunk size.
RESIDENT_BATCH = 128


def plan_for_budget(f: GGUFFile, budget: int | None, n_ctx: int | None = None,
                    layers: tuple[int, int] | None = None, batch: int | None = None,
                    hit_rate: float | None = None, type_k: str = "f16", type_v: str = "f16",
                    kv_spill: bool | None = False, kv_tail: int | None = None, n_seq: int = 1) -> Plan:
    """The plan with the largest prompt chunk that fits the budget: 64 down to 1 tokens; for a mixture
    of experts up to a whole ubatch (MOE_BATCHES) while its run state is a small share of the budget,
    for a dense model RESIDENT_BATCH while the budget holds it whole.
    n_seq: the parallel sequences whose padded streams of cells the KV cache holds (kv.cells.kv_rows).
    kv_spill: True spills the KV cache to storage, None does where the budget cannot hold it for n_ctx
    (then, where spilling does not fit either, the plan holds the positions the budget allows); when it
    spills by itself, its RAM tail takes the budget the weights leave (a pinned weight byte saves a read
    every token, a tail position only past it). kv_tail: the tail's positions (default: the least)."""
    if hit_rate is not None and not 0.0 <= hit_rate <= 1.0:
        raise InvalidArgument(f"an expert hit rate is a fraction from 0 to 1, got {hit_rate}")
    hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
    kw = dict(type_k=type_k, type_v=type_v)
    p = _largest_chunk(f, hp, budget, n_ctx, layers, batch, hit_rate, kw, bool(kv_spill), kv_tail, n_seq)
    if kv_spill:
        p = p.noted(f"the KV cache spills to storage: {p.kv_tail} recent positions of each layer in RAM, the older "
                    f"ones in a spill file per layer ({p.kv_spill_file_bytes:,} B on disk), read back per token "
                    f"(at a full context {p.kv_read_bytes_per_token:,} B of K/V per decode token)")
    if budget is not None:
        p = replace(p, max_ctx=_longest_context(f, hp, p, budget, batch or BATCHES[-1], layers, kw))
        fit = min(p.max_ctx, p.n_ctx) // CHUNK * CHUNK
        if p.verdict == Verdict.INSUFFICIENT and kv_spill is None:
            # the budget cannot hold the whole context's KV cache: spill it to storage
            q = _spilled(f, budget, n_ctx, layers, batch, hit_rate, kw, n_seq)
            if q.verdict != Verdict.INSUFFICIENT:
                return replace(q, max_ctx=p.max_ctx).noted(
                    f"the budget cannot hold the KV cache of {p.n_ctx:,} positions in RAM ({p.min_budget:,} B "
                    f"would); it spills (--kv-spill off: hold the {fit:,} positions the budget allows)")
            if fit < CHUNK:                      # nothing holds the context: the smaller minimum is the one to meet
                p = replace(p, min_budget=min(p.min_budget, q.min_budget))
        if p.verdict == Verdict.INSUFFICIENT and CHUNK <= fit < p.n_ctx and not kv_spill:
            # the KV cache grows as the context fills: plan for the positions the budget holds (fewer: with
            # several sequences their padded streams can hold more rows than max_ctx counts, and a plan for
            # as many positions would ask the same again)
            q = plan_for_budget(f, budget, fit, layers, batch, hit_rate, type_k, type_v, False, n_seq=n_seq)
            if q.verdict != Verdict.INSUFFICIENT:
                return replace(q, n_ctx=p.n_ctx, max_ctx=p.max_ctx, min_budget=p.min_budget).noted(
                    f"the budget holds the KV cache of {fit:,} of the {p.n_ctx:,} positions (it is charged "
                    f"in chunks of {CHUNK} as the context fills); growing past them fails with a budget "
                    f"error naming the position; {p.min_budget:,} B hold the whole context")
    if hp.n_expert > 0 and p.batch < UBATCH and p.verdict != Verdict.INSUFFICIENT:
        whole = make_plan(f, None, n_ctx, UBATCH, layers, None, **kw).state_bytes * MOE_STATE_SHARE
        p = p.noted(f"prompts longer than {p.batch} tokens are computed in chunks of {p.batch}; llama.cpp "
                    f"picks an expert's arithmetic by its rows in a whole ubatch ({UBATCH}), so their logits "
                    f"can differ from llama.cpp's in the last bits; a budget of {whole:,} B or more makes "
                    f"chunks whole ubatches")
    return p


def _largest_chunk(f: GGUFFile, hp: HParams, budget, n_ctx, layers, batch, hit_rate, kw: dict, kv_spill: bool,
                   kv_tail, n_seq: int) -> Plan:
    """The plan of the largest prompt chunk that fits (plan_for_budget), its minimum budget that of the
    smallest chunk, a dense model's resident budget that of a 64-token chunk."""
    moe = hp.n_expert > 0
    batches = (batch,) if batch else BATCHES
    grown = () if batch else MOE_BATCHES if moe else (RESIDENT_BATCH,)     # chunks past 64, on a condition
    for b in grown + batches:
        p = make_plan(f, budget, n_ctx, b, layers, hit_rate, kv_spill=kv_spill, kv_tail=kv_tail, n_seq=n_seq, **kw)
        if p.verdict == Verdict.INSUFFICIENT:
            continue
        # past 64 tokens: a mixture's chunk while its run state is a small share of the budget, a dense
        # model's while the budget holds it whole (never at the cost of a pinned layer)
        if b <= BATCHES[0] or (not budget or p.state_bytes * MOE_STATE_SHARE <= budget if moe
                               else p.verdict == Verdict.RESIDENT):
            break
    if not moe and p.batch > BATCHES[0]:          # the least budget that holds it whole: at 64 tokens
        p = replace(p, resident_budget=make_plan(f, budget, n_ctx, BATCHES[0], layers, hit_rate, kv_spill=kv_spill,
                                                 kv_tail=kv_tail, n_seq=n_seq, **kw).resident_budget)
    least = make_plan(f, None, n_ctx, batches[-1], layers, None, kv_spill=kv_spill, kv_tail=kv_tail, n_seq=n_seq, **kw)
    return replace(p, min_budget=least.min_budget)


def _longest_context(f: GGUFFile, hp: HParams, p: Plan, budget: int, b1: int, layers, kw: dict) -> int:
    """The longest context the budget holds: at the smallest chunk b1, nothing pinned."""
    per = p.kv_bytes_per_pos + state_bytes(hp, b1, 2) - state_bytes(hp, b1, 1)   # cache + attention scores
    base = make_plan(f, None, 1, b1, layers, None, **kw).min_budget - per
    return max(0, (budget - base) // per)


def _spilled(f: GGUFFile, budget: int, n_ctx, layers, batch, hit_rate, kw: dict, n_seq: int) -> Plan:
    """The plan with the KV cache spilled, its RAM tail grown into what the weights leave: a weight byte
    in RAM saves a byte read every token, a tail position's only past it (everything, where they are
    all resident)."""
    q = plan_for_budget(f, budget, n_ctx, layers, batch, hit_rate, kv_spill=True, n_seq=n_seq, **kw)
    if q.verdict == Verdict.INSUFFICIENT:
        return q
    tail = q.kv_tail + (budget - q.planned_peak) // q.kv_bytes_per_pos
    if tail > q.kv_tail:
        q2 = plan_for_budget(f, budget, n_ctx, layers, batch, hit_rate, kv_spill=True, kv_tail=tail, n_seq=n_seq, **kw)
        q = q2 if q2.verdict != Verdict.INSUFFICIENT and q2.pinned == q.pinned else q
    return q
