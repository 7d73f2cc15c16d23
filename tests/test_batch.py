"""kernels.batch.Batch, passed explicitly: rows of a llama.cpp batch get that batch's arithmetic, whoever
computes them, and no kernel keeps ambient (thread-local) state that could choose it instead."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from ramforge.gguf.constants import GGMLType
from ramforge.kernels import qmatmul as qm
from ramforge.kernels.batch import Batch, batch_size
from ramforge.kernels.matmul import matmul
from ramforge.models.weights import QTensor, output_rows, rows_of
from tests.test_dequant import random_blocks

N_IN, N_OUT = 512, 32
KERNELS = Path(__file__).resolve().parents[1] / "ramforge" / "kernels"


def _q4k(seed: int) -> np.ndarray:
    return random_blocks(GGMLType.Q4_K, N_OUT * N_IN // 256, seed=seed)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def test_rows_of_a_batch_round_as_that_batch():
    raw = _q4k(1)
    x = np.random.default_rng(0).standard_normal((9, N_IN)).astype(np.float32)
    whole = matmul(np.empty((9, N_OUT), np.float32), x, GGMLType.Q4_K, raw, N_OUT, N_IN)
    for off, k in ((0, 1), (3, 2), (5, 4), (8, 1)):
        part = matmul(np.empty((k, N_OUT), np.float32), x[off:off + k], GGMLType.Q4_K, raw, N_OUT, N_IN,
                      batch=Batch(9, off))
        assert np.array_equal(_bits(part), _bits(whole[off:off + k])), (off, k)
    # the batch given is what decides: the same two rows as a batch of their own take another plan
    own = qm._plan(GGMLType.Q4_K, N_OUT, N_IN, 2, 2, 0, 1, True, 0)
    viewed = qm._plan(GGMLType.Q4_K, N_OUT, N_IN, 2, 9, 3, 1, True, 0)
    assert own.choice != viewed.choice


def test_rows_past_the_batch_are_a_batch_of_their_own():
    raw = _q4k(2)
    x = np.random.default_rng(1).standard_normal((3, N_IN)).astype(np.float32)
    alone = matmul(np.empty((3, N_OUT), np.float32), x, GGMLType.Q4_K, raw, N_OUT, N_IN)
    past = matmul(np.empty((3, N_OUT), np.float32), x, GGMLType.Q4_K, raw, N_OUT, N_IN, batch=Batch(4, 2))
    assert np.array_equal(_bits(alone), _bits(past))
    assert batch_size(None, 3) == 3 and batch_size(Batch(7, 2), 3) == 7 and Batch(7, 2).at(1) == Batch(7, 3)


def test_rows_of_passes_the_batch_to_every_weight():
    w = [QTensor(f"w{i}", GGMLType.Q4_K, (N_IN, N_OUT), _q4k(10 + i)) for i in range(2)]
    x = np.random.default_rng(2).standard_normal((9, N_IN)).astype(np.float32)
    want = [t.rows(np.empty((9, N_OUT), np.float32), x) for t in w]
    ys = [np.empty((2, N_OUT), np.float32) for _ in w]
    rows_of(x[4:6], *zip(w, ys), batch=Batch(9, 4))
    for y, full in zip(ys, want):
        assert np.array_equal(_bits(y), _bits(full[4:6]))


def test_output_rows_hand_back_the_batch_the_rest_of_the_layer_runs_as():
    class HP:
        n_layer = 2
    a = np.arange(12, dtype=np.float32).reshape(6, 2)
    b = Batch(16, 4)
    assert output_rows(HP, 0, slice(5, 6), b, a)[-1] is b                 # not the last layer: unchanged
    kept, batch = output_rows(HP, 1, slice(5, 6), b, a)
    assert batch == Batch(1, 0) and np.array_equal(kept, a[5:6])
    kept, batch = output_rows(HP, 1, np.array([1, 4]), None, a.copy())
    assert batch == Batch(2, 0) and np.array_equal(kept, a[[1, 4]])


def test_no_kernel_keeps_thread_local_state():
    for path in sorted(KERNELS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(tree)
                 if isinstance(n, (ast.Attribute, ast.Name))}
        assert "local" not in names or "threading" not in names, f"{path.name} keeps thread-local state"
