"""gemma2, as llama.cpp's src/models/gemma2.cpp.

gemma3 without the per-head Q/K norms, with soft-capped logits: embeddings scaled by sqrt(n_embd);
q scaled by 1/sqrt(head_dim) (the 27B, 46 layers: 1/sqrt(n_embd / n_head)); attention logits capped
at +-{arch}.attn_logit_softcapping (default 50) before the softmax, the final logits at
+-{arch}.final_logit_softcapping (default 30, applied by the engine from HParams.final_softcap);
post-attention and post-FFN RMSNorms; GELU-gated FFN; a sliding window
({arch}.attention.sliding_window, default 4096) on the even layers (il % 2 == 0), the odd ones
global. Every layer uses the file's RoPE base and scaling (a {arch}.rope.freq_base_swa, when given,
for the sliding layers). NEOX-style RoPE.
"""
from __future__ import annotations

from ..kernels.attention import attention
from ..kernels.batch import Batch
from ..kernels.ops import rope
from . import gemma3
from .arch import Arch, SoftCaps
from .weights import output_rows, rows_of

GEMMA2_27B_LAYERS = 46          # llama.cpp's LLM_TYPE_27B, whose q scale is by n_embd / n_head
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "post_attention_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """Run the n hidden states in s.x (f32[n, n_embd]) at positions pos0.. through m's layers, in place
    (out, batch: as llama.forward)."""
    hp, w, kv = m.hp, m.weights, m.kv
    pos = kv.positions(pos0, n)                                 # i32[n]
    x, xb = s.x[:n], s.xb[:n]                                   # f32[n, n_embd]
    q, k, v = s.q[:n], s.k[:n], s.v[:n]                         # f32[n, heads, head_dim]
    att, gate, up = s.att[:n], s.gate[:n], s.up[:n]
    q_scale = gemma3.attention_scale(hp, GEMMA2_27B_LAYERS)
    for il in range(*m.layers):
        swa = ARCH.is_swa(hp, il)
        base, scale = ARCH.layer_rope(hp, il)          # rope_freq_base_train_swa: the base unless given
        with w.layer(il) as L:
            rows_of(xb, (L.attn_q, q.reshape(n, -1)), (L.attn_k, k.reshape(n, -1)), (L.attn_v, v.reshape(n, -1)),
                    norm=(x, L.attn_norm.data, hp.rms_eps), batch=batch)     # of xb = RMSNorm(x)
            rope(q, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            rope(k, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            q *= q_scale
            kv.store(il, pos0, k, v)
            win = hp.sliding_window if swa else 0
            attention(att, q, *kv.layer(il), pos0, 1.0, win, hp.attn_softcap, cells=kv.visible(win), batch=batch)
            L.attn_output.rows(xb, att.reshape(n, -1), batch)
            x, xb, gate, up, fb = output_rows(hp, il, out, batch, x, xb, gate, up)    # fb: the FFN's batch
            gemma3.ffn(L, hp, x, xb, gate, up, fb)                 # as Gemma 3 (sandwich norms, GeGLU)


ARCH = Arch("gemma2", forward, gemma3.embed, LAYER_TENSORS, rope_neox=True, k_shift=True,
            swa_pattern=2,                      # layers with il % 2 < 1 use the sliding window
            reads_sliding_window=True, sliding_window_default=4096,
            softcaps=SoftCaps(attn=50.0, final=30.0))
