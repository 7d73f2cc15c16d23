"""Memory plan: what stays resident, what streams, and the smallest budget that works.

Rules (the runtime follows the same ones):
- KV cache: F16, n_layer x n_ctx x n_head_kv x (key_length + value_length) x 2 B.
- Activations: f32 working vectors for one token plus the attention scores and the logits.
- Streaming needs one layer buffer (the largest layer) plus the KV cache and activations;
  persistent tensors that do not fit are streamed through that buffer in chunks.
- Fully resident needs the whole model plus the KV cache and activations.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from .errors import RamforgeError
from .gguf.constants import Keys
from .gguf.reader import GGUFFile
from .models import is_executable
from .models.config import HParams

DEFAULT_CTX = 4096          # as llama-cli: the default context, capped by the model's own
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
        raise RamforgeError(f"{f.path}: cannot tell the vocabulary size (no {Keys.TOKENS} and no token_embd.weight)")
    return embd.dims[1]


@dataclass
class Plan:
    path: str
    arch: str
    executable: bool
    n_ctx: int
    budget: int | None
    model_bytes: int
    persistent: dict[str, int]          # tensor name -> bytes (outside the layers)
    layer_bytes: list[int]              # bytes of each layer, by index
    kv_bytes: int
    activation_bytes: int
    min_budget: int                     # one layer + KV + activations
    resident_budget: int                # whole model + KV + activations
    verdict: str                        # "resident", "streaming" or "insufficient"
    streamed_bytes_per_token: int
    notes: list[str] = field(default_factory=list)

    @property
    def persistent_bytes(self) -> int:
        return sum(self.persistent.values())

    @property
    def largest_layer(self) -> tuple[int, int]:
        i = max(range(len(self.layer_bytes)), key=self.layer_bytes.__getitem__) if self.layer_bytes else -1
        return i, (self.layer_bytes[i] if i >= 0 else 0)

    def to_json(self) -> dict:
        d = asdict(self)
        d["persistent_bytes"] = self.persistent_bytes
        d["largest_layer"] = {"index": self.largest_layer[0], "bytes": self.largest_layer[1]}
        return d


def make_plan(f: GGUFFile, budget: int | None, n_ctx: int | None = None) -> Plan:
    hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
    n_ctx = min(hp.n_ctx_train, DEFAULT_CTX) if n_ctx is None else n_ctx
    if n_ctx <= 0:
        raise RamforgeError(f"context length must be positive, got {n_ctx}")
    layers = [0] * hp.n_layer
    persistent: dict[str, int] = {}
    for t in f.tensors.values():
        i = layer_of(t.name)
        if i is None:
            persistent[t.name] = t.nbytes
        elif i >= hp.n_layer:
            raise RamforgeError(f"tensor {t.name} belongs to layer {i}, but block_count is {hp.n_layer}")
        else:
            layers[i] += t.nbytes
    kv = hp.n_layer * n_ctx * hp.n_head_kv * (hp.head_dim_k + hp.head_dim_v) * 2
    q_dim, kv_dim = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
    act = 4 * (4 * hp.n_embd + 2 * hp.n_ff + q_dim + 2 * kv_dim + hp.n_head * n_ctx + hp.n_vocab)
    model = sum(layers) + sum(persistent.values())
    largest = max(layers, default=0)
    min_budget = largest + kv + act
    resident = model + kv + act
    if budget is None or budget >= resident:
        verdict, streamed = "resident", 0
    elif budget >= min_budget:
        verdict, streamed = "streaming", model
    else:
        verdict, streamed = "insufficient", model
    p = Plan(f.path, hp.arch, is_executable(hp.arch), n_ctx, budget, model, persistent, layers,
             kv, act, min_budget, resident, verdict, streamed)
    if not p.executable:
        p.notes.append(f"architecture {hp.arch} can be inspected and planned but not yet executed")
    return p
