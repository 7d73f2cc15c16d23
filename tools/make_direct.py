"""Write full-size quantized GGUF models directly: random quants with sane block scales, a real
vocabulary, real shapes; no F16 pass (tools/make_models.py quantizes through one, which for a 30B
model means ~60 GB of F16 and an hour of llama.cpp's quantizer on 2 cores).

    python tools/make_direct.py qwen3moe-30b-a3b                  # 48 layers, Q4_K_M, ~18.6 GB
    python tools/make_direct.py qwen3moe-30b-a3b --layers 6       # the first 6 layers' shape
    python tools/make_direct.py gpt-oss-20b                       # MXFP4 experts, Q8_0 elsewhere
    python tools/make_direct.py llama-3.1-8b --out /big/disk/x.gguf
    python tools/make_direct.py qwen3moe-30b-a3b --layers 2 --shape n_embd=256 n_ff_exp=256 n_expert=8
    python tools/make_direct.py qwen3moe-30b-a3b --layers 6 --skew qwen3-30b-a3b   # ...-6l-skew-Q4_K_M.gguf

Each tensor takes the ggml type llama.cpp's quantizer (llama-quant.cpp, 0.3.36) would give it in
that file (make_models.expected_types: e.g. Q4_K_M's Q6_K attn_v / ffn_down on the use_more_bits
layers of the written block count, output Q6_K, the router and norms F32). A quantized tensor's
blocks are random bytes from SFC64 in 64 MiB chunks, whose scale fields are then overwritten from a
per-tensor table of valid scales chosen so the dequantized weights are zero-mean with make_models'
std (1/sqrt(fan_in), embeddings 4/sqrt(n_embd), x4 on what writes the residual in qwen3): Q4_K with
dmin = 7.5 d and min = scale per sub-block (w = d*sc*(q - 7.5)), Q5_K likewise, Q6_K with signed scales, Q8_0 with
no -128, MXFP4 with E8M0 exponents around the std. F32 tensors are make_models.tensor_values
(norms ~1 +- 0.1, router, biases, sinks); Llama 3.1's rope_freqs are its real factors.

--skew PROFILE (tools/skew_router.py) then rewrites each layer's router so that routing on ordinary
text has a real model's published expert popularity and token-to-token reuse: the model runs one
teacher-forced prefill of a calibration text, each layer's router fitted to that layer's hidden states
just before it routes them, and the routers are written into the file in place.

The header is gguf-py's GGUFWriter; tensor data streams in chunks, written to a temp file beside the
output (renamed when done), each 512 MiB flushed and dropped from the page cache, so neither memory
nor disk ever holds more than the file. A vocabulary shorter than the shape's (gpt-oss's 201088 on
the qwen2 vocab) is padded with unused tokens.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import read_gguf_header, stable_seed, vocab_dir  # noqa: E402
from tools.make_models import (  # noqa: E402
    SPECS, Spec, _add_kv, add_hparams, expected_types, tensor_plan, tensor_values,
)
from tools.skew_router import SKEWS  # noqa: E402

CHUNK = 64 << 20          # bytes of blocks generated and written at a time
FLUSH = 512 << 20         # fdatasync + drop from the page cache every this many bytes
FILE_TYPE = {"Q4_K_M": 15, "Q6_K": 18, "Q8_0": 7, "MXFP4_MOE": 38}     # llama_ftype
VOCAB_FILES = {"qwen2": "ggml-vocab-qwen2.gguf", "llama-bpe": "ggml-vocab-llama-bpe.gguf",
               "llama-spm": "ggml-vocab-llama-spm.gguf"}
TOKEN_UNUSED = 5          # llama_token_type of the padding tokens


@dataclass(frozen=True)
class Preset:
    spec: Spec
    qtype: str
    n_vocab: int              # the real model's; a shorter vocabulary is padded to it
    note: str


def _spec(base: str, name: str, vocab: str, **kw) -> Spec:
    std = 4.0 / math.sqrt(kw["n_embd"])
    return dataclasses.replace(SPECS[base], name=name, vocab=vocab, embd_std=std, out_std=std, **kw)


PRESETS = {
    # Qwen/Qwen3-30B-A3B's config.json: untied, 48 layers, 32/4 heads of 128, 128 experts (8 used) of 768
    "qwen3moe-30b-a3b": Preset(
        _spec("qwen3moe", "30b-a3b", "qwen2", n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128,
              n_ff=6144, n_expert=128, n_expert_used=8, n_ff_exp=768, n_ctx=40960, tied=False),
        "Q4_K_M", 151936, "Qwen3-30B-A3B's shape"),
    # openai/gpt-oss-20b's config.json: 24 layers, 64/8 heads of 64, 32 experts (4 used) of 2880, sliding
    # window 128 on even layers, YaRN x32 over 4096; vocab 201088 (o200k_harmony: not among llama.cpp's
    # vocab files, so qwen2's, padded)
    "gpt-oss-20b": Preset(
        _spec("gpt-oss", "20b", "qwen2", n_embd=2880, n_layer=24, n_head=64, n_head_kv=8, head_dim=64,
              n_ff=2880, n_expert=32, n_expert_used=4, n_ff_exp=2880, n_ctx=131072,
              extra_kv=(("attention.sliding_window", 128),)),
        "MXFP4_MOE", 201088, "gpt-oss-20b's shape"),
    # meta-llama/Llama-3.1-8B: 32 layers, 32/8 heads of 128, FFN 14336, rope base 5e5 with rope_freqs
    "llama-3.1-8b": Preset(
        _spec("llama", "3.1-8b", "llama-bpe", n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, head_dim=128,
              n_ff=14336, n_ctx=131072, rope_base=500000.0, eps=1e-5, rope_freqs=True),
        "Q4_K_M", 128256, "Llama-3.1-8B's shape"),
}


# ---------------------------------------------------------------------------------------------
# block formats: random bytes, then valid scale fields from a per-tensor table

@dataclass(frozen=True)
class Block:
    elems: int                # weights per block
    nbytes: int               # bytes per block


BLOCKS = {"Q4_K": Block(256, 144), "Q5_K": Block(256, 176), "Q6_K": Block(256, 210), "Q8_0": Block(32, 34), "MXFP4": Block(32, 17)}
NIBBLE_STD = math.sqrt((16 ** 2 - 1) / 12)                 # uniform 0..15 (Q4_K's q - 7.5)
Q5_STD = math.sqrt((32 ** 2 - 1) / 12)                     # uniform 0..31 (Q5_K's q - 15.5)
Q6_STD = math.sqrt((64 ** 2 - 1) / 12 + 0.25)              # uniform 0..63, minus 32 (rms, mean -0.5)
Q8_STD = math.sqrt((256 ** 2 - 1) / 12)                    # uniform int8 (-128 folded to -127: ~same)
MXFP4_RMS = math.sqrt(2 * (1 + 4 + 9 + 16 + 36 + 64 + 144) / 16) * 0.5   # kvalues_mxfp4, times E8M0_HALF


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(len(x), 2)


def _pack_k4_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """ggml's 12-byte 6-bit scale/min packing of Q4_K / Q5_K (get_scale_min_k4's inverse); (T, 8) -> (T, 12)."""
    q = np.zeros((len(sc), 12), np.uint8)
    q[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    q[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    q[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return q


def scale_table(ggml_type: str, std: float, rng: np.random.Generator) -> tuple[slice, np.ndarray]:
    """(the block's byte span holding its scales, a table of 256 valid contents for it). Every entry
    gives zero-mean weights of rms ~std, with a +-20 % spread of the block scale across entries."""
    jitter = 2.0 ** rng.uniform(-0.3, 0.3, 256)
    if ggml_type in ("Q4_K", "Q5_K"):      # min = scale, dmin = d * the mean quant: zero mean
        sc = rng.integers(24, 64, (256, 8)).astype(np.uint8)
        rms = np.sqrt((sc.astype(np.float64) ** 2).mean(1))
        q_std, q_mean = (NIBBLE_STD, 7.5) if ggml_type == "Q4_K" else (Q5_STD, 15.5)
        d = std * jitter / (rms * q_std)
        return slice(0, 16), np.concatenate([_f16_bytes(d), _f16_bytes(q_mean * d), _pack_k4_scales(sc, sc)], 1)
    if ggml_type == "Q6_K":
        sc = rng.integers(32, 128, (256, 16)) * rng.choice([-1, 1], (256, 16))
        rms = np.sqrt((sc.astype(np.float64) ** 2).mean(1))
        d = std * jitter / (rms * Q6_STD)
        return slice(192, 210), np.concatenate([sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], 1)
    if ggml_type == "Q8_0":
        return slice(0, 2), _f16_bytes(std * jitter / Q8_STD)
    if ggml_type == "MXFP4":
        e = np.round(127 + np.log2(std * jitter / MXFP4_RMS))
        return slice(0, 1), e.astype(np.uint8).reshape(256, 1)
    raise ValueError(f"no direct writer for {ggml_type}; one of {sorted(BLOCKS)}")


def fill_blocks(raw: np.ndarray, ggml_type: str, span: slice, table: np.ndarray) -> None:
    """Overwrite each block's scale span of random bytes `raw` (n, nbytes) with a table entry chosen by
    a byte of that same span (so no quant byte decides its own block's scale)."""
    raw[:, span] = table[raw[:, span.start]]
    if ggml_type == "Q8_0":                                  # the quantizer's range is +-127
        q = raw[:, 2:]
        q[q == 0x80] = 0x81


# ---------------------------------------------------------------------------------------------
# values and types

def target_std(spec: Spec, name: str, shape: tuple[int, ...], kind: str) -> float:
    """make_models.tensor_values' std for a matrix."""
    s = {"embd": spec.embd_std, "out": spec.out_std, "proj": spec.proj_gain / math.sqrt(shape[-1]),
         "router": spec.router_gain / math.sqrt(shape[-1])}[kind]
    if name.endswith(("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")):
        s *= spec.resid_gain
    return s


def llama3_rope_freqs(spec: Spec, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                      orig: int = 8192) -> np.ndarray:
    """Llama 3.1's rope_freqs as convert_hf_to_gguf.py writes them (rope_scaling rope_type llama3)."""
    dim = spec.n_rot or spec.head_dim
    freqs = 1.0 / spec.rope_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    smooth = (orig / wavelen - low) / (high - low)
    f = np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor,
                                                      1.0 / ((1 - smooth) / factor + smooth)))
    return f.astype(np.float32)


