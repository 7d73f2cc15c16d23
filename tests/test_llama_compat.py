"""ramforge.Llama: llama-cpp-python's class. The README examples of llama-cpp-python run with only the import
changed; the oracle tests compare with the real llama_cpp.Llama where the output is deterministic (greedy,
or seeded: llama-cpp-python derives each completion's seed from the Llama's)."""
import inspect
import warnings

import numpy as np
import pytest

from ramforge import Llama
from ramforge.errors import ContextLengthExceeded, InvalidArgument, Unsupported
from ramforge.generation.fim import NoFIMTokens

N_CTX = 256
PLANETS = "Q: Name the planets in the solar system? A: "


@pytest.fixture(scope="module")
def llm():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = Llama(model_path="default", n_gpu_layers=-1, seed=1337, n_ctx=N_CTX, verbose=False)
    yield m
    m.close()


@pytest.fixture(scope="module")
def oracle(default_model):
    llama_cpp = pytest.importorskip("llama_cpp")
    m = llama_cpp.Llama(model_path=str(default_model), n_gpu_layers=-1, seed=1337, n_ctx=N_CTX, verbose=False)
    yield m
    m.close()


def test_keywords_warn_once_and_refuse_what_changes_output():
    with pytest.warns(UserWarning, match="main_gpu, n_gpu_layers") as got:
        m = Llama(model_path="default", n_ctx=64, n_gpu_layers=-1, main_gpu=1, use_mlock=False, verbose=False)
    assert len([w for w in got if "ramforge.Llama ignores" in str(w.message)]) == 1   # one warning, all names
    assert m.n_ctx() == 64
    m.close()
    with pytest.raises(Unsupported, match="lora_path"):
        Llama(model_path="default", lora_path="x.bin", verbose=False)
    with pytest.raises(InvalidArgument, match="n_ctx"):
        Llama(model_path="default", n_ctx=-1, verbose=False)
    with pytest.raises(Unsupported, match="chat_format='llama-2'"):
        Llama(model_path="default", n_ctx=64, chat_format="llama-2", verbose=False)


def test_model_facts(llm):
    assert (llm.n_ctx(), llm.n_vocab(), llm.n_embd()) == (N_CTX, 262144, 640)
    assert (llm.token_bos(), llm.token_eos(), llm.token_nl()) == (2, 1, 248)
    md = llm.metadata
    assert md["general.architecture"] == "gemma3" and md["gemma3.context_length"] == "32768"
    assert md["gemma3.rope.freq_base"] == "1000000.000000" and md["tokenizer.ggml.add_bos_token"] == "true"
    assert "tokenizer.ggml.tokens" not in md            # arrays are left out, as llama.cpp's API does


def test_tokenize_detokenize(llm):
    ids = llm.tokenize(b"Hello world")
    assert ids == [2, 9259, 1902] and llm.tokenize(b"Hello world", add_bos=False) == [9259, 1902]
    assert llm.detokenize(ids) == b"Hello world"        # the leading BOS's space rule
    assert llm.detokenize([1902], prev_tokens=[9259]) == b" world"
    assert llm.tokenize(b"<start_of_turn>", add_bos=False, special=True) == [105]
    with pytest.raises(InvalidArgument):
        llm.detokenize([10 ** 9])


