"""qwen2, as llama.cpp's src/models/qwen2.cpp: llama with Q/K/V biases and NEOX-style RoPE."""
from __future__ import annotations

from . import llama
from .arch import Arch

ARCH = Arch("qwen2", llama.forward, llama.embed, llama.LAYER_TENSORS, optional=llama.BIASES,
            also_read=llama.ALSO_READ, rope_neox=True, rope_freqs=True, k_shift=True)
