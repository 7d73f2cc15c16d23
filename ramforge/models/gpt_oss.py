"""gpt-oss, as llama.cpp's src/models/openai-moe.cpp (GGUF architecture `gpt-oss`).

Per layer: RMSNorm -> Q, K, V with biases -> NEOX RoPE (YaRN-scaled in the released models) ->
attention with one learned sink logit per head, over a sliding window on even layers (il % 2 == 0)
and globally on odd ones, kq scale 1/sqrt(n_rot) -> output projection + bias -> residual ->
RMSNorm (`post_attention_norm`, the FFN's input norm) -> a mixture of experts (models.moe): router
with a bias, the top k logits' softmax as weights, experts with biases and the clamped SwiGLU
(swiglu_oai, alpha 1.702, limit 7) -> residual.
"""
from __future__ import annotations

import numpy as np

from ..kernels.attention import attention
from ..kernels.batch import Batch
from ..kernels.ops import rms_norm, rope
from ..kernels.moe import Gating
from . import llama, moe
from .arch import Arch, MoEArch
from .weights import EXPERT_TENSORS, output_rows, project_qkv

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_bias", "attn_k_bias", "attn_v_bias",
                 "attn_output", "attn_output_bias", "attn_sinks", "post_attention_norm", "ffn_gate_inp", *EXPERT_TENSORS,
                 *moe.BIASES)


def embed(m, x: np.ndarray, tokens) -> None:
    """x f32[n, n_embd] = token embeddings."""
    m.weights.embed(tokens, x)


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """Run the n hidden states in s.x (f32[n, n_embd]) at positions pos0.. through m's layers, in place
    (out, batch: as llama.forward)."""
    hp, w, kv = m.hp, m.weights, m.kv
    pos = kv.positions(pos0, n)                                 # i32[n]
    x, xb = s.x[:n], s.xb[:n]                                   # f32[n, n_embd]
    q, k, v = s.q[:n], s.k[:n], s.v[:n]                         # f32[n, heads, head_dim]
    att = s.att[:n]                                             # f32[n, n_head, hd_v]
    kq_scale = np.float32(1.0) / np.sqrt(np.float32(hp.rope_dim))     # 1.0f/sqrtf(n_rot)
    for il in range(*m.layers):
        swa = ARCH.is_swa(hp, il)
        base, scale = ARCH.layer_rope(hp, il)          # both kinds of layer scaled
        with w.layer(il) as L:
            rms_norm(xb, x, L.attn_norm.data, hp.rms_eps)
            project_qkv(L, xb, q, k, v, batch=batch)
            rope(q, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            rope(k, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            kv.store(il, pos0, k, v)
            win = hp.sliding_window if swa else 0
            attention(att, q, *kv.layer(il), pos0, kq_scale, win, sinks=L.attn_sinks.data, cells=kv.visible(win),
                      batch=batch)
            L.attn_output.rows(xb, att.reshape(n, -1), batch)
            xb += L.attn_output_bias.data
            x, xb, fb = output_rows(hp, il, out, batch, x, xb)   # fb: the FFN's batch
            x += xb                                             # residual
            rms_norm(xb, x, L.post_attention_norm.data, hp.rms_eps)
            moe.ffn(m, s, il, L, xb, x, batch=fb)
            x += xb                                             # residual


ARCH = Arch("gpt-oss", forward, embed, LAYER_TENSORS, optional=llama.BIASES,
            also_read=frozenset(llama.SHARED_EXPERT),    # models.moe looks for qwen2moe's shared expert: None here
            rope_neox=True,
            swa_pattern=2,                      # llama.cpp's load_swa_pattern(ml, 2): layers with il % 2 < 1 slide
            reads_sliding_window=True,
            moe=MoEArch(required=True, ff_key=True, shared=False, norm_w=False, gating=Gating.SOFTMAX_WEIGHT),
            ffn_norm="post_attention_norm")     # the norm before its FFN
