"""Hyperparameters read from GGUF metadata, validated once, named after the GGUF keys."""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from ..errors import ModelFileError, Unsupported
from ..gguf.constants import Keys
from ..kernels.ops import UNSCALED, RopeScale, logf
from . import ARCHS
from .arch import NO_CAPS, Arch


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


def _experts(md: dict[str, Any], arch: str, spec: Arch | None, n_ff: int) -> tuple[int, int, int, int]:
    """(n_expert, n_expert_used, n_ff_exp, n_ff_shexp), validated where the record runs experts (Arch.moe);
    any other architecture's expert keys are only inspected."""
    n_expert = _positive_int(md, Keys.EXPERT_COUNT, arch, required=False)
    n_used = _positive_int(md, Keys.EXPERT_USED_COUNT, arch, required=False)
    moe = spec.moe if spec is not None else None
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


# ---------------------------------------------------------------- RoPE scaling
#
# RoPE scaling as llama.cpp resolves it from a file's metadata: the arguments of every ggml_rope_ext.
#
# llama.cpp reads `{arch}.rope.scaling.type` (absent: "linear"), `.factor` (or the old `.scale_linear`;
# absent or 0: no scaling), `.attn_factor` (1), `.original_context_length` (the training context) for
# every architecture (llama-model.cpp's load_hparams), then sets the context's parameters
# (llama-context.cpp): freq_scale = 1/factor (1 for type none); YaRN's ext_factor = 1 (0 otherwise); and
# for YaRN an attn_factor of mscale(factor) / (1 + 0.1 ln factor), which ggml's rope multiplies back by
# (1 + 0.1 ln factor). The float steps below are libllama's (float32, no fma: that library is built
# without it) with libm's logf; ggml-cpu's own steps are in kernels.ops.rope.
#
# The YaRN tuning keys (`.yarn_ext_factor`, `.yarn_attn_factor`, `.yarn_beta_fast`, `.yarn_beta_slow`,
# `.yarn_log_multiplier`) are read by llama.cpp only for grok, mistral3 and deepseek2, none of which ramforge
# executes: here they are checked for range (a broken file is refused) but, as in llama.cpp, not used
# (llama-cpp-python passes beta_fast 32 and beta_slow 1 in any case).


class RopeScaling(str, Enum):
    """llama_rope_scaling_type, by the names GGUF files use."""

    NONE = "none"
    LINEAR = "linear"
    YARN = "yarn"
    LONGROPE = "longrope"


class UnsupportedRopeScaling(Unsupported):
    """A RoPE scaling type ramforge does not reproduce (for this architecture)."""


# what each scaling type needs from the forward pass: LongRoPE's factor tensors are chosen per
# architecture (models/phi3.py), so only the architectures whose record says `longrope` run it
REPRODUCED = (RopeScaling.NONE, RopeScaling.LINEAR, RopeScaling.YARN, RopeScaling.LONGROPE)

BETA_FAST, BETA_SLOW = 32.0, 1.0       # llama_hparams' defaults (and what llama-cpp-python passes)
_YARN_TUNING = (Keys.ROPE_SCALING_YARN_EXT_FACTOR, Keys.ROPE_SCALING_YARN_ATTN_FACTOR,
                Keys.ROPE_SCALING_YARN_BETA_FAST, Keys.ROPE_SCALING_YARN_BETA_SLOW,
                Keys.ROPE_SCALING_YARN_LOG_MUL)


def _number(md: dict[str, Any], template: str, arch: str) -> float | None:
    key = Keys.of(template, arch)
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, (bool, str, bytes)) or not np.isscalar(v) or not math.isfinite(float(v)):
        raise ConfigError(f"{key} = {v!r}: expected a finite number")
    return float(v)


def _yarn_attn_factor(freq_scale: np.float32) -> np.float32:
    """llama-context.cpp's YaRN attn_factor (mscale 1, no log multiplier): get_mscale(factor, 1) times
    1 / (1 + 0.1 ln factor), factor = 1 / freq_scale, in float32 steps."""
    f = np.float32
    factor = f(1.0) / freq_scale
    mscale = f(1.0) if factor <= f(1.0) else f(f(f(0.1) * f(1.0)) * logf(factor)) + f(1.0)
    return f(mscale * f(f(1.0) / f(f(1.0) + f(f(0.1) * logf(factor)))))


