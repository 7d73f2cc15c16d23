"""Several sequences in one KV cache (ramforge.engine.parallel) against llama.cpp's batched decode, and
llama-server's context shift, replayed from tests/fixtures/parallel/ (tools/record_parallel.py).

The records of the small synthetic F16 models replay in CI; the others (Q8_0 weights, the 270m model)
are slow; `-m oracle` re-records a case live through llama-cpp-python's low-level API and compares."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from ramforge.generation.batcher import replay as replay_passes
from ramforge.engine.engine import Engine
from ramforge.errors import ContextLengthExceeded, InvalidArgument, NotReproduced

FIX = Path(__file__).parent / "fixtures" / "parallel"
RECORDS = sorted(FIX.glob("*.json"))
FAST = ("llama-tiny-f16-par2", "llama-tiny-f16-par4", "llama-tiny-f16-shift", "gemma3-linear-f16-par4",
        "llama-tiny-f16-par4-q8kv", "llama-tiny-f16-cp2", "llama-tiny-f16-join4", "gemma3-linear-f16-join4")


def _load(p: Path) -> dict:
    return json.loads(p.read_text())


def _model(rec: dict):
    from tools.record_parallel import model_file
    return model_file(rec["model"]["id"])


def _sha(row: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(row, np.float32).tobytes()).hexdigest()[:16]


def replay(eng: Engine, steps: list) -> list[str]:
    """Feed the record's steps; the mismatches (empty: every logits row bit-exact)."""
    bad = []
    for i, st in enumerate(steps):
        if "rm" in st:
            eng.seq_rm(*st["rm"])
        elif "add" in st:
            eng.seq_add(*st["add"])
        elif "cp" in st:
            eng.seq_cp(*st["cp"])
        else:
            for s, _, p0 in st["decode"]:
                assert eng.seq_pos_max(s) + 1 == p0, f"step {i}: sequence {s} at {eng.seq_pos_max(s) + 1}, record {p0}"
            got = eng.eval_batch([(s, t) for s, t, _ in st["decode"]])
            for s, want in st["out"].items():
                row = got[int(s)]
                if _sha(row) != want["sha"][0]:
                    top = want["top_ids"][0][0]
                    bad.append(f"step {i} seq {s}: argmax {int(np.argmax(row))} vs {top}, "
                               f"top {row[top]!r} vs {want['top_vals'][0][0]!r}")
    return bad


def _params():
    for p in RECORDS:
        marks = [] if p.stem in FAST else [pytest.mark.slow]
        yield pytest.param(p, marks=marks, id=p.stem)


@pytest.mark.parametrize("path", list(_params()))
def test_replay_equals_llama_cpp(path):
    rec = _load(path)
    o = rec["oracle"]
    with Engine.load(_model(rec), n_ctx=o["n_ctx"], n_seq=o["n_seq_max"], type_k=o.get("type_k", "f16"),
                     type_v=o.get("type_v", "f16")) as eng:
        assert eng.n_ctx == o["n_ctx"] // o["n_seq_max"]
        assert replay(eng, rec["steps"]) == []


@pytest.mark.parametrize("path", [p for p in _params() if p.values[0].stem.endswith("-shift")])
def test_generate_context_shift_equals_llama_server(path):
    """Engine.generate(context_shift=True) shifts where llama-server does and yields its greedy tokens."""
    rec = _load(path)
    steps = rec["steps"]
    prompt = steps[0]["decode"][0][1]
    want = [s["out"]["0"]["top_ids"][0][0] for s in steps if "out" in s]
    with Engine.load(_model(rec), n_ctx=rec["oracle"]["n_ctx"]) as eng:
        got = list(eng.generate(prompt, len(want), stop_on_eog=False, context_shift=True,
                                n_keep=rec["oracle"]["n_keep"]))
        assert got == want
        assert eng.kv.celled and eng.n_past < eng.n_ctx


def test_single_sequence_cells_equal_plain_path():
    """A sequence in KV cells (no holes) computes as the plain path, bit for bit; a reset returns to it."""
    from tools.make_models import ensure_model
    with Engine.load(ensure_model("llama", "f16"), n_ctx=256) as eng:
        prompt = [1, 15043, 29892, 920, 526]
        a = eng.eval(prompt, aligned=True)[-1]
        b = eng.eval([29871])[-1]
        eng.reset(0)
        eng.kv.cells_on()
        assert np.array_equal(eng.eval_batch([(0, prompt)])[0], a)
        assert np.array_equal(eng.eval([29871])[-1], b)
        assert eng.tokens == prompt + [29871]
        eng.seq_rm(0, 3, -1)                                  # a tail removed: plain again
        assert not eng.kv.celled and eng.n_past == 3 and eng.tokens == prompt[:3]


