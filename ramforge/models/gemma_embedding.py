"""gemma-embedding (EmbeddingGemma), as llama.cpp's src/models/gemma-embedding.cpp.

gemma3's layers (models/gemma3.py: embeddings scaled by sqrt(n_embd), per-head Q/K RMSNorm, NEOX RoPE,
post-attention and post-FFN norms, the GeGLU FFN) as an encoder: no KV cache, every token attends to
its own sequence (positions from 0), non-causally; the sliding layers (il % 6 < 5) see only the keys at
most n_swa / 2 positions away on either side (LLAMA_SWA_TYPE_SYMMETRIC), with RoPE base
{arch}.rope.freq_base_swa (default 10000) unscaled. q is scaled by 1/sqrt(head_dim) before attention
(no 27B exception). The output norm of the last layer's output is t_embd. After pooling, the optional
sentence-transformers projections (build_dense_out): dense_2 then dense_3, no biases; with pooling none
each token's vector goes through them.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFileError, Unsupported
from ..kernels.batch import Batch
from ..kernels.encoder import encoder_attention
from ..kernels.ops import rms_norm, rope
from . import gemma3
from .arch import Arch
from .bert import seq_bounds
from .nomic_bert import positions
from .weights import output_rows, rows_of

SLIDING_KEY = "{arch}.attention.sliding_window"
DENSE = ("dense_2.weight", "dense_3.weight")     # build_dense_out's matrices, in the order applied


def check_metadata(md: dict) -> None:
    """llama.cpp requires the sliding window (its get_key without a default)."""
    arch = md.get("general.architecture")
    key = SLIDING_KEY.format(arch=arch)
    if key not in md:
        raise ModelFileError(f"metadata key {key} is missing; it is required for architecture {arch}")


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """The n tokens in s.x (the sequences of Engine.seq_bounds, each from position 0) through the layers,
    in place. Only an embedding pass (Engine.hidden_batch) runs it: llama.cpp's graph has no logits."""
    if getattr(m, "seq_bounds", None) is None:
        raise Unsupported(f"{m.hp.arch} is an embedding model (non-causal, no KV cache): it cannot generate; "
                          f"use its embeddings (Model.embed, /api/embed, /v1/embeddings)")
    hp, w = m.hp, m.weights
    x, xb = s.x[:n], s.xb[:n]
    q, k, v = s.q[:n], s.k[:n], s.v[:n]
    att, gate, up = s.att[:n], s.gate[:n], s.up[:n]
    bounds = seq_bounds(m, n)
    pos = positions(bounds, n)
    q_scale = np.float32(1.0) / np.sqrt(np.float32(hp.head_dim_k))      # f_attention_scale
    for il in range(*m.layers):
        base, scale = ARCH.layer_rope(hp, il)
        with w.layer(il) as L:
            rows_of(xb, (L.attn_q, q.reshape(n, -1)), (L.attn_k, k.reshape(n, -1)), (L.attn_v, v.reshape(n, -1)),
                    norm=(x, L.attn_norm.data, hp.rms_eps), batch=batch)
            rms_norm(q, q, L.attn_q_norm.data, hp.rms_eps)
            rms_norm(k, k, L.attn_k_norm.data, hp.rms_eps)
            rope(q, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            rope(k, pos, hp.rope_dim, base, ARCH.rope_neox, None, scale)
            q *= q_scale
            win = hp.sliding_window if ARCH.is_swa(hp, il) else 0
            encoder_attention(att, q, k, v, bounds, np.float32(1.0), win)
            L.attn_output.rows(xb, att.reshape(n, -1), batch)
            x, xb, gate, up, fb = output_rows(hp, il, out, batch, x, xb, gate, up)
            gemma3.ffn(L, hp, x, xb, gate, up, fb)


def pooled_out(m, v: np.ndarray) -> np.ndarray:
    """build_dense_out on pooled vectors v f32[k, n_embd] (pooling none: every token's): dense_2, then
    dense_3, where the file has them; f32[k, n_embd] (dense_3 brings the width back)."""
    cur = v
    for name in DENSE:
        W = m.weights.matrices[name]
        if W is None:
            continue
        if W.dims[0] != cur.shape[1]:
            raise ModelFileError(f"{m.path}: {name} takes {W.dims[0]} inputs, the vectors have {cur.shape[1]}")
        y = np.empty((cur.shape[0], W.dims[1]), np.float32)
        W.rows(y, np.ascontiguousarray(cur), Batch(cur.shape[0], 0))
        cur = y
    return cur


ARCH = Arch("gemma-embedding", forward, gemma3.embed, gemma3.LAYER_TENSORS, rope_neox=True,
            swa_pattern=6, reads_sliding_window=True,
            rope_base_swa=10000.0, rope_freq_scale_swa=1.0,   # as gemma3: hparams' defaults
            global_matrices=DENSE, causal=False, check_metadata=check_metadata, pooled_out=pooled_out)
