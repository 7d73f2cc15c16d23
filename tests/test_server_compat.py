"""Compatibility with the clients of Ollama and llama-server (issue 41): the GGUF's sampling defaults,
Ollama's tolerant request models, llama-server's endpoints, fill-in-the-middle."""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.sampling.gguf_defaults import gguf_sampler_sequence, gguf_sampling_defaults, meta_text, strtof
from ramforge.sampling.params import sampler_params


# ------------------------------------------------------------------------- general.sampling.*

def test_gguf_sampling_defaults_as_llama_cpp_reads_them():
    md = {"general.sampling.top_k": 20, "general.sampling.top_p": float(np.float32(0.95)),
          "general.sampling.temp": 0.123456789,            # a float64: "%f" keeps six decimals
          "general.sampling.penalty_last_n": 40.7,         # an integer key stored as a float: strtol("40.700000")
          "general.sampling.min_p": "0.05x",               # a string: strtof reads its number
          "general.sampling.mirostat": True,               # "true": not a number, skipped
          "general.sampling.xtc_threshold": [0.1, 0.2],    # an array: skipped
          "general.sampling.penalty_repeat": "abc",        # skipped
          "general.name": "x"}
    got = gguf_sampling_defaults(md)
    assert got == {"top_k": 20, "top_p": float(np.float32(0.95)), "temperature": float(np.float32(0.123457)),
                   "repeat_last_n": 40, "min_p": float(np.float32(0.05))}
    assert sampler_params({}, got).top_k == 20          # usable as defaults beneath a request's values
    assert gguf_sampling_defaults({}) == {}


def test_gguf_sampling_int_keys_wrap_as_int32_and_floats_parse_as_strtof():
    assert gguf_sampling_defaults({"general.sampling.top_k": 2 ** 31})["top_k"] == -(2 ** 31)
    assert gguf_sampling_defaults({"general.sampling.top_k": " -3"})["top_k"] == -3
    assert strtof("0x1p-2") == 0.25 and strtof("  -inf") == float("-inf") and strtof(".5e1z") == 5.0
    assert strtof("e5") is None and strtof("") is None
    assert meta_text(np.float32(0.1)) == "0.100000" and meta_text(False) == "false"


def test_gguf_sampler_sequence_names():
    md = {"general.sampling.sequence": "penalties;Top-K;nucleus;bogus;temp"}
    assert gguf_sampler_sequence(md) == ["penalties", "top_k", "top_p", "temperature"]
    assert gguf_sampler_sequence({}) is None and gguf_sampler_sequence({"general.sampling.sequence": ""}) is None


# ------------------------------------------------------------------------- fill-in-the-middle

class _Vocab:
    def __init__(self, special):
        self.special = special


class _Tok:
    """A tokenizer of one token per character (ids = code points) with FIM ids 1001.. and BOS 1."""

    def __init__(self, rep=True, sep=True, bos=False):
        self.vocab = _Vocab({"fim_pre": 1001, "fim_suf": 1002, "fim_mid": 1003, "fim_rep": 1004 if rep else None,
                             "fim_sep": 1005 if sep else None})
        self.add_bos, self.bos_id = bos, 1

    def encode(self, text, add_special=False, parse_special=False):
        assert not add_special and not parse_special          # llama-server tokenizes the parts plainly
        return [ord(c) for c in text]


def _ids(s):
    return [ord(c) for c in s]


def test_infill_arranges_the_prompt_as_llama_server():
    from ramforge.generation.fim import infill_ids

    extra = [{"filename": "a.py", "text": "x=1"}]
    got = infill_ids(_Tok(), "def f(", "):", extra, [7], n_ctx=4096)          # room beyond a 2048 batch: extra kept
    assert got == ([1004] + _ids("myproject\n") + [1005] + _ids("a.py\n") + _ids("x=1") + [1005] + _ids("filename\n")
                   + [1001] + _ids("def f(") + [7] + [1002] + _ids("):") + [1003])
    assert infill_ids(_Tok(), "p", "s", extra, n_ctx=512) == [1001, ord("p"), 1002, ord("s"), 1003]   # no room: none
    assert infill_ids(_Tok(), "p", "s", n_ctx=512, spm=True) == [1002, ord("s"), 1001, ord("p"), 1003]
    assert infill_ids(_Tok(bos=True), "p", "s", n_ctx=512)[:2] == [1, 1001]  # BOS after the extra, before FIM_PRE
    no_sep = infill_ids(_Tok(rep=False, sep=False), "p", "s", [{"text": "t"}], n_ctx=8192)
    assert no_sep[:len(_ids("\n\n--- snippet ---\n\nt"))] == _ids("\n\n--- snippet ---\n\nt")
    long = infill_ids(_Tok(), "a" * 2000, "b" * 1000, n_ctx=512)                # 3/4 of a batch of prefix, its end
    assert long.count(ord("a")) == 1536 and long.count(ord("b")) == 510


