"""qwen2, as llama.cpp's src/models/qwen2.cpp: llama with Q/K/V biases and NEOX-style RoPE."""
from __future__ import annotations

from . import llama

ROPE_NEOX = True
LAYER_TENSORS = llama.LAYER_TENSORS
OPTIONAL = llama.OPTIONAL
ALSO_READ = llama.ALSO_READ


embed = llama.embed


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch=None) -> None:
    llama.forward(m, s, n, pos0, neox=ROPE_NEOX, out=out, batch=batch)
