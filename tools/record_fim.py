"""Record llama.cpp's fill-in-the-middle (llama-server's /infill) on synthetic models with FIM tokens:
tests/fixtures/fim/<model-id>.json.

    python tools/record_fim.py                 # qwen2-fim-f16 and llama-fim-f16

The models (built on demand into the fixture cache, `ensure_fim_model`) are tiny random-weight ones
(tools/make_models.py) whose vocabularies gain FIM tokens:
- qwen2-fim: Qwen2.5-Coder's layout, <|fim_prefix|> 151659 ... <|file_sep|> 151664 over qwen2's
  padding tokens, with the `tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id` keys (repo-level
  extra context: FIM_REP and FIM_SEP);
- llama-fim: CodeLlama's, ▁<PRE> ▁<SUF> ▁<MID> ▁<EOT> appended to the llama SPM vocabulary as user-defined
  tokens, no keys: llama.cpp recognises them by their text (BOS first, the "--- snippet ---" separator).

Per case the record holds the prompt llama-server's `format_prompt_infill` (tools/server/server-common.cpp
of llama.cpp as llama-cpp-python 0.3.36 vendors it, transcribed in `server_infill_prompt` over llama.cpp's
own tokenizer and FIM ids) builds, and the greedy completion llama.cpp computes after it (its tokens, and
its text as llama-cpp-python's create_completion detokenizes it). llama-cpp-python's own
`create_completion(suffix=)` is no reference: 0.3.36 puts token id 0 where the FIM tokens belong
(`prefix_token_id: int = 0  # ... # TODO: Fix`); `lcpp_suffix_prompt` records what it builds.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import REPO_ROOT, VOCAB_FILES, cache_dir, read_gguf_header, sha256_file, vocab_path  # noqa: E402
from tools.make_models import Spec, _add_kv, build, model_id  # noqa: E402
from tools.record_oracle import dumps  # noqa: E402

OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "fim"
N_BATCH, N_GEN = 2048, 12          # llama-server's default --batch-size; tokens generated per case
SPECS = {
    "qwen2-fim": Spec("qwen2", "qwen2", name="fim", n_ctx=4096, rope_base=1e6, eps=1e-6, qkv_bias=True),
    "llama-fim": Spec("llama", "llama-spm", name="fim", n_ctx=4096),
}
QWEN_FIM = {"pre": (151659, "<|fim_prefix|>"), "mid": (151660, "<|fim_middle|>"), "suf": (151661, "<|fim_suffix|>"),
            "pad": (151662, "<|fim_pad|>"), "rep": (151663, "<|repo_name|>"), "sep": (151664, "<|file_sep|>")}
CODELLAMA_FIM = ("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>")
USER_DEFINED, CONTROL = 4, 3

CODE_PRE = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"
CODE_SUF = "\n\nprint(fibonacci(10))\n"
EXTRA = [{"filename": "utils/math.py", "text": "def add(a, b):\n    return a + b\n"},
         {"text": "import os\n"}]
# name, endpoint kind, prefix, suffix, input_extra, prompt, n_ctx, spm
#   "library": Llama(suffix=), /api/generate and /v1/completions with `suffix`: llama-server's infill where the
#   context leaves no room for the repo-level extra context (n_ctx <= n_batch + 2 n_predict), no prompt;
#   "infill": /infill on a server with that context
CASES = [
    ("code", "library", CODE_PRE, CODE_SUF, [], "", 512, False),
    ("prose", "library", "The capital of France is", ", a city on the Seine.", [], "", 512, False),
    ("spaces", "library", "  x = [1, 2,", " ]\n", [], "", 512, False),
    ("unicode", "library", "naïve café: ", " — 東京", [], "", 512, False),
    ("long-prefix", "library", "x = 1\n" * 800, "y = 2\n" * 400, [], "", 512, False),
    ("small-ctx", "infill", CODE_PRE, CODE_SUF, EXTRA, "", 512, False),
    ("extra", "infill", CODE_PRE, CODE_SUF, EXTRA, "    ", 4096, False),
    ("extra-spm", "infill", CODE_PRE, CODE_SUF, EXTRA, "", 4096, True),
]


def fim_vocab_dir() -> Path:
    return cache_dir() / "vocab-fim"


def write_fim_vocab(base: str) -> Path:
    """A copy of llama.cpp's vocab GGUF `base` (its tokenizer.* keys) with FIM tokens (module doc)."""
    import gguf

    out = fim_vocab_dir() / VOCAB_FILES[base]
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    kv, _ = read_gguf_header(vocab_path(base))
    kv = {k: v for k, v in kv.items() if k.startswith("tokenizer.")}
    vt, tokens, st = kv["tokenizer.ggml.tokens"]
    tokens = [bytes(t) for t in tokens]
    types = np.asarray(kv["tokenizer.ggml.token_type"][1], dtype=np.int32).copy()
    keys = {}
    if base == "qwen2":
        for name, (tid, text) in QWEN_FIM.items():
            tokens[tid], types[tid] = text.encode(), CONTROL
            keys[f"tokenizer.ggml.fim_{name}_token_id"] = tid
    else:
        tokens += [t.encode() for t in CODELLAMA_FIM]
        types = np.concatenate([types, np.full(len(CODELLAMA_FIM), USER_DEFINED, np.int32)])
        svt, scores, sst = kv["tokenizer.ggml.scores"]
        kv["tokenizer.ggml.scores"] = (svt, np.concatenate([np.asarray(scores, np.float32),
                                                            np.zeros(len(CODELLAMA_FIM), np.float32)]), sst)
    kv["tokenizer.ggml.tokens"] = (vt, tokens, st)
    kv["tokenizer.ggml.token_type"] = (kv["tokenizer.ggml.token_type"][0], types, kv["tokenizer.ggml.token_type"][2])
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, "llama")
    for key, (t, val, s) in kv.items():
        _add_kv(w, key, t, val, s)
    for key, tid in keys.items():
        w.add_uint32(key, tid)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def ensure_fim_model(name: str, *, verify: bool = True) -> Path:
    """The cached F16 model `name` (SPECS), built on demand; with verify its sha256 must be the record's."""
    spec = SPECS[name]
    write_fim_vocab(spec.vocab)
    path = build(spec, "F16", vocab_dir=str(fim_vocab_dir()), verbose=False)
    rec = OUT_DIR / f"{model_id(spec, 'F16')}.json"
    if verify and rec.is_file() and sha256_file(path) != json.loads(rec.read_text())["model"]["sha256"]:
        raise RuntimeError(f"{path} does not match the sha256 recorded in {rec}; delete it to rebuild, or re-record")
    return path


