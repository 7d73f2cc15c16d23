"""The mixture-of-experts FFN, as llama.cpp's build_moe_ffn (src/llama-graph.cpp), shared by qwen3moe,
qwen2moe, llama with experts (Mixtral) and gpt-oss.

For n rows xb (the FFN-normed hidden states):
  router logits = xb @ ffn_gate_inp^T [+ b]                (a plain matmul: the batch's arithmetic)
  sel, wts      = top-k of softmax(logits) (ggml_argsort order), normalized to sum 1 if norm_w;
                  gpt-oss: top-k of the logits, weights the softmax of those k (Gating.SOFTMAX_WEIGHT)
  per expert e, on the rows routed to it (mul_mat_id: the arithmetic its row count gets):
      ex[row, slot] = down_e(silu(gate_e(xb)) * up_e(xb))
      gpt-oss: down_e(swiglu_oai(gate_e(xb) + bg_e, up_e(xb) + bu_e)) + bd_e
  out = ex[:, 0] * w0 + ex[:, 1] * w1 + ...                 (slot by slot)
  qwen2moe adds the shared expert: out += down_s(silu(gate_s(xb)) * up_s(xb)) * sigmoid(xb . g)
llama.cpp counts an expert's rows over the whole ubatch; here over the rows of the chunk in hand, so a
ubatch longer than ramforge's chunk (plan.batch) can give an expert vec_dot here where llama.cpp,
counting 8+ rows across chunks, takes the tiled K-quant matmul.
"""
from __future__ import annotations

import numpy as np

from ..kernels.matmul import matmul
from ..kernels.moe import Gating, expert_matmul, route, shared_expert_gate, weighted_sum
from ..kernels.ops import rms_norm, swiglu, swiglu_oai
from ..profiling import timed
from ..stream import routing_trace
from .weights import rows_of

# architecture -> whether the k weights are divided by their sum (build_moe_ffn's norm_w)
NORM_W = {"qwen3moe": True, "qwen2moe": False, "llama": True, "gpt-oss": False}
# architecture -> gating (build_moe_ffn's gating_op), where not softmax
GATING = {"gpt-oss": Gating.SOFTMAX_WEIGHT}
BIASES = ("ffn_gate_inp_bias", "ffn_gate_exps_bias", "ffn_up_exps_bias", "ffn_down_exps_bias")   # gpt-oss's
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0        # gpt-oss's clamped SwiGLU (LLM_FFN_SWIGLU_OAI_MOE)


def ffn(m, s, il: int, L, xb: np.ndarray, x: np.ndarray) -> None:
    """xb f32[n, n_embd] <- layer il's mixture of experts of xb (plus its shared expert, if any).
    x f32[n, n_embd], the residual xb was normed from, predicts the next layer's experts (read ahead
    when they stream; the answer never depends on the guess)."""
    hp, w = m.hp, m.weights
    n = xb.shape[0]
    logits, sel, wts = s.router[:n], s.sel[:n], s.wts[:n]      # f32[n, n_expert], i32[n, k], f32[n, k]
    ex = s.ex[:n]                                              # f32[n, k, n_embd]
    L.ffn_gate_inp.rows(logits, xb)
    if L.ffn_gate_inp_bias is not None:                        # gpt-oss: router, experts and down have biases
        logits += L.ffn_gate_inp_bias.data
    route(sel, wts, logits, NORM_W[hp.arch], GATING.get(hp.arch, Gating.SOFTMAX))
    routing_trace.record(m, il, sel)                           # --trace-routing (a no-op without a trace)
    biases = [_expert_bias(L, t) for t in BIASES[1:]]
    experts = np.unique(sel)                                   # ascending, as mul_mat_id's loop
    with w.experts(il, experts, n) as E:
        if E.wants_prediction:
            E.predict(_predict(w.predictors[il + 1], x, s.xe[:n], logits, hp))
        for e, (gate, up, down) in E:                          # cached experts first: any order is exact
            tok, slot = np.nonzero(sel == e)                   # its rows: (token, slot), token-major
            c = tok.size
            xe, ge, ue, ye = s.xe[:c], s.ge[:c], s.ue[:c], s.ye[:c]
            np.take(xb, tok, axis=0, out=xe)
            _expert_rows(ge, xe, gate)
            _expert_rows(ue, xe, up)
            if biases[0] is None:
                swiglu(ge, ge, ue)
                _expert_rows(ye, ge, down)
            else:                                              # ggml_add_id after each mul_mat_id
                ge += biases[0][e]
                ue += biases[1][e]
                swiglu_oai(ge, ge, ue, OAI_ALPHA, OAI_LIMIT)
                _expert_rows(ye, ge, down)
                ye += biases[2][e]
            ex[tok, slot] = ye
    if hp.n_ff_shexp:                                          # qwen2moe's shared expert, gated
        gate, up, g = s.gate[:n], s.up[:n], s.shgate[:n]       # f32[n, n_ff_shexp] x2, f32[n, 1]
        v = L.ffn_gate_inp_shexp.data                          # f32[n_embd]: a one-row F32 matmul
        matmul(g, xb, L.ffn_gate_inp_shexp.ggml_type, v.view(np.uint8), 1, v.size)
        shared_expert_gate(g)
        rows_of(xb, (L.ffn_gate_shexp, gate), (L.ffn_up_shexp, up))
        swiglu(gate, gate, up)
        shexp = L.ffn_down_shexp.rows(s.ye[:n], gate)
        np.multiply(shexp, g, out=shexp)                       # ffn_shexp_out ...
        weighted_sum(xb, ex, wts)
        xb += shexp                                            # ... added to the mixture
    else:
        weighted_sum(xb, ex, wts)


def _expert_bias(L, name: str) -> np.ndarray | None:
    """An expert bias (GGUF [width, n_expert], F32) as f32[n_expert, width], or None."""
    t = getattr(L, name)
    return None if t is None else t.data.view(np.float32).reshape(t.dims[1], t.dims[0])


def _predict(predictor, x: np.ndarray, xn: np.ndarray, logits: np.ndarray, hp) -> np.ndarray:
    """The next layer's likely experts, most picked first: its router applied to this layer's residual
    x f32[n, n_embd], normed with its ffn_norm (into xn), logits into f32[n, n_expert] scratch; each
    row's top k (a guess: its arithmetic need not be llama.cpp's)."""
    norm, router = predictor
    rms_norm(xn, x, norm.data, hp.rms_eps)
    router.rows(logits, xn)
    k = hp.n_expert_used
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k] if k < hp.n_expert else np.tile(np.arange(k), (len(x), 1))
    ids, counts = np.unique(top, return_counts=True)
    return ids[np.argsort(-counts, kind="stable")]


@timed(lambda y, x, t: f"expert matvec {t.ggml_type.name}")
def _expert_rows(y: np.ndarray, x: np.ndarray, t) -> np.ndarray:
    """y f32[c, rows of t] = x f32[c, n_in] @ t^T for the c rows routed to expert t (a 2-D QTensor)."""
    return expert_matmul(y, x, t.ggml_type, t.data, t.dims[1], t.dims[0])
