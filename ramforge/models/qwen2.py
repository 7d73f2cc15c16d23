"""qwen2, as llama.cpp's src/models/qwen2.cpp: llama with Q/K/V biases and NEOX-style RoPE."""
from __future__ import annotations

from . import llama

ROPE_NEOX = True
LAYER_TENSORS = llama.LAYER_TENSORS
OPTIONAL = llama.OPTIONAL


def forward(m, s, tokens, pos0: int) -> None:
    llama.forward(m, s, tokens, pos0, neox=ROPE_NEOX)
