"""`Layer` answers its architecture's tensor names (None for an absent optional one) and nothing else."""
from __future__ import annotations

import ast
import importlib
import inspect

import numpy as np
import pytest

from ramforge.gguf.constants import GGMLType
from ramforge.models import ARCHITECTURES
from ramforge.models.weights import Layer, QTensor, layer_names


def _module(arch):
    return importlib.import_module(f"ramforge.models.{ARCHITECTURES[arch]}")


def _layer(arch, present=()):
    vec = np.zeros(4, np.float32)
    return Layer(3, layer_names(_module(arch)), {n: QTensor(n, GGMLType.F32, (4,), vec) for n in present})


def test_absent_optional_tensors_are_none_and_unknown_names_fail():
    llama = _layer("llama", ["attn_q"])
    assert llama.attn_q.name == "attn_q"
    assert llama.attn_q_bias is None and llama.attn_q_norm is None      # optional / read by the shared forward
    with pytest.raises(AttributeError, match="layer 3 has no tensor 'attn_qnorm'"):
        llama.attn_qnorm                                                 # a misspelling is no absent tensor
    with pytest.raises(AttributeError, match="post_ffw_norm"):
        llama.post_ffw_norm                                              # gemma3's, not llama's
    assert _layer("qwen3").attn_v_bias is None                           # llama.forward looks for it
    with pytest.raises(AttributeError):
        _layer("gemma3").attn_q_bias
    assert not hasattr(llama, "__deepcopy__") and llama.index == 3


def _attributes_of_L(fn) -> set[str]:
    tree = ast.parse(inspect.getsource(inspect.getmodule(fn)))
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "L"}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_name_a_forward_pass_reads_is_allowed(arch):
    m = _module(arch)
    read = _attributes_of_L(m.forward)
    if "llama" in m.forward.__code__.co_names:                           # qwen2, qwen3 run llama.forward
        read |= _attributes_of_L(_module("llama").forward)
    assert read and read <= layer_names(m), sorted(read - layer_names(m))
