"""One `Arch` record per architecture (models/arch.py), collected in `models.ARCHS`: every executable
architecture has one, each fact is the one the old per-file tables held, and the code that asks it
behaves by it; an unknown architecture is the typed UnsupportedArch."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import ramforge.models as models
from ramforge.engine.engine import _refuse_unsupported_keys
from ramforge.engine.parallel import _shift_rope
from ramforge.errors import NotReproduced, RamforgeError, UnsupportedArch
from ramforge.kernels.moe import Gating
from ramforge.models import ARCHS, arch_of, ffn_norm, is_executable, layer_windows
from ramforge.models.arch import NO_CAPS, Arch, SoftCaps
from ramforge.models.config import ConfigError, HParams, UnsupportedRopeScaling
from ramforge.models.weights import layer_shapes
from ramforge.stream.layout import SMALL
from ramforge.stream.plan import state_shapes

PACKAGE = Path(models.__file__).parent
NOT_ARCHITECTURES = {"arch", "config", "moe", "weights", "routing_trace"}     # the shared pieces of models/
# the architectures of the tables the records replaced (a new architecture adds a record, not a line here)
EXECUTABLE = {"llama", "qwen2", "qwen3", "gemma3", "gemma2", "phi3", "qwen3moe", "qwen2moe", "gpt-oss"}
DENSE = SimpleNamespace(n_expert=0)


OLD = {n: ARCHS[n] for n in sorted(EXECUTABLE)}


def _by(fact) -> dict[str, object]:
    return {n: fact(a) for n, a in OLD.items()}


def _where(fact) -> set[str]:
    return {n for n, a in OLD.items() if fact(a)}


# ----------------------------------------------------------------------------- the table


def test_every_architecture_module_has_its_record_in_the_table():
    modules = {m.name for m in pkgutil.iter_modules([str(PACKAGE)])} - NOT_ARCHITECTURES
    assert modules, PACKAGE
    records = set()
    for name in modules:
        rec = getattr(importlib.import_module(f"ramforge.models.{name}"), "ARCH", None)
        assert isinstance(rec, Arch), f"models/{name}.py defines no ARCH = Arch(...)"
        assert ARCHS[rec.name] is rec, f"models/{name}.py's record is not in models.ARCHS"
        records.add(rec.name)
    assert records == set(ARCHS) >= EXECUTABLE


def test_every_model_the_tests_build_has_a_record():
    from tools.make_models import SPECS
    assert {s.arch for s in SPECS.values()} <= set(ARCHS)


def test_unknown_architecture_is_the_typed_error():
    for name in ("falcon", "mistral", "", None, 3):
        with pytest.raises(UnsupportedArch, match="cannot be executed; executable: .*gemma3.*any architecture can be "
                                                  "inspected") as e:
            arch_of(name)
        assert isinstance(e.value, RamforgeError)
        assert not is_executable(name) if isinstance(name, str) else True
    assert arch_of("gemma3") is ARCHS["gemma3"] and is_executable("gpt-oss")


def test_aliases_share_the_record_and_a_name_is_claimed_once():
    base = ARCHS["llama"]
    alias = dataclasses.replace(base, name="llama-like", aliases=("llama-alias",))
    table = models._table([base, alias])
    assert table["llama-alias"] is alias and table["llama-like"] is alias and table["llama"] is base
    with pytest.raises(ValueError, match="'llama' claimed by llama and twin"):
        models._table([base, dataclasses.replace(base, name="twin", aliases=("llama",))])
    assert all(not a.aliases for a in OLD.values())         # llama.cpp builds no graph for two names yet


def test_every_field_is_asked_somewhere():
    """A field nothing reads would be a fact in name only."""
    read = set()
    for path in (PACKAGE.parent).rglob("*.py"):
        read |= {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
    unread = [f.name for f in dataclasses.fields(Arch) if f.name not in read]
    assert not unread, unread


# ----------------------------------------------------------------------------- the facts, as the old tables held them


def test_facts_equal_the_tables_they_replace():
    # engine.SLIDING_WINDOW_ARCHS, parallel.ISWA_ARCHS, config.SLIDING_WINDOW_DEFAULT
    assert _where(lambda a: a.reads_sliding_window) == {"gemma3", "gemma2", "phi3", "gpt-oss"}
    assert _where(lambda a: a.iswa) == {"gemma2", "gemma3", "gpt-oss"}
    assert _by(lambda a: a.swa_pattern) == {**dict.fromkeys(EXECUTABLE, 0), "gemma3": 6, "gemma2": 2, "gpt-oss": 2}
    assert {n: a.sliding_window_default for n, a in OLD.items() if a.sliding_window_default} == {"gemma2": 4096}
    # parallel.LLAMA_ROPE and its gemma2 / gemma3 branches
    assert _where(lambda a: a.k_shift) == {"llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma2", "gemma3"}
    assert _where(lambda a: a.rope_freqs) == {"llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe"}
    assert _where(lambda a: a.rope_neox) == EXECUTABLE - {"llama"}
    assert {n: (a.rope_base_swa, a.rope_freq_scale_swa) for n, a in OLD.items()
            if (a.rope_base_swa, a.rope_freq_scale_swa) != (None, None)} == {"gemma3": (10000.0, 1.0)}
    # config.MOE_ARCHS, moe.NORM_W, moe.GATING
    assert {n: (m.required, m.ff_key, m.shared, m.norm_w, m.gating) for n, a in OLD.items() if (m := a.moe)} == {
        "qwen3moe": (True, True, False, True, Gating.SOFTMAX), "qwen2moe": (True, True, True, False, Gating.SOFTMAX),
        "llama": (False, False, False, True, Gating.SOFTMAX),
        "gpt-oss": (True, True, False, False, Gating.SOFTMAX_WEIGHT)}
    # config.SOFTCAPS, LONGROPE_ARCHS, FUSED_PROJECTIONS; models.FFN_NORM
    assert {n: a.softcaps for n, a in OLD.items() if a.softcaps != NO_CAPS} == {
        "gemma2": SoftCaps(attn=50.0, final=30.0), "gemma3": SoftCaps(attn=None, final=0.0)}
    assert _where(lambda a: a.longrope) == _where(lambda a: a.fused_projections) == {"phi3"}
    assert {n: a.ffn_norm for n, a in OLD.items() if a.ffn_norm != "ffn_norm"} == {"gpt-oss": "post_attention_norm"}
    assert ffn_norm("gpt-oss") == "post_attention_norm" and ffn_norm("deepseek2") == "ffn_norm"
    assert ARCHS["phi3"].global_vectors == ("rope_factors_long.weight", "rope_factors_short.weight")
    assert SMALL[:2] == ("output_norm.weight", "rope_freqs.weight")         # planned as float32, as the engine keeps them
    assert {"rope_factors_long.weight", "rope_factors_short.weight"} <= set(SMALL)


def test_layer_tensors_with_and_without_experts():
    llama = ARCHS["llama"]
    assert "ffn_gate" in llama.layer_tensors(DENSE) and "ffn_gate_inp" not in llama.layer_tensors(DENSE)
    mixtral = llama.layer_tensors(SimpleNamespace(n_expert=8))
    assert "ffn_gate" not in mixtral and {"ffn_gate_inp", "ffn_gate_exps", "ffn_down_exps"} <= set(mixtral)
    assert ARCHS["qwen2moe"].layer_tensors(DENSE)[-4:] == ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp",
                                                           "ffn_down_shexp")
    shapes = layer_shapes(SimpleNamespace(n_embd=8, n_head=2, n_head_kv=1, head_dim_k=4, head_dim_v=4, n_ff=16,
                                          n_expert=4, n_ff_exp=4, n_ff_shexp=4))
    for n, a in ARCHS.items():                 # every tensor a record names has an expected shape
        assert a.optional <= set(a.tensors), n
        own = a.shapes(SimpleNamespace(n_embd=8, n_ff=16)) if a.shapes is not None else {}    # (Arch.shapes)
        assert not set(a.layer_tensors(SimpleNamespace(n_expert=4))) - set(shapes) - set(own), n


# ----------------------------------------------------------------------------- the code asks the record


def _md(arch: str, **extra) -> dict:
    md = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4,
          f"{arch}.feed_forward_length": 128, f"{arch}.block_count": 12, f"{arch}.rope.freq_base": 500000.0}
    return md | {k.format(arch=arch): v for k, v in extra.items()}


def test_hyperparameters_take_the_records_defaults():
    g2, g3, oss = (HParams.from_metadata(_md(a), 100) for a in ("gemma2", "gemma3", "deepseek2"))
    assert (g2.sliding_window, g2.attn_softcap, g2.final_softcap, g2.rope_base_swa) == (4096, 50.0, 30.0, 500000.0)
    assert (g3.sliding_window, g3.attn_softcap, g3.final_softcap, g3.rope_base_swa) == (0, 0.0, 0.0, 10000.0)
    assert (oss.sliding_window, oss.attn_softcap, oss.rope_base_swa) == (0, 0.0, 500000.0)     # inspect-only
    given = HParams.from_metadata(_md("gemma3", **{"{arch}.rope.freq_base_swa": 20000.0}), 100)
    assert given.rope_base_swa == 20000.0
    with pytest.raises(ConfigError, match=r"gemma3.rope.freq_base_swa = 'x': expected a finite number"):
        HParams.from_metadata(_md("gemma3", **{"{arch}.rope.freq_base_swa": "x"}), 100)
    with pytest.raises(ConfigError, match="qwen3moe.expert_count is missing"):      # Arch.moe.required
        HParams.from_metadata(_md("qwen3moe"), 100)
    assert HParams.from_metadata(_md("llama"), 100).n_expert == 0                      # Mixtral's are optional
    longrope = {"{arch}.rope.scaling.type": "longrope"}
    assert HParams.from_metadata(_md("phi3", **longrope), 100).rope_scaling == "longrope"
    with pytest.raises(UnsupportedRopeScaling, match="'longrope' is reproduced only for phi3, not llama"):
        HParams.from_metadata(_md("llama", **longrope), 100)


def test_sliding_layers_windows_and_rope():
    g3 = HParams.from_metadata(_md("gemma3", **{"{arch}.attention.sliding_window": 512,
                                                "{arch}.rope.scaling.factor": 8.0}), 100)
    a = ARCHS["gemma3"]
    assert a.windows(g3, (0, 12)) == layer_windows(g3, (0, 12)) == [512] * 5 + [0] + [512] * 5 + [0]
    assert a.layer_rope(g3, 0) == (10000.0, g3.rope_scale._replace(freq_scale=1.0))   # sliding: unscaled
    assert a.layer_rope(g3, 5) == (500000.0, g3.rope_scale) and g3.rope_scale.freq_scale == 0.125
    g2 = HParams.from_metadata(_md("gemma2", **{"{arch}.rope.freq_base_swa": 1000.0}), 100)
    assert layer_windows(g2, (2, 6)) == [4096, 0, 4096, 0]
    assert ARCHS["gemma2"].layer_rope(g2, 0) == (1000.0, g2.rope_scale)
    phi3 = HParams.from_metadata(_md("phi3", **{"{arch}.attention.sliding_window": 2047}), 100)
    assert phi3.sliding_window == 2047 and layer_windows(phi3, (0, 3)) == [0, 0, 0]    # read, then turned off
    assert layer_windows(HParams.from_metadata(_md("deepseek2"), 100), (0, 2)) == [0, 0]


def test_the_engine_refuses_what_the_record_does_not_run():
    llama, gemma2 = ARCHS["llama"], ARCHS["gemma2"]
    with pytest.raises(UnsupportedArch, match="llama.attention.sliding_window is not supported for llama"):
        _refuse_unsupported_keys(_md("llama", **{"{arch}.attention.sliding_window": 4096}), "llama", llama)
    _refuse_unsupported_keys(_md("gemma2", **{"{arch}.attention.sliding_window": 4096}), "gemma2", gemma2)
    with pytest.raises(UnsupportedArch, match="qwen2.expert_count = 8"):
        _refuse_unsupported_keys(_md("qwen2", **{"{arch}.expert_count": 8}), "qwen2", ARCHS["qwen2"])
    with pytest.raises(UnsupportedArch, match="gemma3.attn_logit_softcapping"):
        _refuse_unsupported_keys(_md("gemma3", **{"{arch}.attn_logit_softcapping": 50.0}), "gemma3", ARCHS["gemma3"])


def test_state_buffer_for_fused_projections():
    for arch in ("phi3", "llama"):
        hp = HParams.from_metadata(_md(arch), 100)
        assert ("fused" in state_shapes(hp, 4)) == (arch == "phi3")
    hp = SimpleNamespace(n_embd=8, n_head=2, n_head_kv=2, head_dim_k=4, head_dim_v=4, n_ff=16, n_expert=0,
                         n_ff_exp=0, n_ff_shexp=0)
    assert layer_shapes(hp, fused=True)["ffn_up"] == (8, 32) and layer_shapes(hp)["ffn_up"] == (8, 16)


def test_k_shift_as_the_record_says():
    def shift(arch, **md):
        hp = HParams.from_metadata(_md(arch, **md), 100)
        eng = SimpleNamespace(hp=hp, kv=SimpleNamespace(type_k="f16"), arch=ARCHS[arch],
                              weights=SimpleNamespace(rope_freqs=SimpleNamespace(data="factors")))
        return hp, _shift_rope(eng)

    hp, args = shift("llama")
    assert args(3) == (500000.0, False, "factors", hp.rope_scale)
    hp, args = shift("gemma3", **{"{arch}.attention.sliding_window": 512})
    assert args(0) == (10000.0, True, None, hp.rope_scale._replace(freq_scale=1.0))
    assert args(5) == (500000.0, True, None, hp.rope_scale)
    experts = {"{arch}.expert_count": 4, "{arch}.expert_used_count": 2}
    for arch in ("phi3", "gpt-oss"):
        with pytest.raises(NotReproduced, match=f"K-shift .* for {arch} is not reproduced"):
            shift(arch, **experts)
