"""The memory plan's steps (stream/layout.py, stream/plan.py), each on its own.

- classify_tensors and layer_layout on hand-built tensor tables (no file): which tensors a layer
  range reads, spans aligned and merged, a mixture's experts apart with their predictors;
- fixed_costs, needs and residency on hand-built records: fits whole, streams (buffers, the output's
  share, pinned layers in order), refused below the minimum;
- the steps on the synthetic fixture models (tools/make_models.ensure_model): a model that fits
  whole, one that streams, the minimum budget refused with its numbers, MoE experts, KV spill sizing;
- Plan is frozen; `ramforge plan`'s output for the default model equals the one recorded before
  make_plan was split into steps (tests/fixtures/plan/).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ramforge.errors import ModelFileError
from ramforge.flags import DIRECT_ALIGN
from ramforge.gguf.constants import GGMLType
from ramforge.gguf.reader import GGUFFile, TensorInfo
from ramforge.kv.types import spill_layout
from ramforge.models.config import HParams
from ramforge.stream.layout import (EMBD, MERGE_GAP, OUTPUT, classify_tensors, expert_span, layer_layout,
                                    span_of)
from ramforge.stream.plan import (Fixed, Needs, Plan, Request, Verdict, fixed_costs, make_plan, n_vocab_of, needs,
                                  plan_for_budget, residency)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "plan"
F32 = GGMLType.F32
MiB = 1 << 20


def table(*specs) -> dict[str, TensorInfo]:
    """name -> TensorInfo from (name, nbytes[, dims]), laid out back to back from offset 0 in 4 KiB steps."""
    out, off = {}, 0
    for spec in specs:
        name, nbytes, dims = spec if len(spec) == 3 else (*spec, (spec[1] // 4,))
        out[name] = TensorInfo(name, F32, dims, off, nbytes)
        off += -(-nbytes // DIRECT_ALIGN) * DIRECT_ALIGN
    return out


def dense_table(n_layer: int = 3, layer: int = MiB, embd: int = 4 * MiB, output: int | None = 2 * MiB):
    rows = 1000
    specs = [(EMBD, embd, (embd // 4 // rows, rows)), ("output_norm.weight", 256)]
    if output:
        specs.append((OUTPUT, output))
    for i in range(n_layer):
        specs += [(f"blk.{i}.attn_q.weight", layer // 2), (f"blk.{i}.ffn_up.weight", layer // 2)]
    return table(*specs)


# ---- classify_tensors ------------------------------------------------------------------------------

def test_classify_whole_first_middle_last_ranges():
    t = dense_table()
    whole = classify_tensors(t, 3, (0, 3))
    assert whole.big == (OUTPUT, EMBD) and whole.embeds and whole.logits
    assert set(whole.persistent) == {EMBD, OUTPUT, "output_norm.weight"}
    assert [len(whole.by_layer[i]) for i in range(3)] == [2, 2, 2]
    assert whole.model_bytes == sum(x.nbytes for x in t.values())
    assert whole.small_bytes == 4 * 64 and whole.embd_row_bytes == 4 * MiB // 1000
    first, middle, last = (classify_tensors(t, 3, r) for r in ((0, 1), (1, 2), (2, 3)))
    assert first.big == (EMBD,) and not first.logits and first.small_bytes == 0     # output_norm: the last's
    assert middle.big == () and set(middle.by_layer) == {1}
    assert last.big == (OUTPUT,) and not last.embeds and last.small_bytes == 4 * 64


def test_classify_tied_output_is_the_embedding():
    c = classify_tensors(dense_table(output=None), 3, (0, 3))
    assert c.out_name == EMBD and c.big == (EMBD,)


def test_classify_refuses_a_layer_past_block_count():
    t = dense_table(n_layer=3)
    with pytest.raises(ModelFileError, match="blk.2.attn_q.weight belongs to layer 2, but block_count is 2"):
        classify_tensors(t, 2, (0, 2))


# ---- spans and layer_layout ------------------------------------------------------------------------

def test_span_aligns_and_merges_near_tensors():
    near = [TensorInfo("a", F32, (10,), 100, 40), TensorInfo("b", F32, (10,), 5000, 40)]
    s = span_of(0, near)
    assert s.segments == [(0, 2 * DIRECT_ALIGN, 0)] and s.offsets == {"a": 100, "b": 5000}
    far = [near[0], TensorInfo("c", F32, (10,), 100 + MERGE_GAP + 3 * DIRECT_ALIGN, 40)]
    s = span_of(0, far)
    assert len(s.segments) == 2 and s.nbytes == 2 * DIRECT_ALIGN and s.tensor_bytes == 80
    assert s.offsets["c"] == DIRECT_ALIGN + (100 + MERGE_GAP + 3 * DIRECT_ALIGN) % DIRECT_ALIGN


def moe_table(n_layer=2, n_expert=4, per_expert=64 * 1024, n_embd=256):
    specs = [(EMBD, MiB, (256, 1024))]
    for i in range(n_layer):
        specs += [(f"blk.{i}.attn_q.weight", 128 * 1024), (f"blk.{i}.ffn_norm.weight", 4 * n_embd, (n_embd,)),
                  (f"blk.{i}.ffn_gate_inp.weight", 4 * n_embd * n_expert, (n_embd, n_expert))]
        specs += [(f"blk.{i}.ffn_{p}_exps.weight", n_expert * per_expert, (n_embd, per_expert // 4 // n_embd, n_expert))
                  for p in ("gate", "up", "down")]
    return table(*specs)


def test_layer_layout_takes_a_mixtures_experts_apart():
    t = classify_tensors(moe_table(), 2, (0, 2))
    hp = SimpleNamespace(n_expert=4, n_expert_used=2, arch="llama")
    lay = layer_layout(hp, t)
    ex = lay.experts
    assert ex.apart and ex.min_slots == 2 and ex.count == 8 and ex.total_bytes == 2 * 3 * 4 * 64 * 1024
    # one expert: its 64 KiB rows in each of the 3 tensors, whole aligned segments
    assert ex.slot_bytes == expert_span([x for x in t.by_layer[0] if "exps" in x.name], 0).nbytes == 3 * 64 * 1024
    # layer 1's router and ffn_norm (as f32) predict its experts during layer 0; layer 0 has none
    assert ex.predictor_bytes == 4 * 256 + 4 * 256 * 4
    assert all(s.tensor_bytes < w.tensor_bytes for s, w in zip(lay.stream_spans, lay.spans))
    dense = layer_layout(SimpleNamespace(n_expert=0, n_expert_used=0, arch="llama"), t)
    assert not dense.experts.apart and dense.stream_spans == dense.spans


# ---- needs and residency on hand-built records ----------------------------------------------------

def _records(n_layer=3, fixed=(2 * MiB, 1024, MiB, 256)):
    t = classify_tensors(dense_table(n_layer), n_layer, (0, n_layer))
    lay = layer_layout(SimpleNamespace(n_expert=0, n_expert_used=0, arch="llama"), t)
    fx = Fixed(*fixed)
    return t, lay, fx, needs(fx, t, lay, batch=8)


def test_needs_minimum_and_whole():
    t, lay, fx, need = _records()
    assert need.min_budget == fx.total + MiB + 8 * t.embd_row_bytes                   # one buffer, a chunk's rows
    assert need.resident_budget == fx.total + 3 * MiB + 4 * MiB + 2 * MiB


def test_residency_fits_whole_streams_and_refuses():
    t, lay, fx, need = _records()
    whole = residency(None, fx, t, lay, need, 8)
    assert whole.verdict == Verdict.RESIDENT and whole.pinned == (0, 1, 2) and whole.resident == (OUTPUT, EMBD)
    assert residency(need.resident_budget, fx, t, lay, need, 8).verdict == Verdict.RESIDENT
    low = residency(need.min_budget - 1, fx, t, lay, need, 8)
    assert low.verdict == Verdict.INSUFFICIENT and low.pinned == () and low.layer_bytes == (MiB,) * 3
    least = residency(need.min_budget, fx, t, lay, need, 8)
    assert least.verdict == Verdict.STREAMING and least.n_buffers == 1 and least.pinned == ()
    rows = 8 * t.embd_row_bytes
    assert least.embd_row_bytes == rows
    assert least.streamed_bytes_per_token == 3 * MiB + 2 * MiB + t.embd_row_bytes     # layers, output, a row
    # 2 buffers, the output in half the headroom left (2 MiB of 4), then layers in order
    r = residency(fx.total + 2 * MiB + rows + 4 * MiB + MiB // 2, fx, t, lay, need, 8)
    assert r.n_buffers == 2 and r.resident == (OUTPUT,) and r.pinned == (0, 1)
    assert r.streamed_bytes_per_token == r.expected_bytes_per_token == MiB + t.embd_row_bytes


def test_residency_of_a_mixture_fills_the_expert_cache_in_whole_slots():
    t = classify_tensors(moe_table(), 2, (0, 2))
    lay = layer_layout(SimpleNamespace(n_expert=4, n_expert_used=2, arch="llama"), t)
    fx = Fixed(MiB, 512, MiB, 0)
    need = needs(fx, t, lay, 1)
    ex = lay.experts
    assert need.min_budget == fx.total + lay.max_span + 2 * ex.slot_bytes + ex.predictor_bytes + t.embd_row_bytes
    least = residency(need.min_budget, fx, t, lay, need, 1)
    assert least.verdict == Verdict.STREAMING and least.expert_slots == 2
    assert least.expert_hit_rate == 2 / 8
    dense = sum(s.nbytes for s in lay.stream_spans)             # a second buffer, then every dense layer pinned
    more = residency(need.min_budget + lay.max_span + dense + 3 * ex.slot_bytes + 100, fx, t, lay, need, 1,
                     hit_rate=0.5)
    assert more.n_buffers == 2 and more.pinned == (0, 1) and more.resident == ()
    assert more.expert_slots == 5 and more.expert_hit_rate == 0.5
    misses = 2 * 2 * ex.slot_bytes                                   # every layer's top-k a miss
    assert more.streamed_bytes_per_token - more.expected_bytes_per_token == misses // 2


# ---- the fixture models ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    from tools.make_models import ensure_model
    return ensure_model("llama", "F16")


@pytest.fixture(scope="module")
def moe():
    """A synthetic llama with experts, F16: gguf writes it, no llama.cpp quantizer needed (a fresh CI machine
    has none); the plan reads only its tensor table."""
    from tools.make_models import ensure_model
    return ensure_model("llama-moe", "F16")


def test_fixture_model_fits_whole(llama):
    with GGUFFile(llama) as f:
        p = plan_for_budget(f, None, 256)
        hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
        same = make_plan(f, None, 256, p.batch)
        model = sum(t.nbytes for t in f.tensors.values())
    assert p.verdict == "resident" and p.pinned == tuple(range(hp.n_layer)) and p.n_buffers == 0
    assert p.planned_peak == same.resident_budget and p.model_bytes == model
    assert p.resident == ("output.weight", EMBD) and p.streamed_bytes_per_token == 0


def test_fixture_model_streams_and_its_minimum_is_refused_with_the_numbers(llama, tmp_path):
    with GGUFFile(llama) as f:
        whole = plan_for_budget(f, None, 256)
        mid = plan_for_budget(f, (whole.min_budget + whole.resident_budget) // 2, 256)
        one = plan_for_budget(f, whole.min_budget + 2 * max(whole.layer_bytes), 256, batch=1)
        low = plan_for_budget(f, whole.min_budget - 1, 256, kv_spill=False)
        at = plan_for_budget(f, whole.min_budget, 256, kv_spill=False)
    assert mid.verdict == "streaming" and mid.planned_peak <= mid.budget and mid.streamed_bytes_per_token > 0
    # two buffers and one layer pinned (the output, the embedding: more than half the headroom)
    assert one.verdict == "streaming" and one.n_buffers == 2 and one.pinned == (0,) and one.resident == ()
    assert one.streamed_bytes_per_token == sum(one.layer_bytes[1:]) + one.persistent["output.weight"] + \
        one.embd_row_bytes
    assert at.verdict == "streaming" and at.planned_peak <= whole.min_budget
    assert low.verdict == "insufficient" and low.min_budget == whole.min_budget
    from ramforge.engine.engine import Engine
    from ramforge.errors import BudgetTooSmall
    from ramforge.memory import MemoryBudget
    with pytest.raises(BudgetTooSmall, match=f"{whole.min_budget:,}"):
        Engine.load(llama, n_ctx=256, budget=MemoryBudget(whole.min_budget - 1), kv_spill=False, n_threads=1)


def test_make_plan_is_the_steps(llama):
    with GGUFFile(llama) as f:
        hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
        t = classify_tensors(f.tensors, hp.n_layer, (0, hp.n_layer))
        lay = layer_layout(hp, t)
        fx = fixed_costs(hp, Request(256, 16, (0, hp.n_layer)), t)
        need = needs(fx, t, lay, 16)
        p = make_plan(f, need.min_budget, 256, 16)
    assert (p.min_budget, p.resident_budget) == (need.min_budget, need.resident_budget)
    assert (p.kv_bytes, p.state_bytes, p.small_bytes) == (fx.kv_bytes, fx.state_bytes, fx.small_bytes)
    assert p.kv_bytes == 256 * fx.kv_bytes_per_pos and p.layer_bytes == tuple(s.nbytes for s in lay.stream_spans)
    assert isinstance(need, Needs)


def test_fixture_mixture_streams_its_experts_apart(moe):
    with GGUFFile(moe) as f:
        hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
        whole = plan_for_budget(f, None, 128, batch=16)
        p = plan_for_budget(f, whole.min_budget, 128, batch=16)
        lay = layer_layout(hp, classify_tensors(f.tensors, hp.n_layer, (0, hp.n_layer)))
    assert p.verdict == "streaming" and p.experts_apart
    assert p.expert_slots == hp.n_expert_used and p.expert_count == hp.n_layer * hp.n_expert
    assert p.expert_slot_bytes == lay.experts.slot_bytes and p.predictor_bytes == lay.experts.predictor_bytes
    assert p.planned_peak <= whole.min_budget
    assert p.active_bytes_per_token == whole.active_bytes_per_token < p.model_bytes


def test_kv_spill_sizing(llama):
    with GGUFFile(llama) as f:
        hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
        p = plan_for_budget(f, None, 1024, batch=8, kv_spill=True)
        q = plan_for_budget(f, None, 1024, batch=8, kv_spill=True, kv_tail=512)
    lay = spill_layout(1024, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, "f16", "f16", 8)
    assert p.kv_spill and p.kv_tail == lay.tail and p.kv_bytes == lay.charged(hp.n_layer)
    assert p.kv_spill_file_bytes == hp.n_layer * lay.buffer_bytes >= 1024 * p.kv_bytes_per_pos
    assert p.kv_bytes < 1024 * p.kv_bytes_per_pos and 0 < p.kv_read_bytes_per_token <= p.kv_spill_file_bytes
    assert q.kv_tail >= 512 and q.kv_bytes > p.kv_bytes and q.kv_read_bytes_per_token < p.kv_read_bytes_per_token
    assert any("spills to storage" in n for n in p.notes)


def test_several_sequences_near_the_minimum_end(llama):
    # n_seq streams of padded cells hold more rows than max_ctx counts: planning for the positions the
    # budget holds asked the same question again, without end (RecursionError)
    with GGUFFile(llama) as f:
        least = plan_for_budget(f, None, 512).min_budget
        for budget in (least - 1, least):
            p = plan_for_budget(f, budget, 1024, n_seq=3)
            assert p.verdict == "insufficient" or p.planned_peak <= budget
            assert p.verdict != "insufficient" or p.min_budget > budget


def test_plan_is_frozen(llama):
    with GGUFFile(llama) as f:
        p = plan_for_budget(f, None, 256)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.verdict = "streaming"
    assert isinstance(p, Plan) and isinstance(p.notes, tuple) and isinstance(p.pinned, tuple)
    q = p.noted("x")
    assert q.notes == p.notes + ("x",) and p.notes == q.notes[:-1]


# ---- `ramforge plan` unchanged ------------------------------------------------------------------------

CASES = json.loads((FIXTURES / "default.json").read_text()) if (FIXTURES / "default.json").exists() else {}


def _cli(*args) -> str:
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=str(ROOT))
    for k in ("RAMFORGE_KV_TYPE", "TERM"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-m", "ramforge", "plan", "default", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("name", sorted(CASES))
def test_default_model_plan_json_unchanged(default_model, name):
    got = json.loads(_cli(*CASES[name]["args"], "--json"))
    got.pop("path")
    assert got == CASES[name]["plan"]


@pytest.mark.parametrize("ram", ["150M", "60M"])
def test_default_model_plan_text_unchanged(default_model, ram):
    assert _cli("--ram", ram) == (FIXTURES / f"default_{ram}.txt").read_text()
