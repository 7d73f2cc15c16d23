"""qwen3, as llama.cpp's src/models/qwen3.cpp: llama with per-head Q/K RMSNorm and NEOX-style RoPE."""
from __future__ import annotations

from . import llama

ROPE_NEOX = True
LAYER_TENSORS = [t for t in llama.LAYER_TENSORS if not t.endswith("_bias")] + ["attn_q_norm", "attn_k_norm"]
OPTIONAL: set[str] = set()
ALSO_READ = set(llama.OPTIONAL) | {"ffn_gate_inp"}   # llama.forward looks for qwen2's biases, a router: None


embed = llama.embed


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch=None) -> None:
    llama.forward(m, s, n, pos0, neox=ROPE_NEOX, out=out, batch=batch)
