"""Record llama.cpp's (llama-cpp-python 0.3.36) embeddings as small JSON files under
tests/fixtures/embeddings/<model-id>.json, and write the synthetic BERT models they are made on.

    python tools/record_embeddings.py                      # every model in MODELS
    python tools/record_embeddings.py bert-tiny-f16

Models: synthetic `bert` files (random weights, llama.cpp's BGE WordPiece vocabulary, written with
gguf's writer; a Q8_0 one by llama.cpp's quantizer; a reranker with a classifier head), synthetic
`nomic-bert` ones (nomic-embed-text's tensors and mean pooling, F32, F16 and Q8_0), `jina-bert-v2` ones
(jina-embeddings-v2-base-en's tensors, 12 heads of ALiBi, mean pooling; F32 with every optional tensor, F16,
Q8_0, a jina-reranker-v1 head with rank pooling, and jina-v2-code's BPE pre-tokenizer over GPT-2's
vocabulary) and causal
ones (tools/make_models.py's qwen3-tiny-f16, llama-tiny-f16 with its own output matrix, and gemma3-linear-f16:
five layers of a window of 8, one global, so packed documents cross the window); from make_models Specs (write_spec_model) a `gemma-embedding`
model (EmbeddingGemma's traits: a window of 8, dense_2/dense_3 projections) and a Qwen3-Reranker
(qwen3-rerank-f16: qwen3-tiny's weights plus the yes/no cls.output rows, labels and rerank template,
its prompts as llama-server's format_prompt_rerank builds them; both softmax outputs recorded). Per pooling type, per text: llama-cpp-python's tokens and
`Llama(embedding=True, pooling_type=p, n_ctx=512).embed(text)` (normalize=False, one text per call,
so each is a llama_decode of its own) as float32 values (shortest decimals); for rank pooling the
classifier's output. Pooling none: every token's vector, for the first two texts. Pooled types also
`batch`: `embed(TEXTS)` in one call, which llama-cpp-python packs into one llama_decode of
len(TEXTS) sequences (the arithmetic of ramforge's Embedder.embed_many; a causal model's sequences in
its unified KV cache, each token seeing its own sequence's earlier tokens); rank pooling's `batch`:
every pair in one llama_decode, pair i as sequence i.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before llama_cpp is first imported

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import ORACLE_DIR, models_dir, sha256_file, stable_seed, vocab_dir  # noqa: E402
from tools.make_models import (  # noqa: E402
    SPECS, Spec, _copy_vocab, add_hparams, encode, ensure_model, quantize, tensor_plan, tensor_values, write_published,
)
from tools.record_oracle import _cpu_name, dumps  # noqa: E402

FORMAT = 1
EMBED_DIR = ORACLE_DIR.parent / "embeddings"
N_CTX = 512
N_THREADS = 2
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.",
         "Embeddings map documents to vectors; similar meaning, nearby vectors. " * 3,
         "Äpfel und Birnen, 42 Stück!"]
QUERY = "what is a fox?"
# model id -> (how it is made, pooling types recorded)
MODELS = {
    "bert-tiny-f32": ("bert", "F32", 1, (0, 1, 2, 3)),
    "bert-tiny-f16": ("bert", "F16", 1, (0, 1, 2, 3)),
    "bert-tiny-q8_0": ("bert", "Q8_0", 1, (1, 2)),
    "bert-rank-f16": ("bert", "F16", 4, (4,)),
    "qwen3-tiny-f16": ("qwen3", "F16", None, (0, 1, 3)),
    "nomic-bert-tiny-f32": ("nomic-bert", "F32", 1, (1, 2)),
    "nomic-bert-tiny-f16": ("nomic-bert", "F16", 1, (0, 1, 2, 3)),
    "nomic-bert-tiny-q8_0": ("nomic-bert", "Q8_0", 1, (1,)),
    "gemma-embedding-tiny-f32": ("gemma-embedding", "F32", 1, (0, 1, 2, 3)),
    "gemma-embedding-tiny-f16": ("gemma-embedding", "F16", 1, (1, 3)),
    "qwen3-rerank-f16": ("qwen3-rerank", "F16", 4, (4,)),
    "jina-bert-v2-tiny-f32": ("jina-bert-v2", "F32", 1, (0, 1, 2, 3)),
    "jina-bert-v2-tiny-f16": ("jina-bert-v2", "F16", 1, (0, 1, 2, 3)),
    "jina-bert-v2-tiny-q8_0": ("jina-bert-v2", "Q8_0", 1, (1,)),
    "jina-bert-v2-rank-f16": ("jina-bert-v2", "F16", 4, (4,)),
    "jina-bert-v2-code-f16": ("jina-bert-v2", "F16", 1, (1,)),
    "llama-tiny-f16": ("llama", "F16", None, (1, 3)),
    "gemma3-linear-f16": ("gemma3-linear", "F16", None, (1, 3)),
}
ENCODERS = ("bert", "nomic-bert", "jina-bert-v2")  # written here with gguf's writer (WordPiece vocabulary)
SPEC_MODELS = ("gemma-embedding", "qwen3-rerank")  # written here from a make_models Spec (write_spec_model)
BERT_VOCAB = "ggml-vocab-bert-bge.gguf"          # llama.cpp's BGE WordPiece vocabulary (with goldens)
BERT = dict(n_embd=128, n_head=2, n_layer=2, n_ff=512, n_ctx=512, eps=1e-12)
NOMIC_ROPE_BASE = 1000.0                          # nomic-embed-text v1.5's rope_theta
# jina-bert-v2: 12 heads as jina-embeddings-v2-base (ALiBi's slopes of heads 8-11 are inexact: powf(2^-0.5, k));
# the F32 one has every optional tensor llama.cpp reads (q/k norms, attn_norm_2, ffn_up's bias), the others
# jina-embeddings-v2-base-en's tensors only
JINA = dict(n_embd=192, n_head=12, n_layer=2, n_ff=384, n_ctx=512, eps=1e-12)
JINA_ALL_TENSORS = ("jina-bert-v2-tiny-f32",)
# jina-embeddings-v2-base-code's tokenizer: BPE with pre-tokenizer jina-v2-code (GPT-2's regex; a SEP added),
# GPT-2's vocabulary standing in for jina's own
OTHER_VOCAB = {"jina-bert-v2-code-f16": ("ggml-vocab-gpt-2.gguf", "jina-v2-code")}


def f32(v) -> float:
    return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))


def write_bert(out: Path, ftype: str, pooling: int, arch: str = "bert", every_tensor: bool = False,
               vocab: tuple[str, str] | None = None) -> Path:
    """A random-weight bert model (BGE's vocabulary) with `pooling` as bert.pooling_type; pooling 4
    (rank) adds a classifier head (cls, cls.output) as BGE rerankers have. arch "nomic-bert": the
    tensors of nomic-embed-text's GGUF (gguf's MODEL_TENSORS[NOMIC_BERT]: a fused attn_qkv, SwiGLU
    ffn_gate / ffn_up / ffn_down, no biases but the LayerNorms', no position embeddings; RoPE base 1000).
    arch "jina-bert-v2": jina-embeddings-v2-base-en's tensors as llama.cpp's converter writes them (no position
    embeddings: ALiBi; ffn_up = gated_layers, gate | up, 2 * n_ff rows, no bias; ffn_down = mlp.wo with
    bias); every_tensor adds the optional ones (attn_q_norm / attn_k_norm and attn_norm_2 with biases,
    ffn_up's bias); rank pooling: jina-reranker-v1's head, cls {n_embd, 1} and its bias, no cls.output.
    vocab: (llama.cpp's vocab file, tokenizer.ggml.pre) in place of BGE's WordPiece."""
    import gguf
    nomic, jina = arch == "nomic-bert", arch == "jina-bert-v2"
    hp = JINA if jina else BERT
    d, f, L, ctx = hp["n_embd"], hp["n_ff"], hp["n_layer"], hp["n_ctx"]
    rng = np.random.default_rng(stable_seed(arch, pooling))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name(out.stem)
    for key, v in (("context_length", ctx), ("embedding_length", d), ("block_count", L), ("feed_forward_length", f),
                   ("attention.head_count", hp["n_head"]), ("pooling_type", pooling)):
        w.add_uint32(f"{arch}.{key}", v)
    w.add_float32(f"{arch}.attention.layer_norm_epsilon", hp["eps"])
    w.add_bool(f"{arch}.attention.causal", False)
    if nomic:
        w.add_float32(f"{arch}.rope.freq_base", NOMIC_ROPE_BASE)
    w.add_file_type(1 if ftype == "F16" else 0)
    vocab_file = vocab_dir() / (vocab[0] if vocab else BERT_VOCAB)
    if not vocab_file.is_file():
        from tools.fetch_vocab import fetch_vocab          # llama.cpp's vocab files, once
        fetch_vocab(vocab_dir())
    if vocab is None:
        n_vocab = _copy_vocab(w, vocab_file)
    else:
        from tools.make_models import _add_kv, _vocab_kv
        for key, (vt, val, st) in _vocab_kv(vocab_file):
            if key != "tokenizer.ggml.pre":
                _add_kv(w, key, vt, val, st)
        w.add_string("tokenizer.ggml.pre", vocab[1])
        if "tokenizer.ggml.token_type_count" not in dict(_vocab_kv(vocab_file)):
            w.add_token_type_count(2)                      # (the converter's, for a RobertaTokenizer)
        n_vocab = len(dict(_vocab_kv(vocab_file))["tokenizer.ggml.tokens"][1])

    def mat(rows, cols, std=None):
        return (rng.standard_normal((rows, cols)) * (std or 1.0 / np.sqrt(cols))).astype(np.float32)

    def vec(n, base=0.0, std=0.1):
        return (base + rng.standard_normal(n) * std).astype(np.float32)

    t = {"token_embd.weight": mat(n_vocab, d, 0.5), "token_types.weight": mat(2, d, 0.1),
         "position_embd.weight": mat(ctx, d, 0.1), "token_embd_norm.weight": vec(d, 1.0),
         "token_embd_norm.bias": vec(d)}
    if nomic or jina:
        del t["position_embd.weight"]
    for il in range(L):
        p = f"blk.{il}."
        if nomic:
            for name, (r, c) in (("attn_qkv", (3 * d, d)), ("attn_output", (d, d)), ("ffn_up", (f, d)),
                                 ("ffn_gate", (f, d)), ("ffn_down", (d, f))):
                t[p + name + ".weight"] = mat(r, c)
        elif jina:
            for name, (r, c) in (("attn_q", (d, d)), ("attn_k", (d, d)), ("attn_v", (d, d)), ("attn_output", (d, d)),
                                 ("ffn_down", (d, f))):
                t[p + name + ".weight"], t[p + name + ".bias"] = mat(r, c), vec(r)
            t[p + "ffn_up.weight"] = mat(2 * f, d)
            if every_tensor:
                t[p + "ffn_up.bias"] = vec(2 * f)
                for name in ("attn_q_norm", "attn_k_norm", "attn_norm_2"):
                    t[p + name + ".weight"], t[p + name + ".bias"] = vec(d, 1.0), vec(d)
        else:
            for name, (r, c) in (("attn_q", (d, d)), ("attn_k", (d, d)), ("attn_v", (d, d)), ("attn_output", (d, d)),
                                 ("ffn_up", (f, d)), ("ffn_down", (d, f))):
                t[p + name + ".weight"], t[p + name + ".bias"] = mat(r, c), vec(r)
        for name in ("attn_output_norm", "layer_output_norm"):
            t[p + name + ".weight"], t[p + name + ".bias"] = vec(d, 1.0), vec(d)
    if pooling == 4 and jina:
        t |= {"cls.weight": mat(1, d), "cls.bias": vec(1)}
    elif pooling == 4:
        t |= {"cls.weight": mat(d, d), "cls.bias": vec(d), "cls.output.weight": mat(1, d), "cls.output.bias": vec(1)}
    for name, a in t.items():
        half = ftype == "F16" and a.ndim == 2 and name != "token_types.weight"   # (ggml adds only an f32 row)
        w.add_tensor(name, a.astype(np.float16) if half else a)
    return write_published(w, tmp, out)


# EmbeddingGemma's traits, small: gemma3's layers (six: five sliding, one global), a window of 8 (each token
# sees 4 on either side), mean pooling, and the sentence-transformers projections (dense_2 128 -> 256,
# dense_3 256 -> 128); gemma's SPM vocabulary stands in (llama-spm)
GEMMA_EMBEDDING = Spec("gemma-embedding", "llama-spm", n_embd=128, n_layer=6, n_head=4, n_head_kv=2, head_dim=64,
                       n_ff=256, tied=True, post_norms=True, qk_norm=True, eps=1e-6, rope_base=1e6,
                       extra_kv=(("attention.sliding_window", 8), ("rope.freq_base_swa", 10000.0),
                                 ("pooling_type", 1), ("dense_2_feat_in", 128), ("dense_2_feat_out", 256),
                                 ("dense_3_feat_in", 256), ("dense_3_feat_out", 128)))
# Qwen3-Reranker as llama.cpp's converter writes it: rank pooling, labels yes/no, cls.output = the lm head's
# rows of "yes" and "no" (tied: token_embd's), and the "rerank" chat template
QWEN3_RERANK = dataclasses.replace(SPECS["qwen3"], name="rerank", extra_kv=(("pooling_type", 4),))
RERANK_TEMPLATE = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
                   "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                   "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer "
                   "the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def write_spec_model(out: Path, kind: str, ftype: str) -> Path:
    """A float model of a make_models Spec with the tensors and keys of its own: gemma-embedding's dense
    projections, Qwen3-Reranker's classifier head, labels and rerank template."""
    import gguf
    from tools._fixtures import vocab_path
    spec = GEMMA_EMBEDDING if kind == "gemma-embedding" else QWEN3_RERANK
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, spec.arch)
    w.add_name(out.stem)
    add_hparams(w, spec)
    w.add_file_type(1 if ftype == "F16" else 0)
    vocab = vocab_path(spec.vocab)
    n_vocab = _copy_vocab(w, vocab)
    tensors = {name: tensor_values(spec, name, shape, k) for name, shape, k in tensor_plan(spec, n_vocab)}
    if kind == "gemma-embedding":
        rng = np.random.default_rng(stable_seed(kind, "dense"))
        tensors["dense_2.weight"] = (rng.standard_normal((256, 128)) / np.sqrt(128)).astype(np.float32)
        tensors["dense_3.weight"] = (rng.standard_normal((128, 256)) / np.sqrt(256)).astype(np.float32)
    else:
        w.add_array(f"{spec.arch}.classifier.output_labels", ["yes", "no"])
        w.add_string("tokenizer.chat_template.rerank", RERANK_TEMPLATE)
        words = [bytes(t).decode() if not isinstance(t, str) else t for t in _vocab_tokens(vocab)]
        tensors["cls.output.weight"] = tensors["token_embd.weight"][[words.index("yes"), words.index("no")]]
    for name, a in tensors.items():
        data, raw = encode(a, ftype, name)
        w.add_tensor(name, data, raw_dtype=raw)
    return write_published(w, tmp, out)


def _vocab_tokens(vocab: Path) -> list:
    from tools.make_models import _vocab_kv
    return list(dict(_vocab_kv(vocab))["tokenizer.ggml.tokens"][1])


def model_file(mid: str) -> Path:
    kind, ftype, pooling, _ = MODELS[mid]
    if kind not in ENCODERS + SPEC_MODELS:
        return ensure_model(kind, ftype)
    path = models_dir() / f"{mid}.gguf"
    if path.is_file():
        return path
    if kind in SPEC_MODELS:
        return write_spec_model(path, kind, ftype)
    if ftype in ("F32", "F16"):
        return write_bert(path, ftype, pooling, kind, every_tensor=mid in JINA_ALL_TENSORS, vocab=OTHER_VOCAB.get(mid))
    src = model_file(mid.rsplit("-", 1)[0] + "-f16")
    return quantize(src, path, ftype)


def record_model(mid: str) -> dict:
    import llama_cpp
    path = model_file(mid)
    runs = []
    for pt in MODELS[mid][3]:
        llm = llama_cpp.Llama(str(path), embedding=True, pooling_type=pt, n_ctx=N_CTX, n_batch=N_CTX,
                              n_threads=N_THREADS, verbose=False)
        items = []
        if pt == 4:
            for text in TEXTS:
                if MODELS[mid][0] == "qwen3-rerank":            # llama-server's format_prompt_rerank: the template
                    prompt = RERANK_TEMPLATE.replace("{query}", QUERY).replace("{document}", text)
                    pair = llm.tokenize(prompt.encode(), add_bos=False, special=True)
                else:
                    toks = llm.tokenize(QUERY.encode(), add_bos=False), llm.tokenize(text.encode(), add_bos=False)
                    pair = _rerank_tokens(llm, *toks)
                llm._batch.reset()                      # as Llama.embed decodes one sequence
                llm._batch.add_sequence(pair, 0, True)
                llm._ctx.kv_cache_clear()
                llm._ctx.decode(llm._batch)
                ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
                n_out = llama_cpp.llama_model_n_cls_out(llm._model.model)
                items.append({"text": text, "tokens": pair, "scores": [f32(ptr[i]) for i in range(n_out)]})
        else:
            for text in TEXTS[:2] if pt == 0 else TEXTS:      # pooling none: a vector per token, two texts
                v = np.asarray(llm.embed(text), np.float32)
                items.append({"text": text, "tokens": llm.tokenize(text.encode()),
                              "embedding": [[f32(x) for x in r] for r in v] if v.ndim == 2 else [f32(x) for x in v]})
        run = {"pooling_type": pt, "items": items}
        if pt in (1, 2, 3):
            run["batch"] = [[f32(x) for x in v] for v in np.asarray(llm.embed(TEXTS), np.float32)]
        elif pt == 4:
            run["batch"] = _rank_batch(llm, [it["tokens"] for it in items])
        runs.append(run)
        llm.close()
    return {"format": FORMAT, "model": {"id": mid, "sha256": sha256_file(path), "kind": MODELS[mid][0],
                                        "type": MODELS[mid][1]},
            "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX, "n_threads": N_THREADS,
                       "system_info": llama_cpp.llama_print_system_info().decode(), "cpu": _cpu_name()},
            "runs": runs}


def _rank_batch(llm, pairs: list[list[int]]) -> list[list[float]]:
    """The classifier's outputs of every pair decoded in one llama_decode, pair i as sequence i (as
    llama-server's /rerank batches its documents, and Llama.embed packs inputs)."""
    import llama_cpp
    llm._batch.reset()
    for i, pair in enumerate(pairs):
        llm._batch.add_sequence(pair, i, True)
    llm._ctx.kv_cache_clear()
    llm._ctx.decode(llm._batch)
    n_out = llama_cpp.llama_model_n_cls_out(llm._model.model)
    return [[f32(p[j]) for j in range(n_out)] for p in
            (llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, i) for i in range(len(pairs)))]


def _rerank_tokens(llm, q: list[int], d: list[int]) -> list[int]:
    """llama.cpp's format_rerank for a vocabulary that adds BOS and SEP (a WordPiece one): [CLS] q [SEP] d."""
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    out = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
    eos = llama_cpp.llama_vocab_eos(vocab)
    eos = eos if eos >= 0 else llama_cpp.llama_vocab_sep(vocab)
    out += q
    if llama_cpp.llama_vocab_get_add_eos(vocab):
        out.append(eos)
    if llama_cpp.llama_vocab_get_add_sep(vocab):
        out.append(llama_cpp.llama_vocab_sep(vocab))
    out += d
    if llama_cpp.llama_vocab_get_add_eos(vocab):
        out.append(eos)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help=f"model ids (default: all of {', '.join(MODELS)})")
    args = ap.parse_args(argv)
    EMBED_DIR.mkdir(parents=True, exist_ok=True)
    for mid in args.ids or MODELS:
        rec = record_model(mid)
        (EMBED_DIR / f"{mid}.json").write_text(dumps(rec) + "\n")
        print(f"{mid}: {len(rec['runs'])} pooling types")
    return 0


if __name__ == "__main__":
    sys.exit(main())
