"""nomic-bert (nomic-embed-text v1 / v1.5), as llama.cpp's llm_build_bert for LLM_ARCH_NOMIC_BERT.

bert's encoder (models/bert.py) with RoPE in place of absolute positions and a SwiGLU FFN without biases.
Input: token embeddings + token type 0's row, then LayerNorm (with bias); no position embeddings. Per
layer: one fused attn_qkv matmul (rows q | k | v, + attn_qkv.bias where the file has one) -> NEOX-style
RoPE on q and k ({arch}.rope.freq_base; each sequence's positions from 0) -> attention over the
sequence, scale 1/sqrt(head_dim) -> attn_output (+ bias where present) -> residual -> LayerNorm ->
silu(ffn_gate x) * ffn_up x -> ffn_down -> residual -> LayerNorm. The last layer's output is the
embedding (t_embd). llama.cpp loads ffn_up.bias / ffn_down.bias where a file has them but its graph
passes none to this FFN: they are not read here either. No classifier head (no rank pooling).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelFileError
from ..kernels.batch import Batch
from ..kernels.encoder import encoder_attention, layer_norm
from ..kernels.ops import rope
from .arch import Arch
from .bert import check_metadata, hidden_out, seq_bounds
from .weights import rows_of

REQUIRED = ("token_embd_norm.weight", "token_embd_norm.bias")


def embed(m, x: np.ndarray, tokens) -> None:
    """x f32[n, n_embd] = LayerNorm(token embeddings + token type 0's row)."""
    g = m.weights.vectors
    for name in REQUIRED:
        if g[name] is None:
            raise ModelFileError(f"{m.path}: tensor {name} is missing; architecture {m.hp.arch} needs it")
    m.weights.embed(tokens, x)
    if g["token_types.weight"] is not None:
        x += g["token_types.weight"].data[:x.shape[1]]
    layer_norm(x, x, g["token_embd_norm.weight"].data, g["token_embd_norm.bias"].data, m.hp.norm_eps)


def positions(bounds: np.ndarray, n: int) -> np.ndarray:
    """i32[n]: each packed sequence's token positions from 0 (llama.cpp's inp_pos of an encoder batch)."""
    pos = np.empty(n, np.int32)
    for a, b in bounds:
        pos[a:b] = np.arange(b - a, dtype=np.int32)
    return pos


def _qkv_scratch(s, n: int, width: int) -> np.ndarray:
    """f32[n, width] for the fused QKV output: the FFN gate's state buffer (free until the FFN; n_ff is
    4 x n_embd in nomic's models, wider than q | k | v), else a buffer of its own."""
    flat = s.gate.reshape(-1)
    return flat[:n * width].reshape(n, width) if flat.size >= n * width else np.empty((n, width), np.float32)


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """The n tokens in s.x (the sequences of seq_bounds, each from position 0) through the layers, in place."""
    hp, w = m.hp, m.weights
    eps = hp.norm_eps
    x, xb = s.x[:n], s.xb[:n]
    q, k, v, att, gate, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.gate[:n], s.up[:n]
    nq, nk, nv = q[0].size, k[0].size, v[0].size
    bounds = seq_bounds(m, n)
    pos = positions(bounds, n)
    kq_scale = np.float32(1.0 / math.sqrt(float(hp.head_dim_k)))
    for il in range(*m.layers):
        with w.layer(il) as L:
            qkv = _qkv_scratch(s, n, nq + nk + nv)              # f32[n, q | k | v]
            L.attn_qkv.rows(qkv, x, batch)
            if L.attn_qkv_bias is not None:
                qkv += L.attn_qkv_bias.data
            q.reshape(n, -1)[:] = qkv[:, :nq]
            k.reshape(n, -1)[:] = qkv[:, nq:nq + nk]
            v.reshape(n, -1)[:] = qkv[:, nq + nk:]
            rope(q, pos, hp.rope_dim, hp.rope_base, True, None, hp.rope_scale)
            rope(k, pos, hp.rope_dim, hp.rope_base, True, None, hp.rope_scale)
            encoder_attention(att, q, k, v, bounds, kq_scale)
            L.attn_output.rows(xb, att.reshape(n, -1), batch)
            if L.attn_output_bias is not None:
                xb += L.attn_output_bias.data
            xb += x                                                 # re-add the layer input
            layer_norm(x, xb, L.attn_output_norm.data, L.attn_output_norm_bias.data, eps)
            rows_of(x, (L.ffn_gate, gate), (L.ffn_up, up), glu=True, batch=batch)    # gate = silu(gate) * up
            L.ffn_down.rows(xb, gate, batch)
            xb += x                                                 # the attention block bypasses the FFN
            layer_norm(x, xb, L.layer_output_norm.data, L.layer_output_norm_bias.data, eps)


ARCH = Arch(
    name="nomic-bert", forward=forward, embed=embed,
    tensors=("attn_qkv", "attn_qkv_bias", "attn_output", "attn_output_bias", "attn_output_norm",
             "attn_output_norm_bias", "ffn_up", "ffn_gate", "ffn_down", "layer_output_norm", "layer_output_norm_bias"),
    optional=frozenset({"attn_qkv_bias", "attn_output_bias"}),      # nomic's own files have neither
    global_vectors=("token_types.weight", "token_embd_norm.weight", "token_embd_norm.bias"),
    rope_neox=True, causal=False, has_output=False, check_metadata=check_metadata, hidden_out=hidden_out,
)
