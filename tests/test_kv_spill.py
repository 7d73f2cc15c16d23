"""The KV cache spilled to storage (ramforge.stream.kv_spill): the same logits as the cache in RAM, for
every KV type, after rollbacks and restores; the budget's books; the plan, the profile; the errors."""
from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.errors import ContextLengthExceeded, InvalidArgument, KVSpillError
from ramforge.memory import MemoryBudget
from ramforge.kv.cache import KVCache
from ramforge.stream.kv_spill import SpilledKVCache
from ramforge.kv.types import spill_layout
from tools.make_models import ensure_model

IDS = [(7 * i) % 250 + 1 for i in range(450)]     # 450 positions: past the tail of 320 (f16, tiny shapes)


@pytest.fixture(scope="module")
def tiny():
    return ensure_model("llama", "F16")


@pytest.fixture(scope="module")
def ram_logits(tiny):
    """The in-RAM reference: all logits of IDS, then three decode tokens."""
    with Engine.load(tiny, n_ctx=1024) as eng:
        assert isinstance(eng.kv, KVCache)
        return eng.eval(IDS, all_logits=True), [eng.eval([t])[-1] for t in (5, 9, 11)]


def test_spilled_cache_gives_the_in_ram_logits(tiny, ram_logits, tmp_path):
    want, decode = ram_logits
    b = MemoryBudget()
    with Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=str(tmp_path)) as eng:
        kv = eng.kv
        assert isinstance(kv, SpilledKVCache) and eng.plan.kv_spill and kv.dir == str(tmp_path)
        assert len(kv.files) == 3 and os.listdir(tmp_path) == []   # a file per layer, unlinked once open
        got = eng.eval(IDS, all_logits=True)
        n0 = kv.bytes_read
        steps = [eng.eval([t])[-1] for t in (5, 9, 11)]
        assert kv.spilled > 0 and kv.bytes_read > n0 > 0           # older positions came back from the files
        spill_dir = kv.dir
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, c) for a, c in zip(steps, decode))
    assert spill_dir == str(tmp_path) and os.listdir(tmp_path) == []
    assert b.current == 0


def test_a_failed_read_mid_pass_leaks_nothing_and_the_next_eval_resumes(tiny, ram_logits, monkeypatch):
    _, decode = ram_logits
    b = MemoryBudget()
    with Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=True) as eng:
        eng.eval(IDS)
        before, kv = b.current, eng.kv

        def broken(key, offset, out):
            raise KVSpillError(f"{kv.files[key].path}: read failed (injected)", kv.files[key].path)
        monkeypatch.setattr(kv, "read", broken)
        with pytest.raises(KVSpillError, match="injected"):
            eng.eval([5])
        assert b.current == before and not kv._inflight and kv._held is None and eng.n_past == len(IDS)
        monkeypatch.undo()
        assert np.array_equal(eng.eval([5])[-1], decode[0])
    assert b.current == 0


def test_auto_spill_under_the_budget_reads_only_the_windows_and_leaks_nothing():
    """gemma3's sliding layers (window 8 on 5 of 6 layers) read only their window; a budget short of the
    whole cache spills by itself; the managed peak stays under it; a failed eval leaks nothing."""
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.plan import plan_for_budget
    path = ensure_model("gemma3-linear", "F16")
    ids = IDS[:400]
    with Engine.load(path, n_ctx=1024) as ref:
        want = ref.eval(ids, all_logits=True)
        w1 = ref.eval([3])[-1]
    with GGUFFile(path) as f:
        whole = plan_for_budget(f, None, 1024).min_budget
        limit = whole - 1_000_000                              # not the whole context's cache in RAM
        p = plan_for_budget(f, limit, 1024, kv_spill=None)
        off = plan_for_budget(f, limit, 1024, kv_spill=False)
        near = plan_for_budget(f, whole - 300_000, 1024, kv_spill=None)
        least = plan_for_budget(f, whole - 300_000, 1024, kv_spill=True)
    assert p.kv_spill and p.kv_read_bytes_per_token > 0 and any("spills" in n for n in p.notes)
    assert not off.kv_spill and off.kv_positions < 1024
    # spilling by itself, the tail takes what the weights leave (the same layers pinned as with the least)
    assert near.kv_spill and near.kv_tail > least.kv_tail and near.pinned == least.pinned
    assert least.planned_peak < near.planned_peak <= near.budget
    b = MemoryBudget(limit)
    with Engine.load(path, n_ctx=1024, budget=b) as eng:
        kv = eng.kv
        assert isinstance(kv, SpilledKVCache) and kv.windows == [8, 8, 8, 8, 8, 0]
        got = eng.eval(ids, all_logits=True)
        n0 = kv.bytes_read
        g1 = eng.eval([3])[-1]
        # one decode token: the global layer reads every spilled position, the sliding ones none (in the tail)
        assert kv.spilled > 0 and kv.bytes_read - n0 == kv.spilled * (kv.lay.kpos + kv.lay.vpos)
        assert b.peak <= limit and b.peak == eng.plan.planned_peak
        before = b.current
        with pytest.raises(ContextLengthExceeded):             # a failed eval: nothing held, nothing leaked
            eng.eval(list(range(1, 700)))
        assert b.current == before and not kv._inflight and kv._held is None
    assert np.array_equal(got, want) and np.array_equal(g1, w1) and b.current == 0


