"""qwen2moe, as llama.cpp's src/models/qwen2moe.cpp: qwen2's attention (Q/K/V biases, NEOX RoPE) and,
for the FFN, a mixture of experts (weights not normalized) plus a shared expert scaled by the
sigmoid of its own gate (models.moe)."""
from __future__ import annotations

from . import llama

ROPE_NEOX = True
LAYER_TENSORS = [t for t in llama.LAYER_TENSORS if t not in llama.DENSE_FFN] + llama.MOE_FFN + llama.SHARED_EXPERT
OPTIONAL = llama.OPTIONAL
ALSO_READ = llama.ALSO_READ


embed = llama.embed


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch=None) -> None:
    llama.forward(m, s, n, pos0, neox=ROPE_NEOX, out=out, batch=batch)
