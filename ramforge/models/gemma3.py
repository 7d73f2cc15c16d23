"""gemma3, as llama.cpp's src/models/gemma3.cpp.

Embeddings scaled by sqrt(n_embd); per-head Q/K RMSNorm; q scaled by 1/sqrt(head_dim) (the 27B:
1/sqrt(n_embd / n_head)) before attention; post-attention and post-FFN RMSNorms; GELU-gated FFN;
sliding-window attention on every layer but each sixth (il % 6 == 5), which attends globally.
Sliding layers use rope base {arch}.rope.freq_base_swa (default 10000) unscaled, global layers
{arch}.rope.freq_base and the file's RoPE scaling (Gemma 3 4B and larger: linear, factor 8).
NEOX-style RoPE.
"""
from __future__ import annotations

import math

import numpy as np

from ..kernels.attention import attention
from ..kernels.batch import Batch
from ..kernels.ops import geglu, rms_norm, rope
from .arch import Arch, SoftCaps
from .weights import output_rows, rows_of

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                 "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")
GEMMA3_27B_LAYERS = 62          # llama.cpp's LLM_TYPE_27B, whose q scale is by n_embd / n_head


def attention_scale(hp, layers_27b: int = GEMMA3_27B_LAYERS) -> np.float32:
    """llama.cpp's f_attention_scale for gemma3 (and gemma2, with its 27B's layer count), float32 steps:
    1/sqrt(head_dim), but 1/sqrt(n_embd / n_head) for the 27B (gemma3: 62 layers, head_dim 128, n_embd /
    n_head 168)."""
    d = hp.n_embd // hp.n_head if hp.n_layer == layers_27b else hp.head_dim_k
    return np.float32(1.0) / np.sqrt(np.float32(d))


def embed(m, x: np.ndarray, tokens) -> None:
    """x f32[n, n_embd] = token embeddings scaled by sqrt(n_embd)."""
    m.weights.embed(tokens, x)
    x *= np.float32(math.sqrt(m.hp.n_embd))


def ffn(L, hp, x, xb, gate, up, batch: Batch | None = None) -> None:
    """The block after attention (xb: its output), in place on x f32[n, n_embd]: post-attention norm,
    residual, norm, GeGLU FFN (gate, up f32[n, n_ff]), post-FFN norm, residual (Gemma 2 and 3); its
    rows in the arithmetic of `batch` (as llama.forward's)."""
    rms_norm(xb, xb, L.post_attention_norm.data, hp.rms_eps)
    x += xb                                                     # sa_out
    rows_of(xb, (L.ffn_gate, gate), (L.ffn_up, up), norm=(x, L.ffn_norm.data, hp.rms_eps), batch=batch)
    geglu(gate, gate, up)
    L.ffn_down.rows(xb, gate, batch)
    rms_norm(xb, xb, L.post_ffw_norm.data, hp.rms_eps)
    x += xb


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """Run the n hidden states in s.x (f32[n, n_embd]) at positions pos0.. through m's layers, in place
    (out, batch: as llama.forward)."""
    hp, w, kv = m.hp, m.weights, m.kv
    pos = kv.positions(pos0, n)                                 # i32[n]
    x, xb = s.x[:n], s.xb[:n]                                   # f32[n, n_embd]
    q, k, v = s.q[:n], s.k[:n], s.v[:n]                         # f32[n, heads, head_dim]
    att, gate, up = s.att[:n], s.gate[:n], s.up[:n]
    q_scale = attention_scale(hp)
    for il in range(*m.layers):
        swa = ARCH.is_swa(hp, il)
        base, scale = ARCH.layer_rope(hp, il)                  # sliding layers: their own base, unscaled
        with w.layer(il) as L:
            rows_of(xb, (L.attn_q, q.reshape(n, -1)), (L.attn_k, k.reshape(n, -1)), (L.attn_v, v.reshape(n, -1)),
                    norm=(x, L.attn_norm.data, hp.rms_eps), batch=batch)     # of xb = RMSNorm(x)
            rms_norm(q, q, L.attn_q_norm.data, hp.rms_eps)
            rms_norm(k, k, L.attn_k_norm.data, hp.rms_eps)
            rope(q, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            rope(k, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            q *= q_scale
            kv.store(il, pos0, k, v)
            win = hp.sliding_window if swa else 0
            attention(att, q, *kv.layer(il), pos0, 1.0, win, cells=kv.visible(win), batch=batch)
            L.attn_output.rows(xb, att.reshape(n, -1), batch)
            x, xb, gate, up, fb = output_rows(hp, il, out, batch, x, xb, gate, up)    # fb: the FFN's batch
            ffn(L, hp, x, xb, gate, up, fb)


ARCH = Arch("gemma3", forward, embed, LAYER_TENSORS, rope_neox=True, k_shift=True,
            swa_pattern=6,                      # layers with il % 6 < 5 use the sliding window
            reads_sliding_window=True,
            rope_base_swa=10000.0,              # llama.cpp's default for rope_freq_base_train_swa
            rope_freq_scale_swa=1.0,            # rope_freq_scale_train_swa: sliding layers are never scaled
                                                # (Gemma 3 4B+'s linear scaling is its global layers' alone)
            softcaps=SoftCaps(attn=None, final=0.0))
