"""Hyperparameters read from GGUF metadata, validated once, named after the GGUF keys."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelFileError
from ..gguf.constants import Keys


class ConfigError(ModelFileError):
    """Hyperparameters that are missing or inconsistent."""


def _get(md: dict[str, Any], template: str, arch: str, default=None, required=True):
    key = Keys.of(template, arch)
    if key in md:
        return md[key]
    if required and default is None:
        raise ConfigError(f"metadata key {key} is missing; it is required for architecture {arch}")
    return default


def _positive_int(md, template, arch, default=None, required=True) -> int:
    v = _get(md, template, arch, default, required)
    if v is None:
        return 0
    if isinstance(v, np.ndarray):      # per-layer values: ramforge needs one value for all layers
        if v.size == 0 or (v != v.flat[0]).any():
            raise ConfigError(f"{Keys.of(template, arch)} varies per layer ({v.tolist()[:8]}...); not supported")
        v = v.flat[0]
    if isinstance(v, bool) or int(v) != v or int(v) < 0:
        raise ConfigError(f"{Keys.of(template, arch)} = {v!r}: expected a non-negative integer")
    return int(v)


@dataclass(frozen=True)
class MoEArch:
    """How an architecture's experts are described (llama.cpp's load_arch_hparams / load_arch_tensors)."""

    required: bool          # experts are the FFN (qwen*moe), else optional (llama: Mixtral)
    ff_key: bool            # expert width from {arch}.expert_feed_forward_length (else feed_forward_length)
    shared: bool            # a shared expert, {arch}.expert_shared_feed_forward_length wide (default n_ff)


# The architectures whose experts ramforge runs; any other architecture's expert keys are only inspected.
MOE_ARCHS: dict[str, MoEArch] = {
    "qwen3moe": MoEArch(required=True, ff_key=True, shared=False),
    "qwen2moe": MoEArch(required=True, ff_key=True, shared=True),
    "llama": MoEArch(required=False, ff_key=False, shared=False),
    "gpt-oss": MoEArch(required=True, ff_key=True, shared=False),
}


def _experts(md: dict[str, Any], arch: str, n_ff: int) -> tuple[int, int, int, int]:
    """(n_expert, n_expert_used, n_ff_exp, n_ff_shexp), validated for the architectures in MOE_ARCHS."""
    n_expert = _positive_int(md, Keys.EXPERT_COUNT, arch, required=False)
    n_used = _positive_int(md, Keys.EXPERT_USED_COUNT, arch, required=False)
    moe = MOE_ARCHS.get(arch)
    if moe is None or (n_expert == 0 and not moe.required):
        return n_expert, n_used, 0, 0
    ec, uc = Keys.of(Keys.EXPERT_COUNT, arch), Keys.of(Keys.EXPERT_USED_COUNT, arch)
    if n_expert == 0:
        raise ConfigError(f"{ec} is {'missing' if ec not in md else 0}; a {arch} model needs at least one expert")
    if not 1 <= n_used <= n_expert:
        raise ConfigError(f"{uc} = {n_used}: each token must use between 1 and {ec} = {n_expert} experts")
    n_ff_exp = n_ff
    if moe.ff_key:
        n_ff_exp = _positive_int(md, Keys.EXPERT_FEED_FORWARD_LENGTH, arch, default=n_ff // n_used)
    n_ff_shexp = _positive_int(md, Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, arch, default=n_ff) if moe.shared else 0
    if n_ff_exp == 0:
        raise ConfigError(f"{arch}: the experts' FFN width is 0")
    return n_expert, n_used, n_ff_exp, n_ff_shexp


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layer: int            # {arch}.block_count
    n_embd: int             # {arch}.embedding_length
    n_ff: int               # {arch}.feed_forward_length
    n_head: int             # {arch}.attention.head_count
    n_head_kv: int          # {arch}.attention.head_count_kv (defaults to n_head)
    head_dim_k: int         # {arch}.attention.key_length (defaults to n_embd / n_head)
    head_dim_v: int         # {arch}.attention.value_length
    n_ctx_train: int        # {arch}.context_length
    n_vocab: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    sliding_window: int     # 0: none
    n_expert: int = 0       # {arch}.expert_count (0: a dense FFN)
    n_expert_used: int = 0  # {arch}.expert_used_count: experts per token
    n_ff_exp: int = 0       # one expert's FFN width
    n_ff_shexp: int = 0     # the shared expert's FFN width (qwen2moe), 0: none

    @property
    def n_ff_dense(self) -> int:
        """Width of the FFN that runs as plain matmuls: the dense FFN, or a MoE model's shared expert."""
        return self.n_ff_shexp if self.n_expert else self.n_ff

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int) -> "HParams":
        arch = md.get(Keys.ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            raise ConfigError(f"metadata key {Keys.ARCHITECTURE} is missing or not a string: {arch!r}")
        n_embd = _positive_int(md, Keys.EMBEDDING_LENGTH, arch)
        n_head = _positive_int(md, Keys.HEAD_COUNT, arch)
        if n_head == 0:
            raise ConfigError(f"{Keys.of(Keys.HEAD_COUNT, arch)} is 0; a model needs at least one attention head")
        n_head_kv = _positive_int(md, Keys.HEAD_COUNT_KV, arch, default=n_head)
        if n_head_kv == 0 or n_head % n_head_kv:
            raise ConfigError(f"{Keys.of(Keys.HEAD_COUNT_KV, arch)} = {n_head_kv} must be positive and divide "
                              f"{Keys.of(Keys.HEAD_COUNT, arch)} = {n_head}")
        if n_embd % n_head and Keys.of(Keys.KEY_LENGTH, arch) not in md:
            raise ConfigError(f"embedding length {n_embd} is not a multiple of head count {n_head} "
                              f"and {Keys.of(Keys.KEY_LENGTH, arch)} is not given")
        head_dim_k = _positive_int(md, Keys.KEY_LENGTH, arch, default=n_embd // n_head)
        n_ff = _positive_int(md, Keys.FEED_FORWARD_LENGTH, arch)
        return cls(
            arch=arch,
            n_layer=_positive_int(md, Keys.BLOCK_COUNT, arch),
            n_embd=n_embd,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=_positive_int(md, Keys.VALUE_LENGTH, arch, default=head_dim_k),
            n_ctx_train=_positive_int(md, Keys.CONTEXT_LENGTH, arch, default=2048),
            n_vocab=n_vocab,
            rms_eps=float(_get(md, Keys.LAYERNORM_RMS_EPS, arch, default=1e-5)),
            rope_base=float(_get(md, Keys.ROPE_FREQ_BASE, arch, default=10000.0)),
            rope_dim=_positive_int(md, Keys.ROPE_DIMENSION_COUNT, arch, default=head_dim_k),
            sliding_window=_positive_int(md, Keys.SLIDING_WINDOW, arch, default=0, required=False),
            **dict(zip(("n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp"), _experts(md, arch, n_ff))),
        )
