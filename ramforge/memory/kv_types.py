"""KV cache types: their names, ggml type ids and row sizes (no kernels: the planner imports this)."""
from __future__ import annotations

import numpy as np

from ..errors import KVTypeError

CHUNK = 256                   # positions the cache is charged for at a time (llama.cpp pads its view to 256 cells)
CHUNK = 256                   # positions the cache is charged for at a time (llama.cpp pads its view to 256 cells)
QK = 32                                           # elements per block of both quantized types
# name -> (ggml type id, bytes per block of 32 elements); F16 is 2 bytes an element
KV_TYPES = {"f16": (1, 64), "q8_0": (8, 34), "q4_0": (2, 18)}
KV_TYPE_NAMES = {v[0]: k for k, v in KV_TYPES.items()}


def kv_type(value) -> str:
    """A KV cache type from its name ("f16", "q8_0", "q4_0"; any case) or ggml type id (1, 8, 2, as
    llama-cpp-python's type_k / type_v take); InvalidArgument for anything else."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) in KV_TYPE_NAMES:
            return KV_TYPE_NAMES[int(value)]
    elif isinstance(value, str):
        name = value.strip().lower()
        if name in KV_TYPES:
            return name
        if name.isdigit() and int(name) in KV_TYPE_NAMES:
            return KV_TYPE_NAMES[int(name)]
    raise KVTypeError(f"unknown KV cache type {value!r}: one of {', '.join(KV_TYPES)} "
                          f"(or their ggml type ids {', '.join(str(v[0]) for v in KV_TYPES.values())})")


def row_bytes(kind: str, head_dim: int) -> int:
    """Bytes of one cache row (one position, one KV head) of type `kind`."""
    if kind == "f16":
        return 2 * head_dim
    if head_dim % QK:
        raise KVTypeError(f"a {kind} KV cache stores blocks of {QK} elements; a head size of {head_dim} is not "
                              f"a multiple of {QK} (use f16 for this model)")
    return head_dim // QK * KV_TYPES[kind][1]


def bytes_per_position(n_layer: int, n_head_kv: int, hd_k: int, hd_v: int, type_k: str = "f16",
                       type_v: str = "f16") -> int:
    """Cache bytes of one position over n_layer layers (K and V rows of every KV head)."""
    return n_layer * n_head_kv * (row_bytes(kv_type(type_k), hd_k) + row_bytes(kv_type(type_v), hd_v))