def rope_scaling(md: dict[str, Any], arch: str, n_ctx_train: int) -> tuple[RopeScaling, RopeScale]:
    """(scaling type, ggml_rope_ext's scaling arguments, the original context among them) for a file's metadata.

    Raises ConfigError naming the key of a value out of range, UnsupportedRopeScaling for a type
    ramforge does not reproduce."""
    type_key = Keys.of(Keys.ROPE_SCALING_TYPE, arch)
    name = md.get(type_key, RopeScaling.LINEAR.value)
    try:
        kind = RopeScaling(name)
    except ValueError:
        raise UnsupportedRopeScaling(f"{type_key} = {name!r} is not a RoPE scaling ramforge reproduces; "
                                     f"reproduced: {', '.join(k.value for k in REPRODUCED)}") from None
    if kind == RopeScaling.LONGROPE and not (arch in ARCHS and ARCHS[arch].longrope):
        raise UnsupportedRopeScaling(f"{type_key} = 'longrope' is reproduced only for "
                                     f"{', '.join(sorted(n for n, a in ARCHS.items() if a.longrope))}, not {arch}")
    old_name = Keys.of(Keys.ROPE_SCALING_FACTOR, arch) not in md and Keys.of(Keys.ROPE_SCALE_LINEAR, arch) in md
    factor_key = Keys.ROPE_SCALE_LINEAR if old_name else Keys.ROPE_SCALING_FACTOR
    factor = _number(md, factor_key, arch) or 0.0
    if factor < 0 or (kind == RopeScaling.YARN and factor == 0):
        raise ConfigError(f"{Keys.of(factor_key, arch)} = {factor}: a RoPE scaling factor must be positive")
    attn = _number(md, Keys.ROPE_SCALING_ATTN_FACTOR, arch)
    if attn is not None and attn <= 0:
        raise ConfigError(f"{Keys.of(Keys.ROPE_SCALING_ATTN_FACTOR, arch)} = {attn}: must be positive")
    orig = _number(md, Keys.ROPE_SCALING_ORIG_CTX_LEN, arch)
    if orig is not None and (orig < 1 or orig != int(orig)):
        raise ConfigError(f"{Keys.of(Keys.ROPE_SCALING_ORIG_CTX_LEN, arch)} = {orig}: must be a positive integer")
    _check_yarn_tuning(md, arch)

    f = np.float32
    freq_scale = f(1.0) if factor == 0 or kind == RopeScaling.NONE else f(f(1.0) / f(factor))
    ext_factor = f(1.0) if kind == RopeScaling.YARN else f(0.0)
    attn_factor = _yarn_attn_factor(freq_scale) if ext_factor != 0 else f(1.0)
    attn_factor = f(attn_factor * f(1.0 if attn is None else attn))
    n_ctx_orig = int(orig) if orig else n_ctx_train
    return kind, RopeScale(float(freq_scale), float(ext_factor), float(attn_factor), BETA_FAST, BETA_SLOW,
                           n_ctx_orig)


def _check_yarn_tuning(md: dict[str, Any], arch: str) -> None:
    """The YaRN tuning keys llama.cpp does not read for ramforge's architectures: refused when out of range."""
    ext, yattn, fast, slow, _ = (_number(md, t, arch) for t in _YARN_TUNING)
    if ext is not None and not 0 <= ext <= 1:
        raise ConfigError(f"{Keys.of(Keys.ROPE_SCALING_YARN_EXT_FACTOR, arch)} = {ext}: must be in [0, 1]")
    if yattn is not None and yattn <= 0:
        raise ConfigError(f"{Keys.of(Keys.ROPE_SCALING_YARN_ATTN_FACTOR, arch)} = {yattn}: must be positive")
    for key, v in ((Keys.ROPE_SCALING_YARN_BETA_FAST, fast), (Keys.ROPE_SCALING_YARN_BETA_SLOW, slow)):
        if v is not None and v <= 0:
            raise ConfigError(f"{Keys.of(key, arch)} = {v}: must be positive")
    fast, slow = BETA_FAST if fast is None else fast, BETA_SLOW if slow is None else slow
    if fast < slow:
        raise ConfigError(f"{Keys.of(Keys.ROPE_SCALING_YARN_BETA_FAST, arch)} = {fast} is below "
                          f"{Keys.of(Keys.ROPE_SCALING_YARN_BETA_SLOW, arch)} = {slow}: beta_fast must be >= beta_slow")


