"""Where a layer range's tensors are and how they are read: the tensor table classified (per layer,
persistent, what the range reads) and each layer's read span, whole and as it streams (a mixture's
experts apart, one slot each). Pure steps of the memory plan (stream.plan): records in, records out.

A span is a layer's tensors as file segments aligned to DIRECT_ALIGN (O_DIRECT), tensors closer than
MERGE_GAP in one segment, laid back to back in a buffer; the plan counts the alignment's slack.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..errors import ModelFileError
from ..flags import DIRECT_ALIGN as ALIGN
from ..gguf.constants import GGML_BLOCK
from ..gguf.reader import TensorInfo
from ..models import ARCHS, ffn_norm
from ..models.config import HParams

MERGE_GAP = 1 << 16         # tensors closer than this are read in one span
SMALL = ("output_norm.weight", "rope_freqs.weight",     # and the architectures' own tensors (Arch.global_vectors)
         *dict.fromkeys(t for a in ARCHS.values() for t in a.global_vectors))
EXPERT_SUFFIXES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
EMBD, OUTPUT = "token_embd.weight", "output.weight"
_LAYER = re.compile(r"^blk\.(\d+)\.")


def layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def block_row_bytes(t: TensorInfo) -> int:
    """Bytes of one row (dims[0] elements) of a 2-D tensor."""
    be, bb = GGML_BLOCK[t.ggml_type]
    return t.dims[0] // be * bb


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


@dataclass(frozen=True)
class Tensors:
    """The tensor table sorted for one layer range (classify_tensors)."""

    layers: tuple[int, int]
    by_layer: Mapping[int, tuple[TensorInfo, ...]]   # the range's layers' tensors
    persistent: Mapping[str, int]                 # tensor name -> bytes, outside the layers (all of them)
    out_name: str                                 # the output projection: output.weight, else the tied embedding
    big: tuple[str, ...]                          # the large persistent tensors this range reads
    small_bytes: int                              # the small persistent tensors (SMALL), kept as float32
    embd_row_bytes: int                           # one row of the token embedding (0: none)
    model_bytes: int
    logits: bool                                  # the range computes the logits (the last, unless embedding)

    @property
    def embeds(self) -> bool:                     # the first range embeds the tokens
        return self.layers[0] == 0


def classify_tensors(table: Mapping[str, TensorInfo], n_layer: int, layers: tuple[int, int],
                     logits: bool = True) -> Tensors:
    """Sort a tensor table (name -> TensorInfo) into the range's layers and the persistent tensors.
    logits=False: passes that end in the hidden states (embeddings), which never read the output matrix."""
    a, b = layers
    by_layer: dict[int, list[TensorInfo]] = {i: [] for i in range(a, b)}
    persistent: dict[str, int] = {}
    for t in table.values():
        i = layer_of(t.name)
        if i is None:
            persistent[t.name] = t.nbytes
        elif i >= n_layer:
            raise ModelFileError(f"tensor {t.name} belongs to layer {i}, but block_count is {n_layer}")
        elif a <= i < b:
            by_layer[i].append(t)
    out_name = OUTPUT if OUTPUT in persistent else EMBD
    logits = logits and b == n_layer
    big = [out_name] if logits else []                    # the last range computes logits
    if a == 0 and EMBD not in big:                        # the first range embeds tokens
        big.append(EMBD)
    small = sum(4 * table[n].n_elements for n in SMALL
                if n in table and (b == n_layer or n != "output_norm.weight"))
    embd = table.get(EMBD)
    return Tensors(layers, {i: tuple(ts) for i, ts in by_layer.items()}, persistent, out_name,
                   tuple(n for n in big if n in persistent), small,
                   embd.nbytes // embd.dims[1] if embd is not None else 0, sum(t.nbytes for t in table.values()),
                   logits)


@dataclass(frozen=True)
class Experts:
    """How a mixture's experts are read when it streams (all zero for a dense model)."""

    apart: bool = False                           # one by one into an expert cache, apart from their layers
    slot_bytes: int = 0                           # one expert's read span (largest over layers and experts)
    min_slots: int = 0                            # the cache's least capacity: one layer's top-k
    predictor_bytes: int = 0                      # layers' routers and ffn_norms, resident to predict experts
    total_bytes: int = 0                          # the range's expert tensors
    count: int = 0                                # experts in the range (layers x n_expert)
    k: int = 0                                    # experts a token uses per layer
    n_expert: int = 0


@dataclass(frozen=True)
class Layout:
    """The range's read spans (layer_layout): whole layers (resident) and as they stream."""

    spans: tuple[Span, ...]
    stream_spans: tuple[Span, ...]                # without the experts where they stream apart
    experts: Experts

    @property
    def max_span(self) -> int:
        return max((s.nbytes for s in self.stream_spans), default=0)


def layer_layout(hp: HParams, t: Tensors) -> Layout:
    """Each layer's read span; for a mixture whose every layer has its 3 expert tensors, the spans
    without them and one expert's slot."""
    a, b = t.layers
    spans = tuple(span_of(i, list(t.by_layer[i])) for i in range(a, b))
    experts = {i: [x for x in t.by_layer[i] if is_expert_tensor(x.name)] for i in range(a, b)}
    total = sum(x.nbytes for ts in experts.values() for x in ts)
    ex = Experts(total_bytes=total, count=(b - a) * hp.n_expert, k=hp.n_expert_used, n_expert=hp.n_expert)
    if not (hp.n_expert > 0 and all(len(x) == len(EXPERT_SUFFIXES) for x in experts.values())):
        return Layout(spans, spans, ex)
    names = {i: {x.name: x for x in t.by_layer[i]} for i in range(a, b)}
    # layer i's router and ffn_norm (as f32), resident to guess its experts during layer i-1
    predictors = sum(4 * names[i][f"blk.{i}.{ffn_norm(hp.arch)}.weight"].n_elements
                     + names[i][f"blk.{i}.ffn_gate_inp.weight"].nbytes for i in range(a + 1, b))
    slot = max(expert_span(experts[i], e).nbytes for i in range(a, b) for e in range(hp.n_expert))
    stream = tuple(span_of(i, [x for x in t.by_layer[i] if not is_expert_tensor(x.name)]) for i in range(a, b))
    return Layout(spans, stream, replace(ex, apart=True, slot_bytes=slot, min_slots=hp.n_expert_used,
                                         predictor_bytes=predictors))
