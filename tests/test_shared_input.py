"""kernels.qmatmul.SharedInput: matmuls of one input given it quantize the input once per activation type
(q, k, v; gate, up), with results bit-identical to quantizing it for each."""
from __future__ import annotations

import numpy as np

from ramforge.gguf.constants import GGMLType
from ramforge.kernels import qmatmul as qm
from ramforge.kernels.matmul import SharedInput, matmul
from tests.test_dequant import random_blocks

N_IN = 512


def _weights():
    # two Q4_K weights (activation Q8_K) and one Q8_0 (activation Q8_0)
    out = []
    for i, (t, n_out) in enumerate(((GGMLType.Q4_K, 16), (GGMLType.Q4_K, 8), (GGMLType.Q8_0, 24))):
        be = 256 if t == GGMLType.Q4_K else 32
        out.append((t, n_out, random_blocks(t, n_out * N_IN // be, seed=i)))
    return out


def _run(x, ws, shared=None):
    return [matmul(np.zeros((x.shape[0], n), np.float32), x, t, raw, n, N_IN, shared=shared) for t, n, raw in ws]


def test_shared_input_quantizes_once_per_type_and_changes_no_bit(monkeypatch):
    x = np.random.default_rng(0).standard_normal((3, N_IN)).astype(np.float32)
    ws = _weights()
    alone = _run(x, ws)
    calls = []
    real = qm.quantize_activation
    monkeypatch.setattr(qm, "quantize_activation", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    shared = SharedInput(x)
    together = _run(x, ws, shared)
    other = _run(x.copy(), ws[:1], shared)      # another array, even equal, is quantized for itself
    after = _run(x, ws[:1])                      # not given the shared input: quantized again
    assert [str(a) for a in calls] == ["ActType.Q8_K", "ActType.Q8_0", "ActType.Q8_K", "ActType.Q8_K"]
    assert sorted(str(k[0]) for k in shared.by_key) == ["ActType.Q8_0", "ActType.Q8_K"]
    for a, b in zip(alone, together):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.array_equal(other[0], alone[0]) and np.array_equal(after[0], alone[0])
