"""Record llama.cpp's log-probabilities (llama-cpp-python 0.3.36) for ramforge's
logprobs: tests/fixtures/logprobs/<model-id>.json.

    python tools/record_logprobs.py            # gemma3-270m-q4_k_m and llama-tiny-f16

Per model and prompt, greedy (temperature 0): the completion llama-cpp-python's `create_completion(
logprobs=5)` returns (OpenAI's legacy `logprobs` shape: tokens, text_offset, token_logprobs,
top_logprobs), its streamed chunks, and for each generated position the 20 best token ids with the
log of the probability llama-server reports (`get_token_probabilities`: softmax of the raw logits),
computed here in float64 from llama.cpp's logits rows as llama-server gets them (a context without
logits_all: the prompt's last row alone), as an independent reference. The completion needs
`logits_all=True`, which rounds the prompt's last row as a batch of outputs.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import REPO_ROOT, sha256_file  # noqa: E402
from tools.record_oracle import GEMMA_ID, GEMMA_PROMPTS, SYNTH_PROMPTS, dumps, model_table  # noqa: E402

OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "logprobs"
MODELS = (GEMMA_ID, "llama-tiny-f16")
PROMPTS = {GEMMA_ID: [p for p in GEMMA_PROMPTS if p[0] in ("prose", "chinese", "emoji", "chat")],
           "llama-tiny-f16": SYNTH_PROMPTS}
N_CTX, N_GEN, N_LEGACY, N_TOP = 512, 10, 5, 20


def server_top(row, n: int) -> list[list]:
    """[id, log p] of the n best, p = softmax(row) in float64 (llama-server's `probs` before sampling)."""
    import numpy as np

    x = np.asarray(row, dtype=np.float64)
    lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
    order = sorted(range(x.size), key=lambda i: -x[i])[:n]
    return [[int(i), float(lp[i])] for i in order]


def server_rows(srv, prompt_ids: list[int], ids: list[int]):
    """The logits rows as llama-server computes them: the prompt with one output row, then one
    token per decode (logits_all changes the prompt's last row in the last bits)."""
    import llama_cpp
    import numpy as np

    def last():
        ptr = llama_cpp.llama_get_logits_ith(srv._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(srv.n_vocab(),)).copy()

    srv.reset()
    srv.eval(prompt_ids)
    rows = [last()]
    for t in ids[:-1]:
        srv.eval([t])
        rows.append(last())
    return rows


def plain(x):
    """numpy scalars (llama-cpp-python returns some logprobs as np.float32) made JSON floats."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return float(x) if hasattr(x, "dtype") else x


def record_model(mid: str) -> dict:
    import llama_cpp

    path = Path(model_table()[mid]["path"]())
    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2, n_threads_batch=2,
                          logits_all=True, verbose=False)
    srv = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2, n_threads_batch=2,
                          verbose=False)
    rec = {"format": 1, "model": {"id": mid, "file": path.name, "sha256": sha256_file(path), "n_vocab": llm.n_vocab()},
           "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX, "n_gen": N_GEN,
                      "legacy_logprobs": N_LEGACY, "top": N_TOP, "recorder": "python tools/record_logprobs.py"},
           "prompts": []}
    for name, text, special in PROMPTS[mid]:
        kw = dict(max_tokens=N_GEN, temperature=0.0, logprobs=N_LEGACY, seed=1)
        llm.reset()
        out = llm.create_completion(text, **kw)
        prompt_ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        n_prompt = out["usage"]["prompt_tokens"]
        ids = [int(t) for t in llm._input_ids[n_prompt:]]
        scores = llm.scores
        if len(ids) < out["usage"]["completion_tokens"]:        # the last pick is never evaluated
            ids.append(int(scores[n_prompt - 1 + len(ids)].argmax()))
        top = [server_top(row, N_TOP) for row in server_rows(srv, prompt_ids, ids)]
        llm.reset()
        chunks = [c["choices"][0] for c in llm.create_completion(text, stream=True, **kw)]
        rec["prompts"].append({"name": name, "text": text, "prompt_tokens": prompt_ids, "tokens": ids,
                               "completion": plain(out["choices"][0]), "stream": plain(chunks), "server_top": top})
    llm.close()
    srv.close()
    return rec


def main() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for mid in MODELS:
        rec = record_model(mid)
        (OUT_DIR / f"{mid}.json").write_text(dumps(rec) + "\n")
        print(f"{mid}: {len(rec['prompts'])} prompts")


if __name__ == "__main__":
    main()
