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
        return cls(
            arch=arch,
            n_layer=_positive_int(md, Keys.BLOCK_COUNT, arch),
            n_embd=n_embd,
            n_ff=_positive_int(md, Keys.FEED_FORWARD_LENGTH, arch),
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
        )