def test_bad_input_is_refused():
    from tools.make_models import ensure_model
    with Engine.load(ensure_model("llama", "f16"), n_ctx=512, n_seq=2) as eng:
        assert eng.n_ctx == 256
        with pytest.raises(InvalidArgument):
            eng.eval_batch([(2, [1])])                        # sequence id out of range
        with pytest.raises(InvalidArgument):
            eng.eval_batch([(0, [1]), (0, [2])])
        with pytest.raises(InvalidArgument):
            list(eng.generate([1, 2], 4, context_shift=True, n_keep=256))
        half = eng.plan.batch // 2 + 1
        with pytest.raises(NotReproduced):                    # a ubatch of 2 sequences' prompts past the chunk
            eng.eval_batch([(0, [1] * half), (1, [3] * half)])
        assert eng.seq_pos_max(0) == eng.seq_pos_max(1) == -1    # ... leaves no cells behind
        with pytest.raises(ContextLengthExceeded):
            eng.eval_batch([(1, [1] * 257)])
        assert eng.seq_pos_max(1) == -1


def test_shift_refused_where_not_reproduced():
    """A sliding-window model whose window cache would reuse other cells, a quantized K cache: refused."""
    from tools.make_models import ensure_model
    with Engine.load(ensure_model("gemma3-linear", "f16"), n_ctx=256) as eng:
        eng.eval_batch([(0, list(range(1, 30)))])
        eng.seq_rm(0, 5, 15)
        eng.seq_add(0, 15, 29, -10)
        with pytest.raises(NotReproduced):
            eng.eval_batch([(0, [7])])
    with Engine.load(ensure_model("llama", "f16"), n_ctx=256, type_k="q8_0", type_v="q8_0") as eng:
        eng.eval([1, 2, 3], aligned=True)
        with pytest.raises(NotReproduced):
            eng.seq_add(0, 1, 3, -1)


@pytest.mark.oracle
@pytest.mark.parametrize("mid,case", [("llama-tiny-f16", "par4"), ("llama-tiny-f16", "shift")])
def test_live_oracle(mid, case):
    """Recorded again now through llama-cpp-python: ramforge replays it bit-exactly."""
    from tools.record_parallel import record
    rec = record(mid, case)
    o = rec["oracle"]
    with Engine.load(_model(rec), n_ctx=o["n_ctx"], n_seq=o["n_seq_max"]) as eng:
        assert replay(eng, rec["steps"]) == []


def test_model_context_shift_greedy_equals_llama_server():
    """api.Model(context_shift=True): a greedy stream past the context equals llama-server's tokens;
    n_keep beyond the context is refused; without the shift the same request does not fit."""
    import ramforge
    rec = _load(FIX / "llama-tiny-f16-shift.json")
    steps = rec["steps"]
    prompt = steps[0]["decode"][0][1]
    want = [s["out"]["0"]["top_ids"][0][0] for s in steps if "out" in s]
    with ramforge.Model(str(_model(rec)), n_ctx=256, context_shift=True) as m:
        last = list(m.stream(prompt, len(want), temperature=0, repeat_penalty=1.0, n_keep=rec["oracle"]["n_keep"]))[-1]
        got = last.tokens
        assert got == want[:len(got)] and len(got) > 256 - len(prompt), (len(got), last.finish_reason)
        with pytest.raises(InvalidArgument):
            list(m.stream(prompt, 4, n_keep=256))
    with ramforge.Model(str(_model(rec)), n_ctx=256) as m:
        with pytest.raises(ContextLengthExceeded):
            list(m.stream(prompt, 300, temperature=0))


