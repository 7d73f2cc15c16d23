"""Architectures: the table of what ramforge can execute; everything else is inspect-only.

Mistral models ship as GGUF architecture `llama` and run through ramforge.models.llama, as do
Mixtral's (llama with experts: `llama.expert_count`).
"""
from __future__ import annotations

# GGUF general.architecture -> module under ramforge.models with LAYER_TENSORS, OPTIONAL, ALSO_READ, forward()
ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "gemma2": "gemma2",
    "phi3": "phi3",
    "qwen3moe": "qwen3moe",
    "qwen2moe": "qwen2moe",
    "gpt-oss": "gpt_oss",
    "bert": "bert",
}

# The norm before a layer's FFN, where it is not `ffn_norm` (the expert guess norms with it).
FFN_NORM: dict[str, str] = {"gpt-oss": "post_attention_norm"}

# Aliases that share another architecture's forward pass. None yet: llama.cpp builds the phi3, gemma2 and
# gemma3 graphs for those architectures alone (phimoe, gemma, gemma3n have graphs of their own).
ALIASES: dict[str, str] = {}


def is_executable(arch: str) -> bool:
    return ALIASES.get(arch, arch) in ARCHITECTURES


def ffn_norm(arch: str) -> str:
    """The tensor suffix of the norm before a layer's FFN in architecture `arch`."""
    return FFN_NORM.get(ALIASES.get(arch, arch), "ffn_norm")