@pytest.mark.parametrize("tk, tv", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("f16", "q4_0")])
def test_the_buffers_hold_the_caches_own_bytes_for_each_type(tk, tv):
    """What attention reads from a spilled cache, and what it exports, equals the in-RAM cache's bytes."""
    rng = np.random.default_rng(1)
    L, n_ctx, nkv, hd, batch = 2, 1536, 2, 64, 64
    ram = KVCache(MemoryBudget(), L, n_ctx, nkv, hd, hd, type_k=tk, type_v=tv)
    sp = SpilledKVCache(MemoryBudget(), L, n_ctx, nkv, hd, hd, type_k=tk, type_v=tv, batch=batch, windows=[0, 100])
    try:
        pos = 0
        for n in [batch] * 20 + [1] * 5:
            k, v = (rng.standard_normal((L, n, nkv, hd), np.float32) for _ in range(2))
            sp.begin_pass(pos, n)
            for i in range(L):
                ram.store(i, pos, k[i], v[i])
                sp.store(i, pos, k[i], v[i])
                lo = 0 if i == 0 else max(0, pos - 99)
                for a, c in zip(sp.layer(i), ram.layer(i)):
                    assert np.array_equal(a[lo:pos + n], c[lo:pos + n])
            sp.end_pass()
            pos += n
            sp.n_past = ram.n_past = pos
        assert sp.spilled >= pos - sp.lay.tail and sp.spilled % sp.lay.group == 0
        for a, c in zip(sp.export(pos), ram.export(pos)):
            assert np.array_equal(a, c)
    finally:
        sp.close()


def test_rollback_and_speculative_decoding_match_the_cache_in_ram(tiny):
    prompt = IDS[:400]                                         # the cached sequence: its prefix is reused

    def drafter(ids):                                          # mostly rejected: each pass rolls back
        return np.array([5, 9, 11, 13], np.intc)
    outs = []
    for spill in (False, True):
        with Engine.load(tiny, n_ctx=1024, kv_spill=spill) as eng:
            eng.eval(IDS, all_logits=True)
            eng.reset(100)                                         # back past the positions in the files
            a = eng.eval(IDS[100:400], all_logits=True)
            toks = list(eng.generate(prompt, 8, draft=drafter, stop_on_eog=False, reuse_prefix=True))
            outs.append((a, toks, eng.timings.spec.drafted))
            assert isinstance(eng.kv, SpilledKVCache) == spill
    (a0, t0, d0), (a1, t1, d1) = outs
    assert np.array_equal(a0, a1) and t0 == t1 and d1 == d0 > 0


