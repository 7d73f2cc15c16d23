"""Logits with quantized KV caches against llama.cpp's, bit for bit (records: tools/record_kv.py).

Each record holds, per cache configuration (type_k, type_v), llama-cpp-python's logits (flash attention
on, as a quantized V cache requires) for the oracle record's prompts: the prompt in one llama_decode,
then its greedy tokens one decode each. ramforge replays the same calls and every position's float32
logits row must hash the same. llama.cpp's flash attention over a quantized cache computes each query
row whole in one thread, so its logits do not depend on the thread count: recording twice gives the
same hashes.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from tools.oracle_report import model_path

KV_DIR = Path(__file__).parent / "fixtures" / "kv"
RECORDS = [json.loads(p.read_text()) for p in sorted(KV_DIR.glob("*.json"))]
REPRODUCED_BUILD = "AVX512 = 1"
FLOAT_TYPES = {"F32", "F16", "BF16"}               # their synthetic files are made without llama.cpp: run in CI
SLOW = {"gemma3-270m-q4_k_m"}                       # 18 layers, a 600-token prompt, five configurations


def _hash(row: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(row, np.float32).tobytes()).hexdigest()[:16]


def replay(rec: dict, eng: Engine, runs: list[dict]) -> list[tuple[str, int, int, float]]:
    """(prompt, positions, positions whose logits hash equal, max |d| over the recorded top values) per prompt."""
    out = []
    eng.ubatch = rec["oracle"]["n_ubatch"]
    for pr, run in zip(rec["prompts"], runs):
        eng.reset()
        rows = [eng.eval(pr["tokens"], all_logits=True, aligned=True)]
        rows += [eng.eval([t]) for t in run["gen_tokens"]]
        ours = np.concatenate(rows)
        lg = run["logits"]
        same = sum(_hash(r) == h for r, h in zip(ours, lg["sha"]))
        d = max(float(np.abs(ours[i, ids] - np.asarray(v, np.float32)).max())
                for i, (ids, v) in enumerate(zip(lg["top_ids"], lg["top_vals"])))
        out.append((pr["name"], len(lg["sha"]), same, d))
    return out


def _params():
    for rec in RECORDS:
        mid = rec["model"]["id"]
        m = rec["model"]
        marks = [] if m["source"] == "synthetic" and m["type"] in FLOAT_TYPES else [pytest.mark.oracle]
        if mid in SLOW:
            marks.append(pytest.mark.slow)
        if REPRODUCED_BUILD not in rec["oracle"]["system_info"]:
            marks.append(pytest.mark.skip(reason=f"{mid}: recorded by a build without AVX-512"))
        for cfg in rec["configs"]:
            yield pytest.param(rec, cfg, id=f"{mid}-{cfg['type_k']}-{cfg['type_v']}", marks=marks)


@pytest.mark.parametrize("rec, cfg", list(_params()))
def test_quantized_kv_logits_equal_llama_cpp(rec, cfg):
    with Engine.load(model_path(rec), n_ctx=rec["oracle"]["n_ctx"], type_k=cfg["type_k"],
                     type_v=cfg["type_v"]) as eng:
        res = replay(rec, eng, cfg["runs"])
    for name, n, same, d in res:
        assert same == n, f"{name}: {n - same} of {n} logits rows differ from llama.cpp's (max |d| {d:.3g})"