def test_infill_without_fim_tokens_names_them():
    from ramforge.errors import InvalidArgument
    from ramforge.generation.fim import infill_ids

    tok = _Tok()
    tok.vocab.special["fim_mid"] = None
    with pytest.raises(InvalidArgument, match="middle token"):
        infill_ids(tok, "a", "b", n_ctx=512)


# ------------------------------------------------------------------------- the server

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import json  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from ramforge.server import ServerConfig, create_app  # noqa: E402
from tests.serving import serving  # noqa: E402

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def srv():
    app = create_app(ServerConfig(ram="400M", n_ctx=512, keep_alive=600, alias="my-alias"))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        yield SimpleNamespace(url=url, app=app, manager=app.state.manager,
                              http=httpx.Client(base_url=url, timeout=900))


# The JSON the Go client (api.Client, as `ollama run` uses it) sends: no omitempty on these fields.
GO_SHOW = {"model": "default", "system": "", "template": "", "verbose": False, "options": None, "name": ""}
GO_GENERATE = {"model": "default", "prompt": "Hi", "suffix": "", "system": "", "template": "", "stream": False,
               "options": {"num_predict": 2, "temperature": 0, "tfs_z": 1.0, "penalize_newline": True, "bogus": 3}}
GO_CHAT = {"model": "default", "messages": [{"role": "User", "content": "Hi", "tool_call_id": "call_1"}],
           "stream": False, "options": {"num_predict": 2, "temperature": 0}, "think": "max", "shift": True,
           "truncate": True}


def test_go_client_show_is_answered_with_capabilities_and_parameters(srv):
    r = srv.http.post("/api/show", json=GO_SHOW)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["capabilities"] == ["completion"]             # gemma-3's template: no tools, no FIM, no <think>
    lines = d["parameters"].splitlines()
    assert 'stop                           "<end_of_turn>"' in lines and 'stop                           "<eos>"' in lines
    r = srv.http.post("/api/show", json={**GO_SHOW, "model": "", "name": "default", "system": "Be brief.",
                                         "options": {"temperature": 0.5}})
    assert r.status_code == 200 and r.json()["system"] == "Be brief."
    assert "temperature                    0.5" in r.json()["parameters"]


def test_go_client_generate_and_chat(srv, caplog):
    with caplog.at_level("WARNING", logger="ramforge.server"):
        r = srv.http.post("/api/generate", json=GO_GENERATE)
    assert r.status_code == 200, r.text
    assert r.json()["done"] and r.json()["eval_count"] <= 2
    warned = " ".join(rec.getMessage() for rec in caplog.records)
    assert "bogus" in warned and "tfs_z" in warned and "penalize_newline" in warned    # logged, ignored
    r = srv.http.post("/api/chat", json=GO_CHAT)
    assert r.status_code == 200, r.text
    assert r.json()["message"]["role"] == "assistant"
    r = srv.http.post("/api/generate", json={**GO_GENERATE, "truncate": False, "shift": False, "think": "low"})
    assert r.status_code == 200, r.text


def test_ollama_values_still_refused(srv):
    for body in ({**GO_CHAT, "think": "extreme"}, {**GO_GENERATE, "options": {"num_thread": 10 ** 6}},
                 {**GO_GENERATE, "options": {"num_batch": "many"}}, {**GO_GENERATE, "unknown_field": 1},
                 {**GO_GENERATE, "template": "{{ .Prompt }}"}):
        r = srv.http.post("/api/generate" if "prompt" in body else "/api/chat", json=body)
        assert r.status_code == 400 and r.json()["error"], (body, r.text)


def test_runner_options_are_honoured(srv):
    r = srv.http.post("/api/generate", json={**GO_GENERATE, "options": {"num_predict": 1, "num_batch": 64,
                                                                          "num_thread": 1}})
    assert r.status_code == 200, r.text
    assert srv.manager.current.runner[0] == 1 and srv.manager.current.runner[2] == 64
    assert srv.manager.current.model.engine.n_threads == 1


