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
- the KV cache is charged as the context fills (memory.kv_cache); where the budget cannot hold it
  for n_ctx, the plan is made for the positions it holds (kv_positions, whole chunks of 256), and
  growing past them fails with a budget error naming the position. max_ctx: the longest context
  the budget holds at all (smallest chunk, nothing pinned).
- where the budget cannot hold the KV cache for n_ctx (or when asked), the cache spills to storage
  (memory.kv_spill): the fixed part holds a tail of recent positions per layer and two read buffers of
  one layer's cache at n_ctx instead of the whole cache; each token reads the older positions back
  (kv_read_bytes_per_token at a full context). A budget that holds neither plans for the positions
  it holds, as above.
A mixture of experts that does not fit whole streams its experts apart from their layers: a layer's
read span holds its dense tensors (attention, norms, router, shared expert); each expert (its rows
of gate, up and down: three aligned segments) is read alone into an expert cache of whole slots,
at least one layer's top-k (the minimum budget counts them), then what the headroom left after
pinning dense layers allows.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from ..errors import InvalidArgument, ModelFileError
from ..flags import DEFAULT_CTX, DIRECT_ALIGN as ALIGN, N_UBATCH as UBATCH  # ALIGN: read spans are aligned (O_DIRECT)
from ..gguf.constants import GGML_BLOCK, Keys
from ..gguf.reader import GGUFFile, TensorInfo
from ..models import ffn_norm, is_executable
from ..models.config import FUSED_PROJECTIONS, HParams
from ..kv.cells import kv_rows
from ..kv.types import CHUNK, bytes_per_position, kv_type, spill_layout

