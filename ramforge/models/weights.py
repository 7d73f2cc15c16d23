"""Model weights as compact tensors, named after their GGUF tensors, and the run state.

A `Layer`'s attributes are the GGUF tensor suffixes (attn_q, ffn_down, ...), so a forward pass
reads like the graph in llama.cpp's src/models/*.cpp. ramforge.stream.weights lays them out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InternalError, ModelFileError, check_token_ids
from ..gguf.constants import GGMLType
from ..gguf.reader import GGUFFile, TensorInfo
from ..kernels import fused
from ..kernels.dequant import dequantize
from ..kernels.batch import Batch
from ..kernels.matmul import SharedInput, matmul
from ..kernels.ops import rms_norm, swiglu
from ..kernels.registry import kernels_for
from ..profiling import timed


class ModelError(ModelFileError):
    """A model file that lacks a tensor or has one of the wrong shape."""


@dataclass
class QTensor:
    """A weight: packed bytes (matrices) or float32 values (vectors: norms and biases)."""

    name: str
    ggml_type: GGMLType
    dims: tuple[int, ...]             # GGUF order: dims[0] is the row length
    data: np.ndarray                  # uint8 packed rows, or f32[dims[0]] for a vector
    repacked: int = 0                 # rows in kernels.repack's groups of this many (0: in file order)

    @timed(lambda self, y, x, batch=None, shared=None: f"matvec {self.ggml_type.name}")
    def rows(self, y: np.ndarray, x: np.ndarray, batch: Batch | None = None,
             shared: SharedInput | None = None) -> np.ndarray:
        """y f32[n_tok, dims[1]] = x f32[n_tok, dims[0]] @ W^T, in the arithmetic of `batch` (the llama.cpp
        batch x's rows belong to; None: their own); shared: x's quantization, shared (kernels.matmul)."""
        return matmul(y, x, self.ggml_type, self.data, self.dims[1], self.dims[0], self.repacked, batch, shared)

    @timed("embedding")
    def get_rows(self, ids, out: np.ndarray) -> np.ndarray:
        """Dequantized rows `ids` (an embedding lookup) into out f32[len(ids), dims[0]]."""
        k = kernels_for(self.ggml_type)
        row_bytes = self.dims[0] // k.block_elems * k.block_bytes
        check_token_ids(ids, self.dims[1])
        for i, t in enumerate(ids):
            dequantize(self.ggml_type, self.data[t * row_bytes:(t + 1) * row_bytes], out=out[i])
        return out


@dataclass
class Layer:
    """One transformer block's tensors, as attributes named after their GGUF suffixes (`L.attn_q`).

    `names` are the tensors its architecture may have (`Arch.layer_names`): one of them that this file
    lacks (an optional bias or norm) reads as None; any other name is an AttributeError, so a
    misspelled tensor fails loudly instead of reading as an absent one. A name read once is kept as a
    plain attribute (a forward pass reads a resident layer's ~15 names every token): `tensors` is filled
    before the layer is first read and not changed after."""

    index: int
    names: frozenset[str]
    tensors: dict[str, QTensor] = field(default_factory=dict)

    def __getattr__(self, name: str):
        d = self.__dict__                      # only reached for names that are not real attributes
        tensors, names = d.get("tensors", {}), d.get("names", frozenset())
        if name in tensors or name in names:
            d[name] = value = tensors.get(name)
            return value
        raise AttributeError(f"layer {d.get('index')} has no tensor {name!r}: its architecture's layer tensors "
                             f"are {', '.join(sorted(names))}")


def expert_slice(t: QTensor, e: int) -> QTensor:
    """Expert e of a 3-D expert tensor (GGUF [n_in, n_out, n_expert]): its n_out rows, contiguous bytes,
    as a 2-D QTensor (repacked as the tensor: each expert's rows in their own groups)."""
    n_in, n_out, n_exp = t.dims
    if not 0 <= e < n_exp:
        raise InternalError(f"{t.name}: expert {e} is out of range for {n_exp} experts")
    k = kernels_for(t.ggml_type)
    nbytes = n_out * (n_in // k.block_elems * k.block_bytes)
    return QTensor(f"{t.name}[{e}]", t.ggml_type, (n_in, n_out), t.data[e * nbytes:(e + 1) * nbytes], t.repacked)


class LayerExperts:
    """A layer's experts served from its 3-D tensors as loaded: E[e] -> (gate, up, down), 2-D QTensors."""

    def __init__(self, layer: Layer):
        self.layer = layer

    def __getitem__(self, e: int) -> tuple[QTensor, QTensor, QTensor]:
        return tuple(expert_slice(self.layer.tensors[s], int(e)) for s in EXPERT_TENSORS)


_AFTER = {fused.Epilogue.NONE: "", fused.Epilogue.ADD: "+add", fused.Epilogue.SWIGLU: "+swiglu"}


def _label(plan, x, outs, pairs, norm=None, epi=fused.Epilogue.NONE, res=None) -> str:
    # the --profile op: the matvec's types, and the norm before and the op after it where fused
    return f"{'norm+' if norm else ''}matvec {'+'.join(w.ggml_type.name for w, _ in pairs)}{_AFTER[epi]}"


@timed(_label)
def _fused_rows(plan, x: np.ndarray, outs: list, pairs, norm=None, epi=fused.Epilogue.NONE,
                res=None) -> None:
    fused.run(plan, x, outs, norm, res)


def _outs(pairs) -> list:
    return [(y, w.ggml_type, w.data, w.dims[1], w.repacked) for w, y in pairs]


def rows_of(x: np.ndarray, *pairs, norm: tuple | None = None, glu: bool = False, batch: Batch | None = None) -> None:
    """y = x @ W^T for each (W, y) pair: QTensors of one input x f32[n, W.dims[0]], y f32[n, W.dims[1]];
    x quantized once for all of them. norm (src f32[n, n_in], w f32[n_in], eps): first x = rms_norm(src) * w.
    glu: the pairs are (ffn_gate, gate), (ffn_up, up), and gate = silu(gate) * up after. A lone token's
    (up to kernels.fused.MAX_WEIGHTS weights) is one compiled call where kernels.fused applies.
    batch: the llama.cpp batch x's rows belong to (QTensor.rows)."""
    if x.shape[0] == 1 and (len(pairs) > 1 or norm is not None):
        outs, epi = _outs(pairs), fused.Epilogue.SWIGLU if glu else fused.Epilogue.NONE
        plan = fused.fusable(x, outs, norm=norm, epi=epi, batch=batch)
        if plan is not None:
            return _fused_rows(plan, x, outs, pairs, norm, epi)
    if norm is not None:
        rms_norm(x, norm[0], norm[1], norm[2])
    shared = SharedInput(x)
    for w, y in pairs:
        w.rows(y, x, batch, shared)
    if glu:
        swiglu(pairs[0][1], pairs[0][1], pairs[1][1])


def add_rows(res: np.ndarray, w: QTensor, a: np.ndarray, y: np.ndarray, batch: Batch | None = None) -> None:
    """res += a @ W^T (a residual after a projection): res, y f32[n, W.dims[1]] (y holds the product);
    a f32[n, W.dims[0]] (rows of `batch`, QTensor.rows). A lone token's is one compiled call where
    kernels.fused applies."""
    if a.shape[0] == 1:
        outs = _outs(((w, y),))
        plan = fused.fusable(a, outs, epi=fused.Epilogue.ADD, res=res, batch=batch)
        if plan is not None:
            return _fused_rows(plan, a, outs, ((w, y),), None, fused.Epilogue.ADD, res)
    w.rows(y, a, batch)
    res += y


def project_qkv(L, xb: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, norm: tuple | None = None,
                batch: Batch | None = None) -> None:
    """q, k, v f32[n, heads, head_dim] = xb f32[n, n_embd] through attn_q/k/v (+ their biases where the
    file has them), xb quantized once for the three; norm: xb = rms_norm first; batch: as rows_of's."""
    n = xb.shape[0]
    qf, kf, vf = q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)
    rows_of(xb, (L.attn_q, qf), (L.attn_k, kf), (L.attn_v, vf), norm=norm, batch=batch)
    for bias, flat in ((L.attn_q_bias, qf), (L.attn_k_bias, kf), (L.attn_v_bias, vf)):
        if bias is not None:
            flat += bias.data


def output_rows(hp, il: int, out: slice | np.ndarray | None, batch: Batch | None, *arrays):
    """After the last layer's attention llama.cpp keeps only the rows whose logits are wanted
    (inp_out_ids) and runs the rest of the layer as a batch of those rows: the arrays narrowed to
    `out` at layer il = n_layer - 1, and the batch to run them as, Batch(k, 0) (else the arrays and
    `batch` unchanged). out: a slice (views of those rows), or row indices i64[k] (several sequences'
    last tokens in one ubatch): those rows gathered, in order, into the arrays' first k rows."""
    if out is None or il != hp.n_layer - 1:
        return (*arrays, batch)
    if isinstance(out, slice):
        narrowed = tuple(a[out] for a in arrays)
    else:
        k = len(out)
        for a in arrays:
            a[:k] = a[out]                     # (fancy indexing copies first: overlapping rows are safe)
        narrowed = tuple(a[:k] for a in arrays)
    return (*narrowed, Batch(narrowed[0].shape[0], 0))


# Tensor suffix -> expected GGUF dims, as a function of the hyperparameters (models.config.HParams, not
# imported here: config reads the architecture records, whose modules import this one). fused: the
# architecture's gate and up are one ffn_up matmul (Arch.fused_projections), 2 * n_ff wide.
def layer_shapes(hp, fused: bool = False) -> dict[str, tuple[int, ...]]:
    q, kv_k, kv_v = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k, hp.n_head_kv * hp.head_dim_v
    return {
        "attn_norm": (hp.n_embd,),
        "attn_q": (hp.n_embd, q), "attn_k": (hp.n_embd, kv_k), "attn_v": (hp.n_embd, kv_v),
        "attn_q_bias": (q,), "attn_k_bias": (kv_k,), "attn_v_bias": (kv_v,),
        "attn_qkv": (hp.n_embd, q + kv_k + kv_v), "attn_qkv_bias": (q + kv_k + kv_v,),
        "attn_output": (hp.n_head * hp.head_dim_v, hp.n_embd),
        "attn_q_norm": (hp.head_dim_k,), "attn_k_norm": (hp.head_dim_k,),
        "post_attention_norm": (hp.n_embd,),
        "ffn_norm": (hp.n_embd,),
        "ffn_gate": (hp.n_embd, hp.n_ff), "ffn_up": (hp.n_embd, (2 if fused else 1) * hp.n_ff), "ffn_down": (hp.n_ff, hp.n_embd),
        "post_ffw_norm": (hp.n_embd,),
        # experts: GGUF [row length, rows, expert], so one expert's rows are contiguous bytes
        "ffn_gate_inp": (hp.n_embd, hp.n_expert),
        "ffn_gate_exps": (hp.n_embd, hp.n_ff_exp, hp.n_expert), "ffn_up_exps": (hp.n_embd, hp.n_ff_exp, hp.n_expert),
        "ffn_down_exps": (hp.n_ff_exp, hp.n_embd, hp.n_expert),
        "ffn_gate_inp_shexp": (hp.n_embd,),
        "ffn_gate_shexp": (hp.n_embd, hp.n_ff_shexp), "ffn_up_shexp": (hp.n_embd, hp.n_ff_shexp),
        "ffn_down_shexp": (hp.n_ff_shexp, hp.n_embd),
        # gpt-oss: biases of the output projection, router and experts; one attention sink per head
        "attn_output_bias": (hp.n_embd,), "attn_sinks": (hp.n_head,), "ffn_gate_inp_bias": (hp.n_expert,),
        "ffn_gate_exps_bias": (hp.n_ff_exp, hp.n_expert), "ffn_up_exps_bias": (hp.n_ff_exp, hp.n_expert),
        "ffn_down_exps_bias": (hp.n_embd, hp.n_expert),
        # bert: LayerNorms with biases after attention and after the FFN, the FFN's biases
        "attn_output_norm": (hp.n_embd,), "attn_output_norm_bias": (hp.n_embd,), "ffn_up_bias": (hp.n_ff,),
        "ffn_down_bias": (hp.n_embd,), "layer_output_norm": (hp.n_embd,), "layer_output_norm_bias": (hp.n_embd,),
    }


EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def _shape_error(path, name: str, suffix: str, dims: tuple[int, ...], shape: tuple[int, ...], hp) -> str:
    """What is wrong with a tensor of the wrong shape, naming the hyperparameter it contradicts."""
    head = f"{path}: tensor {name} has shape {list(dims)}, expected {list(shape)}"
    if suffix in EXPERT_TENSORS and len(dims) == 3 and dims[2] != hp.n_expert:
        return f"{head}: it holds {dims[2]} experts (its last dimension) but {hp.arch}.expert_count is {hp.n_expert}"
    if suffix == "ffn_gate_inp":
        return (f"{head}: the router maps the {hp.n_embd}-wide hidden state to one logit per expert "
                f"({hp.arch}.expert_count = {hp.n_expert})")
    return f"{head} from the hyperparameters"


def gguf_name(suffix: str, il: int | None = None) -> str:
    """attn_q -> blk.3.attn_q.weight; attn_q_bias -> blk.3.attn_q.bias; token_embd -> token_embd.weight."""
    base, kind = (suffix[:-5], "bias") if suffix.endswith("_bias") else (suffix, "weight")
    return f"{base}.{kind}" if il is None else f"blk.{il}.{base}.{kind}"


def validate_tensors(f: GGUFFile, hp, arch, layers: tuple[int, int]) -> None:
    """Every tensor the forward pass of `arch` (a models.arch.Arch) needs is present, of the expected
    shape and of an executable type."""
    shapes = layer_shapes(hp, arch.fused_projections) | (arch.shapes(hp) if arch.shapes is not None else {})
    need = [("token_embd", None, (hp.n_embd, hp.n_vocab))]
    if layers[1] == hp.n_layer and arch.has_output:          # (an encoder has neither)
        need.append(("output_norm", None, (hp.n_embd,)))
        if "output.weight" in f.tensors:
            need.append(("output", None, (hp.n_embd, hp.n_vocab)))
    for il in range(*layers):
        for s in arch.layer_tensors(hp):
            if s not in arch.optional or gguf_name(s, il) in f.tensors:
                need.append((s, il, shapes[s]))
    for suffix, il, shape in need:
        name = gguf_name(suffix, il)
        info: TensorInfo | None = f.tensors.get(name)
        if info is None:
            raise ModelError(f"{f.path}: tensor {name} is missing; architecture {hp.arch} needs it")
        if info.dims != tuple(shape):
            raise ModelError(_shape_error(f.path, name, suffix, info.dims, shape, hp))
        kernels_for(info.ggml_type)          # refuses a type without kernels, by name