def f32_values(spec: Spec, name: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "factor_llama3":
        return llama3_rope_freqs(spec)
    return np.ascontiguousarray(tensor_values(spec, name, shape, kind), np.float32)


def tensor_types(spec: Spec, qtype: str, n_vocab: int) -> dict[str, str]:
    types = expected_types(spec, qtype, n_vocab)
    bad = {n: t for n, t in types.items() if t != "F32" and t not in BLOCKS}
    if bad:
        raise ValueError(f"{qtype} on this shape needs types without a direct writer: {sorted(set(bad.values()))} "
                         f"(e.g. {next(iter(bad))}); have {sorted(BLOCKS)}")
    return types


# ---------------------------------------------------------------------------------------------
# the file

def resolve(preset: str, layers: int | None = None, shape: dict | None = None) -> Preset:
    p = PRESETS[preset]
    kw = dict(shape or {})
    if layers is not None:
        kw["n_layer"] = layers
    bad = [k for k in kw if k not in {f.name for f in dataclasses.fields(Spec)}]
    if bad:
        raise ValueError(f"unknown shape fields {bad}; Spec has {[f.name for f in dataclasses.fields(Spec)]}")
    if kw:
        name = p.spec.name + (f"-{kw['n_layer']}l" if "n_layer" in kw else "") + ("-small" if set(kw) - {"n_layer"} else "")
        if "n_embd" in kw:                   # make_models' embedding std, 4/sqrt(n_embd)
            kw.setdefault("embd_std", 4.0 / math.sqrt(kw["n_embd"]))
            kw.setdefault("out_std", kw["embd_std"])
        p = dataclasses.replace(p, spec=dataclasses.replace(p.spec, name=name, **kw))
    return p


def default_name(p: Preset, skew: str | None = None) -> str:
    return f"{p.spec.arch}-{p.spec.name}{'-skew' if skew else ''}-{p.qtype}.gguf"


def _vocab_kv(vocab: str, n_vocab: int) -> list[tuple[str, tuple]]:
    """The vocab GGUF's tokenizer.* keys, its token list padded to n_vocab with unused tokens."""
    kv, _ = read_gguf_header(vocab_dir() / VOCAB_FILES[vocab])
    out = [(k, v) for k, v in kv.items() if k.startswith("tokenizer.")]
    n = len(kv["tokenizer.ggml.tokens"][1])
    if n > n_vocab:
        raise ValueError(f"vocab {vocab} has {n} tokens, more than the shape's {n_vocab}")
    if n < n_vocab:
        pad = [f"<|unused_{i}|>".encode() for i in range(n, n_vocab)]
        fix = {"tokenizer.ggml.tokens": lambda v: (v[0], list(v[1]) + pad, v[2]),
               "tokenizer.ggml.token_type": lambda v: (v[0], np.concatenate(
                   [v[1], np.full(n_vocab - n, TOKEN_UNUSED, v[1].dtype)]), v[2]),
               "tokenizer.ggml.scores": lambda v: (v[0], np.concatenate(
                   [v[1], np.zeros(n_vocab - n, v[1].dtype)]), v[2])}
        out = [(k, fix[k](v) if k in fix else v) for k, v in out]
    return out


def _metadata(w, p: Preset) -> None:
    import gguf
    s, A = p.spec, p.spec.arch
    w.add_name(f"ramforge direct {s.arch}-{s.name} {p.qtype}")
    w.add_description(f"ramforge synthetic random-quant model ({p.note}; tools/make_direct.py, seed {s.seed})")
    add_hparams(w, s)
    w.add_file_type(FILE_TYPE[p.qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, (vt, val, st) in _vocab_kv(s.vocab, p.n_vocab):
        _add_kv(w, key, vt, val, st)
    w.add_uint32(f"{A}.vocab_size", p.n_vocab)


def _drop(fd: int, upto: int) -> None:
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, upto, os.POSIX_FADV_DONTNEED)


def write_direct(p: Preset, out: Path, progress: bool = True) -> Path:
    """Write preset p to out (replacing it); returns out."""
    import gguf

    spec = p.spec
    types = tensor_types(spec, p.qtype, p.n_vocab)
    plan = tensor_plan(spec, p.n_vocab)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    QT = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(tmp, spec.arch)
    _metadata(w, p)
    total = 0
    for name, shape, _ in plan:
        t = types[name]
        if t == "F32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * math.prod(shape))
            total += 4 * math.prod(shape)
            continue
        b = BLOCKS[t]
        if shape[-1] % b.elems:
            raise ValueError(f"{name} {shape}: rows of {shape[-1]} are not whole {t} blocks of {b.elems}")
        row = shape[-1] // b.elems * b.nbytes
        w.add_tensor_info(name, (*shape[:-1], row), np.dtype(np.uint8), math.prod(shape[:-1]) * row, raw_dtype=QT[t])
        total += math.prod(shape[:-1]) * row
    t0, done, flushed = time.perf_counter(), 0, 0
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        f = w.fout[0]
        fd = f.fileno()
        for name, shape, kind in plan:
            w.write_padding(f, f.tell())
            w.tensors[0].pop(name)               # the writer's record of what is still to write
            t = types[name]
            if t == "F32":
                x = f32_values(spec, name, shape, kind)
                f.write(x.tobytes())
                n = x.nbytes
            else:
                n = _write_quant(f, spec, name, shape, kind, t)
            w.write_padding(f, n)
            done += n
            if done - flushed >= FLUSH:
                f.flush()
                _drop(fd, f.tell())
                flushed = done
                if progress:
                    el = time.perf_counter() - t0
                    print(f"\r{done / 1e9:6.2f}/{total / 1e9:.2f} GB  {done / el / 1e9:.2f} GB/s", end="",
                          file=sys.stderr, flush=True)
        f.flush()
        _drop(fd, f.tell())
        w.close()
        os.replace(tmp, out)
    finally:
        w.close()
        tmp.unlink(missing_ok=True)
    if progress:
        el = time.perf_counter() - t0
        print(f"\rwrote {out}: {out.stat().st_size / 1e9:.2f} GB in {el:.0f} s ({done / el / 1e9:.2f} GB/s)",
              file=sys.stderr, flush=True)
    return out


def _write_quant(f, spec: Spec, name: str, shape: tuple[int, ...], kind: str, t: str) -> int:
    b = BLOCKS[t]
    n_blocks = math.prod(shape) // b.elems
    gen = np.random.SFC64(stable_seed(spec.seed, "direct", name))
    span, table = scale_table(t, target_std(spec, name, shape, kind), np.random.Generator(gen))
    per = max(1, CHUNK // b.nbytes)
    for lo in range(0, n_blocks, per):
        k = min(per, n_blocks - lo)
        raw = gen.random_raw(-(-k * b.nbytes // 8)).view(np.uint8)[:k * b.nbytes].reshape(k, b.nbytes)
        fill_blocks(raw, t, span, table)
        f.write(memoryview(raw).cast("B"))
    return n_blocks * b.nbytes


def write_skewed(p: Preset, out: Path, profile, progress: bool = True) -> dict:
    """Write preset p to out with its routers skew-routed by profile (tools/skew_router.SKEWS);
    returns each layer's fit."""
    if not p.spec.n_expert or p.spec.arch != "qwen3moe":
        raise ValueError(f"--skew needs a qwen3moe preset (a router without bias); {p.spec.arch} {p.spec.name}")
    p = dataclasses.replace(p, note=f"{p.note}; skew-routed as {profile.name}: {profile.source}")
    out = Path(out)
    tmp = write_direct(p, out.with_name(f".{out.name}.{os.getpid()}.skew"), progress)
    try:
        fits = calibrate_routers(p.spec, tmp, profile, progress)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return fits


CALIBRATION_TOKENS = 1024       # the calibration texts run as one pass of at most this many tokens


def calibrate_routers(spec: Spec, path: Path, profile, progress: bool = True) -> dict:
    """Fit each layer's router to its hidden states in one prefill of the calibration text (each
    layer's router set just before it routes), then write the routers into the file at path."""
    from ramforge.engine.engine import Engine
    from ramforge.gguf.reader import GGUFFile
    from ramforge.models import moe
    from tools.skew_router import CALIBRATION_TEXTS, skew_router

    routers, fits, ffn, segments = {}, {}, moe.ffn, []

    def fitted(m, s, il, L, xb, x, batch=None):
        if il not in routers:
            t = L.ffn_gate_inp
            name = f"blk.{il}.ffn_gate_inp.weight"
            W0 = t.data.view(np.float32).reshape(t.dims[1], t.dims[0])
            rng = np.random.Generator(np.random.PCG64(stable_seed(spec.seed, "skew", profile.name, name)))
            W, fits[il] = skew_router(xb, W0, spec.n_expert_used, profile, rng, segments)
            if t.data.flags.writeable:
                W0[...] = W
            else:
                L.ffn_gate_inp = dataclasses.replace(t, data=W.view(np.uint8).reshape(t.data.shape))
            routers[name] = W
            if progress:
                f = fits[il]
                print(f"layer {il}: g {f['g']:.2f} lam {f['lam']:.2f} -> top 40 % {f['top40']:.1%} "
                      f"(want {profile.top40:.1%}), reuse {f['reuse']:.1%} (want {profile.reuse:.1%})",
                      file=sys.stderr, flush=True)
        ffn(m, s, il, L, xb, x, batch=batch)

    moe.ffn = fitted
    try:
        with Engine.load(str(path), n_ctx=CALIBRATION_TOKENS, batch=CALIBRATION_TOKENS) as e:
            ids = []
            for i, text in enumerate(CALIBRATION_TEXTS):
                more = e.tokenizer.encode(text, add_special=i == 0)
                segments.append(slice(len(ids), len(ids) + len(more)))
                ids += more
            if len(ids) > e.plan.batch:
                raise RuntimeError(f"the calibration texts are {len(ids)} tokens, a pass {e.plan.batch}")
            e.eval(ids, outputs_all=True)                      # one pass, the last layer on every row too
    finally:
        moe.ffn = ffn
    if len(routers) != spec.n_layer:
        raise RuntimeError(f"calibrated {len(routers)} of {spec.n_layer} layers' routers")
    with GGUFFile(path) as f:
        at = {name: f.tensors[name].offset for name in routers}
    with open(path, "r+b") as fh:
        for name, W in routers.items():
            fh.seek(at[name])
            fh.write(np.ascontiguousarray(W, np.float32).tobytes())
        fh.flush()
        os.fsync(fh.fileno())
    return fits


def _shape_arg(s: str) -> tuple[str, object]:
    k, _, v = s.partition("=")
    if not v:
        raise argparse.ArgumentTypeError(f"{s!r}: expected FIELD=VALUE, e.g. n_embd=256")
    return k, float(v) if "." in v else int(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", choices=list(PRESETS))
    ap.add_argument("--layers", type=int, help="write the first N layers only (the types as llama.cpp's "
                                                "quantizer picks them for an N-layer file)")
    ap.add_argument("--shape", nargs="+", type=_shape_arg, default=[], metavar="FIELD=VALUE",
                    help="override make_models.Spec fields (smaller test shapes), e.g. n_embd=256 n_expert=8")
    ap.add_argument("--out", type=Path, help="output file (default: /work/models/<arch>-<name>-<type>.gguf)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing file")
    ap.add_argument("--skew", choices=list(SKEWS), help="routers fitted to this real model's published expert "
                                                        "popularity and token-to-token reuse (tools/skew_router.py)")
    a = ap.parse_args(argv)
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be >= 1")
    try:
        p = resolve(a.preset, a.layers, dict(a.shape))
        types = tensor_types(p.spec, p.qtype, p.n_vocab)
    except ValueError as ex:
        ap.error(str(ex))
    out = a.out or Path("/work/models") / default_name(p, a.skew)
    if out.exists() and not a.force:
        print(f"{out} exists (--force to rewrite)", file=sys.stderr)
        return 0
    need = sum(math.prod(s) // BLOCKS[types[n]].elems * BLOCKS[types[n]].nbytes if types[n] != "F32"
               else 4 * math.prod(s) for n, s, _ in tensor_plan(p.spec, p.n_vocab))
    free = os.statvfs(out.parent if out.parent.exists() else Path(out.anchor)).f_bavail * \
        os.statvfs(out.parent if out.parent.exists() else Path(out.anchor)).f_frsize
    if need > free:
        print(f"{out}: needs {need / 1e9:.2f} GB, {free / 1e9:.2f} GB free", file=sys.stderr)
        return 1
    print(f"{default_name(p, a.skew)}: {p.spec.n_layer} layers, {need / 1e9:.2f} GB -> {out}", file=sys.stderr)
    if a.skew:
        try:
            write_skewed(p, out, SKEWS[a.skew])
        except ValueError as ex:
            ap.error(str(ex))
    else:
        write_direct(p, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
