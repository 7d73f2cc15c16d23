"""phi3 (Phi-3, Phi-3.5, Phi-4-mini, Phi-4), as llama.cpp's src/models/phi3.cpp.

llama with fused projections: one attn_qkv matmul whose rows are q, then k, then v; one ffn_up matmul
whose first n_ff rows are the SwiGLU gate and the next n_ff its up (ggml_swiglu of the fused row).
NEOX-style RoPE with the file's scaling, and LongRoPE's frequency factors where the file has them:
rope_factors_long when the context llama.cpp allocates (n_ctx padded to 256) exceeds
{arch}.rope.scaling.original_context_length, else rope_factors_short; their magnitude
{arch}.rope.scaling.attn_factor is in HParams.rope_scale (with the original context). q scaled by 1/sqrt(head_dim) before
attention. llama.cpp turns phi3's sliding window off ({arch}.attention.sliding_window is read, then
set to 0): every layer attends to the whole context, here too.
"""
from __future__ import annotations

import numpy as np

from ..kernels.attention import attention
from ..kernels.batch import Batch
from ..kernels.ops import rms_norm, rope, swiglu
from ..flags import KV_PAD
from .arch import Arch
from .weights import output_rows

LAYER_TENSORS = ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down")

def embed(m, x: np.ndarray, tokens) -> None:
    """x f32[n, n_embd] = token embeddings."""
    m.weights.embed(tokens, x)


def rope_factors(m) -> np.ndarray | None:
    """llama_model::get_rope_factors: the long factors when the allocated context exceeds the original
    one, else the short ones (f32[n_rot/2]); None without LongRoPE tensors."""
    w = m.weights
    n_ctx_seq = -(-m.n_ctx // KV_PAD) * KV_PAD    # llama.cpp allocates n_ctx padded (cparams.n_ctx_seq)
    t = w.vectors["rope_factors_long.weight" if n_ctx_seq > m.hp.rope_scale.n_ctx_orig else "rope_factors_short.weight"]
    return None if t is None else t.data


def _scratch(s, rows: int, width: int) -> np.ndarray:
    """A contiguous f32[rows, width] in the state's buffer for fused outputs (s.fused, plan.state_shapes)."""
    return s.fused[:rows * width].reshape(rows, width)


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """Run the n hidden states in s.x (f32[n, n_embd]) at positions pos0.. through m's layers, in place
    (out, batch: as llama.forward)."""
    hp, w, kv = m.hp, m.weights, m.kv
    pos = kv.positions(pos0, n)                                 # i32[n]
    x, xb = s.x[:n], s.xb[:n]                                   # f32[n, n_embd]
    q, k, v = s.q[:n], s.k[:n], s.v[:n]                         # f32[n, heads, head_dim]
    att, gate, up = s.att[:n], s.gate[:n], s.up[:n]             # f32[n, n_head, hd], f32[n, n_ff]
    nq, nk, nv = q[0].size, k[0].size, v[0].size
    q_scale = np.float32(1.0) / np.sqrt(np.float32(hp.head_dim_k))
    ff = rope_factors(m)
    for il in range(*m.layers):
        with w.layer(il) as L:
            rms_norm(xb, x, L.attn_norm.data, hp.rms_eps)
            qkv = _scratch(s, n, nq + nk + nv)                  # f32[n, q | k | v]
            L.attn_qkv.rows(qkv, xb, batch)
            q.reshape(n, -1)[:] = qkv[:, :nq]
            k.reshape(n, -1)[:] = qkv[:, nq:nq + nk]
            v.reshape(n, -1)[:] = qkv[:, nq + nk:]
            rope(q, pos, hp.rope_dim, hp.rope_base, ARCH.rope_neox, ff, hp.rope_scale)
            rope(k, pos, hp.rope_dim, hp.rope_base, ARCH.rope_neox, ff, hp.rope_scale)
            q *= q_scale
            kv.store(il, pos0, k, v)
            attention(att, q, *kv.layer(il), pos0, 1.0, cells=kv.visible(0), batch=batch)
            L.attn_output.rows(xb, att.reshape(n, -1), batch)
            x, xb, gate, up, fb = output_rows(hp, il, out, batch, x, xb, gate, up)    # fb: the FFN's batch
            x += xb                                             # residual
            rms_norm(xb, x, L.ffn_norm.data, hp.rms_eps)
            gu = _scratch(s, xb.shape[0], 2 * hp.n_ff)
            L.ffn_up.rows(gu, xb, fb)                           # f32[rows, gate | up]
            gate[:], up[:] = gu[:, :hp.n_ff], gu[:, hp.n_ff:]
            swiglu(gate, gate, up)
            L.ffn_down.rows(xb, gate, fb)
            x += xb                                             # residual


ARCH = Arch("phi3", forward, embed, LAYER_TENSORS,
            global_vectors=("rope_factors_long.weight", "rope_factors_short.weight"),   # LongRoPE's, chosen by rope_factors
            rope_neox=True, longrope=True,
            reads_sliding_window=True,          # and turned off: every layer attends to the whole context
            fused_projections=True)             # ffn_up holds the gate's n_ff rows and then the up's
