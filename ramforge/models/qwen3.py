"""qwen3, as llama.cpp's src/models/qwen3.cpp: llama with per-head Q/K RMSNorm and NEOX-style RoPE."""
from __future__ import annotations

from . import llama
from .arch import Arch

LAYER_TENSORS = (*(t for t in llama.LAYER_TENSORS if not t.endswith("_bias")), "attn_q_norm", "attn_k_norm")
ALSO_READ = llama.BIASES | {"ffn_gate_inp"}     # llama.forward looks for qwen2's biases, a router: None

ARCH = Arch("qwen3", llama.forward, llama.embed, LAYER_TENSORS, also_read=ALSO_READ, rope_neox=True,
            rope_freqs=True, k_shift=True)
