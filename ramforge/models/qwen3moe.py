"""qwen3moe, as llama.cpp's src/models/qwen3moe.cpp: qwen3's attention (per-head Q/K RMSNorm, NEOX
RoPE) and, for the FFN, a mixture of experts (models.moe) with weights normalized to sum 1."""
from __future__ import annotations

from . import llama, qwen3
from .arch import Arch, MoEArch

ARCH = Arch("qwen3moe", llama.forward, llama.embed, llama.with_experts(qwen3.LAYER_TENSORS),
            also_read=llama.ALSO_READ | llama.BIASES, rope_neox=True, rope_freqs=True, k_shift=True,
            moe=MoEArch(required=True, ff_key=True, shared=False, norm_w=True))