def test_debug_render_only(srv):
    r = srv.http.post("/api/chat", json={"model": "default", "messages": HI, "_debug_render_only": True})
    assert r.status_code == 200, r.text
    assert "<start_of_turn>user\nHi" in r.json()["debug_info"]["rendered_template"]


def test_version_head_and_root(srv):
    d = srv.http.get("/api/version").json()
    major, minor, _ = (int(x) for x in d["version"].split("."))
    assert (major, minor) >= (0, 6) and d["ramforge_version"]
    for path in ("/", "/api/tags", "/api/version"):
        assert srv.http.head(path).status_code == 200, path


def test_suffix_without_fim_tokens_is_400_naming_them(srv):
    r = srv.http.post("/api/generate", json={"model": "default", "prompt": "def f(", "suffix": "):", "stream": False})
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]
    r = srv.http.post("/v1/completions", json={"model": "default", "prompt": "def f(", "suffix": "):"})
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
    r = srv.http.post("/infill", json={"input_prefix": "def f(", "input_suffix": "):"})
    assert r.status_code == 400 and "middle" in r.json()["error"]


def test_v1_single_model_leniency_alias_and_max_tokens_clamp(srv):
    names = [m["id"] for m in srv.http.get("/v1/models").json()["data"]]
    assert "my-alias" in names
    for name in ("gpt-4o", "models/gemma.gguf", "my-alias"):
        r = srv.http.post("/v1/chat/completions", json={"model": name, "messages": HI, "max_tokens": 1,
                                                        "temperature": 0})
        assert r.status_code == 200 and r.json()["model"] == name, r.text
    r = srv.http.post("/v1/completions", json={"model": "x", "prompt": "one two " * 240, "max_tokens": 8192,
                                               "temperature": 0, "logit_bias": {"1": False, "106": False}})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["choices"][0]["finish_reason"] == "length" and d["usage"]["total_tokens"] == 512


def test_reasoning_effort_and_parallel_tool_calls(srv):
    for effort in ("none", "xhigh", "minimal"):
        r = srv.http.post("/v1/chat/completions", json={"model": "default", "messages": HI, "max_tokens": 1,
                                                        "reasoning_effort": effort})
        assert r.status_code == 200, (effort, r.text)
    r = srv.http.post("/v1/chat/completions", json={"model": "default", "messages": HI, "reasoning_effort": "max"})
    assert r.status_code == 400


def test_tokenize_detokenize_apply_template(srv):
    r = srv.http.post("/tokenize", json={"content": "Hello world", "add_special": True, "with_pieces": True})
    toks = r.json()["tokens"]
    assert toks[0] == {"id": 2, "piece": "<bos>"} and "".join(t["piece"] for t in toks[1:]) == "Hello world"
    ids = [t["id"] for t in toks]
    assert srv.http.post("/tokenize", json={"content": "Hello world", "add_special": True}).json()["tokens"] == ids
    assert srv.http.post("/detokenize", json={"tokens": ids[1:]}).json()["content"] == "Hello world"
    assert srv.http.post("/detokenize", json={"tokens": [10 ** 8]}).status_code == 400
    assert srv.http.post("/tokenize", json={"content": "x" * (1 << 18 + 1)}).status_code in (400, 413)
    p = srv.http.post("/apply-template", json={"messages": HI}).json()["prompt"]
    assert p == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_props_slots_metrics_health(srv):
    d = srv.http.get("/props").json()
    assert d["total_slots"] == 1 and "<start_of_turn>" in d["chat_template"] and d["model_alias"] == "my-alias"
    assert d["default_generation_settings"]["params"]["top_k"] == 40
    slots = srv.http.get("/slots").json()
    assert slots[0]["id"] == 0 and slots[0]["is_processing"] is False
    before = srv.manager.stats.predicted_tokens
    srv.http.post("/completion", json={"prompt": "Hi", "n_predict": 2, "temperature": 0})
    text = srv.http.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("llamacpp:tokens_predicted_total"))
    assert float(line.split()[-1]) >= before + 1
    assert srv.http.get("/v1/health").json()["status"] == "ok" and srv.http.get("/health").status_code == 200


