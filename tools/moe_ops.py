"""ramforge's mixture-of-experts ops against llama.cpp's own intermediate tensors, op by op.

    python tools/moe_ops.py qwen3moe:Q4_K_M llama-moe:Q8_0 [...]      # spec:type, as make_models

llama.cpp (llama-cpp-python, through its eval callback) evaluates one prompt and hands over every
layer's ffn_norm output and MoE intermediates (router logits, probabilities, top-k, weights, each
expert slot's gate / up / swiglu / down, the mixture, qwen2moe's shared expert). Each ramforge op
then gets llama.cpp's inputs to that op, so a difference is that op's alone. Printed per op: the
share of bit-equal values and the max |difference|.

Some ops round the same on every x86 build: the top-k order, the weights from the probabilities,
the expert matmuls of quantized experts (integer dots), the weighted sum, the shared expert's gate
and sum. Others round as the build's SIMD width does (the F32 router matmul, softmax's vector exp
and sums, swiglu, F16/BF16 dots): ramforge reproduces the AVX-512 build, so those are bit-equal
only against an AVX-512 build (`llama_cpp.llama_print_system_info()`).
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPT = "The quick brown fox jumps over the lazy dog. Meanwhile, in the city, 1, 2, 3, 5, 8, 13, 21, 34,"
# ops that round the same on every x86 build of llama.cpp (see the module doc); the expert matmuls
# too where the experts are quantized
BUILD_INDEPENDENT = ("top-k", "weights", "mixture", "shexp sigmoid", "shexp out", "ffn out")
EXPERT_MATMULS = ("expert gate", "expert up", "expert down")
GGML_F32, GGML_I32 = 0, 26


def llama_avx512() -> bool:
    import llama_cpp
    return "AVX512 = 1" in llama_cpp.llama_print_system_info().decode()


def intermediates(path: Path, tokens: list[int], prefixes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """llama.cpp's tensors whose names start with `prefixes` ("ffn_moe_topk-0", ...) after evaluating
    `tokens` in one batch with every row's output kept, as numpy arrays (GGUF dims reversed, squeezed)."""
    import llama_cpp

    base = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    base.ggml_get_name.restype, base.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    got: dict[str, np.ndarray] = {}

    def cb(t, ask, _):
        name = base.ggml_get_name(t).decode()
        if ask:
            return name.startswith(prefixes)
        # struct ggml_tensor: enum type; buffer *; int64 ne[4] (offset 16); size_t nb[4] (offset 48)
        typ = ctypes.c_int.from_address(t).value
        ne = list((ctypes.c_int64 * 4).from_address(t + 16))
        nb = list((ctypes.c_size_t * 4).from_address(t + 48))
        span = sum((n - 1) * s for n, s in zip(ne, nb)) + 4
        buf = (ctypes.c_char * span).from_address(base.ggml_get_data(t))
        dt = {GGML_F32: np.float32, GGML_I32: np.int32}[typ]
        got[name] = np.ndarray(tuple(reversed(ne)), dt, buf, strides=tuple(reversed(nb))).copy().squeeze()
        return True

    fn = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(cb)
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, verbose=False)
    params = llm.context_params
    params.cb_eval, params.cb_eval_user_data = fn, None
    ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, 1
            batch.seq_id[i][0] = 0
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llm.close()
    return got


def _cmp(ours, theirs) -> tuple[float, float]:
    """(share of bit-equal values, max |difference|)."""
    ours, theirs = np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
    if ours.shape != theirs.shape:
        raise ValueError(f"shapes differ: {ours.shape} vs {theirs.shape}")
    return float(np.mean(ours == theirs)), float(np.abs(ours - theirs).max(initial=0.0))


def build_independent(eng, op: str) -> bool:
    """Whether llama.cpp's every x86 build rounds `op` of this engine's model the same."""
    from ramforge.kernels.registry import kernels_for

    if op in EXPERT_MATMULS:
        with eng.weights.layer(0) as L:
            return all(kernels_for(L.tensors[s].ggml_type).qdot is not None
                       for s in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))
    return op in BUILD_INDEPENDENT


