"""The one table of executable ggml types and their kernels.

A type not in `REGISTRY` can still be inspected (its block size is in GGML_BLOCK) but not run:
`kernels_for` refuses it with UnsupportedType.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from ramforge.errors import UnsupportedType
from ramforge.gguf.constants import GGML_BLOCK, GGMLType
from ramforge.kernels import decode as _dq
from ramforge.kernels import iquants as _iq
from ramforge.kernels import lowbit as _lb
from ramforge.kernels import unpack as _up
from ramforge.kernels.variants import IQ1_DELTA, IQ1_DLANES, K_LANES, K_MIN4, K_SUM, Q8_1_SUM, QDot


class ActType(Enum):
    """How llama.cpp's CPU backend rounds the activation before a dot with a weight type
    (ggml-cpu's `vec_dot_type`): the matmul reproduces that rounding."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"      # blocks of 32, f16 scale amax/127, round half to even
    Q8_1 = "q8_1"      # as Q8_0 (plus block sums, which a float dot does not need)
    Q8_K = "q8_k"      # blocks of 256, f32 scale -max/127 of the signed max


@dataclass(frozen=True)
class QuantKernels:
    """Kernels of one executable ggml type.

    dequant(out_f32, raw_u8, first_block, n_blocks): numba kernel writing
    n_blocks * block_elems float32 values decoded from blocks [first_block, first_block + n_blocks).
    qdot: how the type runs through the integer-dot matmul (kernels.variants.QDot): its row
    unpacker into int8 quants and integer sub-block scales, its sub-block size, and which of
    llama.cpp's kernels (and so which float arithmetic) it gets; None for the float types, which
    keep the float matmul.
    """

    ggml_type: GGMLType
    dequant: Callable
    act: ActType
    qdot: QDot | None = None

    @property
    def block_elems(self) -> int:
        return GGML_BLOCK[self.ggml_type][0]

    @property
    def block_bytes(self) -> int:
        return GGML_BLOCK[self.ggml_type][1]


def _table(*entries: QuantKernels) -> dict[GGMLType, QuantKernels]:
    return {k.ggml_type: k for k in entries}


T, A, Q = GGMLType, ActType, QDot
REGISTRY: dict[GGMLType, QuantKernels] = _table(
    QuantKernels(T.F32, _dq._dequant_f32, A.F32),
    QuantKernels(T.F16, _dq._dequant_f16, A.F16),
    QuantKernels(T.BF16, _dq._dequant_bf16, A.BF16),
    QuantKernels(T.Q4_0, _dq._dequant_q4_0, A.Q8_0, Q(_up._unpack_q4_0, 32, repack=(32, 32), raw=T.Q4_0, wmax=8)),
    QuantKernels(T.Q4_1, _dq._dequant_q4_1, A.Q8_1, Q(_up._unpack_q4_1, 32, Q8_1_SUM, raw=T.Q4_1)),
    QuantKernels(T.Q5_0, _dq._dequant_q5_0, A.Q8_0, Q(_up._unpack_q5_0, 32, raw=T.Q5_0)),
    QuantKernels(T.Q5_1, _dq._dequant_q5_1, A.Q8_1, Q(_up._unpack_q5_1, 32, Q8_1_SUM, raw=T.Q5_1)),
    QuantKernels(T.Q8_0, _dq._dequant_q8_0, A.Q8_0, Q(_up._unpack_q8_0, 32, raw=T.Q8_0)),
    QuantKernels(T.Q2_K, _dq._dequant_q2_k, A.Q8_K,
                 Q(_up._unpack_q2_k, 16, K_LANES, repack=(128, 256), tiled=True, raw=T.Q2_K, wmax=3)),
    QuantKernels(T.Q3_K, _dq._dequant_q3_k, A.Q8_K, Q(_up._unpack_q3_k, 16, tiled=True, raw=T.Q3_K, wmax=4)),
    QuantKernels(T.Q4_K, _dq._dequant_q4_k, A.Q8_K,
                 Q(_up._unpack_q4_k, 32, K_MIN4, repack=(64, 256), tiled=True, raw=T.Q4_K, wmax=15)),
    QuantKernels(T.Q5_K, _dq._dequant_q5_k, A.Q8_K, Q(_up._unpack_q5_k, 32, K_SUM, tiled=True, raw=T.Q5_K, wmax=31)),
    QuantKernels(T.Q6_K, _dq._dequant_q6_k, A.Q8_K, Q(_up._unpack_q6_k, 16, offset=32, tiled=True, raw=T.Q6_K, wmax=32)),
    QuantKernels(T.Q8_K, _dq._dequant_q8_k, A.Q8_K, Q(_up._unpack_q8_k, 32, raw=T.Q8_K)),
    QuantKernels(T.IQ4_NL, _dq._dequant_iq4_nl, A.Q8_0, Q(_up._unpack_iq4_nl, 32, repack=(32, 32), lanes2=True)),
    QuantKernels(T.IQ4_XS, _dq._dequant_iq4_xs, A.Q8_K, Q(_up._unpack_iq4_xs, 32, tiled=True, raw=T.IQ4_XS)),
    QuantKernels(T.MXFP4, _lb._dequant_mxfp4, A.Q8_0,
                 Q(_up._unpack_mxfp4, 32, repack=(32, 32), lanes2=True, vec_dot_only=True)),
    QuantKernels(T.TQ2_0, _dq._dequant_tq2_0, A.Q8_K, Q(_up._unpack_tq2_0, 16, offset=1, raw=T.TQ2_0)),
    QuantKernels(T.TQ1_0, _lb._dequant_tq1_0, A.Q8_K, Q(_lb._unpack_tq1_0, 16, offset=1, raw=T.TQ1_0)),
    QuantKernels(T.IQ1_S, _lb._dequant_iq1_s, A.Q8_K, Q(_lb._unpack_iq1_s, 32, IQ1_DELTA, tiled=True, raw=T.IQ1_S)),
    QuantKernels(T.IQ1_M, _lb._dequant_iq1_m, A.Q8_K, Q(_lb._unpack_iq1_m, 16, IQ1_DLANES, tiled=True, raw=T.IQ1_M)),
    # the codebook types (iquants.py): vec_dot below 8 tokens, the tiled matmul from 8; no repack,
    # no tinyBLAS; their sub-block size and 2^-post from the type's layout
    *(QuantKernels(t, _iq.DEQUANT[t], A.Q8_K, Q(_iq.UNPACK[t], L.sub, tiled=True, raw=t, post=L.post))
      for t, L in _iq.LAYOUTS.items()),
)
del T, A, Q


def _as_type(t) -> GGMLType | None:
    try:
        return GGMLType(t)
    except ValueError:
        return None


def is_executable(t) -> bool:
    """True when ggml type `t` (a GGMLType or its int id) has kernels."""
    gt = _as_type(t)
    return gt is not None and gt in REGISTRY


def kernels_for(t) -> QuantKernels:
    """The kernels of ggml type `t` (a GGMLType or its int id); UnsupportedType if it has none."""
    gt = t if type(t) is GGMLType else _as_type(t)          # (every matmul asks: no enum call for a GGMLType)
    if gt is not None and gt in REGISTRY:
        return REGISTRY[gt]
    supported = ", ".join(k.name for k in REGISTRY)
    what = gt.name if gt is not None else f"id {t!r} (unknown to ggml)"
    raise UnsupportedType(f"tensor type {what} is not supported for execution; supported: {supported}")
