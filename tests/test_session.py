"""Saved states (ramforge.generation.session): a restored conversation answers as the uninterrupted one, in the
same process and after a restart; bad state files are refused and leave the sequence empty; the
prompt cache resumes alternating conversations."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from ramforge import Model
from ramforge.errors import InvalidArgument, StateError
from ramforge.generation.session import MAGIC, PromptCache, State, model_sha256, read_state, write_state

GREEDY = {"temperature": 0}
TURN1 = "Q: Name three colours of the rainbow.\nA:"
OTHER = "Write the numbers from one to ten in words:"


@pytest.fixture(scope="module")
def model():
    with Model("default", n_ctx=256) as m:
        yield m


def _turns(m):
    """(first turn's answer, second turn's prompt ids): a conversation that continues the first."""
    r1 = m.generate(TURN1, 12, **GREEDY)
    ids2 = m.tokenize(TURN1) + r1.tokens + m.tokenize("\nQ: And two more?\nA:", add_bos=False)
    return r1, ids2


def test_a_restored_conversation_answers_as_the_uninterrupted_one(model, tmp_path):
    m = model
    m.engine.reset(0)
    _, ids2 = _turns(m)
    straight = m.generate(ids2, 16, **GREEDY)

    m.engine.reset(0)
    _turns(m)
    state, path = m.save_state(), tmp_path / "turn1.state"
    n_written = m.save_state_file(path)
    assert n_written == path.stat().st_size and state.n_tokens == m.engine.n_past > 0
    m.generate(OTHER, 8, **GREEDY)                             # another conversation in between
    m.load_state(state)
    again = m.generate(ids2, 16, **GREEDY)
    assert again.tokens == straight.tokens
    assert again.prompt_eval_tokens == straight.prompt_eval_tokens < len(ids2)   # resumed, not recomputed
    # after a restart: a new Model, the state read from its file
    with Model("default", n_ctx=256) as fresh:
        fresh.load_state(path)
        restarted = fresh.generate(ids2, 16, **GREEDY)
    assert restarted.tokens == straight.tokens and restarted.prompt_eval_tokens == straight.prompt_eval_tokens


def _refused(m, path, why):
    m.generate(OTHER, 2, **GREEDY)
    with pytest.raises(StateError, match=why):
        m.load_state(path)
    assert m.engine.n_past == 0 and m.engine.tokens == []            # left empty, never half-filled


def test_bad_state_files_are_refused(model, tmp_path):
    m = model
    m.engine.reset(0)
    m.generate(TURN1, 4, **GREEDY)
    good = tmp_path / "good.state"
    m.save_state_file(good)
    raw = good.read_bytes()
    n_header = struct.unpack("<I", raw[len(MAGIC):len(MAGIC) + 4])[0]
    body = len(MAGIC) + 4 + n_header

    def variant(name, data):
        p = tmp_path / name
        p.write_bytes(data)
        return p

    _refused(m, variant("magic", b"X" + raw[1:]), "not a ramforge state file")
    _refused(m, variant("cut", raw[:-7]), "truncated or damaged")
    flipped = bytearray(raw)
    flipped[-3] ^= 0x40
    _refused(m, variant("flip", bytes(flipped)), "do not match their sha256")
    header = json.loads(raw[len(MAGIC) + 4:body])
    for key, value, why in (("model_sha256", "0" * 64, "another model"),
                            ("head_dim_k", header["head_dim_k"] * 2, "head_dim_k"),
                            ("type_k", "q8_0", "type_k")):
        h = json.dumps({**header, key: value}).encode()
        _refused(m, variant(key, MAGIC + struct.pack("<I", len(h)) + h + raw[body:]), why)
    _refused(m, variant("huge", MAGIC + struct.pack("<I", 1 << 30) + raw[body:]), "damaged")
    _refused(m, tmp_path / "missing.state", "cannot read")
    # tokens outside the vocabulary, in a file whose sha256 is right
    st = read_state(good, m.engine)
    bad = State(st.tokens.copy(), st.k, st.v, st.shape)
    bad.tokens[1] = m.engine.hp.n_vocab
    write_state(tmp_path / "vocab.state", bad, m.path)
    _refused(m, tmp_path / "vocab.state", f"token id {m.engine.hp.n_vocab}")
    m.load_state(good)                                              # the good one still loads
    assert m.engine.n_past == st.n_tokens


def test_hostile_state_headers_are_refused_as_damaged(model, tmp_path):
    """robustness/hostile_files.py's headers (1e999, NaN, 5,000 digits, nested 30,000 deep, mistyped
    n_tokens, ...): each a StateError (damaged), the sequence left empty; the good file still loads."""
    from robustness.hostile_files import hostile_headers

    m = model
    m.engine.reset(0)
    m.generate(TURN1, 4, **GREEDY)
    good = tmp_path / "good.state"
    m.save_state_file(good)
    raw = good.read_bytes()
    body = len(MAGIC) + 4 + struct.unpack("<I", raw[len(MAGIC):len(MAGIC) + 4])[0]
    for i, (name, h) in enumerate(hostile_headers(json.loads(raw[len(MAGIC) + 4:body])).items()):
        p = tmp_path / f"hostile-{i}.state"
        p.write_bytes(MAGIC + struct.pack("<I", len(h)) + h + raw[body:])
        with pytest.raises(StateError, match="damaged|another context shape") as e:
            m.load_state(p)
        assert m.engine.n_past == 0, name
        with pytest.raises(StateError):
            read_state(p, m.engine)
        assert len(str(e.value)) < 400, name
    m.load_state(good)                                              # the good one still loads


def test_a_gone_client_stops_state_files_between_layers(model, tmp_path):
    """Save and restore check ramforge.cancel a layer at a time: a client gone mid-way stops them with
    ClientDisconnected; a save leaves no file (nor temporary), a restore an empty sequence, the budget as before."""
    from ramforge import cancel
    from ramforge.errors import ClientDisconnected

    m = model
    m.engine.reset(0)
    m.generate(TURN1, 4, **GREEDY)
    good = tmp_path / "good.state"
    m.save_state_file(good)
    budget = m.engine.budget.current
    checks = []

    def gone_at_third_layer():
        checks.append(1)
        return len(checks) > 3

    for act in (lambda: m.save_state_file(tmp_path / "cut.state"), lambda: m.load_state(good)):
        checks.clear()
        token = cancel.INTERRUPT.set(gone_at_third_layer)
        try:
            with pytest.raises(ClientDisconnected):
                act()
        finally:
            cancel.INTERRUPT.reset(token)
        assert 3 < len(checks) < 2 * m.engine.kv.k.shape[0]              # stopped mid-way, not at the end
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.state"]
    assert m.engine.n_past == 0 and m.engine.tokens == [] and m.engine.budget.current <= budget
    m.load_state(good)                                              # nothing else changed
    assert m.engine.n_past > 0


def test_a_state_longer_than_the_context_is_refused(model, tmp_path):
    model.engine.reset(0)
    model.generate(TURN1, 4, **GREEDY)
    path = tmp_path / "long.state"
    model.save_state_file(path)
    with Model("default", n_ctx=8) as small:
        with pytest.raises(StateError, match="this context holds 8"):
            small.load_state(path)
        assert small.engine.n_past == 0


def test_prompt_cache_resumes_alternating_conversations(model):
    m = model
    a = m.tokenize(TURN1)
    b = m.tokenize(OTHER)
    m.engine.reset(0)
    plain = [m.generate(p, 6, **GREEDY) for p in (a, b, a)]
    m.engine.reset(0)
    cache = PromptCache("64M")
    m.set_cache(cache)
    try:
        cached = [m.generate(p, 6, **GREEDY) for p in (a, b, a)]
    finally:
        m.set_cache(None)
    assert [r.tokens for r in cached] == [r.tokens for r in plain]
    assert plain[2].prompt_eval_tokens == len(a) - 1                # recomputed past the shared BOS
    assert cached[2].prompt_eval_tokens == 1                        # resumed: only the last token again
    assert len(cache) >= 1 and 0 < cache.nbytes <= cache.budget.limit
    cache.close()
    assert cache.nbytes == 0


def test_prompt_cache_keeps_to_its_capacity(model):
    m = model
    m.engine.reset(0)
    m.generate(TURN1, 4, **GREEDY)
    one = m.save_state()
    cache = PromptCache(one.nbytes * 2 + 100)
    for i in range(4):
        st = State(one.tokens.copy(), one.k, one.v, one.shape)
        st.tokens[-1] = i
        assert cache.put(st)
    assert len(cache) == 2 and cache.nbytes <= cache.budget.limit
    assert not PromptCache(10).put(one)                             # larger than the whole cache
    with pytest.raises(InvalidArgument):
        PromptCache(0)
    assert isinstance(np.asarray(one.tokens), np.ndarray)


def test_a_quantized_cache_restores_and_another_kv_type_is_refused(tmp_path):
    with Model("default", n_ctx=256, type_k="q8_0", type_v="q4_0") as q:
        _, ids2 = _turns(q)
        straight = q.generate(ids2, 8, **GREEDY)
        q.engine.reset(0)
        _turns(q)
        path = tmp_path / "q.state"
        q.save_state_file(path)
        q.generate(OTHER, 4, **GREEDY)
        q.load_state(path)
        assert q.generate(ids2, 8, **GREEDY).tokens == straight.tokens
    with Model("default", n_ctx=256) as f16:
        with pytest.raises(StateError, match="type_k: q8_0 vs f16"):
            f16.load_state(path)
        assert f16.engine.n_past == 0


# ---- the files themselves: private, exclusive, regular, streamed ------------------------------------

def test_state_files_are_private_and_replace_only_state_files(model, tmp_path):
    import stat
    m = model
    m.engine.reset(0)
    m.generate(TURN1, 4, **GREEDY)
    path = tmp_path / "s.state"
    m.save_state_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not list(tmp_path.glob(".*tmp"))
    m.save_state_file(path)                                         # a state file of that name: replaced
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name, make in (("link.state", lambda p: p.symlink_to(victim)), ("other.txt", lambda p: p.write_text("x"))):
        target = tmp_path / name
        make(target)
        with pytest.raises(StateError, match="is not a ramforge state file: it is not replaced"):
            m.save_state_file(target)
        assert victim.read_text() == "precious" and (target.is_symlink() or target.read_text() == "x")
    # the old predictable temporary name, planted as a link, is never written through
    import os
    planted = tmp_path / f".new.state.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    m.save_state_file(tmp_path / "new.state")
    assert victim.read_text() == "precious" and planted.is_symlink()
    assert sorted(p.name for p in tmp_path.glob(".*tmp")) == [planted.name]


def test_only_regular_files_are_restored_and_nothing_blocks(model, tmp_path):
    import os
    import threading
    m = model
    m.engine.reset(0)
    m.generate(TURN1, 4, **GREEDY)
    good = tmp_path / "good.state"
    m.save_state_file(good)
    fifo = tmp_path / "fifo.state"
    os.mkfifo(fifo)
    link = tmp_path / "link.state"
    link.symlink_to(good)
    cases = [(fifo, "not a regular file"), (link, "symbolic link"), (tmp_path, "not a regular file")]
    if os.path.exists("/dev/null"):
        cases.append(("/dev/null", "not a regular file"))
    for path, why in cases:
        done = []

        def restore():
            try:
                _refused(m, path, why)
                done.append(True)
            except BaseException as e:          # reported below
                done.append(e)
        t = threading.Thread(target=restore, daemon=True)
        t.start()
        t.join(30)
        assert done == [True], (path, done or "blocked")
    m.load_state(good)
    assert m.engine.n_past > 0


def test_state_files_stream_without_a_copy_of_the_cache(model, tmp_path):
    """save_state_file / load_state_file move the cache a layer at a time: their peak allocation is a
    fraction of the cache they write, and the budget's books end as they began."""
    import tracemalloc
    m = model
    m.engine.reset(0)
    m.generate(OTHER + " " + TURN1 * 3, 8, **GREEDY)
    n = m.engine.n_past
    cache_bytes = n * m.engine.kv.bytes_per_pos
    path = tmp_path / "big.state"
    before = m.budget.current
    model_sha256(m.path)                                            # hashed once, before measuring
    tracemalloc.start()
    try:
        written = m.save_state_file(path)
        _, peak_save = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        m.engine.reset(0)
        m.load_state(path)
        _, peak_load = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written > cache_bytes > 500_000 and m.engine.n_past == n
    assert peak_save < cache_bytes / 4 and peak_load < cache_bytes / 4, (peak_save, peak_load, cache_bytes)
    assert m.budget.current == before
    kv_bytes = m.engine.kv.nbytes
    # the file is the one write_state writes from a copy
    copy = tmp_path / "copy.state"
    write_state(copy, m.save_state(), m.path)
    assert copy.read_bytes() == path.read_bytes()
    # a damaged file: the sequence empty, its KV charge given back
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    (tmp_path / "bad.state").write_bytes(bytes(raw))
    with pytest.raises(StateError, match="sha256"):
        m.load_state(tmp_path / "bad.state")
    assert m.engine.n_past == 0 and m.engine.kv.nbytes == 0 and m.budget.current == before - kv_bytes