def server_infill_prompt(llm, prefix: str, suffix: str, extra: list[dict], prompt: list[int], *, n_ctx: int,
                         n_predict: int = -1, n_batch: int = N_BATCH, spm: bool = False) -> list[int]:
    """format_prompt_infill (llama.cpp tools/server/server-common.cpp), line for line, over llama.cpp's
    tokenizer (common_tokenize(vocab, text, add_special=false, parse_special=false)) and FIM ids."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    pre, suf, mid = (llama_cpp.llama_vocab_fim_pre(vocab), llama_cpp.llama_vocab_fim_suf(vocab),
                     llama_cpp.llama_vocab_fim_mid(vocab))
    rep, sep = llama_cpp.llama_vocab_fim_rep(vocab), llama_cpp.llama_vocab_fim_sep(vocab)
    null = -1                                                  # LLAMA_TOKEN_NULL
    assert null not in (pre, suf, mid), "the model has no FIM prefix/suffix/middle token"

    def tok(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=False, special=False) if text else []

    extra_tokens = []
    tokens_prefix, tokens_suffix = tok(prefix), tok(suffix)
    if rep != null:
        extra_tokens += [rep] + tok("myproject\n")
    for chunk in extra:
        if sep != null:
            extra_tokens += [sep] + tok(chunk.get("filename", "tmp") + "\n")
        else:
            extra_tokens += tok("\n\n--- snippet ---\n\n")
        extra_tokens += tok(chunk.get("text", ""))
    if sep != null:
        extra_tokens += [sep] + tok("filename\n")
    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, (n_batch // 4) - (2 + len(prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    tokens_prefix = tokens_prefix[len(tokens_prefix) - n_prefix_take:]
    tokens_suffix = tokens_suffix[:n_suffix_take]
    tokens_prefix = [pre] + tokens_prefix + list(prompt)
    tokens_suffix = [suf] + tokens_suffix
    embd_inp, embd_end = (tokens_suffix, tokens_prefix) if spm else (tokens_prefix, tokens_suffix)
    if llama_cpp.llama_vocab_get_add_bos(vocab):
        embd_inp = [llama_cpp.llama_vocab_bos(vocab)] + embd_inp
    embd_inp = extra_tokens[len(extra_tokens) - n_extra_take:] + embd_inp
    return embd_inp + embd_end + [mid]


def greedy(llm, prompt_ids: list[int], n: int) -> tuple[list[int], str]:
    """llama.cpp's greedy tokens after prompt_ids (to an end-of-generation token or n) and their text
    as llama-cpp-python's create_completion gives it."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    llm.reset()
    ids = []
    for t in llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True):
        if llama_cpp.llama_vocab_is_eog(vocab, t):
            ids.append(int(t))
            break
        ids.append(int(t))
        if len(ids) == n:
            break
    llm.reset()
    text = llm.create_completion(prompt_ids, max_tokens=n, temperature=0.0)["choices"][0]["text"]
    return ids, text