def test_native_completion_matches_v1_and_streams(srv):
    body = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0, "return_tokens": True,
            "cache_prompt": True, "unknown_thing": 1}
    d = srv.http.post("/completion", json=body).json()
    v1 = srv.http.post("/v1/completions", json={"model": "default", "prompt": body["prompt"], "max_tokens": 6,
                                                "temperature": 0}).json()
    assert d["content"] == v1["choices"][0]["text"] and len(d["tokens"]) == d["tokens_predicted"]
    assert d["stop"] is True and d["stop_type"] in ("limit", "eos") and d["id_slot"] == 0
    with srv.http.stream("POST", "/completion", json={**body, "stream": True}) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
    assert "".join(e["content"] for e in events) == d["content"] and events[-1]["stop"] is True
    assert srv.http.post("/completion", json={"prompt": "x", "samplers": ["top_k"]}).status_code == 400
    assert srv.http.post("/completion", json={"prompt": "x", "id_slot": 3}).status_code == 400


# ------------------------------------------------------------------------- the official clients

def test_python_ollama_client(srv):
    ollama = pytest.importorskip("ollama")
    c = ollama.Client(host=srv.url)
    shown = c.show("default")
    assert "completion" in shown.capabilities and "stop" in shown.parameters
    r = c.generate(model="default", prompt="Hi", options={"num_predict": 2, "temperature": 0, "tfs_z": 1.0,
                                                          "num_thread": 1})
    assert r.done and r.eval_count <= 2
    r = c.chat(model="default", messages=[{"role": "user", "content": "Hi"}], think="low",
               options={"num_predict": 2, "temperature": 0})
    assert r.message.role == "assistant"
    assert any(m.model == "default" for m in c.list().models)


_NODE = r"""
import { Ollama } from 'ollama';
const c = new Ollama({ host: process.argv[2] });
const out = {};
out.version = await c.version();
out.show = await c.show({ model: 'default' });
out.generate = await c.generate({ model: 'default', prompt: 'Hi', options: { num_predict: 2, temperature: 0 } });
out.chat = await c.chat({ model: 'default', messages: [{ role: 'user', content: 'Hi' }], think: 'low',
                          options: { num_predict: 2, temperature: 0 } });
let n = 0;
for await (const part of await c.generate({ model: 'default', prompt: 'Hi', stream: true,
                                           options: { num_predict: 3, temperature: 0 } })) { n += 1; }
out.chunks = n;
out.list = await c.list();
console.log(JSON.stringify(out));
"""


@pytest.mark.slow
def test_npm_ollama_client(srv):
    """The npm `ollama` client (installed once into the git-ignored fixture cache) against the server."""
    from tests.npm import run_node

    out = run_node(_NODE, srv.url)
    assert out["version"]["version"] == "0.12.11"
    assert "completion" in out["show"]["capabilities"]
    assert out["generate"]["done"] and out["chat"]["message"]["role"] == "assistant" and out["chunks"] >= 2
    assert any(m["name"] == "default" for m in out["list"]["models"])


# ------------------------------------------------------- a model with sampling defaults and a tool_use template

def gguf_with(src: Path, dst: Path, extra: list[tuple[str, int, object]]) -> Path:
    """A copy of the GGUF `src` with the kv pairs `extra` ((key, GGUFValueType, value)) added before its
    own: the added bytes are padded (a filler string) to the file's alignment, so the tensor data stays
    aligned and its offsets, relative to the data section, stay true."""
    import struct

    from ramforge.gguf.constants import GGUFValueType as VT
    from ramforge.gguf.reader import GGUFFile
    from tools.ggufbuild import _str, encode_value

    with GGUFFile(src) as f:
        align, data_at = f.alignment, f.data_offset
    kv = b"".join(_str(k) + struct.pack("<I", t) + encode_value(t, v) for k, t, v in extra)
    filler = len(_str("ramforge.test.pad")) + 4 + 8                 # the filler's key, type and length
    pad = -(len(kv) + filler) % align
    kv += _str("ramforge.test.pad") + struct.pack("<I", VT.STRING) + _str(" " * pad)
    raw = src.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", raw)
    dst.write_bytes(struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + len(extra) + 1) + kv + raw[24:])
    with GGUFFile(dst) as f:                                        # the tensors where they were
        assert f.data_offset == data_at + len(kv)
    return dst


