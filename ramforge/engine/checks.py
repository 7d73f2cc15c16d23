"""Load-time checks of a model file and the KV types: what ramforge's forward pass does not implement is
refused by name (metadata keys, tensors), as is a KV type it does not know (Engine.load calls these)."""
from __future__ import annotations

import numpy as np

from .. import flags
from ..errors import InvalidArgument, UnsupportedArch
from ..gguf.constants import Keys
from ..gguf.reader import GGUFFile
from ..models.arch import Arch
from ..models.config import HParams
from ..models.weights import ModelError, gguf_name


def _refuse_unsupported_keys(md: dict, arch: str, spec: Arch) -> None:
    """Metadata that would change the math but that ramforge's forward pass for `spec` does not
    implement, refused by name."""
    def get(t):
        return md.get(Keys.of(t, arch))

    group = get(Keys.EXPERT_GROUP_COUNT)
    if group is not None and np.isscalar(group) and group > 1:
        raise UnsupportedArch(f"{Keys.of(Keys.EXPERT_GROUP_COUNT, arch)} = {group}: grouped expert routing is "
                              f"not supported")
    moe = () if spec.moe else (Keys.EXPERT_COUNT,)   # experts run only where the forward pass has them
    caps = spec.softcaps                           # soft-caps only where the graph applies them
    uncapped = [t for t, d in ((Keys.ATTN_LOGIT_SOFTCAPPING, caps.attn), (Keys.FINAL_LOGIT_SOFTCAPPING, caps.final))
                if d is None]
    for t in (*moe, *uncapped, "{arch}.rope.dimension_sections", "{arch}.attention.sliding_window_pattern"):
        v = md.get(Keys.of(t, arch))
        if v is not None and not (np.isscalar(v) and v == 0):
            raise UnsupportedArch(f"{Keys.of(t, arch)} = {v!r} is not supported by ramforge's {arch} forward pass")
    if not spec.reads_sliding_window and get(Keys.SLIDING_WINDOW):
        raise UnsupportedArch(f"{Keys.of(Keys.SLIDING_WINDOW, arch)} is not supported for {arch}")


def kv_types(type_k=None, type_v=None, env: dict | None = None) -> tuple[str, str]:
    """The KV cache types (names) from explicit values (a name or a ggml type id each), else
    $RAMFORGE_KV_TYPE (one type for both, or "K,V"), else f16 (llama.cpp's default)."""
    from ..kv.types import kv_type
    raw = flags.KV_TYPE.raw(env)
    dk = dv = "f16"
    if raw:
        parts = [p.strip() for p in raw.split(",")]
        if len(parts) > 2:
            raise InvalidArgument(f"RAMFORGE_KV_TYPE={raw!r}: one KV type, or two as K,V")
        dk, dv = kv_type(parts[0]), kv_type(parts[-1])
    return kv_type(dk if type_k is None else type_k), kv_type(dv if type_v is None else type_v)


def _refuse_unknown_tensors(f: GGUFFile, hp: HParams, arch: Arch) -> None:
    """A tensor the forward pass would ignore changes the answer: refuse it by name."""
    known = {gguf_name(s) for s in ("token_embd", "output_norm", "output", "rope_freqs")}
    known.update(arch.global_vectors, arch.global_matrices)
    for il in range(hp.n_layer):
        known.update(gguf_name(s, il) for s in arch.layer_tensors(hp))
    for name in f.tensors:
        if name not in known:
            raise ModelError(f"{f.path}: tensor {name} is not used by ramforge's {hp.arch} forward pass; "
                             f"refusing rather than ignoring it")