def test_saved_states_of_a_spilled_cache_restore_anywhere(tiny, ram_logits, tmp_path):
    import tracemalloc

    from ramforge.generation.session import (load_state, load_state_file, read_state, save_state, write_state,
                                             write_state_file)
    want, decode = ram_logits
    with Engine.load(tiny, n_ctx=1024, kv_spill=True) as eng:
        eng.eval(IDS)
        st = save_state(eng)                                   # read back from the files
        write_state(tmp_path / "s.bin", st, eng.path)
        before = eng.budget.current
        tracemalloc.start()
        try:                                                    # streamed through the charged read buffers
            write_state_file(tmp_path / "streamed.bin", eng)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert eng.budget.current == before and peak < st.k.nbytes / 4, (peak, st.k.nbytes)
    assert (tmp_path / "streamed.bin").read_bytes() == (tmp_path / "s.bin").read_bytes()
    for spill in (True, False):
        for streamed in (False, True):
            with Engine.load(tiny, n_ctx=1024, kv_spill=spill) as eng:
                if streamed:
                    before = eng.budget.current
                    tracemalloc.start()
                    try:
                        load_state_file(eng, tmp_path / "streamed.bin")
                        peak = tracemalloc.get_traced_memory()[1]
                    finally:
                        tracemalloc.stop()
                    assert peak < st.k.nbytes / 4 and eng.budget.current - before == (0 if spill else eng.kv.nbytes)
                else:
                    load_state(eng, read_state(tmp_path / "s.bin", eng))
                assert eng.n_past == len(IDS)
                assert np.array_equal(eng.eval([5])[-1], decode[0])
                assert np.array_equal(save_state(eng).k[:, :len(IDS)], st.k)
    raw = bytearray((tmp_path / "streamed.bin").read_bytes())
    raw[-100] ^= 1
    (tmp_path / "bad.bin").write_bytes(bytes(raw))
    from ramforge.errors import StateError
    with Engine.load(tiny, n_ctx=1024, kv_spill=True) as eng:
        with pytest.raises(StateError, match="sha256"):
            load_state_file(eng, tmp_path / "bad.bin")
        assert eng.n_past == 0 and eng.kv.spilled == 0 and eng.tokens == []     # empty, not half restored
        load_state_file(eng, tmp_path / "streamed.bin")
        assert np.array_equal(eng.eval([5])[-1], decode[0])


def test_plan_and_profile_report_the_spill(tiny):
    from click.testing import CliRunner

    from ramforge.cli import cli
    from ramforge.profiling import PROFILE
    r = CliRunner().invoke(cli, ["plan", str(tiny), "--ctx", "1024", "--ram", "1G", "--kv-spill", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    lay = spill_layout(1024, 2, 64, 64, "f16", "f16", p["batch"])
    assert p["kv_spill"] and p["kv_bytes"] == lay.charged(3) and p["kv_spill_file_bytes"] == 3 * lay.buffer_bytes
    assert p["kv_read_bytes_per_token"] == 3 * lay.read_bytes(1023, 1, lay.spilled_at(1023, 1), 0)
    r = CliRunner().invoke(cli, ["plan", str(tiny), "--ctx", "1024", "--ram", "1G", "--kv-spill", "off", "--json"])
    assert r.exit_code == 0 and not json.loads(r.output)["kv_spill"]
    PROFILE.reset()
    PROFILE.enabled = True
    try:
        with Engine.load(tiny, n_ctx=1024, kv_spill=True) as eng:
            eng.eval(IDS)
            n0 = eng.kv.bytes_read
            eng.eval([5])
            eng.eval([6])
            per = (eng.kv.bytes_read - n0) / 2
        s = PROFILE.summary()
    finally:
        PROFILE.enabled = False
        PROFILE.reset()
    assert per > 0 and s["kv_bytes_per_decode_token"] == per
    assert s["passes"][-1]["kv_bytes_read"] == per and s["passes"][-1]["kv"][0]["layer"] == "kv 0"


def test_an_unwritable_directory_is_a_clear_error_and_leaks_nothing(tiny, tmp_path):
    (tmp_path / "file").write_text("x")
    b = MemoryBudget()
    with pytest.raises(KVSpillError, match="not writable") as e:
        Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=str(tmp_path / "file" / "sub"))
    assert e.value.path == str(tmp_path / "file" / "sub") and b.current == 0
    with pytest.raises(InvalidArgument, match="kv_spill"):
        Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=3)
    assert b.current == 0


def test_a_full_disk_is_a_clear_error_with_the_numbers(tiny, tmp_path, monkeypatch):
    import ramforge.stream.kv_spill as ks
    b = MemoryBudget()
    monkeypatch.setattr(ks, "_free_bytes", lambda d: 1000)
    with pytest.raises(KVSpillError, match="1,000 B free") as e:
        Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=str(tmp_path))
    assert e.value.free == 1000 and e.value.needed > 1000 and b.current == 0 and os.listdir(tmp_path) == []
    monkeypatch.undo()

    def full(fd, off, n):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(KVSpillError, match="disk is full") as e:
        Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=str(tmp_path))
    assert e.value.path.endswith(".kv") and b.current == 0 and os.listdir(tmp_path) == []


# ---- the files on the disk: planned size, nothing left behind, never in RAM -----------------------