def lcpp_suffix_prompt(llm, prefix: str, suffix: str) -> list[int]:
    """The prompt llama-cpp-python 0.3.36's create_completion(prefix, suffix=) evaluates (token 0 for each
    FIM token): the tokens its completion reports as the prompt's."""
    llm.reset()
    out = llm.create_completion(prefix, suffix=suffix, max_tokens=1, temperature=0.0)
    return [int(t) for t in llm._input_ids[:out["usage"]["prompt_tokens"]]]


def record_model(name: str) -> dict:
    import llama_cpp

    path = ensure_fim_model(name, verify=False)
    llm = llama_cpp.Llama(str(path), n_ctx=4096, n_batch=N_BATCH, n_ubatch=512, n_threads=2, n_threads_batch=2,
                          verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    fim = {k: int(getattr(llama_cpp, f"llama_vocab_fim_{k}")(vocab)) for k in ("pre", "suf", "mid", "pad", "rep", "sep")}
    rec = {"format": 1, "model": {"id": path.stem, "file": path.name, "sha256": sha256_file(path),
                                  "n_vocab": llm.n_vocab()},
           "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_batch": N_BATCH, "n_gen": N_GEN,
                      "fim_tokens": fim, "recorder": "python tools/record_fim.py"},
           "cases": []}
    for cname, kind, prefix, suffix, extra, prompt, n_ctx, spm in CASES:
        prompt_ids = llm.tokenize(prompt.encode(), add_bos=False, special=True) if prompt else []
        ids = server_infill_prompt(llm, prefix, suffix, extra, prompt_ids, n_ctx=n_ctx, spm=spm)
        tokens, text = greedy(llm, ids, N_GEN)
        case = {"name": cname, "kind": kind, "prefix": prefix, "suffix": suffix, "input_extra": extra,
                "prompt": prompt, "n_ctx": n_ctx, "spm": spm, "prompt_tokens": ids, "tokens": tokens, "text": text}
        if kind == "library" and len(ids) < 1024:
            case["lcpp_suffix_prompt"] = lcpp_suffix_prompt(llm, prefix, suffix)
        rec["cases"].append(case)
    llm.close()
    return rec


def main() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in SPECS:
        rec = record_model(name)
        (OUT_DIR / f"{rec['model']['id']}.json").write_text(dumps(rec) + "\n")
        print(f"{rec['model']['id']}: {len(rec['cases'])} cases, fim tokens {rec['oracle']['fim_tokens']}")


if __name__ == "__main__":
    main()
