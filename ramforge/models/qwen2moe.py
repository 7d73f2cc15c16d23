"""qwen2moe, as llama.cpp's src/models/qwen2moe.cpp: qwen2's attention (Q/K/V biases, NEOX RoPE) and,
for the FFN, a mixture of experts (weights not normalized) plus a shared expert scaled by the
sigmoid of its own gate (models.moe)."""
from __future__ import annotations

from . import llama
from .arch import Arch, MoEArch

ARCH = Arch("qwen2moe", llama.forward, llama.embed, (*llama.with_experts(llama.LAYER_TENSORS), *llama.SHARED_EXPERT),
            optional=llama.BIASES, also_read=llama.ALSO_READ, rope_neox=True, rope_freqs=True, k_shift=True,
            moe=MoEArch(required=True, ff_key=True, shared=True, norm_w=False))