DEFAULT_BATCH = 64          # prompt tokens per forward chunk
MERGE_GAP = 1 << 16         # tensors closer than this are read in one span
PERSISTENT_SHARE = 0.5      # of the streaming headroom, at most this much for resident persistent tensors
SMALL = ("output_norm.weight", "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
EXPERT_SUFFIXES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
_LAYER = re.compile(r"^blk\.(\d+)\.")


def layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def n_vocab_of(f: GGUFFile) -> int:
    tokens = f.metadata.get(Keys.TOKENS)
    if tokens is not None:
        return len(tokens)
    embd = f.tensors.get("token_embd.weight")
    if embd is None or len(embd.dims) < 2:
        raise ModelFileError(f"{f.path}: cannot tell the vocabulary size (no {Keys.TOKENS} and no token_embd.weight)")
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
    if hp.arch in FUSED_PROJECTIONS:  # a fused QKV or gate-up matmul's output, split after (models.phi3)
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


def is_expert_tensor(name: str) -> bool:
    """A 3-D expert tensor (GGUF [n_in, n_out, n_expert]), which a streaming plan reads expert by expert."""
    return name.endswith(EXPERT_SUFFIXES)


@dataclass(frozen=True)
class _Slice:
    name: str
    offset: int
    nbytes: int


def expert_span(tensors: list[TensorInfo], e: int) -> Span:
    """Expert e's read plan: its contiguous bytes in each of the layer's expert tensors."""
    return span_of(e, [_Slice(t.name, t.offset + e * (t.nbytes // t.dims[2]), t.nbytes // t.dims[2])
                       for t in tensors])


@dataclass
class Span:
    """One layer's read plan: file segments laid out back to back in a buffer."""

    index: int
    segments: list[tuple[int, int, int]]          # (file offset, length, buffer offset), all aligned
    offsets: dict[str, int]                       # tensor name -> buffer offset
    tensor_bytes: int

    @property
    def nbytes(self) -> int:
        return sum(n for _, n, _ in self.segments)


def span_of(index: int, tensors: list[TensorInfo]) -> Span:
    segs: list[list[int]] = []                    # [aligned start, aligned end]
    for t in sorted(tensors, key=lambda t: t.offset):
        lo, hi = t.offset - t.offset % ALIGN, -(-(t.offset + t.nbytes) // ALIGN) * ALIGN
        if segs and lo <= segs[-1][1] + MERGE_GAP:
            segs[-1][1] = max(segs[-1][1], hi)
        else:
            segs.append([lo, hi])
    out, pos = [], 0
    for lo, hi in segs:
        out.append((lo, hi - lo, pos))
        pos += hi - lo
    offsets = {}
    for t in tensors:
        lo, _, buf = next(s for s in out if s[0] <= t.offset < s[0] + s[1])
        offsets[t.name] = buf + t.offset - lo
    return Span(index, out, offsets, sum(t.nbytes for t in tensors))


@dataclass
class Plan:
    path: str
    arch: str
    executable: bool
    n_ctx: int
    batch: int
    budget: int | None
    layers: tuple[int, int]                       # the contiguous range [first, last) this plan runs
    model_bytes: int
    persistent: dict[str, int]                    # tensor name -> bytes (outside the layers)
    layer_bytes: list[int]                        # read-span bytes of each layer in the range
    kv_bytes: int
    state_bytes: int
    small_bytes: int
    verdict: str                                  # "resident", "streaming" or "insufficient"
    min_budget: int
    resident_budget: int
    resident: list[str] = field(default_factory=list)    # big persistent tensors kept resident
    pinned: list[int] = field(default_factory=list)      # layers kept resident
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
    notes: list[str] = field(default_factory=list)
    type_k: str = "f16"                           # KV cache types (memory.kv_cache)
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
        charged as positions fill (in chunks, memory.kv_cache), so below n_ctx the engine holds less;
        the layout (what is pinned, what streams) sets the full cache's kv_bytes aside all the same."""
        lb = dict(zip(range(*self.layers), self.layer_bytes))
        return (self.kv_bytes + self.state_bytes + self.small_bytes + self.n_buffers * self.buffer_bytes
                + sum(self.persistent[n] for n in self.resident) + sum(lb[i] for i in self.pinned)
                + self.embd_row_bytes + self.expert_slots * self.expert_slot_bytes + self.predictor_bytes)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(persistent_bytes=self.persistent_bytes, planned_peak=self.planned_peak,
                 kv_bytes_per_1k=self.kv_bytes_per_1k,
                 largest_layer={"index": self.largest_layer[0], "bytes": self.largest_layer[1]})
        return d


def make_plan(f: GGUFFile, budget: int | None, n_ctx: int | None = None, batch: int = DEFAULT_BATCH,
              layers: tuple[int, int] | None = None, hit_rate: float | None = None, type_k: str = "f16",
              type_v: str = "f16", kv_spill: bool = False, kv_tail: int | None = None, n_seq: int = 1) -> Plan:
    """hit_rate: the expert cache hit rate for expected_bytes_per_token; by default the share of all
    experts the cache holds (what routing spread evenly over the experts would hit)."""
    hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
    n_ctx = min(hp.n_ctx_train, DEFAULT_CTX) if n_ctx is None else n_ctx
    if n_ctx <= 0 or batch <= 0:
        raise InvalidArgument(f"context length and batch must be positive, got {n_ctx} and {batch}")
    a, b = layers or (0, hp.n_layer)
    if not 0 <= a < b <= hp.n_layer:
        raise InvalidArgument(f"layer range [{a}, {b}) is not within the model's {hp.n_layer} layers")
    by_layer: dict[int, list[TensorInfo]] = {i: [] for i in range(a, b)}
    persistent: dict[str, int] = {}
    for t in f.tensors.values():
        i = layer_of(t.name)
        if i is None:
            persistent[t.name] = t.nbytes
        elif i >= hp.n_layer:
            raise ModelFileError(f"tensor {t.name} belongs to layer {i}, but block_count is {hp.n_layer}")
        elif a <= i < b:
            by_layer[i].append(t)
    spans = [span_of(i, by_layer[i]) for i in range(a, b)]
    out_name = "output.weight" if "output.weight" in persistent else "token_embd.weight"
    big = [out_name] if b == hp.n_layer else []              # the last range computes logits
    if a == 0 and "token_embd.weight" not in big:            # the first range embeds tokens
        big.append("token_embd.weight")
    big = [n for n in big if n in persistent]
    kv_pos = bytes_per_position(b - a, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, type_k, type_v)
    kv = kv_rows(n_ctx, n_seq) * kv_pos     # n_seq > 1: its streams' cells, each padded (memory.cells)
    if kv_spill:                       # the tails and the read buffers (memory.kv_spill)
        lay = spill_layout(n_ctx, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, type_k, type_v, batch, kv_tail)
        kv = lay.charged(b - a)
    state = state_bytes(hp, batch, n_ctx)
    small = sum(4 * f.tensors[n].n_elements for n in SMALL                # kept as float32
                if n in f.tensors and (b == hp.n_layer or n != "output_norm.weight"))
    fixed = kv + state + small
    layer_total = sum(s.nbytes for s in spans)
    resident_budget = fixed + layer_total + sum(persistent[n] for n in big)
    experts = {i: [t for t in by_layer[i] if is_expert_tensor(t.name)] for i in range(a, b)}
    apart = hp.n_expert > 0 and all(len(x) == len(EXPERT_SUFFIXES) for x in experts.values())
    k = hp.n_expert_used
    if apart:                          # streaming: layers without their experts, experts one by one
        spans_s = [span_of(i, [t for t in by_layer[i] if not is_expert_tensor(t.name)]) for i in range(a, b)]
        slot = max(expert_span(experts[i], e).nbytes for i in range(a, b) for e in range(hp.n_expert))
        min_slots = k
        # layer i's router and ffn_norm (as f32), resident to guess its experts during layer i-1
        predictors = sum(4 * f.tensors[f"blk.{i}.{ffn_norm(hp.arch)}.weight"].n_elements
                         + f.tensors[f"blk.{i}.ffn_gate_inp.weight"].nbytes for i in range(a + 1, b))
    else:
        spans_s, slot, min_slots, predictors = spans, 0, 0, 0
    expert_total = sum(t.nbytes for x in experts.values() for t in x)
    max_span = max((s.nbytes for s in spans_s), default=0)
    embd = f.tensors.get("token_embd.weight")
    row_bytes = embd.nbytes // embd.dims[1] if embd is not None else 0
    min_budget = fixed + max_span + min_slots * slot + predictors + (batch * row_bytes if a == 0 else 0)
    p = Plan(f.path, hp.arch, is_executable(hp.arch), n_ctx, batch, budget, (a, b),
             sum(t.nbytes for t in f.tensors.values()), persistent, [s.nbytes for s in spans],
             kv, state, small, "resident", min_budget, resident_budget, expert_count=(b - a) * hp.n_expert,
             type_k=kv_type(type_k), type_v=kv_type(type_v), kv_bytes_per_pos=kv_pos, n_ctx_train=hp.n_ctx_train,
             kv_positions=n_ctx)
    if kv_spill:
        p.kv_spill, p.kv_tail, p.kv_spill_file_bytes = True, lay.tail, (b - a) * lay.buffer_bytes
        pos0 = n_ctx - 1                                 # a decode token at a full context
        p.kv_read_bytes_per_token = sum(lay.read_bytes(pos0, 1, lay.spilled_at(pos0, 1), w)
                                        for w in layer_windows(hp, None, (a, b)))
    outside = sum(persistent.values()) - sum(persistent[n] for n in big)          # norms, rope factors
    p.active_bytes_per_token = (sum(t.nbytes for x in by_layer.values() for t in x) - expert_total
                                + (expert_total * k // hp.n_expert if hp.n_expert else 0) + outside
                                + (persistent.get(out_name, 0) if b == hp.n_layer else 0) + (row_bytes if a == 0 else 0))
    if budget is None or budget >= resident_budget:
        p.resident, p.pinned = big, list(range(a, b))
    elif budget < min_budget:
        p.verdict = "insufficient"
    else:
        p.verdict = "streaming"
        p.layer_bytes = [s.nbytes for s in spans_s]
        p.experts_apart, p.expert_slot_bytes, p.predictor_bytes = apart, slot, predictors
        avail = budget - fixed - min_slots * slot - predictors
        p.n_buffers = 2 if avail >= 2 * max_span + (batch * row_bytes if a == 0 else 0) else 1
        p.buffer_bytes = max_span
        head = avail - p.n_buffers * max_span
        # every token reads the output projection and every dense layer, an expert only k/n_expert of
        # the time: a mixture keeps the output resident before its expert cache; the embedding, one row a
        # token, only if it is the output
        share = head if apart else int(head * PERSISTENT_SHARE)
        for n in (big if not apart else [n for n in big if n == out_name]):
            if persistent[n] <= share:
                p.resident.append(n)
                share -= persistent[n]
                head -= persistent[n]
        if a == 0 and "token_embd.weight" not in p.resident:
            p.embd_row_bytes = batch * row_bytes
            head -= p.embd_row_bytes
        for s in spans_s:                         # dense layers first: every token needs all of them
            if s.nbytes <= head:
                p.pinned.append(s.index)
                head -= s.nbytes
        streamed = [s.nbytes for s in spans_s if s.index not in p.pinned]
        if b == hp.n_layer and out_name in persistent and out_name not in p.resident:
            streamed.append(persistent[out_name])
        if not streamed:                          # everything that streams is a row of the embedding
            head += p.n_buffers * p.buffer_bytes
            p.n_buffers = p.buffer_bytes = 0
        if apart:                                 # then the expert cache, in whole slots
            p.expert_slots = min(min_slots + head // slot, p.expert_count)
        misses = (b - a) * k * slot if apart and p.expert_slots < p.expert_count else 0
        dense = sum(streamed) + (row_bytes if p.embd_row_bytes else 0)
        p.streamed_bytes_per_token = dense + misses
        if apart:
            p.expert_hit_rate = p.expert_slots / p.expert_count if hit_rate is None else hit_rate
            p.expected_bytes_per_token = dense + round(misses * (1.0 - p.expert_hit_rate))
        else:
            p.expected_bytes_per_token = p.streamed_bytes_per_token
    if not p.executable:
        p.notes.append(f"architecture {hp.arch} can be inspected and planned but not executed")
    return p


def layer_windows(hp: HParams, module, layers: tuple[int, int]) -> list[int]:
    """Each layer's attention window (0: the whole context), as the architecture's forward pass passes
    it (its is_swa); module: the architecture's module, imported here when None."""
    if module is None:
        import importlib

        from ..models import ALIASES, ARCHITECTURES
        name = ARCHITECTURES.get(ALIASES.get(hp.arch, hp.arch))
        module = importlib.import_module(f"ramforge.models.{name}") if name else None
    swa = getattr(module, "is_swa", None)
    return [hp.sliding_window if swa is not None and swa(hp, il) else 0 for il in range(*layers)]


def block_row_bytes(t: TensorInfo) -> int:
    """Bytes of one row (dims[0] elements) of a 2-D tensor."""
    be, bb = GGML_BLOCK[t.ggml_type]
    return t.dims[0] // be * bb


BATCHES = (64, 32, 16, 8, 4, 2, 1)
# A mixture's chunk may grow to a whole ubatch: llama.cpp's mul_mat_id picks an expert's arithmetic by
# the rows the whole ubatch routes to it, so chunks shorter than the ubatch can round a long prompt's
# expert rows differently. Taken when the run state stays within 1/MOE_STATE_SHARE of the budget.
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
    n_seq: the parallel sequences whose padded streams of cells the KV cache holds (memory.cells.kv_rows).
    kv_spill: True spills the KV cache to storage, None does where the budget cannot hold it for n_ctx
    (then, where spilling does not fit either, the plan holds the positions the budget allows); when it
    spills by itself, its RAM tail takes the budget the weights leave (a pinned weight byte saves a read
    every token, a tail position only past it). kv_tail: the tail's positions (default: the least)."""
    if hit_rate is not None and not 0.0 <= hit_rate <= 1.0:
        raise InvalidArgument(f"an expert hit rate is a fraction from 0 to 1, got {hit_rate}")
    hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
    moe = hp.n_expert > 0
    batches = (batch,) if batch else BATCHES
    grown = () if batch else MOE_BATCHES if moe else (RESIDENT_BATCH,)     # chunks past 64, on a condition
    for b in grown + batches:
        p = make_plan(f, budget, n_ctx, b, layers, hit_rate, type_k, type_v, bool(kv_spill), kv_tail, n_seq)
        if p.verdict == "insufficient":
            continue
        # past 64 tokens: a mixture's chunk while its run state is a small share of the budget, a dense
        # model's while the budget holds it whole (never at the cost of a pinned layer)
        if b <= BATCHES[0] or (not budget or p.state_bytes * MOE_STATE_SHARE <= budget if moe
                               else p.verdict == "resident"):
            break
    if not moe and p.batch > BATCHES[0]:          # the least budget that holds it whole: at 64 tokens
        p.resident_budget = make_plan(f, budget, n_ctx, BATCHES[0], layers, hit_rate, type_k, type_v,
                                      bool(kv_spill), kv_tail, n_seq).resident_budget
    p.min_budget = make_plan(f, None, n_ctx, batches[-1], layers, None, type_k, type_v, bool(kv_spill), kv_tail,
                             n_seq).min_budget
    if kv_spill:
        p.notes.append(f"the KV cache spills to storage: {p.kv_tail} recent positions of each layer in RAM, the older "
                       f"ones in a spill file per layer ({p.kv_spill_file_bytes:,} B on disk), read back per token "
                       f"(at a full context {p.kv_read_bytes_per_token:,} B of K/V per decode token)")
    if budget is not None:                      # the longest context the budget holds (smallest chunk, no pins)
        b1 = batches[-1]
        per = p.kv_bytes_per_pos + state_bytes(hp, b1, 2) - state_bytes(hp, b1, 1)   # cache + attention scores
        base = make_plan(f, None, 1, b1, layers, None, type_k, type_v).min_budget - per
        p.max_ctx = max(0, (budget - base) // per)
        fit = min(p.max_ctx, p.n_ctx) // CHUNK * CHUNK
        if p.verdict == "insufficient" and kv_spill is None:
            # the budget cannot hold the whole context's KV cache: spill it to storage
            q = plan_for_budget(f, budget, n_ctx, layers, batch, hit_rate, type_k, type_v, True, n_seq=n_seq)
            # a weight byte in RAM saves a byte read every token, a tail position's only past it: the tail
            # takes what the weights leave (everything, where they are all resident)
            tail = q.kv_tail + (budget - q.planned_peak) // q.kv_bytes_per_pos if q.verdict != "insufficient" else 0
            if tail > q.kv_tail:
                q2 = plan_for_budget(f, budget, n_ctx, layers, batch, hit_rate, type_k, type_v, True, tail, n_seq)
                q = q2 if q2.verdict != "insufficient" and q2.pinned == q.pinned else q
            if q.verdict != "insufficient":
                q.max_ctx = p.max_ctx
                q.notes.append(f"the budget cannot hold the KV cache of {p.n_ctx:,} positions in RAM ({p.min_budget:,} B "
                               f"would); it spills (--kv-spill off: hold the {fit:,} positions the budget allows)")
                return q
            if fit < CHUNK:                      # nothing holds the context: the smaller minimum is the one to meet
                p.min_budget = min(p.min_budget, q.min_budget)
        if p.verdict == "insufficient" and fit >= CHUNK and not kv_spill:
            # the KV cache grows as the context fills: plan for the positions the budget holds
            q = plan_for_budget(f, budget, fit, layers, batch, hit_rate, type_k, type_v, False, n_seq=n_seq)
            if q.verdict != "insufficient":
                q.n_ctx, q.max_ctx, q.min_budget = p.n_ctx, p.max_ctx, p.min_budget
                q.notes.append(f"the budget holds the KV cache of {fit:,} of the {p.n_ctx:,} positions (it is charged "
                               f"in chunks of {CHUNK} as the context fills); growing past them fails with a budget "
                               f"error naming the position; {p.min_budget:,} B hold the whole context")
                return q
    if moe and p.batch < UBATCH and p.verdict != "insufficient":
        whole = make_plan(f, None, n_ctx, UBATCH, layers, None, type_k, type_v).state_bytes * MOE_STATE_SHARE
        p.notes.append(f"prompts longer than {p.batch} tokens are computed in chunks of {p.batch}; llama.cpp "
                       f"picks an expert's arithmetic by its rows in a whole ubatch ({UBATCH}), so their logits "
                       f"can differ from llama.cpp's in the last bits; a budget of {whole:,} B or more makes "
                       f"chunks whole ubatches")
    return p