# ---------------------------------------------------------------- soft-capping

def _softcaps(md: dict[str, Any], arch: str, spec: Arch | None) -> tuple[float, float]:
    """(attention, final) logit soft-caps as the record's graph applies them (Arch.softcaps), 0: none."""
    caps = spec.softcaps if spec is not None else NO_CAPS
    out = []
    for template, default in ((Keys.ATTN_LOGIT_SOFTCAPPING, caps.attn), (Keys.FINAL_LOGIT_SOFTCAPPING, caps.final)):
        if default is None:
            out.append(0.0)
            continue
        v = _number(md, template, arch)
        v = default if v is None else v
        if v < 0 or (v == 0 and default != 0):
            raise ConfigError(f"{Keys.of(template, arch)} = {v}: a soft-cap must be positive")
        out.append(float(np.float32(v)))
    return out[0], out[1]


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
    rms_eps: float          # {arch}.attention.layer_norm_rms_epsilon
    rope_base: float
    rope_dim: int
    sliding_window: int     # {arch}.attention.sliding_window (default Arch.sliding_window_default), 0: none
    n_expert: int = 0       # {arch}.expert_count (0: a dense FFN)
    n_expert_used: int = 0  # {arch}.expert_used_count: experts per token
    n_ff_exp: int = 0       # one expert's FFN width
    n_ff_shexp: int = 0     # the shared expert's FFN width (qwen2moe), 0: none
    rope_scaling: RopeScaling = RopeScaling.LINEAR   # {arch}.rope.scaling.type
    rope_scale: RopeScale = UNSCALED                 # ggml_rope_ext's scaling arguments (rope_scaling())
    attn_softcap: float = 0.0   # {arch}.attn_logit_softcapping where the graph caps (Arch.softcaps), 0: none
    final_softcap: float = 0.0  # {arch}.final_logit_softcapping, likewise
    rope_base_swa: float = 10000.0  # {arch}.rope.freq_base_swa: the sliding layers' RoPE base (default
                                    # Arch.rope_base_swa, else rope_base)
    norm_eps: float = 0.0   # {arch}.attention.layer_norm_epsilon: LayerNorm's (bert), 0: not in the file

    @property
    def n_ff_dense(self) -> int:
        """Width of the FFN that runs as plain matmuls: the dense FFN, or a MoE model's shared expert."""
        return self.n_ff_shexp if self.n_expert else self.n_ff

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int) -> "HParams":
        arch = md.get(Keys.ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            raise ConfigError(f"metadata key {Keys.ARCHITECTURE} is missing or not a string: {arch!r}")
        spec = ARCHS.get(arch)              # None: inspect-only, read with no architecture's defaults
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
        n_ctx_train = _positive_int(md, Keys.CONTEXT_LENGTH, arch, default=2048)
        scaling, scale = rope_scaling(md, arch, n_ctx_train)
        rope_base = float(_get(md, Keys.ROPE_FREQ_BASE, arch, default=10000.0))
        base_swa = _number(md, "{arch}.rope.freq_base_swa", arch)
        if base_swa is None:
            base_swa = spec.rope_base_swa if spec is not None and spec.rope_base_swa is not None else rope_base
        return cls(
            arch=arch,
            n_layer=_positive_int(md, Keys.BLOCK_COUNT, arch),
            n_embd=n_embd,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=_positive_int(md, Keys.VALUE_LENGTH, arch, default=head_dim_k),
            n_ctx_train=n_ctx_train,
            n_vocab=n_vocab,
            rms_eps=float(_get(md, Keys.LAYERNORM_RMS_EPS, arch, default=1e-5)),
            rope_base=rope_base,
            rope_dim=_positive_int(md, Keys.ROPE_DIMENSION_COUNT, arch, default=head_dim_k),
            sliding_window=_positive_int(md, Keys.SLIDING_WINDOW, arch, required=False,
                                         default=spec.sliding_window_default if spec is not None else 0),
            **dict(zip(("n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp"), _experts(md, arch, spec, n_ff))),
            rope_scaling=scaling,
            rope_scale=scale,
            **dict(zip(("attn_softcap", "final_softcap"), _softcaps(md, arch, spec))),
            rope_base_swa=float(base_swa),
            norm_eps=float(_number(md, "{arch}.attention.layer_norm_epsilon", arch) or 0.0),
        )
