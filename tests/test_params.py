"""One table of sampler parameters (ramforge.sampling.params) and one builder, used by the CLI, `Model` and
both servers: each front end's parameters come from the table, and none spells the list again."""
from __future__ import annotations

import ast
import inspect
import math
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import ramforge
from ramforge.errors import InvalidArgument
from ramforge.sampling.params import NAMES, PARAMS, SamplerError, SamplerParams, sampler_params, stop_strings

PACKAGE = Path(ramforge.__file__).resolve().parent


def test_the_table_is_the_dataclass():
    assert NAMES == tuple(inspect.signature(SamplerParams).parameters)
    assert {p.name: p.default for p in PARAMS} == SamplerParams().as_dict()
    assert {"temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "frequency_penalty",
            "presence_penalty", "repeat_last_n", "seed", "min_keep", "top_n_sigma", "xtc_probability",
            "xtc_threshold", "dynatemp_range", "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta",
            "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
            "logit_bias"} == set(NAMES)
    for p in PARAMS:
        assert p.doc and p.valid and p.kind in (int, float, dict, tuple) and p.server in ("", "clamp", "default")
        p.check(p.default)


def test_builder_defaults_and_errors():
    assert sampler_params() == SamplerParams()
    assert sampler_params({"temperature": None, "top_k": 5}) == SamplerParams(top_k=5)
    front = {"top_p": 0.9, "min_p": 0.0}
    assert sampler_params({"top_p": None}, front) == SamplerParams(top_p=0.9, min_p=0.0)
    assert sampler_params({"top_p": 0.5}, front).top_p == 0.5
    assert sampler_params({"seed": None}, {"seed": 7}).seed == 7
    with pytest.raises(TypeError, match="unknown sampler parameter temp;.*temperature, top_k"):
        sampler_params({"temp": 0.5})
    with pytest.raises(SamplerError, match="top_p = 1.5"):
        sampler_params({"top_p": 1.5})
    # front ends' spellings of the two non-scalar parameters
    b = sampler_params({"logit_bias": {"5": False, 7: 1.5}, "dry_sequence_breakers": ["a", "bc"]})
    assert b.logit_bias == ((5, -math.inf), (7, 1.5)) and b.dry_sequence_breakers == ("a", "bc")
    assert sampler_params({"logit_bias": [[3, 2.0], [3, 2.0]]}).logit_bias == ((3, 2.0), (3, 2.0))
    for bad in ({"hello": 1.0}, {"1": float("inf")}, [[1]], {True: 1.0}):
        with pytest.raises(SamplerError, match="logit_bias"):
            sampler_params({"logit_bias": bad})


def test_stop_strings():
    assert stop_strings(None) == [] and stop_strings("a") == ["a"] and stop_strings(("a", "b")) == ["a", "b"]
    for bad, needle in (([""], "empty string"), ([3], "a int"), (["x" * 5], "5 characters"), (["a"] * 3, "at most 2")):
        with pytest.raises(InvalidArgument, match=needle):
            stop_strings(bad, max_count=2, max_length=4)


def test_cli_options_come_from_the_table():
    from ramforge.cli import cli
    from ramforge.cli.console import CLI_SPELLING, sampler_options

    for command in ("run", "chat"):
        res = CliRunner().invoke(cli, [command, "--help"])
        assert res.exit_code == 0
        for p in PARAMS:
            flag = CLI_SPELLING.get(p.name, "--" + p.name.replace("_", "-"))
            assert flag in res.output, (command, flag)

    @click.command()
    @sampler_options
    def probe(**sampling):
        click.echo(repr(sampler_params(sampling)))

    out = CliRunner().invoke(probe, ["--logit-bias", "15+1.5", "--logit-bias", "3-inf", "--dry-sequence-breaker",
                                     "none", "--mirostat", "2"]).output
    assert "logit_bias=((15, 1.5), (3, -inf))" in out and "dry_sequence_breakers=()" in out and "mirostat=2" in out
    assert CliRunner().invoke(probe, ["--logit-bias", "15x1"]).exit_code == 2
    assert "[default: 0.8]" in CliRunner().invoke(cli, ["run", "--help"]).output


def test_server_fields_come_from_the_table():
    pytest.importorskip("fastapi")
    from ramforge.server import ollama, openai

    for model in (ollama.Options, openai.ChatRequest, openai.CompletionRequest):
        assert set(NAMES) <= set(model.model_fields)
    o = ollama.Options()
    assert o.sampling() == SamplerParams(top_p=0.9, min_p=0.0).as_dict()          # Ollama's defaults
    assert ollama.Options(seed=-5, temperature=0.2).sampling()["seed"] is None       # negative: random
    c = openai.CompletionRequest(prompt="x", seed=2 ** 32, typical_p=0.5)
    assert c.sampling() == SamplerParams(temperature=1.0, top_p=1.0, min_p=0.0, typical_p=0.5, seed=1).as_dict()
    with pytest.raises(Exception, match="temperature"):
        openai.CompletionRequest(prompt="x", temperature=3)                          # OpenAI's range: 0..2
    # llama-server clamps xtc_* and mirostat, and takes a dry_base below 1 as its default
    c = openai.CompletionRequest(prompt="x", xtc_probability=1.5, xtc_threshold=-1, mirostat=7, dry_base=0.5,
                                 logit_bias={"12": -100, "13": False}, dry_sequence_breakers=["\n"])
    s = c.sampling()
    assert (s["xtc_probability"], s["xtc_threshold"], s["mirostat"], s["dry_base"]) == (1.0, 0.0, 2, 1.75)
    assert s["logit_bias"] == ((12, -100.0), (13, -math.inf)) and s["dry_sequence_breakers"] == ("\n",)
    assert ollama.Options(mirostat=1, mirostat_tau=3.0).sampling()["mirostat_tau"] == 3.0
    with pytest.raises(Exception, match="logit_bias"):
        openai.CompletionRequest(prompt="x", logit_bias={"hello": 1.0}).sampling()


def _table_names_in(node) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} & set(NAMES)
    if isinstance(node, ast.Call):
        return {k.arg for k in node.keywords if k.arg} & set(NAMES)
    return set()


def test_no_front_end_spells_the_parameter_list_again():
    # a def taking, or a call passing, three or more of the table's names is a copy of the list
    # Llama reproduces llama-cpp-python's own method signatures, names and defaults (its contract, checked by
    # test_llama_compat), and maps them once onto the table (Llama._init_sampler -> sampler_params)
    mirrors = {"generation/llama.py", "generation/llama_completion.py"}
    copies = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "params.py" or path.relative_to(PACKAGE).as_posix() in mirrors:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = _table_names_in(node)
            if len(names) >= 3:
                copies.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {sorted(names)}")
    assert not copies, copies
