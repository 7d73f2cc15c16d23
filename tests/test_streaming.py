"""Out-of-core engine: budgets, prefetch, page-cache hygiene, layer ranges, faults."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ramforge.engine.engine import Engine
from ramforge.errors import BudgetTooSmall, RamforgeError
from ramforge.gguf.reader import GGUFFile
from ramforge.memory import MemoryBudget
from ramforge.stream.plan import plan_for_budget
from ramforge.stream import io as sio
from tools.oracle_report import records

PROMPT = [1, 415, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889]


@pytest.fixture(scope="module")
def tiny():
    from tools.make_models import ensure_model

    return ensure_model("llama", "F16")


@pytest.fixture(scope="module")
def reference(tiny):
    with Engine.load(tiny, n_ctx=64) as e:
        return e.eval(PROMPT, all_logits=True, aligned=True), list(e.generate(PROMPT, 12))


def _budgets(path, n_ctx=64):
    with GGUFFile(path) as f:
        full = plan_for_budget(f, None, n_ctx)
        return full.min_budget, full.resident_budget


@pytest.mark.parametrize("io", ["direct", "buffered", "mmap"])
@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])
def test_streaming_is_identical_to_resident(tiny, reference, io, where):
    lo, hi = _budgets(tiny)
    budget = MemoryBudget(int(lo + where * (hi - 1 - lo)))
    with Engine.load(tiny, n_ctx=64, budget=budget, io=io) as e:
        assert e.plan.verdict == "streaming"
        # aligned: the arithmetic is llama.cpp's for the whole prompt, whatever chunks the budget allows
        logits = e.eval(PROMPT, all_logits=True, aligned=True)
        gen = list(e.generate(PROMPT, 12))
        assert budget.peak <= budget.limit
        if io != "mmap":
            assert budget.peak == e.plan.planned_peak                       # the plan is the runtime's rule
    assert np.array_equal(logits, reference[0]) and gen == reference[1]
    assert budget.current == 0


def test_gemma3_at_small_budget_matches_oracle(default_model):
    rec = next(r for r in records() if r["model"]["source"] != "synthetic")
    pr = next(p for p in rec["prompts"] if p["name"] == "whitespace")     # no near-tie in 32 greedy steps
    budget = MemoryBudget("48M")
    with Engine.load(default_model, n_ctx=256, budget=budget) as e:
        assert e.plan.verdict == "streaming" and e.plan.resident == ()
        assert list(e.generate(pr["tokens"], 32)) == pr["gen_tokens"]
        assert budget.peak <= budget.limit and abs(budget.peak - e.plan.planned_peak) <= 0.05 * e.plan.planned_peak


def test_budget_below_minimum_names_it(tiny):
    lo, _ = _budgets(tiny)
    with pytest.raises(BudgetTooSmall) as e:
        Engine.load(tiny, n_ctx=64, budget=MemoryBudget(lo - 1))
    assert e.value.minimum == lo and f"{lo:,}" in str(e.value)


def test_layer_ranges_chain_to_the_full_model(tiny, reference):
    a = Engine.load(tiny, n_ctx=64, layers=(0, 1), budget=MemoryBudget("64M"))
    b = Engine.load(tiny, n_ctx=64, layers=(1, 3), budget=MemoryBudget("64M"))
    with a, b:
        x = np.zeros((len(PROMPT), a.hp.n_embd), np.float32)
        a.arch.embed(a, x, PROMPT)
        h = a.eval_hidden(x)
        logits = b.eval_hidden(h, logits=True)
        assert a.kv.k.shape[0] == 1 and b.kv.k.shape[0] == 2
    assert np.array_equal(logits, reference[0])


@pytest.mark.parametrize("io", ["direct", "buffered"])
def test_page_cache_does_not_hold_the_model(tiny, io):
    # a copy beside the fixture (the same filesystem), which no other test (xdist worker) reads meanwhile
    own = Path(tiny).with_name(f".page-cache-{os.getpid()}-{io}.gguf")
    shutil.copyfile(tiny, own)
    try:
        with open(own, "rb+") as fh:               # written back first: eviction skips dirty pages
            os.fsync(fh.fileno())
        sio.evict(own)
        lo, hi = _budgets(own)
        with Engine.load(own, n_ctx=64, budget=MemoryBudget(lo + (hi - lo) // 3), io=io) as e:
            list(e.generate(PROMPT, 4))
        resident, size = sio.page_cache_residency(own)
        assert resident <= 0.05 * size, f"{io}: page cache holds {resident:,} of {size:,} B"
    finally:
        own.unlink(missing_ok=True)


class _Faulty:
    """Wraps ModelFile.read_into: the n-th call raises EIO, reads short, or the file is truncated."""

    def __init__(self, monkeypatch, kind, nth):
        self.kind, self.nth, self.calls = kind, nth, 0
        self.real = sio.ModelFile.read_into
        monkeypatch.setattr(sio.ModelFile, "read_into", self)

    def __get__(self, obj, objtype=None):
        return lambda offset, out: self(obj, offset, out)

    def __call__(self, f, offset, out):
        self.calls += 1
        if self.calls == self.nth:
            if self.kind == "eio":
                raise sio.IOError_(f"{f.path}: read failed: Input/output error (injected)")
            if self.kind == "short":
                self.real(f, offset, out[: len(out) // 2])
                raise sio.IOError_(f"{f.path}: short read at offset {offset} (injected)")
            if self.kind == "truncated":        # the file really shrinks under the open engine
                os.truncate(f.path, offset + len(out) // 2)
        return self.real(f, offset, out)


@pytest.mark.parametrize("kind", ["eio", "short"])
@pytest.mark.parametrize("nth", [1, 2, 5])
def test_read_faults_release_everything_and_recover(tiny, reference, monkeypatch, kind, nth):
    lo, hi = _budgets(tiny)
    budget = MemoryBudget(lo)
    with Engine.load(tiny, n_ctx=64, budget=budget) as e:
        standing = budget.current
        faulty = _Faulty(monkeypatch, kind, nth)
        with pytest.raises(RamforgeError, match="injected"):
            list(e.generate(PROMPT, 4))
        # nothing held but the KV cache's chunks for the positions that were filled (charged as they fill)
        assert budget.current == standing + e.kv.nbytes and e.kv.capacity == -(-e.n_past // 64) * 64
        faulty.nth = -1
        assert list(e.generate(PROMPT, 12)) == reference[1]
    assert budget.current == 0


@pytest.mark.parametrize("nth", [1, 3])
def test_file_truncated_while_streaming_releases_everything_and_recovers(tiny, reference, tmp_path,
                                                                          monkeypatch, nth):
    import shutil

    p = tmp_path / "m.gguf"
    shutil.copy(tiny, p)
    original, st = p.read_bytes(), os.stat(p)
    lo, _ = _budgets(p)
    budget = MemoryBudget(lo)
    with Engine.load(p, n_ctx=64, budget=budget) as e:
        standing = budget.current
        faulty = _Faulty(monkeypatch, "truncated", nth)
        with pytest.raises(RamforgeError, match="short read .* truncated or changed"):
            list(e.generate(PROMPT, 4))
        assert budget.current == standing + e.kv.nbytes and os.path.getsize(p) < len(original)
        with pytest.raises(sio.ModelChanged, match="changed on disk"):     # refused while shrunk
            list(e.generate(PROMPT, 4))
        assert budget.current == standing + e.kv.nbytes
        faulty.nth = -1
        p.write_bytes(original)                 # the file restored, as it was: the engine goes on
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert list(e.generate(PROMPT, 12)) == reference[1]
    assert budget.current == 0


def test_changed_file_is_refused(tiny, tmp_path):
    import shutil

    p = tmp_path / "m.gguf"
    shutil.copy(tiny, p)
    lo, _ = _budgets(p)
    with Engine.load(p, n_ctx=64, budget=MemoryBudget(lo)) as e:
        list(e.generate(PROMPT, 2))
        os.utime(p, ns=(0, 10**9))
        with pytest.raises(sio.ModelChanged, match="changed on disk"):
            list(e.generate(PROMPT, 2))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(frac=st.floats(0.0, 1.2), n_ctx=st.sampled_from([16, 48, 64]), first=st.integers(0, 2), width=st.integers(1, 3))
def test_budget_invariant_over_random_budgets_and_ranges(tiny, frac, n_ctx, first, width):
    last = min(3, first + width)
    with GGUFFile(tiny) as f:
        p = plan_for_budget(f, None, n_ctx, (first, last))
    budget = MemoryBudget(int(p.min_budget + frac * (p.resident_budget - p.min_budget)))
    with Engine.load(tiny, n_ctx=n_ctx, budget=budget, layers=(first, last)) as e:
        x = np.random.default_rng(0).standard_normal((5, e.hp.n_embd)).astype(np.float32)
        e.eval_hidden(x, logits=last == 3)
        e.eval_hidden(x[:1], logits=last == 3)
        assert budget.peak <= budget.limit and budget.peak == e.plan.planned_peak
    assert budget.current == 0


def test_probe_read_speed_takes_any_length(tmp_path):
    """An nbytes (or file size) that is not a whole number of O_DIRECT blocks is read in whole blocks."""
    from ramforge.stream.io import probe_read_speed

    p = tmp_path / "f.bin"
    p.write_bytes(np.random.default_rng(0).integers(0, 255, 3 * 4096 + 123, dtype=np.uint8).tobytes())
    for nbytes in (5000, 4096, 1 << 20):
        assert probe_read_speed(str(p), nbytes=nbytes, chunk=8192) > 0


@pytest.mark.parametrize("how", ["madvise", "a write a page", "left to faults"])
@pytest.mark.parametrize("threads", [1, 3])
def test_populate_faults_every_page_in(how, threads, monkeypatch):
    """populate() leaves every page of a fresh buffer in memory (so reads into it later take no page
    faults); where madvise does not know the advice (EINVAL: a kernel before 5.14) it writes a byte a page;
    where it refuses otherwise (ENOMEM) the pages are left to fault in when used."""
    import ctypes
    import errno
    import mmap

    if how == "a write a page":
        monkeypatch.setattr(sio, "MADV_POPULATE_WRITE", 0x7fff)
    elif how == "left to faults":
        libc = sio._c()

        class Refusing:
            def __getattr__(self, name):
                return getattr(libc, name)

            def madvise(self, *args):
                ctypes.set_errno(errno.ENOMEM)
                return -1

        monkeypatch.setattr(sio, "_libc", Refusing())

    m = mmap.mmap(-1, (48 << 20) + 3 * 4096)                  # fresh anonymous pages, never touched (a freed
    buf = np.frombuffer(m, np.uint8)                           # malloc block could already be in memory)
    assert sio.memory_residency(buf) == 0
    sio.populate(buf, threads)
    assert sio.memory_residency(buf) == (0 if how == "left to faults" else buf.nbytes)
    del buf
    m.close()


def test_stream_buffers_are_in_memory_before_the_first_pass(tiny):
    """aligned_empty(fault_in=) faults a buffer's pages in (populate): a streamed model's buffers are in memory
    once it loads, not faulted in by its first token's reads."""
    lo, _ = _budgets(tiny)
    with Engine.load(tiny, n_ctx=64, budget=MemoryBudget(lo)) as e:
        assert e.weights._buffers
        assert all(sio.memory_residency(b) == b.nbytes for b in e.weights._buffers)


@pytest.mark.parametrize("spec", ["phi3-longrope", "gemma2"])
def test_new_architectures_stream_as_they_run_resident(spec):
    # phi3's fused-projection buffer and LongRoPE factors, gemma2's capped logits: the same at the
    # smallest budget as resident, peak within the plan
    from tools.make_models import ensure_model

    path = ensure_model(spec, "F16")
    with Engine.load(path, n_ctx=64) as e:
        want = e.eval(PROMPT, all_logits=True, aligned=True)
    lo, _ = _budgets(path)
    budget = MemoryBudget(lo)
    with Engine.load(path, n_ctx=64, budget=budget) as e:
        assert e.plan.verdict == "streaming"
        got = e.eval(PROMPT, all_logits=True, aligned=True)
        assert budget.peak == e.plan.planned_peak
    assert np.array_equal(got, want)
