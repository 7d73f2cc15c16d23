"""The library API: llama-cpp-python-shaped Model on the budgeted engine."""
from __future__ import annotations

import numpy as np
import pytest

import ramforge
from ramforge.errors import RamforgeError
from tools.oracle_report import records


@pytest.fixture(scope="module")
def model():
    with ramforge.Model("default", ram="400M", n_ctx=512) as m:
        yield m
    assert m.budget.current == 0


def _prose():
    """The gemma3 oracle prompt whose 32-token greedy continuation has no near-tie (every top1-top2 gap
    exceeds 0.1 std in llama.cpp's record), so kernel-level rounding cannot flip it."""
    rec = next(r for r in records() if r["model"]["source"] != "synthetic")
    return next(p for p in rec["prompts"] if p["name"] == "whitespace")


def test_completion_is_openai_shaped_and_matches_oracle(model):
    pr = _prose()
    out = model(pr["text"], max_tokens=32, temperature=0)
    assert out["object"] == "text_completion" and out["choices"][0]["text"] == pr["gen_text"]
    assert out["usage"] == {"prompt_tokens": len(pr["tokens"]), "completion_tokens": 32,
                            "total_tokens": len(pr["tokens"]) + 32}
    assert out["choices"][0]["finish_reason"] == "length"
    chunks = list(model.create_completion(pr["text"], max_tokens=32, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == pr["gen_text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_every_gemma_oracle_prompt_answers_as_llama_cpp():
    # the library, with llama.cpp's batch settings of the record: the same 32 greedy tokens as
    # llama.cpp for every recorded prompt (prose, code, numbers, five scripts, chat, 619 tokens)
    rec = next(r for r in records() if r["model"]["source"] != "synthetic")
    with ramforge.Model("default", ram="600M", n_ctx=rec["oracle"]["n_ctx"],
                        n_ubatch=rec["oracle"]["n_ubatch"]) as m:
        for pr in rec["prompts"]:
            ids = pr["tokens_special"] if pr["special"] else pr["tokens"]
            r = m.generate(ids, len(pr["gen_tokens"]), temperature=0)
            assert r.tokens == pr["gen_tokens"], pr["name"]
    with pytest.raises(RamforgeError, match="n_ubatch"):
        ramforge.Model("default", n_ubatch=0)


def test_generate_response_and_prefix_reuse(model):
    pr = _prose()
    r = model.generate(pr["tokens"], 8, temperature=0)
    assert r.done and r.tokens == pr["gen_tokens"][:8] and r.completion_tokens == 8
    again = model.generate(pr["tokens"] + r.tokens, 4, temperature=0)
    assert again.prompt_tokens == len(pr["tokens"]) + 8 and again.prompt_eval_tokens <= 2
    assert again.tokens == pr["gen_tokens"][8:12]


def test_stop_strings_and_tokenize(model):
    pr = _prose()
    stop = pr["gen_text"][10:14]
    out = model(pr["text"], max_tokens=32, temperature=0, stop=[stop])
    assert out["choices"][0]["text"] == pr["gen_text"][:pr["gen_text"].index(stop)]
    assert out["choices"][0]["finish_reason"] == "stop"
    assert model.tokenize(pr["text"]) == pr["tokens"]
    assert model.tokenize(pr["text"].encode()) == pr["tokens"]
    assert model.detokenize(pr["gen_tokens"]).decode() == pr["gen_text"]


def test_a_reused_prefix_does_not_change_the_arithmetic(model):
    # the prompt's tail after a cached prefix (here BOS, left by another prompt) is computed as the
    # rows of the batch the whole prompt would make: the logits equal a fresh evaluation's, bit for bit
    eng = model.engine
    long_ids = model.tokenize("Tell me about the history of printing presses in Europe, in detail.")
    ids = model.tokenize("Name three colours, and say which of them you like best.")
    eng.reset()
    fresh = eng.eval(ids)[-1].copy()
    for other in (long_ids, ids[:3] + [ids[3] + 1]):      # shared prefixes: BOS; the first 3 tokens
        eng.reset()
        eng.eval(other)
        list(eng.generate(ids, 1, reuse_prefix=True))
        assert 0 < eng.timings.prompt_tokens < len(ids)
        assert np.array_equal(eng.state.prompt_logits.view(np.uint32), fresh.view(np.uint32))
    list(eng.generate(ids, 1, reuse_prefix=True))          # the same prompt again: its kept logits
    assert eng.timings.prompt_tokens == 0
    assert np.array_equal(eng.state.prompt_logits.view(np.uint32), fresh.view(np.uint32))


def test_sampling_is_seeded_and_validated(model):
    a = model("Once upon a time", max_tokens=10, temperature=1.0, seed=11)
    b = model("Once upon a time", max_tokens=10, temperature=1.0, seed=11)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    with pytest.raises(RamforgeError, match="top_p"):
        model("x", max_tokens=2, top_p=2.0)
    with pytest.raises(RamforgeError, match="stop"):
        model("x", max_tokens=2, stop=[""])


def test_chat_completion_renders_the_gemma_template(model):
    rec = next(r for r in records() if r["model"]["source"] != "synthetic")
    pr = next(p for p in rec["prompts"] if p["name"] == "chat")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert model.render_chat(msgs) == pr["text"]
    assert model.tokenize(model.render_chat(msgs), special=True) == pr["tokens_special"]
    out = model.create_chat_completion(msgs, max_tokens=6, temperature=0)
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["role"] == "assistant"
    assert model.tokenize(out["choices"][0]["message"]["content"], add_bos=False) == pr["gen_tokens"][:6]
    chunks = list(model.create_chat_completion(msgs, max_tokens=6, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == out["choices"][0]["message"]["content"]
