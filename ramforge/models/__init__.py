"""Architectures: the table of what ramforge can execute; everything else is inspect-only.

Each model module defines its `ARCH` record (models/arch.py); `ARCHS` maps every GGUF
general.architecture name a record runs (its name and aliases) to it. Mistral models ship as GGUF
architecture `llama` and run through ramforge.models.llama, as do Mixtral's (llama with experts:
`llama.expert_count`). Adding an architecture: docs/ARCHITECTURE.md, "Adding an architecture".
"""
from __future__ import annotations

from ..errors import UnsupportedArch
from . import bert, gemma2, gemma3, gemma_embedding, gpt_oss, jina_bert, llama, nomic_bert, phi3, qwen2, qwen2moe, qwen3, \
    qwen3moe
from .arch import Arch


def _table(records) -> dict[str, Arch]:
    """name and aliases -> record; a name claimed twice is a programming error."""
    table: dict[str, Arch] = {}
    for a in records:
        for name in (a.name, *a.aliases):
            if name in table:
                raise ValueError(f"architecture name {name!r} claimed by {table[name].name} and {a.name}")
            table[name] = a
    return table


# GGUF general.architecture -> its record. (None has aliases: llama.cpp builds the phi3, gemma2 and gemma3
# graphs for those architectures alone; phimoe, gemma, gemma3n have graphs of their own.)
ARCHS: dict[str, Arch] = _table(m.ARCH for m in (llama, qwen2, qwen3, gemma3, gemma2, phi3, qwen3moe, qwen2moe,
                                                 gpt_oss, bert, nomic_bert, gemma_embedding, jina_bert))


def arch_of(name) -> Arch:
    """The record of GGUF architecture `name`; UnsupportedArch for one ramforge cannot execute."""
    a = ARCHS.get(name) if isinstance(name, str) else None
    if a is None:
        raise UnsupportedArch(f"architecture {name!r} cannot be executed; executable: "
                              f"{', '.join(sorted(ARCHS))} (any architecture can be inspected)")
    return a


def is_executable(name: str) -> bool:
    return name in ARCHS


def ffn_norm(name: str) -> str:
    """The tensor suffix of the norm before a layer's FFN (Arch.ffn_norm; `ffn_norm` for an
    inspect-only architecture)."""
    a = ARCHS.get(name)
    return a.ffn_norm if a is not None else "ffn_norm"


def layer_windows(hp, layers: tuple[int, int]) -> list[int]:
    """Each layer's attention window (0: the whole context), as the forward pass passes it
    (Arch.windows; no window for an inspect-only architecture)."""
    a = ARCHS.get(hp.arch)
    return a.windows(hp, layers) if a is not None else [0] * (layers[1] - layers[0])