@pytest.mark.slow
def test_servers_context_shift():
    """serve --context-shift: both APIs generate past the context; num_keep / n_keep beyond it is a 400."""
    import httpx
    import uvicorn

    from ramforge.server.app import create_app
    from ramforge.server.common import ServerConfig
    from tests.serving import serving
    app = create_app(ServerConfig(ram="400M", n_ctx=256, keep_alive=600, context_shift=True))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        http = httpx.Client(base_url=url, timeout=300)
        r = http.post("/api/generate", json={"model": "default", "prompt": "Once upon a time", "stream": False,
                                             "options": {"temperature": 0, "num_predict": 270, "num_keep": 4}})
        assert r.status_code == 200 and r.json()["eval_count"] == 270, r.text
        r = http.post("/api/generate", json={"model": "default", "prompt": "Hi", "stream": False,
                                             "options": {"num_predict": 4, "num_keep": 300}})
        assert r.status_code == 400 and "n_keep" in r.text
        r = http.post("/v1/completions", json={"model": "default", "prompt": "Hi", "max_tokens": 4, "n_keep": 999})
        assert r.status_code == 400 and "n_keep" in r.text
        r = http.post("/v1/completions", json={"model": "default", "prompt": "Once", "max_tokens": 260,
                                               "temperature": 0, "n_keep": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 260, r.text


def test_batcher_joins_and_leaves_between_passes():
    """Five concurrent greedy requests on four slots: each answer equals a replay of the scheduler's
    passes through eval_batch on a fresh engine; the fifth waits for a slot; all slots end free."""
    import threading

    from ramforge.generation.batcher import Batcher
    from ramforge.errors import ServerBusy
    from tools.make_models import ensure_model
    path = ensure_model("llama", "f16")
    prompts = [[1, 15043, 29892], [1, 450, 4996, 17354, 1701], [1, 3532], [1, 1724, 338, 278], [1, 376, 1576]]
    lens = [6, 9, 3, 7, 5]
    with Engine.load(path, n_ctx=1024, n_seq=4) as eng:
        b = Batcher(eng, log=True)
        got = [None] * 5

        def run(i):
            got[i] = list(b.generate(prompts[i], lens[i], stop_on_eog=False))
        ts = [threading.Thread(target=run, args=(i,)) for i in range(5)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert b.free == [0, 1, 2, 3] and not b.active and (eng.kv.cell_pos < 0).all()
        b.max_wait = 0.01
        b.free.clear()
        with pytest.raises(ServerBusy):
            b.generate([1, 2], 2)
        b.free[:] = [0, 1, 2, 3]
        b.close()
        schedule = b.schedule
    assert [len(g) for g in got] == lens
    with Engine.load(path, n_ctx=1024, n_seq=4) as eng:
        segs = replay_passes(eng, schedule)
    assert len(schedule) < sum(lens)                            # passes were shared
    for i, p in enumerate(prompts):
        seg = next(o for t, o in segs if t == list(p))
        assert seg[:lens[i]] == got[i]


def test_batcher_joins_waiting_prompts_in_one_pass():
    """Prompts waiting together join one pass (llama-server's update_slots), in slot order, up to the
    engine's chunk of prompt tokens; the answers equal a replay of the passes through eval_batch."""
    from ramforge.generation.batcher import Batcher
    from tools.make_models import ensure_model
    path = ensure_model("llama", "f16")
    prompts = [[1, 15043, 29892, 920], [1, 450, 4996, 17354], [1, 3532, 29879, 6778], [1, 1724, 338]]
    with Engine.load(path, n_ctx=1024, n_seq=4) as eng:
        b = Batcher(eng, log=True)
        with b.cond:                                 # (reentrant) the scheduler waits until all four are queued
            gens = [b.generate(p, 5, stop_on_eog=False) for p in prompts]
        got = [list(g) for g in gens]
        b.close()
        long = Batcher(eng, log=True)                # 2 x (chunk / 2 + 1) prompt tokens exceed the chunk
        half = eng.plan.batch // 2 + 1
        with long.cond:
            gens = [long.generate([1] + [450 + i] * (half - 1), 2, stop_on_eog=False) for i in range(2)]
        [list(g) for g in gens]
        long.close()
    assert [[s for s, _ in e] for e in b.schedule[:1]] == [[0, 1, 2, 3]]
    assert [len(t) for _, t in b.schedule[0]] == [4, 4, 4, 3]
    assert [[len(t) for _, t in e] for e in long.schedule[:2]] == [[half], [1, half]]
    with Engine.load(path, n_ctx=1024, n_seq=4) as eng:
        segs = replay_passes(eng, b.schedule)
    for p, g in zip(prompts, got):
        assert next(o for t, o in segs if t == p) == g


@pytest.mark.slow
def test_serve_parallel_through_the_openai_client():
    """serve --parallel 4 with gemma-3-270m: four concurrent greedy requests through the official
    openai client share passes; each answer is what a replay of the server's passes through
    eval_batch gives; the slots are free afterwards, and the lock was not held while they generated."""
    from concurrent.futures import ThreadPoolExecutor

    import openai
    import uvicorn

    from ramforge.store.resolve import default_model_path
    from ramforge.server.app import create_app
    from ramforge.server.common import ServerConfig
    from tests.serving import serving
    app = create_app(ServerConfig(model="default", ram="600M", n_ctx=1024, keep_alive=600, parallel=4))
    prompts = ["Name three colours.", "Count to five.", "What is the capital of France?", "Say hello."]
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        m = app.state.manager
        client.completions.create(model="default", prompt="Hi", max_tokens=1)      # load the model
        model = m.current.model
        model.batcher.schedule = []

        def ask(p):
            return client.completions.create(model="default", prompt=p, max_tokens=12, temperature=0,
                                             extra_body={"repeat_penalty": 1.0})
        with ThreadPoolExecutor(4) as ex:
            answers = list(ex.map(ask, prompts))
        schedule = list(model.batcher.schedule)
        assert m.busy == 0 and model.batcher.free == [0, 1, 2, 3] and not m.lock.locked()
        ids = [model.tokenize(p, add_bos=True) for p in prompts]
        detok = model.detokenize
    assert len(schedule) < sum(a.usage.completion_tokens for a in answers)     # passes were shared
    with Engine.load(default_model_path(), n_ctx=1024, n_seq=4) as eng:
        segs = replay_passes(eng, schedule)
    for p, a in zip(ids, answers):
        seg = next(o for t, o in segs if t == p)
        n = a.usage.completion_tokens
        assert a.choices[0].text == detok(seg[:n]).decode("utf-8", "replace")


def test_cli_run_context_shift():
    """`ramforge run --context-shift --keep N` generates past --ctx; without it the request does not fit."""
    from click.testing import CliRunner

    from ramforge.cli import cli
    from tools.make_models import ensure_model
    path = str(ensure_model("llama", "f16"))
    args = ["run", path, "-p", "Once upon a time", "-n", "300", "--ctx", "256", "--temp", "0", "--json"]
    r = CliRunner().invoke(cli, args + ["--context-shift", "--keep", "4"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["timings"]["gen_tokens"] > 256 or out.get("finish_reason") == "stop", out
    r = CliRunner().invoke(cli, args)
    assert r.exit_code != 0 and isinstance(r.exception, ContextLengthExceeded)


def test_each_slot_is_charged_for_its_own_cells():
    """A sequence's cells are charged to the budget in its own stream (whole chunks), not as rows up to
    its stream's place in the cache; seq_rm keeps the charge (as the plain path's reset)."""
    from tools.make_models import ensure_model
    with Engine.load(ensure_model("llama", "f16"), n_ctx=1024, n_seq=4) as eng:
        kv = eng.kv
        eng.eval_batch([(3, [1, 2, 3])])
        assert kv.caps == [0, 0, 0, kv.chunk] and kv.nbytes == kv.chunk * kv.bytes_per_pos
        eng.eval_batch([(0, [1]), (1, [1])])
        assert kv.caps == [kv.chunk, kv.chunk, 0, kv.chunk] and kv.nbytes == 3 * kv.chunk * kv.bytes_per_pos


def test_plan_leaves_room_for_every_streams_padded_cells():
    """n_ctx 512 over 4 sequences is 4 streams of 256 cells (1024 rows): the plan under a budget takes
    the padding's bytes out of the weights' share, so every stream can fill up. At 64M gemma's plan
    left 3.4 MB for a 9.4 MB padding, and the fourth stream failed with KVBudgetExceeded."""
    from ramforge.memory import MemoryBudget
    from ramforge.store.resolve import default_model_path
    with Engine.load(default_model_path(), n_ctx=512, budget=MemoryBudget("64M"), n_seq=4) as eng:
        kv = eng.kv
        assert kv.n_ctx_seq == 256 and eng.plan.n_ctx == 512
        for s in range(4):
            kv.reserve(kv.n_ctx_seq, s)
        assert kv.nbytes == 4 * 256 * kv.bytes_per_pos