TOOL_MARK = "TOOL-USE TEMPLATE for "
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """The default model with general.sampling.{temp, top_k, top_p} and both chat templates, served; each
    Model.stream call's sampler keywords are recorded."""
    from ramforge.generation import api
    from ramforge.gguf.constants import GGUFValueType as VT
    from ramforge.store.resolve import default_model_path

    chat = api._DEFAULT_MODEL_TEMPLATE.read_text()
    tool_use = "{%- if tools %}" + TOOL_MARK + "{{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}" + chat
    path = gguf_with(default_model_path(), tmp_path_factory.mktemp("synth") / "synth.gguf", [
        ("general.sampling.temp", VT.FLOAT32, 0.25), ("general.sampling.top_k", VT.INT32, 1),
        ("general.sampling.top_p", VT.FLOAT32, 0.5),
        ("tokenizer.chat_template", VT.STRING, chat), ("tokenizer.chat_template.tool_use", VT.STRING, tool_use)])
    seen = []
    original = api.Model.stream

    def recording(self, prompt, max_tokens=256, **kw):
        seen.append(kw)
        return original(self, prompt, max_tokens, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(api.Model, "stream", recording)
    app = create_app(ServerConfig(model=str(path), ram="400M", n_ctx=512, keep_alive=600))
    try:
        with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
            yield SimpleNamespace(http=httpx.Client(base_url=url, timeout=900), seen=seen, manager=app.state.manager)
    finally:
        mp.undo()


def _sampled(seen) -> tuple:
    kw = seen[-1]
    return kw["temperature"], kw["top_k"], kw["top_p"]


def test_gguf_sampling_defaults_beneath_v1_requests(synth):
    chat = {"model": "synth", "messages": HI, "max_tokens": 2}
    assert synth.http.post("/v1/chat/completions", json=chat).status_code == 200
    assert _sampled(synth.seen) == (0.25, 1, 0.5)                   # the GGUF's, not OpenAI's 1 / 40 / 1
    assert synth.http.post("/v1/chat/completions", json={**chat, "temperature": 0.9, "top_k": 7}).status_code == 200
    assert _sampled(synth.seen) == (0.9, 7, 0.5)                    # the request's win
    assert synth.http.post("/v1/completions", json={"model": "x", "prompt": "Hi", "max_tokens": 2}).status_code == 200
    assert _sampled(synth.seen) == (0.25, 1, 0.5)
    r = synth.http.post("/v1/responses", json={"model": "x", "input": "Hi", "max_output_tokens": 2, "top_p": 0.7})
    assert r.status_code == 200 and _sampled(synth.seen) == (0.25, 1, 0.7)
    r = synth.http.post("/api/generate", json={"model": str(synth.manager.cfg.model), "prompt": "Hi", "stream": False,
                                               "options": {"num_predict": 2}})
    assert r.status_code == 200, r.text
    assert _sampled(synth.seen) == (0.8, 40, 0.9)                   # Ollama reads none of them


def test_tools_render_with_the_tool_use_template(synth):
    name = str(synth.manager.cfg.model)
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    r = synth.http.post("/api/chat", json={"model": name, "messages": ask, "tools": [WEATHER],
                                           "_debug_render_only": True})
    assert r.status_code == 200, r.text
    shown = r.json()["debug_info"]["rendered_template"]
    # the tool_use template rendered it, and ToolSession.prepare read that one (it takes `tools`: no generic note)
    assert TOOL_MARK + "get_weather" in shown and "You can call these tools" not in shown
    plain = synth.http.post("/api/chat", json={"model": name, "messages": ask, "_debug_render_only": True})
    assert TOOL_MARK not in plain.json()["debug_info"]["rendered_template"]
    chat = {"model": "x", "messages": ask, "max_tokens": 1, "tools": [WEATHER]}
    assert synth.http.post("/v1/chat/completions", json=chat).status_code == 200
    rendered = synth.manager.current.model._rendered
    assert TOOL_MARK + "get_weather" in rendered and "You can call these tools" not in rendered
    assert synth.http.post("/v1/chat/completions", json={**chat, "tool_choice": "none"}).status_code == 200
    assert TOOL_MARK not in synth.manager.current.model._rendered       # no tools offered: the plain template
    r = synth.http.post("/v1/responses", json={"model": "x", "input": "Weather?", "max_output_tokens": 1,
                                               "tools": [{"type": "function", **WEATHER["function"]}]})
    assert r.status_code == 200 and TOOL_MARK + "get_weather" in synth.manager.current.model._rendered