def test_create_completion_contract(llm):
    out = llm(PLANETS, max_tokens=32, stop=["Q:", "\n"], echo=True)
    text = out["choices"][0]["text"]
    assert text.startswith(PLANETS) and out["object"] == "text_completion" and out["model"] == "default"
    assert out["usage"]["prompt_tokens"] == len(llm.tokenize(PLANETS.encode()))
    g = llm("The capital of France is", max_tokens=8, temperature=0)
    again = llm("The capital of France is", max_tokens=8, temperature=0)
    assert g["choices"][0]["text"] == again["choices"][0]["text"] and g["choices"][0]["finish_reason"] == "length"
    assert g["choices"][0]["text"].startswith(" ")       # the first token's space kept, as llama-cpp-python
    chunks = list(llm("The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == g["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    with pytest.raises(ContextLengthExceeded):
        llm("word " * 400, max_tokens=4)
    with pytest.raises(InvalidArgument, match="logits_all"):
        llm("x", max_tokens=2, logprobs=2)


def test_processors_and_stopping_criteria(llm):
    first = llm("The capital of France is", max_tokens=1, temperature=0)["choices"][0]["text"]
    banned = llm.tokenize(first.encode(), add_bos=False)[0]

    def ban(input_ids, scores):
        assert input_ids[-1] == llm.tokenize(b"The capital of France is")[-1]
        scores[banned] = -np.inf
        return scores
    other = llm("The capital of France is", max_tokens=1, temperature=0, logits_processor=[ban])
    assert other["choices"][0]["text"] != first
    n_prompt = len(llm.tokenize(b"The capital of France is"))

    def two_generated(input_ids, logits):      # called with the evaluated tokens and the sampled token's logits
        assert logits.shape == (llm.n_vocab(),)
        return len(input_ids) >= n_prompt + 2
    out = llm("The capital of France is", max_tokens=10, temperature=0, stopping_criteria=two_generated)
    assert out["usage"]["completion_tokens"] == 2 and out["choices"][0]["finish_reason"] == "stop"


def test_generate_eval_sample_reset(llm):
    tokens = llm.tokenize(b"The capital of France is")
    gen = llm.generate(tokens, temp=0)
    got = [next(gen) for _ in range(4)]
    gen.close()
    llm.reset()
    llm.eval(tokens)
    assert llm.n_tokens == len(tokens) and llm.sample(temp=0) == got[0]
    state = llm.save_state()
    assert state.n_tokens == len(tokens) and state.input_ids.tolist() == tokens
    llm.reset()
    llm.load_state(state)
    assert llm.n_tokens == len(tokens)


def test_refusals(llm):
    with pytest.raises(NoFIMTokens, match="fill-in-the-middle"):
        llm("def f(", suffix="\n    return x", max_tokens=4)
    with pytest.raises(InvalidArgument, match="embedding=True"):     # as llama-cpp-python asks
        llm.embed("hello")
    with pytest.raises(InvalidArgument, match="embedding=True"):
        llm.create_embedding("hello")


def test_from_pretrained_loads_what_the_hub_download_gives(monkeypatch, default_model):
    from ramforge.store import hf

    asked = []
    monkeypatch.setattr(hf, "download", lambda repo, filename: asked.append((repo, filename)) or default_model)
    with Llama.from_pretrained("ggml-org/gemma-3-270m-GGUF", "*Q4_K_M.gguf", n_ctx=64, verbose=False) as m:
        assert m.n_ctx() == 64 and m.n_vocab() == 262144
    assert asked == [("ggml-org/gemma-3-270m-GGUF", "*Q4_K_M.gguf")]


def test_embed_on_a_bert_model_matches_model_embed():
    from ramforge.generation.api import Model
    from tools.record_embeddings import model_file

    path = str(model_file("bert-tiny-f32"))
    with Llama(path, embedding=True, n_threads=1, verbose=False) as llm, Model(path, n_threads=1) as m:
        assert llm.embed("hello world") == m.embed("hello world")
        out = llm.create_embedding(["a", "b c"])
        assert [d["index"] for d in out["data"]] == [0, 1] and out["usage"]["prompt_tokens"] > 0


def test_chat_defaults_are_llama_cpp_pythons():
    sig = inspect.signature(Llama.create_chat_completion).parameters
    assert sig["temperature"].default == 0.2 and sig["top_p"].default == 0.95 and sig["max_tokens"].default is None
    comp = inspect.signature(Llama.create_completion).parameters
    assert comp["temperature"].default == 0.8 and comp["max_tokens"].default == 16


def test_chat_completion_shape(llm):
    llm.chat_format = "chatml"
    try:
        out = llm.create_chat_completion(messages=[{"role": "user", "content": "Say hi."}], max_tokens=6, seed=1)
    finally:
        llm.chat_format = None
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["role"] == "assistant"
    assert out["id"].startswith("chatcmpl-") and out["usage"]["completion_tokens"] <= 6


# ---- against llama-cpp-python ------------------------------------------------------------------------

def fresh(*models):
    """The same starting point on both sides: llama-cpp-python's seed moves on with every completion, and
    what its KV cache holds (which prefix a prompt reuses, so how its tokens were batched) depends on
    the calls before."""
    for m in models:
        m.reset()
        m.set_seed(1337)


@pytest.mark.oracle
def test_readme_completion_matches_llama_cpp(llm, oracle):
    for kwargs in ({"max_tokens": 32, "stop": ["Q:", "\n"], "echo": True},          # the README's, seeded
                   {"max_tokens": 24, "temperature": 0},
                   {"max_tokens": 16, "seed": 7, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.2},
                   {"max_tokens": 16, "mirostat_mode": 2, "seed": 3},
                   {"max_tokens": 16, "repeat_penalty": 1.3, "temperature": 0}):
        fresh(llm, oracle)
        ours, theirs = llm(PLANETS, **kwargs), oracle(PLANETS, **kwargs)
        assert ours["choices"][0]["text"] == theirs["choices"][0]["text"], kwargs
        assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"], kwargs
        assert ours["usage"] == theirs["usage"], kwargs


@pytest.mark.oracle
def test_readme_stream_and_chat_match_llama_cpp(llm, oracle):
    fresh(llm, oracle)
    ours = [c["choices"][0]["text"] for c in llm(PLANETS, max_tokens=20, temperature=0, stream=True)]
    theirs = [c["choices"][0]["text"] for c in oracle(PLANETS, max_tokens=20, temperature=0, stream=True)]
    assert ours == theirs
    messages = [{"role": "system", "content": "You are an assistant who perfectly describes images."},
                {"role": "user", "content": "Describe this image in detail please."}]
    llm.chat_format, saved = "chatml", oracle.chat_format
    oracle.chat_format = "chatml"
    try:
        fresh(llm, oracle)
        a = llm.create_chat_completion(messages=messages, max_tokens=24, seed=5)
        b = oracle.create_chat_completion(messages=messages, max_tokens=24, seed=5)
    finally:
        llm.chat_format, oracle.chat_format = None, saved
    assert a["choices"][0]["message"] == b["choices"][0]["message"] and a["usage"] == b["usage"]


@pytest.mark.oracle
def test_generate_tokens_match_llama_cpp(llm, oracle):
    toks = llm.tokenize(b"Hello, world!")
    assert toks == oracle.tokenize(b"Hello, world!")
    ours, theirs = [], []
    fresh(llm, oracle)
    for out, m in ((ours, llm), (theirs, oracle)):
        for t in m.generate(toks, top_k=40, top_p=0.95, temp=0, repeat_penalty=1.0):
            out.append(t)
            if len(out) == 12:
                break
    assert ours == theirs