def check_layer(eng, il: int, g: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Layer il's MoE ops of a loaded Engine, each fed llama.cpp's inputs `g`: op -> (equal share, max |d|)."""
    from ramforge.kernels.batch import Batch
    from ramforge.kernels.matmul import matmul
    from ramforge.kernels.moe import _softmax, expert_matmul, route, shared_expert_gate, weighted_sum
    from ramforge.kernels.ops import swiglu

    hp = eng.hp
    x = g[f"ffn_norm-{il}"]                                        # f32[n, n_embd]
    n, k = x.shape[0], hp.n_expert_used
    logits = g[f"ffn_moe_logits-{il}"].astype(np.float32)
    probs_l = g[f"ffn_moe_probs-{il}"].astype(np.float32)
    topk = g[f"ffn_moe_topk-{il}"].reshape(n, k)
    wname = f"ffn_moe_weights_norm-{il}" if eng.arch.moe.norm_w else f"ffn_moe_weights-{il}"
    w_l = g[wname].reshape(n, k).astype(np.float32)
    out: dict[str, tuple[float, float]] = {}
    batch = Batch(n, 0)                                            # the llama.cpp batch of llama.cpp's n rows
    with eng.weights.layer(il) as L:
        lg = np.empty((n, hp.n_expert), np.float32)
        L.ffn_gate_inp.rows(lg, x, batch)
        out["router logits"] = _cmp(lg, logits)
        probs = np.empty_like(logits)
        for t in range(n):
            _softmax(probs[t], logits[t])
        out["probs"] = _cmp(probs, probs_l)
        sel, wts = np.empty((n, k), np.int32), np.empty((n, k), np.float32)
        route(sel, wts, probs_l, False)        # top-k of llama.cpp's probabilities (softmax keeps the order)
        out["top-k"] = (float(np.mean(sel == topk)), float(np.abs(sel - topk).max()))
        w = np.take_along_axis(probs_l, topk, 1)
        if eng.arch.moe.norm_w:
            total = np.array([np.float32(np.sum(r, dtype=np.float64)) for r in w], np.float32)
            w = w / np.maximum(total, np.float32(6.103515625e-5))[:, None]
        out["weights"] = _cmp(w, w_l)
        gl, ul, sl, dl = (g[f"ffn_moe_{s}-{il}"].reshape(n, k, -1) for s in ("gate", "up", "swiglu", "down"))
        G, U, S, D = (np.zeros_like(a) for a in (gl, ul, sl, dl))
        with eng.weights.experts(il, np.unique(topk), n) as E:
            for e, (gate, up, down) in E:
                tok, slot = np.nonzero(topk == e)
                xe = np.ascontiguousarray(x[tok])
                for t, dst in ((gate, G), (up, U)):
                    y = np.empty((tok.size, t.dims[1]), np.float32)
                    dst[tok, slot] = expert_matmul(y, xe, t.ggml_type, t.data, t.dims[1], t.dims[0], t.repacked)
                s = np.empty((tok.size, gl.shape[2]), np.float32)
                S[tok, slot] = swiglu(s, np.ascontiguousarray(gl[tok, slot]), np.ascontiguousarray(ul[tok, slot]))
                y = np.empty((tok.size, down.dims[1]), np.float32)
                D[tok, slot] = expert_matmul(y, np.ascontiguousarray(sl[tok, slot]), down.ggml_type, down.data,
                                             down.dims[1], down.dims[0], down.repacked)   # (a pinned layer's: repacked)
        for name, ours, theirs in (("expert gate", G, gl), ("expert up", U, ul), ("swiglu", S, sl), ("expert down", D, dl)):
            out[name] = _cmp(ours, theirs)
        mix = weighted_sum(np.empty((n, hp.n_embd), np.float32), np.ascontiguousarray(dl), w_l)
        out["mixture"] = _cmp(mix, g[f"ffn_moe_out-{il}"])
        if hp.n_ff_shexp:
            gi = g[f"ffn_shexp_gate_inp-{il}"].reshape(n, 1).astype(np.float32)
            v = L.ffn_gate_inp_shexp.data
            ours = matmul(np.empty((n, 1), np.float32), x, L.ffn_gate_inp_shexp.ggml_type, v.view(np.uint8), 1, v.size,
                          batch=batch)
            out["shexp gate logit"] = _cmp(ours, gi)
            gate = g[f"ffn_shexp_gate-{il}"].reshape(n, 1)
            out["shexp sigmoid"] = _cmp(shared_expert_gate(gi.copy()), gate)
            shexp_out = g[f"ffn_shexp-{il}"] * gate
            out["shexp out"] = _cmp(shexp_out, g[f"ffn_shexp_out-{il}"])
            out["ffn out"] = _cmp(g[f"ffn_moe_out-{il}"] + g[f"ffn_shexp_out-{il}"], g[f"ffn_out-{il}"])
    return out


def check_model(spec: str, qtype: str, prompt: str = PROMPT) -> dict[int, dict[str, tuple[float, float, bool]]]:
    """Every layer's ops (check_layer) for make_models' `spec` model of `qtype`, on `prompt`:
    layer -> op -> (equal share, max |d|, build-independent)."""
    import llama_cpp
    from make_models import ensure_model
    from ramforge.engine.engine import Engine

    path = ensure_model(spec, qtype, verify=False)
    vocab = llama_cpp.Llama(str(path), n_ctx=64, vocab_only=True, verbose=False)
    tokens = vocab.tokenize(prompt.encode(), add_bos=True)
    vocab.close()
    g = intermediates(path, tokens, ("ffn_norm-", "ffn_moe_", "ffn_shexp", "ffn_out-"))
    with Engine.load(path, n_ctx=512) as eng:
        return {il: {op: (*r, build_independent(eng, op)) for op, r in check_layer(eng, il, g).items()}
                for il in range(eng.hp.n_layer)}


def main(argv: list[str]) -> int:
    print(f"llama.cpp build: {'AVX-512' if llama_avx512() else 'not AVX-512'}; "
          f"build-independent ops: {', '.join(BUILD_INDEPENDENT)}")
    bad = 0
    for arg in argv:
        spec, qtype = arg.split(":")
        for il, ops in check_model(spec, qtype).items():
            print(f"{spec}:{qtype} layer {il}")
            for op, (eq, d, independent) in ops.items():
                flag = "" if eq == 1.0 else ("  <- differs" if independent or llama_avx512() else "")
                bad += bool(flag)
                print(f"    {op:18s} equal {eq * 100:6.2f}%  max |d| {d:.3g}{flag}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
