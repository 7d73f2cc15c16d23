"""qwen3moe, as llama.cpp's src/models/qwen3moe.cpp: qwen3's attention (per-head Q/K RMSNorm, NEOX
RoPE) and, for the FFN, a mixture of experts (models.moe) with weights normalized to sum 1."""
from __future__ import annotations

from . import llama, qwen3

ROPE_NEOX = True
LAYER_TENSORS = [t for t in qwen3.LAYER_TENSORS if t not in llama.DENSE_FFN] + llama.MOE_FFN
OPTIONAL: set[str] = set()
ALSO_READ = llama.ALSO_READ | set(llama.OPTIONAL)


embed = llama.embed


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch=None) -> None:
    llama.forward(m, s, n, pos0, neox=ROPE_NEOX, out=out, batch=batch)
