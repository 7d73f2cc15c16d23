"""`Layer` answers its architecture's tensor names (None for an absent optional one) and nothing else."""
from __future__ import annotations

import ast
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from ramforge.gguf.constants import GGMLType
from ramforge.models import ARCHS, llama, moe
from ramforge.models.weights import Layer, QTensor

DENSE = SimpleNamespace(n_expert=0)          # the hyperparameters a layer's names depend on


def _layer(arch, present=(), hp=DENSE):
    vec = np.zeros(4, np.float32)
    return Layer(3, ARCHS[arch].layer_names(hp), {n: QTensor(n, GGMLType.F32, (4,), vec) for n in present})


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
    assert llama.ffn_gate_inp is None                                    # dense llama: no router
    mixtral = _layer("llama", ["ffn_gate_inp"], SimpleNamespace(n_expert=8))
    assert mixtral.ffn_gate_inp.name == "ffn_gate_inp" and mixtral.ffn_gate_inp_shexp is None
    with pytest.raises(AttributeError):
        _layer("gemma3").ffn_gate_inp


def _attributes_of_L(fn) -> set[str]:
    tree = ast.parse(inspect.getsource(inspect.getmodule(fn)))
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "L"}


@pytest.mark.parametrize("arch,n_expert", [(a, 0) for a in sorted(ARCHS)] + [("llama", 8)])
def test_every_name_a_forward_pass_reads_is_allowed(arch, n_expert):
    a, hp = ARCHS[arch], SimpleNamespace(n_expert=n_expert)
    read = _attributes_of_L(a.forward)                                  # the whole module of its forward pass
    if "llama" in a.forward.__code__.co_names:                           # a forward pass delegating to llama's
        read |= _attributes_of_L(llama.forward)
    if "ffn_gate_inp" in a.layer_tensors(hp):                            # a router: the experts' FFN too
        read |= _attributes_of_L(moe.ffn)
    names = a.layer_names(hp)
    assert read and read <= names, sorted(read - names)
