"""Write deterministic random-weight GGUF models (llama / qwen2 / qwen3) with real vocabularies,
and quantize them with llama.cpp (via llama-cpp-python) to the types ramforge supports.

    python tools/make_models.py                                 # all archs x all types
    python tools/make_models.py --arch qwen3 --types F16 Q4_K_M
    python tools/make_models.py --preset llama-3b --types Q4_K_M --out /big/disk
    python tools/make_models.py --preset llama-1b --types Q4_0 Q4_K_M Q5_K_M Q6_K Q8_0 IQ4_XS

From tests:  from tools.make_models import ensure_model
             path = ensure_model("llama", "Q4_K_M")       # built on demand, cached
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):             # run as `python tools/<name>.py`: make the `tools` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import (  # noqa: E402
    ORACLE_DIR, llama_cpp_or_none, models_dir, read_gguf_header, sha256_file, stable_seed, vocab_path,
)

FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M",
               "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4_MOE")
# low-bit types llama_model_quantize cannot make without an imatrix: written by write_lowbit_model
# (ggml_quantize_chunk with a synthetic importance vector, tools/ggml_quant.py)
LOWBIT_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0", "MXFP4")
ALL_TYPES = FLOAT_TYPES + QUANT_TYPES + LOWBIT_TYPES
FILE_TYPE = {"F32": 0, "F16": 1, "BF16": 32}      # llama_ftype of the float variants
# llama_ftype of the low-bit variants (llama.h's LLAMA_FTYPE_MOSTLY_*)
LOWBIT_FILE_TYPE = {"IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XXS": 23, "IQ1_S": 24, "IQ3_S": 26, "IQ2_S": 28,
                    "IQ1_M": 31, "TQ1_0": 36, "TQ2_0": 37, "MXFP4": 38}
LOWBIT_FALLBACK = "Q8_0"  # a matrix whose rows are not a whole number of the type's blocks


@dataclass(frozen=True)
class Spec:
    arch: str
    vocab: str                # key of _fixtures.VOCAB_FILES
    name: str = "tiny"
    n_embd: int = 256
    n_layer: int = 3
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 768
    n_ctx: int = 512
    rope_base: float = 10000.0
    eps: float = 1e-5
    qkv_bias: bool = False
    qk_norm: bool = False
    tied: bool = False        # no output.weight: llama.cpp reuses token_embd
    seed: int = 1234
    # init scales, tuned so logits have std ~4 (measured with llama.cpp) and are never flat
    embd_std: float = 0.25    # token_embd (and the lm head when tied)
    out_std: float = 0.25     # output.weight
    proj_gain: float = 1.0    # projection std = gain / sqrt(fan_in)
    resid_gain: float = 1.0   # extra gain of attn_output / ffn_down (what writes the residual)
    norm_jitter: float = 0.1  # norm weights = 1 + jitter * N(0,1)
    bias_std: float = 0.2
    # mixture of experts (0: a dense FFN)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0         # an expert's FFN width (qwen*moe: expert_feed_forward_length; llama: n_ff)
    n_ff_shexp: int = 0       # the shared expert's FFN width (qwen2moe), 0: none
    router_gain: float = 1.0  # ffn_gate_inp std = gain / sqrt(n_embd)
    # RoPE scaling: (key under {arch}.rope.scaling., value) pairs written as they are (str, float32, uint32)
    rope_scaling: tuple = ()
    # other metadata: (key under {arch}., value) pairs, written likewise (soft-caps, sliding window)
    extra_kv: tuple = ()
    post_norms: bool = False  # gemma's post_attention_norm and post_ffw_norm
    fused: bool = False       # phi3: attn_qkv (q, k, v rows) and ffn_up holding gate and up
    rope_factors: bool = False  # LongRoPE's rope_factors_long / rope_factors_short (n_rot/2 each)
    n_rot: int = 0            # rope.dimension_count (0: head_dim; less: partial rotary, as Phi-4-mini's)
    rope_freqs: bool = False  # Llama 3.1's rope_freqs (n_rot/2 frequency divisors)


SPECS = {
    "llama": Spec("llama", "llama-spm"),
    "qwen2": Spec("qwen2", "qwen2", rope_base=1e6, eps=1e-6, qkv_bias=True),
    # tied: a bigger residual keeps the token's own embedding from dominating its logit
    "qwen3": Spec("qwen3", "qwen2", rope_base=1e6, eps=1e-6, qk_norm=True, tied=True, resid_gain=4.0),
    # mixtures of experts: 256-wide expert rows keep the K-quants (no fallback type)
    "qwen3moe": Spec("qwen3moe", "qwen2", rope_base=1e6, eps=1e-6, qk_norm=True, tied=True, resid_gain=4.0,
                     n_expert=16, n_expert_used=4, n_ff_exp=256, router_gain=2.0),
    "qwen2moe": Spec("qwen2moe", "qwen2", rope_base=1e6, eps=1e-6, qkv_bias=True, n_expert=8, n_expert_used=2,
                     n_ff_exp=256, n_ff_shexp=512, router_gain=2.0),
    # gpt-oss: biases everywhere, one sink per head, sliding window on even layers (short here, so the
    # records cross it), YaRN as the released models (factor 32 over 4096), 16 experts (4 used) with the
    # clamped SwiGLU; a qwen2 vocab (the harmony tokenizer is not among llama.cpp's vocab files)
    "gpt-oss": Spec("gpt-oss", "qwen2", rope_base=150000.0, qkv_bias=True, n_ff=256, n_expert=16,
                    n_expert_used=4, n_ff_exp=256, router_gain=2.0, extra_kv=(("attention.sliding_window", 16),),
                    rope_scaling=(("type", "yarn"), ("factor", 32.0), ("original_context_length", 4096))),
    # Mixtral: GGUF architecture llama with experts, expert FFN width = feed_forward_length
    "llama-moe": Spec("llama", "llama-spm", name="moe", n_ff=256, n_expert=8, n_expert_used=2, n_ff_exp=256,
                      router_gain=2.0),
    # RoPE scaling: YaRN as Qwen3's long-context files (factor 4 over an original context of 128, so the
    # ramp between YaRN's correction dims falls inside the 32 pairs), and linear (freq_scale 1/4)
    "qwen3-yarn": Spec("qwen3", "qwen2", name="yarn", rope_base=1e6, eps=1e-6, qk_norm=True, tied=True,
                       resid_gain=4.0, rope_scaling=(("type", "yarn"), ("factor", 4.0),
                                                     ("original_context_length", 128))),
    "llama-linear": Spec("llama", "llama-spm", name="linear", rope_scaling=(("type", "linear"), ("factor", 4.0))),
    # Llama 3.1's RoPE: the rope_freqs tensor divides each pair's frequency (1 for the fast pairs, up to 8)
    "llama-freqs": Spec("llama", "llama-spm", name="freqs", rope_freqs=True),
    # gemma2 (llama-spm: gemma's vocab is SPM too): caps low enough to bend the logits (attention ~ +-5,
    # final ~ +-17), a window of 8 on layers 0 and 2
    "gemma2": Spec("gemma2", "llama-spm", tied=True, post_norms=True, eps=1e-6,
                   extra_kv=(("attn_logit_softcapping", 5.0), ("final_logit_softcapping", 15.0),
                             ("attention.sliding_window", 8))),
    # phi3 (its own vocab), fused QKV and gate-up; with LongRoPE factors and their attn_factor, the long
    # ones chosen (original context 256 < the 512 llama.cpp allocates) or the short (original 512)
    "phi3": Spec("phi3", "phi-3", fused=True),
    "phi3-longrope": Spec("phi3", "phi-3", name="longrope", fused=True, rope_factors=True,
                          rope_scaling=(("attn_factor", 1.1902381), ("original_context_length", 256))),
    "phi3-short": Spec("phi3", "phi-3", name="short", fused=True, rope_factors=True,
                       rope_scaling=(("attn_factor", 1.1902381), ("original_context_length", 512))),
    # Phi-4-mini's traits: tied embeddings, a partial rotary (48 of 64 dims), LongRoPE (long factors chosen)
    "phi3-mini4": Spec("phi3", "phi-3", name="mini4", fused=True, tied=True, n_rot=48, rope_factors=True,
                       resid_gain=4.0, rope_scaling=(("attn_factor", 1.1902381), ("original_context_length", 256))),
    # gemma3 with Gemma 3 4B's linear RoPE scaling (factor 8) on its global layer (il 5) only; window 8
    "gemma3-linear": Spec("gemma3", "llama-spm", name="linear", n_layer=6, tied=True, post_norms=True, qk_norm=True,
                          eps=1e-6, rope_base=1e6, rope_scaling=(("type", "linear"), ("factor", 8.0)),
                          extra_kv=(("attention.sliding_window", 8), ("rope.freq_base_swa", 10000.0))),
}
def _big(name: str, base: str = "llama", **shape) -> Spec:
    """A preset on SPECS[base] (its vocab, norms, biases, router gain); embd/out std scale as
    4/sqrt(n_embd) to keep the logit std near 4."""
    std = 4.0 / float(np.sqrt(shape["n_embd"]))
    return dataclasses.replace(SPECS[base], name=name, embd_std=std, out_std=std, **shape)


PRESETS = {
    # Llama-3.2-1B's layer shape (GQA 32/8 heads of 64, 8192-wide FFN), untied, with the llama-spm
    # vocab: ~1.1B params; Q4_K_M ~0.7 GB (benchmarks/vs_llamacpp.py --preset 1b)
    "llama-1b": _big("1b", n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, head_dim=64,
                     n_ff=8192, n_ctx=4096),
    # Llama-3.2-3B's layer shape (24/8 heads of 128), likewise: ~3.0B params; Q4_K_M ~1.8 GB
    # (benchmarks/out_of_core.py, vs_llamacpp.py --preset 3b)
    "llama-3b": _big("3b", n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, head_dim=128,
                     n_ff=8192, n_ctx=4096),
    # ~250M params: big enough that a forward pass is weight-bound, small enough to build in a minute
    # (benchmarks/vs_llamacpp.py's synthetic Q4_0 / Q8_0 / Q6_K comparisons)
    "llama-250m": _big("250m", n_embd=1024, n_layer=16, n_head=16, n_head_kv=4, head_dim=64, n_ff=2816),
    # the same code path, scaled down (checks the preset/streaming path quickly)
    "llama-3b-mini": _big("3b-mini", n_embd=512, n_layer=4, n_head=8, n_head_kv=2, head_dim=64,
                          n_ff=1536),
    # Qwen3-30B-A3B's layer shape (128 experts, 8 used, 768-wide experts; feed_forward_length as the
    # real header) for 5 of its 48 layers; tied as the qwen3moe spec. Q4_K_M ~2 GB, experts ~95% of it
    # (benchmarks/moe_out_of_core.py)
    "qwen3moe-30b-a3b-5l": _big("30b-a3b-5l", "qwen3moe", n_embd=2048, n_layer=5, n_head=32, n_head_kv=4,
                                head_dim=128, n_ff=6144, n_expert=128, n_expert_used=8, n_ff_exp=768,
                                n_ctx=4096),
}


def model_id(spec: Spec, qtype: str) -> str:
    return f"{spec.arch}-{spec.name}-{qtype.lower()}"


# ---------------------------------------------------------------------------------------------
# tensor plan and deterministic values

def tensor_plan(spec: Spec, n_vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape [rows, cols], kind) in the file order llama.cpp's converters use."""
    e, hd, nq, nkv = spec.n_embd, spec.head_dim, spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    plan = [("token_embd.weight", (n_vocab, e), "embd")]
    if spec.rope_freqs:
        plan.append(("rope_freqs.weight", ((spec.n_rot or hd) // 2,), "factor_llama3"))
    if spec.rope_factors:
        n_rot = spec.n_rot or hd
        plan += [("rope_factors_long.weight", (n_rot // 2,), "factor_long"),
                 ("rope_factors_short.weight", (n_rot // 2,), "factor_short")]
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        plan.append((b + "attn_norm.weight", (e,), "norm"))
        if spec.fused:
            plan.append((b + "attn_qkv.weight", (nq + 2 * nkv, e), "proj"))
        for t, rows in (("q", nq), ("k", nkv), ("v", nkv)) if not spec.fused else ():
            plan.append((b + f"attn_{t}.weight", (rows, e), "proj"))
            if spec.qkv_bias:
                plan.append((b + f"attn_{t}.bias", (rows,), "bias"))
        if spec.qk_norm:
            plan += [(b + "attn_q_norm.weight", (hd,), "norm"), (b + "attn_k_norm.weight", (hd,), "norm")]
        oss = spec.arch == "gpt-oss"
        plan.append((b + "attn_output.weight", (e, nq), "proj"))
        if oss:
            plan += [(b + "attn_output.bias", (e,), "bias"), (b + "attn_sinks.weight", (spec.n_head,), "sink")]
        if spec.post_norms or oss:        # gpt-oss: its FFN's input norm has this name
            plan.append((b + "post_attention_norm.weight", (e,), "norm"))
        if not oss:
            plan.append((b + "ffn_norm.weight", (e,), "norm"))
        if spec.n_expert:                     # numpy [experts, rows, cols] = GGUF [cols, rows, experts]
            x, f = spec.n_expert, spec.n_ff_exp
            plan.append((b + "ffn_gate_inp.weight", (x, e), "router"))
            if oss:
                plan.append((b + "ffn_gate_inp.bias", (x,), "bias"))
            for t, shape in (("gate", (x, f, e)), ("up", (x, f, e)), ("down", (x, e, f))):
                plan.append((b + f"ffn_{t}_exps.weight", shape, "proj"))
                if oss:
                    plan.append((b + f"ffn_{t}_exps.bias", shape[:2], "bias"))
            if spec.n_ff_shexp:
                f = spec.n_ff_shexp
                plan += [(b + "ffn_gate_inp_shexp.weight", (e,), "proj"),
                         (b + "ffn_gate_shexp.weight", (f, e), "proj"),
                         (b + "ffn_up_shexp.weight", (f, e), "proj"),
                         (b + "ffn_down_shexp.weight", (e, f), "proj")]
        elif spec.fused:
            plan += [(b + "ffn_up.weight", (2 * spec.n_ff, e), "proj"),
                     (b + "ffn_down.weight", (e, spec.n_ff), "proj")]
        else:
            plan += [(b + "ffn_gate.weight", (spec.n_ff, e), "proj"),
                     (b + "ffn_up.weight", (spec.n_ff, e), "proj"),
                     (b + "ffn_down.weight", (e, spec.n_ff), "proj")]
        if spec.post_norms:
            plan.append((b + "post_ffw_norm.weight", (e,), "norm"))
    plan.append(("output_norm.weight", (e,), "norm"))
    if not spec.tied:
        plan.append(("output.weight", (n_vocab, e), "out"))
    return plan


def tensor_values(spec: Spec, name: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """The float32 master values of one tensor; depends only on (spec.seed, name, shape, kind)."""
    rng = np.random.Generator(np.random.PCG64(stable_seed(spec.seed, name)))
    x = rng.standard_normal(shape, dtype=np.float32)
    if kind == "norm":
        return x * np.float32(spec.norm_jitter) + np.float32(1.0)
    if kind.startswith("factor"):              # LongRoPE: long factors 1..~40 growing with the pair, short near 1;
        i = np.arange(shape[0], dtype=np.float32) / np.float32(shape[0])    # Llama 3.1's: 1 to 8
        grow = {"factor_long": np.float32(40.0) ** i, "factor_short": np.float32(1.0) + np.float32(0.1) * i,
                "factor_llama3": np.minimum(np.float32(8.0), np.float32(1.0) + np.float32(12.0) * i * i)}[kind]
        return (grow * (np.float32(1.0) + np.float32(0.05) * np.abs(x))).astype(np.float32)
    scale = {"embd": spec.embd_std, "out": spec.out_std, "bias": spec.bias_std, "sink": 1.0,
             "proj": spec.proj_gain / np.sqrt(shape[-1]), "router": spec.router_gain / np.sqrt(shape[-1])}[kind]
    if name.endswith(("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")):
        scale *= spec.resid_gain
    x *= np.float32(scale)
    return x


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even, as ggml_fp32_to_bf16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)


def stays_f32(name: str, shape: tuple[int, ...], ftype: str) -> bool:
    """1-D tensors, biases (gpt-oss's experts' are 2-D) and the expert router stay F32 in every variant, as
    llama.cpp's converter writes them."""
    return len(shape) == 1 or ftype == "F32" or name.endswith(("ffn_gate_inp.weight", ".bias"))


def encode(x: np.ndarray, ftype: str, name: str = "") -> tuple[np.ndarray, object]:
    """(array to write, raw_dtype) for one tensor in a float variant (see stays_f32)."""
    import gguf
    if stays_f32(name, x.shape, ftype):
        return x.astype(np.float32, copy=False), None
    if ftype == "F16":
        return x.astype(np.float16), None
    return to_bf16_bits(x), gguf.GGMLQuantizationType.BF16


# ---------------------------------------------------------------------------------------------
# float models

@functools.lru_cache(maxsize=4)
def _vocab_kv(vocab_file: Path) -> tuple:
    kv, _ = read_gguf_header(vocab_file)
    return tuple((k, v) for k, v in kv.items() if k.startswith("tokenizer."))


def _add_kv(writer, key: str, vt: int, val, st) -> None:
    """Write one key as read_gguf_header gives it (raw bytes for strings, the same value types)."""
    import gguf
    VT = gguf.GGUFValueType
    if vt == VT.ARRAY:
        writer.add_key_value(key, val if st == VT.STRING else val.tolist(), VT.ARRAY, sub_type=VT(st))
    else:
        writer.add_key_value(key, val, VT(vt))


def _copy_vocab(writer, vocab_file: Path) -> int:
    """Copy every tokenizer.* key from a vocab GGUF; returns n_vocab."""
    for key, (vt, val, st) in _vocab_kv(vocab_file):
        _add_kv(writer, key, vt, val, st)
    tokens = dict(_vocab_kv(vocab_file)).get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{vocab_file} has no tokenizer.ggml.tokens")
    return len(tokens[1])


def write_published(w, tmp: Path, out: Path) -> Path:
    """Write a GGUFWriter holding its tensors in memory to tmp and publish it as out (_publish); tmp is
    removed whatever happens."""
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        _publish(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _publish(tmp: Path, dst: Path) -> None:
    """Give a finished build (tmp) its name dst, unless a concurrent build (another pytest-xdist worker)
    published it first: then that file stays, as another process may have it open (a replaced file
    would read as changed on disk), and ours is dropped with tmp by the caller. Builds are deterministic."""
    try:
        os.link(tmp, dst)
    except FileExistsError:
        pass
    except OSError:                 # a file system without hard links: no-replace is then best effort
        if not dst.exists():
            os.replace(tmp, dst)


def add_hparams(w, spec: Spec) -> None:
    """spec's hyperparameters as `{arch}.*` keys of GGUFWriter w (the order the oracle files were written in)."""
    A = spec.arch
    for key, val in (("context_length", spec.n_ctx), ("embedding_length", spec.n_embd), ("block_count", spec.n_layer),
                     ("feed_forward_length", spec.n_ff), ("attention.head_count", spec.n_head),
                     ("attention.head_count_kv", spec.n_head_kv), ("attention.key_length", spec.head_dim),
                     ("attention.value_length", spec.head_dim)):
        w.add_uint32(f"{A}.{key}", val)
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", spec.eps)
    w.add_float32(f"{A}.rope.freq_base", spec.rope_base)
    w.add_uint32(f"{A}.rope.dimension_count", spec.n_rot or spec.head_dim)
    for key, value in [(f"rope.scaling.{k}", v) for k, v in spec.rope_scaling] + list(spec.extra_kv):
        add = w.add_string if isinstance(value, str) else w.add_float32 if isinstance(value, float) else w.add_uint32
        add(f"{A}.{key}", value)
    if spec.n_expert:
        w.add_uint32(f"{A}.expert_count", spec.n_expert)
        w.add_uint32(f"{A}.expert_used_count", spec.n_expert_used)
        if spec.arch != "llama":              # Mixtral's experts are feed_forward_length wide
            w.add_uint32(f"{A}.expert_feed_forward_length", spec.n_ff_exp)
        if spec.n_ff_shexp:
            w.add_uint32(f"{A}.expert_shared_feed_forward_length", spec.n_ff_shexp)


def write_float_model(spec: Spec, ftype: str, out: Path, vocab_dir: str | None = None) -> Path:
    """Stream a float (F32/F16/BF16) model to `out` one tensor at a time (bounded memory)."""
    import gguf
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, spec.arch)
    w.add_name(model_id(spec, ftype))
    w.add_description(f"ramforge synthetic random-weight test model, seed {spec.seed}")
    A = spec.arch
    add_hparams(w, spec)
    w.add_file_type(FILE_TYPE[ftype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_vocab = _copy_vocab(w, vocab_path(spec.vocab, vocab_dir))
    w.add_uint32(f"{A}.vocab_size", n_vocab)

    plan = tensor_plan(spec, n_vocab)
    f32 = np.dtype(np.float32)
    for name, shape, _ in plan:
        n = int(np.prod(shape))
        if stays_f32(name, shape, ftype):
            w.add_tensor_info(name, shape, f32, 4 * n)
        elif ftype == "F16":
            w.add_tensor_info(name, shape, np.dtype(np.float16), 2 * n)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.uint16), 2 * n, raw_dtype=gguf.GGMLQuantizationType.BF16)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name, shape, kind in plan:
            data, _ = encode(tensor_values(spec, name, shape, kind), ftype, name)
            w.write_tensor_data(data)
            del data
        w.close()
        _publish(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# ---------------------------------------------------------------------------------------------
# quantization (llama.cpp) and the expected per-tensor types

def require_llama_cpp(what: str):
    lc = llama_cpp_or_none()
    if lc is None:
        raise RuntimeError(
            f"{what} needs llama.cpp's quantizer: `pip install llama-cpp-python==0.3.36` "
            "(or use a float type F32/F16/BF16, which needs only gguf)")
    return lc


@contextlib.contextmanager
def _stderr_filtered():
    """Send fd 2 to a temp file during a C call, then re-emit the warning/error lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            for line in f.read().decode(errors="replace").splitlines():
                if any(w in line.lower() for w in ("warn", "error", "fail", "fallback")):
                    print(line, file=sys.stderr)


def quantize(src: Path, dst: Path, qtype: str, nthread: int = 2) -> Path:
    lc = require_llama_cpp(f"quantizing {src.name} to {qtype}")
    params = lc.llama_model_quantize_default_params()
    params.ftype = getattr(lc, f"LLAMA_FTYPE_MOSTLY_{qtype}")
    params.nthread = nthread
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        with _stderr_filtered():   # llama.cpp logs every tensor; keep only warnings/errors
            rc = lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({src.name} -> {qtype}) failed with {rc}")
        _publish(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


# ---------------------------------------------------------------------------------------------
# low-bit types: ggml_quantize_chunk with a synthetic importance matrix

def lowbit_type(name: str, shape: tuple[int, ...], qtype: str) -> str:
    """The ggml type a tensor of numpy `shape` gets in a LOWBIT_TYPES model: F32 as the F16 model
    keeps it (norms, biases, router); every other matrix (token_embd and output too) qtype when its
    rows are whole blocks, else LOWBIT_FALLBACK."""
    import gguf
    if stays_f32(name, shape, "F16"):
        return "F32"
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0]
    return qtype if shape[-1] % block == 0 else LOWBIT_FALLBACK


def write_lowbit_model(src: Path, out: Path, qtype: str) -> Path:
    """Rewrite the F16 model `src` as `out` in `qtype` (one of LOWBIT_TYPES): same KVs (but
    general.file_type), tensors in the same order, each matrix quantized by ggml's own quantizer with
    the importance vector 1 + 0.5*|N(0,1)| seeded by the tensor's name (ggml_quant.importance)."""
    import gguf

    from tools.ggml_quant import importance, quantize_rows
    require_llama_cpp(f"writing {out.name}")
    QT = gguf.GGMLQuantizationType
    kv, _ = read_gguf_header(src)
    reader = gguf.GGUFReader(src)
    arch = kv["general.architecture"][1].decode()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, arch)
    for key, (vt, val, st) in kv.items():
        if key == "general.architecture":            # the writer's first key already
            continue
        _add_kv(w, key, vt, LOWBIT_FILE_TYPE[qtype] if key == "general.file_type" else val, st)
    try:
        for t in reader.tensors:
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))   # numpy order [.., rows, cols]
            x = np.asarray(t.data).reshape(shape)
            ty = lowbit_type(t.name, shape, qtype)
            if ty == "F32":
                w.add_tensor(t.name, np.ascontiguousarray(x, np.float32))
                continue
            rows = x.reshape(-1, shape[-1]).astype(np.float32)
            q = quantize_rows(rows, int(QT[ty]), importance(stable_seed("imatrix", t.name), shape[-1]))
            w.add_tensor(t.name, q.reshape(*shape[:-1], q.shape[-1]), raw_dtype=QT[ty])
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return write_published(w, tmp, out)


_BASE = {"Q2_K": "Q2_K", "Q3_K_M": "Q3_K", "Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K"}
_BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "IQ4_NL": 32}


def expected_types(spec: Spec, qtype: str, n_vocab: int) -> dict[str, str]:
    """Per-tensor ggml types llama.cpp's quantizer (llama-quant.cpp, 0.3.36) picks for our specs:
    no imatrix, not a 70B, no tensor-type overrides; n_gqa >= 4 (llama-1b) lifts attn_v in Q2_K and
    IQ4_NL / IQ4_XS. The expert router stays as written
    (F32); expert and shared-expert tensors take their role's rule (ffn_down*: the down rules, by the
    layer in the name); 8 experts (Mixtral's count) lift attn_k / attn_v to Q8_0 and attn_output to Q5_K.
    LOWBIT_TYPES follow write_lowbit_model's own rule (lowbit_type)."""
    if qtype in LOWBIT_TYPES:
        return {name: lowbit_type(name, shape, qtype) for name, shape, _ in tensor_plan(spec, n_vocab)}
    if qtype == "MXFP4_MOE":             # gpt-oss's release layout: experts MXFP4, every other matrix Q8_0
        return {name: "F32" if stays_f32(name, shape, "F16") else "MXFP4" if len(shape) == 3 else "Q8_0"
                for name, shape, _ in tensor_plan(spec, n_vocab)}
    base = _BASE.get(qtype, qtype)
    n = spec.n_layer
    more = lambda i: i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # use_more_bits
    eight = spec.n_expert == 8
    gqa4 = spec.n_head >= 4 * spec.n_head_kv               # llama.cpp's n_gqa() >= 4
    out = {}
    for name, shape, kind in tensor_plan(spec, n_vocab):
        if stays_f32(name, shape, "F16"):
            out[name] = "F32"
            continue
        role = name.split(".")[-2]
        i = int(name.split(".")[1]) if name.startswith("blk.") else -1
        t = base
        if kind == "out" or (kind == "embd" and spec.tied):
            t = "Q8_0" if shape[-1] % _BLOCK.get(base, 256) else ("Q6_K" if base != "Q8_0" else "Q8_0")
        elif role in ("attn_v", "attn_qkv"):         # llama-quant.cpp's attn-v-like tensors
            t = {"Q2_K": "Q4_K" if gqa4 else "Q3_K", "Q3_K_M": "Q5_K" if i < 2 else "Q4_K"}.get(qtype, base)
            if qtype in ("IQ4_NL", "IQ4_XS") and gqa4:
                t = "Q5_K"
            if qtype in ("Q4_K_M", "Q5_K_M") and more(i):
                t = "Q6_K"
            t = "Q8_0" if eight else t
        elif role == "attn_k" and eight:
            t = "Q8_0"
        elif role.startswith("ffn_down"):
            if qtype == "Q2_K":
                t = "Q3_K"
            elif qtype == "Q3_K_M":
                t = "Q5_K" if i < n // 16 else "Q4_K"
            elif qtype in ("Q4_K_M", "Q5_K_M") and more(i):
                t = "Q6_K"
            elif qtype in ("IQ4_NL", "IQ4_XS") and i < n // 8:
                t = "Q5_K"
        elif role == "attn_output":
            if eight:
                t = "Q5_K" if qtype in ("Q2_K", "Q3_K_M", "IQ4_NL", "Q4_K_M", "IQ4_XS") else base
            else:
                t = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(qtype, base)
        out[name] = t
    return out


def file_tensor_types(path: Path) -> dict[str, str]:
    import gguf
    return {name: gguf.GGMLQuantizationType(ty).name for name, _, ty, _ in read_gguf_header(path)[1]}


def type_summary(types: dict[str, str]) -> str:
    """Compact 'role: type per layer' summary, e.g. 'ffn_down=Q4_K,Q4_K,Q6_K'."""
    roles: dict[str, list[str]] = defaultdict(list)
    for name, t in types.items():
        key = name.rsplit(".", 1)[0].split(".", 2)[-1] if name.startswith("blk.") else name.rsplit(".", 1)[0]
        key += ".bias" if name.endswith(".bias") else ""
        roles[key].append(t)
    return " ".join(f"{k}={','.join(v) if len(set(v)) > 1 else v[0]}" for k, v in roles.items()
                    if not (k.endswith("norm") or k.endswith(".bias")))


# ---------------------------------------------------------------------------------------------
# cached builds

_verified: set[Path] = set()


def _recorded_sha(mid: str) -> str | None:
    p = ORACLE_DIR / f"{mid}.json"
    if p.is_file():
        return json.loads(p.read_text())["model"]["sha256"]
    return None


def build(spec: Spec, qtype: str, out_dir: Path | None = None, vocab_dir: str | None = None,
          nthread: int = 2, keep_f16: bool = True, verbose: bool = True) -> Path:
    """Build (or reuse) one model file; quantized types go through the F16 model."""
    out_dir = Path(out_dir) if out_dir else models_dir()
    path = out_dir / f"{model_id(spec, qtype)}.gguf"
    if path.is_file():
        return path
    t0 = time.perf_counter()
    if qtype in FLOAT_TYPES:
        write_float_model(spec, qtype, path, vocab_dir)
    elif qtype in QUANT_TYPES + LOWBIT_TYPES:
        require_llama_cpp(f"building {path.name}")
        f16 = out_dir / f"{model_id(spec, 'F16')}.gguf"
        had_f16 = f16.is_file()
        build(spec, "F16", out_dir, vocab_dir, nthread, verbose=verbose)
        try:
            if qtype in LOWBIT_TYPES:
                write_lowbit_model(f16, path, qtype)
            else:
                quantize(f16, path, qtype, nthread)
        finally:
            if not keep_f16 and not had_f16:
                f16.unlink(missing_ok=True)
        got = file_tensor_types(path)
        n_vocab = next(ne[1] for name, ne, _, _ in read_gguf_header(path)[1] if name == "token_embd.weight")
        want = expected_types(spec, qtype, n_vocab)
        if got != want:
            diff = {k: (want.get(k), got.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
            print(f"WARNING {path.name}: tensor types differ from expectation (want, got): {diff}",
                  file=sys.stderr)
    else:
        raise ValueError(f"unknown type {qtype!r}; one of {ALL_TYPES}")
    if verbose:
        print(f"built {path.name}: {path.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr)
    return path


def reproducible_here(spec: Spec) -> bool:
    """Whether this host builds spec's files as the oracle's recording host (AVX-512) did. LongRoPE's
    long factors are numpy float32 powers, which numpy computes with its AVX-512 (SVML) code where the
    CPU has it and otherwise rounds differently in some elements (seen on an AVX2-only AMD EPYC:
    phi3-longrope, -short and -mini4 F16 files with other sha256s)."""
    if not spec.rope_factors:
        return True
    try:
        from numpy._core._multiarray_umath import __cpu_features__  # noqa: PLC0415
    except ImportError:                        # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__  # noqa: PLC0415
    return bool(__cpu_features__.get("AVX512_SKX"))


def ensure_model(arch: str, qtype: str, *, verify: bool = True) -> Path:
    """Path of the cached synthetic `arch` model (llama/qwen2/qwen3) of type `qtype`, built on demand.
    With verify, the file's sha256 must equal the one in tests/fixtures/oracle/<id>.json (if any),
    so oracle comparisons never run against a drifted model (where reproducible_here: elsewhere the
    oracle tests skip the model's records)."""
    if arch not in SPECS:
        raise ValueError(f"unknown arch {arch!r}; one of {sorted(SPECS)}")
    qtype = qtype.upper()
    spec = SPECS[arch]
    path = build(spec, qtype, verbose=False)
    if verify and path not in _verified and reproducible_here(spec):
        want = _recorded_sha(model_id(spec, qtype))
        if want is not None and sha256_file(path) != want:
            raise RuntimeError(
                f"{path} does not match the sha256 recorded in {ORACLE_DIR}/{model_id(spec, qtype)}.json; "
                "delete it to rebuild, or re-record the oracle if the generator changed on purpose")
        _verified.add(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", default=list(SPECS), choices=list(SPECS))
    ap.add_argument("--types", nargs="+", default=list(ALL_TYPES), type=str.upper)
    ap.add_argument("--preset", choices=list(PRESETS), help="a big model instead of the tiny archs")
    ap.add_argument("--out", type=Path, help="output dir (default: <fixtures cache>/models)")
    ap.add_argument("--vocab-dir", help="dir with ggml-vocab-*.gguf (default $RAMFORGE_VOCAB_DIR or <cache>/vocab)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-f16", action="store_true", help="keep a preset's F16 intermediate")
    ap.add_argument("--force", action="store_true", help="rebuild files that already exist")
    a = ap.parse_args(argv)
    bad = [t for t in a.types if t not in ALL_TYPES]
    if bad:
        ap.error(f"unknown types {bad}; choose from {ALL_TYPES}")
    specs = [PRESETS[a.preset]] if a.preset else [SPECS[x] for x in a.arch]
    out_dir = a.out or models_dir()
    for spec in specs:
        f16 = out_dir / f"{model_id(spec, 'F16')}.gguf"
        # a preset's F16 (GBs) is made once for all its types, then deleted unless asked for or already there
        drop = a.preset and not (a.keep_f16 or "F16" in a.types or f16.is_file())
        if a.force:
            for t in a.types + ["F16"]:
                (out_dir / f"{model_id(spec, t)}.gguf").unlink(missing_ok=True)
        try:
            for t in a.types:
                p = build(spec, t, out_dir, a.vocab_dir, a.threads)
                print(f"{p.name:32s} {p.stat().st_size / 2**20:9.2f} MiB  sha256 {sha256_file(p)}", flush=True)
                print(f"    {type_summary(file_tensor_types(p))}", flush=True)
        finally:
            if drop:
                f16.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