def _fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_spill_files_keep_to_the_planned_size_and_are_unlinked_while_open(tiny, tmp_path):
    import stat

    from ramforge.errors import InternalError
    with Engine.load(tiny, n_ctx=1024, kv_spill=str(tmp_path)) as eng:
        kv = eng.kv
        sizes = [os.fstat(f.fd).st_size for f in kv.files]
        assert sum(sizes) == eng.plan.kv_spill_file_bytes and len(set(sizes)) == 1
        assert all(os.fstat(f.fd).st_nlink == 0 and stat.S_IMODE(os.fstat(f.fd).st_mode) == 0o600 for f in kv.files)
        assert os.listdir(tmp_path) == []
        if os.path.isdir("/proc/self/fd"):
            assert sum(t.startswith(str(tmp_path)) and t.endswith("(deleted)") for t in _fd_targets()) == 3
        eng.eval(IDS + IDS[:500])                              # close to the whole context
        assert kv.spilled > 512 and [os.fstat(f.fd).st_size for f in kv.files] == sizes
        f = kv.files[0]
        with pytest.raises(InternalError, match="outside its planned"):
            f.write(f.size - 4096, np.zeros(8192, np.uint8))      # never past the planned size
        with pytest.raises(InternalError, match="outside its planned"):
            f.read_into(f.size, np.zeros(4096, np.uint8))
        assert os.fstat(f.fd).st_size == sizes[0]
    with pytest.raises(InternalError, match="the plan said"):
        SpilledKVCache(MemoryBudget(), 3, 1024, 2, 64, 64, file_bytes=eng.plan.kv_spill_file_bytes - 1,
                       directory=str(tmp_path))
    assert os.listdir(tmp_path) == []


KILLED = """
import sys
from ramforge.engine.engine import Engine
eng = Engine.load(sys.argv[1], n_ctx=1024, kv_spill=sys.argv[2])
eng.eval(list(range(1, 450)))
print(eng.kv.spilled, flush=True)
sys.stdin.read()
"""


