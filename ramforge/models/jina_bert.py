"""jina-bert-v2 (jina-embeddings-v2, jina-reranker-v1), as llama.cpp's llm_build_bert for LLM_ARCH_JINA_BERT_V2.

bert's encoder (models/bert.py) with ALiBi in place of positions and a GEGLU FFN. Input: token embeddings
+ token type 0's row, then LayerNorm (with bias); no position embeddings. Per layer: Q, K, V (+ biases
where present) -> LayerNorm of q and of k over the whole row (attn_q_norm / attn_k_norm, bias optional,
where present) -> attention over the sequence, scale 1/sqrt(head_dim), each score biased by ALiBi
(-slope_h * |p0 - p1|; max_bias 8, which llama.cpp sets for this architecture whatever the file says;
kernels.encoder.alibi_slopes) -> attn_output (+ bias) -> residual -> LayerNorm -> [where attn_norm_2
exists (jina-v2-code): + the layer input again -> LayerNorm] -> ffn_up (+ bias where present), its
2 * n_ff rows gate | up -> gelu(gate) * up (ggml_geglu) -> ffn_down (+ bias) -> residual -> LayerNorm.
The last layer's output is the embedding (t_embd). Rank pooling (jina-reranker-v1): the first token
through cls (+ bias), tanh; no cls.output.

llama.cpp also loads a split FFN (a separate ffn_gate, ffn_up n_ff wide: GELU-gated) and a plain GELU
one; its converter has written only the fused gate | up since ("no longer used"): ramforge runs that
one; a split file is refused (a tensor the pass does not read, ffn_gate, is refused), a plain GELU one
by ffn_up's shape.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelFileError
from ..kernels.batch import Batch
from ..kernels.encoder import alibi_slopes, encoder_attention, layer_norm, tanh
from ..kernels.ops import geglu
from . import nomic_bert
from .arch import Arch
from .bert import check_metadata, hidden_out, seq_bounds

MAX_ALIBI_BIAS = 8.0          # llama_model_jina_bert_v2::load_arch_hparams (the file's key is not read)


def embed(m, x: np.ndarray, tokens) -> None:
    """x f32[n, n_embd] = LayerNorm(token embeddings + token type 0's row), as nomic-bert's; the token types
    are required here (llama.cpp's jina-bert-v2 loads them without a fallback)."""
    if m.weights.vectors["token_types.weight"] is None:
        raise ModelFileError(f"{m.path}: tensor token_types.weight is missing; architecture {m.hp.arch} needs it")
    nomic_bert.embed(m, x, tokens)


def _linear(W, b, y, x, batch: Batch | None) -> None:
    W.rows(y, x, batch)
    if b is not None:
        y += b.data


def _norm(out, x, w, b, eps) -> None:
    """LayerNorm with w and b where given (build_norm: no bias, no add)."""
    layer_norm(out, x, w.data, b.data if b is not None else np.zeros_like(w.data), eps)


def _scratch(s, n: int, width: int) -> np.ndarray:
    """A contiguous f32[n, width] in the state's buffer for fused outputs (s.fused, plan.state_shapes)."""
    return s.fused[:n * width].reshape(n, width)


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """The n tokens in s.x (the sequences of seq_bounds, each from position 0) through the layers, in place."""
    hp, w = m.hp, m.weights
    eps = hp.norm_eps
    x, xb = s.x[:n], s.xb[:n]
    q, k, v, att, gate, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.gate[:n], s.up[:n]
    bounds = seq_bounds(m, n)
    kq_scale = np.float32(1.0 / math.sqrt(float(hp.head_dim_k)))
    slopes = alibi_slopes(hp.n_head, MAX_ALIBI_BIAS)
    for il in range(*m.layers):
        with w.layer(il) as L:
            _linear(L.attn_q, L.attn_q_bias, q.reshape(n, -1), x, batch)
            _linear(L.attn_k, L.attn_k_bias, k.reshape(n, -1), x, batch)
            _linear(L.attn_v, L.attn_v_bias, v.reshape(n, -1), x, batch)
            if L.attn_q_norm is not None:
                _norm(q.reshape(n, -1), q.reshape(n, -1), L.attn_q_norm, L.attn_q_norm_bias, eps)
            if L.attn_k_norm is not None:
                _norm(k.reshape(n, -1), k.reshape(n, -1), L.attn_k_norm, L.attn_k_norm_bias, eps)
            encoder_attention(att, q, k, v, bounds, kq_scale, slopes=slopes)
            _linear(L.attn_output, L.attn_output_bias, xb, att.reshape(n, -1), batch)
            xb += x                                                 # re-add the layer input
            if L.attn_norm_2 is None:
                layer_norm(x, xb, L.attn_output_norm.data, L.attn_output_norm_bias.data, eps)
            else:
                layer_norm(xb, xb, L.attn_output_norm.data, L.attn_output_norm_bias.data, eps)
                xb += x                                             # and once more (jina-v2-code)
                _norm(x, xb, L.attn_norm_2, L.attn_norm_2_bias, eps)
            gu = _scratch(s, n, 2 * hp.n_ff)
            _linear(L.ffn_up, L.ffn_up_bias, gu, x, batch)          # f32[n, gate | up]
            gate[:], up[:] = gu[:, :hp.n_ff], gu[:, hp.n_ff:]
            geglu(gate, gate, up)
            _linear(L.ffn_down, L.ffn_down_bias, xb, gate, batch)
            xb += x                                                 # the attention block bypasses the FFN
            layer_norm(x, xb, L.layer_output_norm.data, L.layer_output_norm_bias.data, eps)


def rank_head(m, h: np.ndarray) -> np.ndarray:
    """llama.cpp's rank pooling head for this architecture on the first tokens' states h f32[k, n_embd]:
    cls (+ bias), tanh (jina-reranker-v1: cls is one row, no cls.output); f32[k, rows of cls]."""
    W, b = m.weights.matrices["cls.weight"], m.weights.vectors["cls.bias"]
    if W is None:
        return h.copy()
    y = np.empty((h.shape[0], W.dims[1]), np.float32)
    W.rows(y, h, Batch(h.shape[0], 0))               # the first tokens' rows, a batch of their own
    if b is not None:
        y += b.data
    return tanh(y)


def shapes(hp) -> dict[str, tuple[int, ...]]:
    """Its tensors' dims where they differ from layer_shapes': q/k norms over the whole row, as llama.cpp
    creates them ({n_embd}), attn_norm_2, and ffn_up's bias over gate | up."""
    d = (hp.n_embd,)
    return {"attn_q_norm": d, "attn_q_norm_bias": d, "attn_k_norm": d, "attn_k_norm_bias": d,
            "attn_norm_2": d, "attn_norm_2_bias": d, "ffn_up_bias": (2 * hp.n_ff,)}


ARCH = Arch(
    name="jina-bert-v2", forward=forward, embed=embed,
    tensors=("attn_q", "attn_q_bias", "attn_k", "attn_k_bias", "attn_v", "attn_v_bias",
             "attn_q_norm", "attn_q_norm_bias", "attn_k_norm", "attn_k_norm_bias",
             "attn_output", "attn_output_bias", "attn_output_norm", "attn_output_norm_bias",
             "attn_norm_2", "attn_norm_2_bias", "ffn_up", "ffn_up_bias", "ffn_down", "ffn_down_bias",
             "layer_output_norm", "layer_output_norm_bias"),
    optional=frozenset({"attn_q_bias", "attn_k_bias", "attn_v_bias", "attn_q_norm", "attn_q_norm_bias",
                        "attn_k_norm", "attn_k_norm_bias", "attn_norm_2", "attn_norm_2_bias", "ffn_up_bias"}),
    global_vectors=("token_types.weight", "token_embd_norm.weight", "token_embd_norm.bias", "cls.bias"),
    global_matrices=("cls.weight",),
    causal=False, has_output=False, fused_projections=True, check_metadata=check_metadata,
    hidden_out=hidden_out, rank_head=rank_head, shapes=shapes,
)
