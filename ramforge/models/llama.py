"""llama (and mistral, and Mixtral: llama with experts), as llama.cpp's src/models/llama.cpp; qwen2,
qwen3 and the qwen MoE models reuse it.

Per layer: RMSNorm -> Q, K, V (+ optional biases, + optional per-head Q/K RMSNorm) -> RoPE ->
attention over the F16 KV cache -> output projection -> residual -> RMSNorm -> SwiGLU FFN, or a
mixture of SwiGLU experts (models.moe) where the layer has a router -> residual.
"""
from __future__ import annotations

import math

import numpy as np

from ..kernels.attention import attention
from ..kernels.batch import Batch
from ..kernels.ops import rms_norm, rope
from . import moe
from .arch import Arch, MoEArch
from .weights import EXPERT_TENSORS, add_rows, output_rows, project_qkv, rows_of

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_bias", "attn_k_bias", "attn_v_bias",
                 "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
BIASES = frozenset({"attn_q_bias", "attn_k_bias", "attn_v_bias"})        # optional in llama and qwen2
DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")
MOE_FFN = ("ffn_gate_inp", *EXPERT_TENSORS)
SHARED_EXPERT = ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")   # qwen2moe's
# forward() serves qwen2/qwen3 and the MoE models too: what one has and another lacks reads as None
# (a router and a shared expert for llama; the dense FFN, unreached, for a model with experts)
ALSO_READ = frozenset({"attn_q_norm", "attn_k_norm", "ffn_gate_inp", *DENSE_FFN, *SHARED_EXPERT, *moe.BIASES})


def with_experts(tensors) -> tuple[str, ...]:
    """A layer's tensors with a router and experts where the dense FFN was."""
    return (*(t for t in tensors if t not in DENSE_FFN), *MOE_FFN)


def embed(m, x: np.ndarray, tokens) -> None:
    """x f32[n, n_embd] = token embeddings."""
    m.weights.embed(tokens, x)


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """Run the n hidden states in s.x (f32[n, n_embd]) at positions pos0.. through m's layers, in place.
    out: the rows wanted from the model's last layer; after its attention only they go on (llama.cpp's
    inp_out_ids), computed as a batch of their own. batch: the llama.cpp batch the n rows belong to
    (kernels.batch; None: a batch of their own), which picks the matmuls' and attention's arithmetic. RoPE
    normal or NEOX as m.arch says (qwen*: NEOX)."""
    hp, w, kv, neox = m.hp, m.weights, m.kv, m.arch.rope_neox
    pos = kv.positions(pos0, n)                                 # i32[n]
    x, xb = s.x[:n], s.xb[:n]                                   # f32[n, n_embd]
    q, k, v = s.q[:n], s.k[:n], s.v[:n]                         # f32[n, heads, head_dim]
    att, gate, up = s.att[:n], s.gate[:n], s.up[:n]             # f32[n, n_head, hd_v], f32[n, n_ff]
    kq_scale = 1.0 / math.sqrt(hp.head_dim_k)
    ff = w.rope_freqs.data if w.rope_freqs is not None else None
    for il in range(*m.layers):
        with w.layer(il) as L:
            project_qkv(L, xb, q, k, v, norm=(x, L.attn_norm.data, hp.rms_eps), batch=batch)     # of xb = RMSNorm(x)
            if L.attn_q_norm is not None:                       # qwen3: per-head RMSNorm of q and k
                rms_norm(q, q, L.attn_q_norm.data, hp.rms_eps)
                rms_norm(k, k, L.attn_k_norm.data, hp.rms_eps)
            rope(q, pos, hp.rope_dim, hp.rope_base, neox, ff, hp.rope_scale)
            rope(k, pos, hp.rope_dim, hp.rope_base, neox, ff, hp.rope_scale)
            kv.store(il, pos0, k, v)
            attention(att, q, *kv.layer(il), pos0, kq_scale, cells=kv.visible(0), batch=batch)
            add_rows(x, L.attn_output, att.reshape(n, -1), xb, batch)   # residual: x += the output projection (xb)
            x, xb, gate, up, fb = output_rows(hp, il, out, batch, x, xb, gate, up)    # fb: the FFN's batch
            if L.ffn_gate_inp is not None:                      # experts: xb <- their mixture
                rms_norm(xb, x, L.ffn_norm.data, hp.rms_eps)
                moe.ffn(m, s, il, L, xb, x, batch=fb)
                x += xb                                         # residual
            else:                                               # gate <- silu(gate) * up, of xb = RMSNorm(x)
                rows_of(xb, (L.ffn_gate, gate), (L.ffn_up, up), norm=(x, L.ffn_norm.data, hp.rms_eps), glu=True,
                        batch=fb)
                add_rows(x, L.ffn_down, gate, xb, fb)           # residual: x += the FFN's output (xb)


# Mixtral (llama.expert_count > 0) has a router and experts where llama has its FFN
ARCH = Arch("llama", forward, embed, LAYER_TENSORS, optional=BIASES, also_read=ALSO_READ,
            tensors_with_experts=with_experts(LAYER_TENSORS), rope_freqs=True, k_shift=True,
            moe=MoEArch(required=False, ff_key=False, shared=False, norm_w=True))