def test_a_killed_process_leaves_no_spill_file(tiny, tmp_path):
    import signal
    import subprocess
    import sys
    with subprocess.Popen([sys.executable, "-c", KILLED, str(tiny), str(tmp_path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            line = child.stdout.readline()
            assert line.strip() and int(line) > 0, child.stderr.read()
            assert os.listdir(tmp_path) == []                # spilling, and nothing in the directory
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
    assert os.listdir(tmp_path) == []


def _memory_dir() -> str | None:
    from ramforge.stream.kv_spill import memory_filesystem
    return "/dev/shm" if os.path.isdir("/dev/shm") and memory_filesystem("/dev/shm") else None


def test_a_directory_in_ram_is_refused(tiny, tmp_path, monkeypatch):
    import ramforge.stream.kv_spill as ks
    shm = _memory_dir()
    if shm is not None:                                       # a real tmpfs where the machine has one
        b = MemoryBudget()
        d = os.path.join(shm, f"ramforge-test-{os.getpid()}")
        try:
            with pytest.raises(KVSpillError, match="tmpfs, which keeps its files in RAM") as e:
                Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=d)
            assert e.value.path == d and "--kv-spill" in str(e.value) and b.current == 0
            assert not os.path.exists(d) or os.listdir(d) == []
        finally:
            if os.path.isdir(d):
                os.rmdir(d)
    # wherever a directory is on ramfs (told by /proc/self/mountinfo, here pretended)
    monkeypatch.setattr(ks, "memory_filesystem", lambda d: "ramfs" if d.startswith(str(tmp_path)) else None)
    with pytest.raises(KVSpillError, match=f"KV spill directory {tmp_path} is on ramfs"):
        Engine.load(tiny, n_ctx=1024, kv_spill=str(tmp_path))


def test_the_default_directory_falls_back_to_var_tmp_when_tmp_is_in_ram(tiny, tmp_path, monkeypatch):
    import tempfile

    import ramforge.stream.kv_spill as ks
    memory = {str(tmp_path)}
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(ks, "memory_filesystem", lambda d: "tmpfs" if d in memory else None)
    if not os.access("/var/tmp", os.W_OK):
        pytest.skip("/var/tmp is not writable here")
    with Engine.load(tiny, n_ctx=1024, kv_spill=True) as eng:
        assert eng.kv.dir == "/var/tmp"
    memory.add("/var/tmp")
    b = MemoryBudget()
    with pytest.raises(KVSpillError, match=f"the default spill directory {tmp_path} is on tmpfs") as e:
        Engine.load(tiny, n_ctx=1024, budget=b, kv_spill=True)
    assert "TMPDIR" in str(e.value) and b.current == 0


def test_mountinfo_is_read_for_the_deepest_mount(tmp_path, monkeypatch):
    import builtins
    import io

    import ramforge.stream.kv_spill as ks
    info = ("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
            "30 22 0:5 / /mnt/fast\\040disk rw - tmpfs tmpfs rw\n"
            "31 30 8:2 / /mnt/fast\\040disk/real rw - xfs /dev/sdb rw\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: io.StringIO(info) if f == "/proc/self/mountinfo"
                        else real_open(f, *a, **k))
    assert ks.memory_filesystem("/mnt/fast disk/x") == "tmpfs"
    assert ks.memory_filesystem("/mnt/fast disk/real/x") is None
    assert ks.memory_filesystem("/mnt/fast disk2") is None and ks.memory_filesystem("/home") is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_quantized_types_through_the_engine(tiny, kind):
    ids = [(11 * i) % 250 + 1 for i in range(1300)]          # past the tail of 1024 (groups of 512)
    with Engine.load(tiny, n_ctx=1536, type_k=kind, type_v=kind) as ref:
        want = ref.eval(ids, all_logits=True)
    with Engine.load(tiny, n_ctx=1536, type_k=kind, type_v=kind, kv_spill=True) as eng:
        got = eng.eval(ids, all_logits=True)
        assert eng.kv.spilled > 0 and eng.kv.bytes_read > 0
    assert np.array_equal(got, want)


@pytest.mark.slow
def test_default_model_spilled_gives_the_in_ram_logits(default_model):
    ids = [(37 * i) % 5000 + 2 for i in range(900)]
    with Engine.load(default_model, n_ctx=1024) as ref:
        want = ref.eval(ids, all_logits=True)
        w1 = ref.eval([5])[-1]
    b = MemoryBudget("64M")
    with Engine.load(default_model, n_ctx=1024, budget=b, kv_spill=True) as eng:
        got = eng.eval(ids, all_logits=True)
        g1 = eng.eval([5])[-1]
        assert eng.kv.spilled > 0 and eng.kv.bytes_read > 0 and b.peak <= b.limit
    assert np.array_equal(got, want) and np.array_equal(g1, w1) and b.current == 0


def test_the_server_passes_its_kv_spill_on(tiny):
    from ramforge.server.common import ServerConfig
    from ramforge.server.manager import ModelManager, Target
    from ramforge.store.modelfile import ModelConfig
    m = ModelManager(ServerConfig(kv_spill=True))._load(Target("tiny", str(tiny), ModelConfig()), 1024)
    try:
        assert isinstance(m.engine.kv, SpilledKVCache)
    finally:
        m.close()


def test_run_with_kv_spill_prints_the_tokens_of_the_cache_in_ram(tiny, tmp_path):
    """`ramforge run --kv-spill DIR` (and bare --kv-spill) generates what the cache in RAM does; a context
    shift, which moves KV cells, is refused with a spilled cache, naming the fix."""
    from click.testing import CliRunner

    from ramforge.cli import cli
    base = ["run", str(tiny), "-p", "Once upon a time", "-n", "12", "--ctx", "512", "--temp", "0", "--json"]
    outs = []
    for extra in (["--kv-spill", "off"], ["--kv-spill", str(tmp_path)], ["--kv-spill"]):
        r = CliRunner().invoke(cli, base + extra)
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.output.strip().splitlines()[-1])["completion_tokens"])
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 12
    assert not os.listdir(tmp_path)                  # the spill's files are gone with the engine
    r = CliRunner().invoke(cli, base + ["--kv-spill", "--context-shift"])
    assert r.exit_code != 0 and "--kv-spill off" in str(r.exception)


def test_parallel_sequences_are_refused_with_a_spilled_cache(tiny):
    with pytest.raises(InvalidArgument, match="--kv-spill off"):
        Engine.load(tiny, n_ctx=1024, kv_spill=True, n_seq=2)


def test_serve_refuses_kv_spill_with_parallel_slots_or_a_context_shift(tiny):
    from click.testing import CliRunner

    from ramforge.cli import cli
    for extra in (["--parallel", "2"], ["--context-shift"]):
        r = CliRunner().invoke(cli, ["serve", str(tiny), "--kv-spill", *extra])
        assert r.exit_code == 2 and "--kv-spill is not supported with --parallel or --context-shift" in r.output
