"""bert (BERT, BGE, MiniLM, BGE rerankers), as llama.cpp's llm_build_bert.

An encoder: every token attends to every token of its sequence (no KV cache: keys and values are the
batch's own, float32). Input: token embeddings + token type 0's row + absolute position embeddings,
then LayerNorm (with bias). Per layer: Q, K, V (+ biases) -> attention -> output projection (+ bias)
-> residual -> LayerNorm -> up (+ bias) -> GELU -> down (+ bias) -> residual -> LayerNorm. No output
norm and no output matrix: the last layer's output is the embedding (t_embd). Rank pooling (a
reranker) takes the first token through the classifier head: cls (+ bias), tanh, cls.output (+ bias).

All of bert's facts are in its record, `ARCH` (the tensors, the metadata it checks, its head).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelFileError
from ..kernels.encoder import encoder_attention, gelu, layer_norm, tanh
from ..kernels.batch import Batch
from .arch import Arch

EPS_KEY = "{arch}.attention.layer_norm_epsilon"
CAUSAL_KEY = "{arch}.attention.causal"
REQUIRED = ("position_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias")


def check_metadata(md: dict) -> None:
    """The LayerNorm epsilon ({arch}.attention.layer_norm_epsilon, HParams.norm_eps) is required, as in
    llama.cpp; a causal bert is not this graph (check_not_causal)."""
    arch = md.get("general.architecture")
    key = EPS_KEY.format(arch=arch)
    if key not in md:
        raise ModelFileError(f"metadata key {key} is missing; it is required for architecture {arch}")
    check_not_causal(md)


def check_not_causal(md: dict) -> None:
    """{arch}.attention.causal must be false: llama.cpp runs the file causally when it is true or missing
    (llama_hparams.causal_attn defaults to true), and ramforge's encoders are non-causal only."""
    arch = md.get("general.architecture")
    key = CAUSAL_KEY.format(arch=arch)
    causal = md.get(key)
    if causal is None:
        raise ModelFileError(f"metadata key {key} is missing: llama.cpp then runs {arch} with causal attention "
                             f"(its default), which ramforge's {arch} (an encoder only) does not; "
                             f"convert the model again with llama.cpp's convert_hf_to_gguf.py, which writes it")
    if causal:
        raise ModelFileError(f"{key} = true: ramforge's {arch} is an encoder only")


def _globals(m) -> dict:
    """The tensors beside the layers (Arch.global_vectors and global_matrices, read at load)."""
    g = {**m.weights.vectors, **m.weights.matrices}
    for name in REQUIRED:
        if g[name] is None:
            raise ModelFileError(f"{m.path}: tensor {name} is missing; architecture {m.hp.arch} needs it")
    return g


def seq_bounds(m, n: int) -> np.ndarray:
    """The batch's sequences' rows [a, b) i64[n_seq, 2] (Engine.seq_bounds: several packed; else one)."""
    b = getattr(m, "seq_bounds", None)
    return np.array([[0, n]], np.int64) if b is None else b


def embed(m, x: np.ndarray, tokens) -> None:
    """x f32[n, n_embd] = LayerNorm(token embeddings + token type 0 + position embeddings); each
    sequence's positions from 0."""
    g = _globals(m)
    n, d = x.shape
    bounds = seq_bounds(m, n)
    longest = int((bounds[:, 1] - bounds[:, 0]).max())
    if longest > m.hp.n_ctx_train:
        raise ModelFileError(f"{longest} tokens exceed the {m.hp.n_ctx_train} position embeddings")
    m.weights.embed(tokens, x)
    if g["token_types.weight"] is not None:
        x += g["token_types.weight"].data[:d]
    pos = g["position_embd.weight"].data.reshape(-1, d)
    for a, b in bounds:
        x[a:b] = pos[:b - a] + x[a:b]
    layer_norm(x, x, g["token_embd_norm.weight"].data, g["token_embd_norm.bias"].data, m.hp.norm_eps)


def _linear(W, b, y, x, batch: Batch | None) -> None:
    W.rows(y, x, batch)
    y += b.data


def forward(m, s, n: int, pos0: int, out: slice | None = None, batch: Batch | None = None) -> None:
    """The n tokens in s.x (the sequences of seq_bounds, each from position 0) through the layers, in place
    (batch: as llama.forward)."""
    hp, w = m.hp, m.weights
    eps = m.hp.norm_eps
    x, xb = s.x[:n], s.xb[:n]
    q, k, v, att, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.up[:n]
    bounds = seq_bounds(m, n)
    kq_scale = 1.0 / math.sqrt(float(hp.head_dim_k))
    for il in range(*m.layers):
        with w.layer(il) as L:
            _linear(L.attn_q, L.attn_q_bias, q.reshape(n, -1), x, batch)
            _linear(L.attn_k, L.attn_k_bias, k.reshape(n, -1), x, batch)
            _linear(L.attn_v, L.attn_v_bias, v.reshape(n, -1), x, batch)
            encoder_attention(att, q, k, v, bounds, np.float32(kq_scale))
            _linear(L.attn_output, L.attn_output_bias, xb, att.reshape(n, -1), batch)
            xb += x                                                 # re-add the layer input
            layer_norm(x, xb, L.attn_output_norm.data, L.attn_output_norm_bias.data, eps)
            _linear(L.ffn_up, L.ffn_up_bias, up, x, batch)
            gelu(up)
            _linear(L.ffn_down, L.ffn_down_bias, xb, up, batch)
            xb += x                                                 # the attention block bypasses the FFN
            layer_norm(x, xb, L.layer_output_norm.data, L.layer_output_norm_bias.data, eps)


def hidden_out(m, x: np.ndarray) -> np.ndarray:
    """t_embd: the last layer's output as it is (its LayerNorm ends it)."""
    return x.copy()


def rank_head(m, h: np.ndarray) -> np.ndarray:
    """llama.cpp's rank pooling head on the first tokens' states h f32[k, n_embd]: cls (+ bias), tanh,
    cls.output (+ bias); f32[k, n_cls_out]."""
    g = _globals(m)
    cur, batch = h, Batch(h.shape[0], 0)             # the first tokens' rows, a batch of their own
    for weight, bias, act in (("cls", "cls.bias", tanh), ("cls.output", "cls.output.bias", None)):
        W = g[f"{weight}.weight"]
        if W is None:
            continue
        y = np.empty((h.shape[0], W.dims[1]), np.float32)
        W.rows(y, cur, batch)
        if g[bias] is not None:
            y += g[bias].data
        cur = act(y) if act is not None else y
    return cur


ARCH = Arch(
    name="bert", forward=forward, embed=embed,
    tensors=("attn_q", "attn_q_bias", "attn_k", "attn_k_bias", "attn_v", "attn_v_bias",
             "attn_output", "attn_output_bias", "attn_output_norm", "attn_output_norm_bias",
             "ffn_up", "ffn_up_bias", "ffn_down", "ffn_down_bias", "layer_output_norm", "layer_output_norm_bias"),
    # beside token_embd: token types, absolute positions, the embedding norm; the classifier head (rerankers)
    global_vectors=("token_types.weight", "position_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias",
                    "cls.bias", "cls.output.bias"),
    global_matrices=("cls.weight", "cls.output.weight"),
    causal=False, has_output=False, check_metadata=check_metadata, hidden_out=hidden_out, rank_head=rank_head,
)
