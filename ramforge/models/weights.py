"""Model weights as compact tensors, named after their GGUF tensors, and the run state.

`ResidentWeights` reads every tensor once into budget-charged memory. Layers are handed out by
`layer(il)` as a `Layer` whose attributes are the GGUF tensor suffixes (attn_q, ffn_down, ...), so
a forward pass reads like the graph in llama.cpp's src/models/*.cpp.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import RamforgeError
from ..gguf.constants import GGMLType
from ..gguf.reader import GGUFFile, TensorInfo
from ..kernels.dequant import dequantize
from ..kernels.matmul import matmul
from ..kernels.registry import kernels_for
from ..memory import MemoryBudget
from .config import HParams


class ModelError(RamforgeError):
    """A model file that lacks a tensor or has one of the wrong shape."""


@dataclass
class QTensor:
    """A weight: packed bytes (matrices) or float32 values (vectors: norms and biases)."""

    name: str
    ggml_type: GGMLType
    dims: tuple[int, ...]             # GGUF order: dims[0] is the row length
    data: np.ndarray                  # uint8 packed rows, or f32[dims[0]] for a vector

    def rows(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """y f32[n_tok, dims[1]] = x f32[n_tok, dims[0]] @ W^T."""
        return matmul(y, x, self.ggml_type, self.data, self.dims[1], self.dims[0])

    def get_rows(self, ids, out: np.ndarray) -> np.ndarray:
        """Dequantized rows `ids` (an embedding lookup) into out f32[len(ids), dims[0]]."""
        k = kernels_for(self.ggml_type)
        row_bytes = self.dims[0] // k.block_elems * k.block_bytes
        for i, t in enumerate(ids):
            if not 0 <= t < self.dims[1]:
                raise RamforgeError(f"token id {t} is out of range for a vocabulary of {self.dims[1]}")
            dequantize(self.ggml_type, self.data[t * row_bytes:(t + 1) * row_bytes], out=out[i])
        return out


@dataclass
class Layer:
    """One transformer block's tensors; absent optional tensors are None."""

    index: int
    tensors: dict[str, QTensor] = field(default_factory=dict)

    def __getattr__(self, name: str):
        try:
            return self.__dict__["tensors"][name]
        except KeyError:
            return None


# Tensor suffix -> expected GGUF dims, as a function of the hyperparameters.
def layer_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    q, kv_k, kv_v = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k, hp.n_head_kv * hp.head_dim_v
    return {
        "attn_norm": (hp.n_embd,),
        "attn_q": (hp.n_embd, q), "attn_k": (hp.n_embd, kv_k), "attn_v": (hp.n_embd, kv_v),
        "attn_q_bias": (q,), "attn_k_bias": (kv_k,), "attn_v_bias": (kv_v,),
        "attn_output": (hp.n_head * hp.head_dim_v, hp.n_embd),
        "attn_q_norm": (hp.head_dim_k,), "attn_k_norm": (hp.head_dim_k,),
        "post_attention_norm": (hp.n_embd,),
        "ffn_norm": (hp.n_embd,),
        "ffn_gate": (hp.n_embd, hp.n_ff), "ffn_up": (hp.n_embd, hp.n_ff), "ffn_down": (hp.n_ff, hp.n_embd),
        "post_ffw_norm": (hp.n_embd,),
    }


def gguf_name(suffix: str, il: int | None = None) -> str:
    """attn_q -> blk.3.attn_q.weight; attn_q_bias -> blk.3.attn_q.bias; token_embd -> token_embd.weight."""
    base, kind = (suffix[:-5], "bias") if suffix.endswith("_bias") else (suffix, "weight")
    return f"{base}.{kind}" if il is None else f"blk.{il}.{base}.{kind}"


class ResidentWeights:
    """Every tensor read once into memory charged to the budget; `close()` releases it all."""

    def __init__(self, f: GGUFFile, hp: HParams, layer_tensors: list[str], budget: MemoryBudget,
                 optional: set[str] = frozenset()):
        self.hp = hp
        self._charges = []
        shapes = layer_shapes(hp)
        try:
            self.token_embd = self._load(f, "token_embd", (hp.n_embd, hp.n_vocab), budget)
            self.output_norm = self._load(f, "output_norm", (hp.n_embd,), budget)
            tied = "output.weight" not in f.tensors
            self.output = self.token_embd if tied else self._load(f, "output", (hp.n_embd, hp.n_vocab), budget)
            self.rope_freqs = self._load(f, "rope_freqs", None, budget) if "rope_freqs.weight" in f.tensors else None
            self.layers = []
            for il in range(hp.n_layer):
                layer = Layer(il)
                for s in layer_tensors:
                    if gguf_name(s, il) in f.tensors or s not in optional:
                        layer.tensors[s] = self._load(f, s, shapes[s], budget, il)
                self.layers.append(layer)
        except BaseException:
            self.close()
            raise

    def _load(self, f: GGUFFile, suffix: str, shape, budget: MemoryBudget, il: int | None = None) -> QTensor:
        name = gguf_name(suffix, il)
        info: TensorInfo | None = f.tensors.get(name)
        if info is None:
            raise ModelError(f"{f.path}: tensor {name} is missing; architecture {self.hp.arch} needs it")
        if shape is not None and info.dims != tuple(shape):
            raise ModelError(f"{f.path}: tensor {name} has shape {list(info.dims)}, expected {list(shape)} "
                             f"from the hyperparameters")
        kernels_for(info.ggml_type)          # refuses a type without kernels, by name
        charge = budget.charge(name, info.nbytes)
        self._charges.append(charge)
        raw = f.read_tensor(info)
        if len(info.dims) == 1:              # vectors are used as float32
            vec = dequantize(info.ggml_type, raw, n_elements=info.n_elements)
            charge.settle(vec.nbytes)
            return QTensor(name, GGMLType.F32, info.dims, vec)
        return QTensor(name, info.ggml_type, info.dims, raw)

    def layer(self, il: int) -> Layer:
        return self.layers[il]

    def close(self) -> None:
        for c in self._charges:
            c.release()
        self._charges.clear()
