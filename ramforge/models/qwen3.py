"""qwen3, as llama.cpp's src/models/qwen3.cpp: llama with per-head Q/K RMSNorm and NEOX-style RoPE.

A Qwen3-Reranker is this architecture with rank pooling and a classifier head, cls.output.weight (the
lm head's rows of "yes" and "no", {arch}.classifier.output_labels): build_pooling takes each sequence's
last token's t_embd (the output norm), cls.output, then a softmax; the score is its first value.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFileError
from ..kernels.batch import Batch
from ..kernels.pool import softmax_rows
from . import llama
from .arch import Arch

LAYER_TENSORS = (*(t for t in llama.LAYER_TENSORS if not t.endswith("_bias")), "attn_q_norm", "attn_k_norm")
ALSO_READ = llama.BIASES | {"ffn_gate_inp"}     # llama.forward looks for qwen2's biases, a router: None
CLS_OUT = "cls.output.weight"


def rank_head(m, h: np.ndarray) -> np.ndarray:
    """Rank pooling's head on the last tokens' t_embd h f32[k, n_embd]: softmax(cls.output h),
    f32[k, n_cls_out] (llama.cpp's build_pooling for LLM_ARCH_QWEN3)."""
    W = m.weights.matrices[CLS_OUT]
    if W is None:
        raise ModelFileError(f"{m.path}: rank pooling needs {CLS_OUT} (a Qwen3-Reranker's yes/no rows); "
                             f"this {m.hp.arch} file has none")
    y = np.empty((h.shape[0], W.dims[1]), np.float32)
    W.rows(y, np.ascontiguousarray(h), Batch(h.shape[0], 0))
    return softmax_rows(y)


ARCH = Arch("qwen3", llama.forward, llama.embed, LAYER_TENSORS, also_read=ALSO_READ, rope_neox=True,
            rope_freqs=True, k_shift=True, global_matrices=(CLS_OUT,), rank_head=rank_head)
