"""llama-server's slot save/restore/erase and the prompt cache (--cache-ram) through `ramforge serve`,
with the official openai client: a restored conversation's next answer equals the uninterrupted one,
in the same server and after a restart."""
from __future__ import annotations

import pytest

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from types import SimpleNamespace  # noqa: E402

from ramforge.server import ServerConfig, create_app  # noqa: E402
from tests.serving import serving  # noqa: E402

TURN1 = [{"role": "user", "content": "Name a colour of the rainbow."}]
OTHER = [{"role": "user", "content": "Count from one to five."}]


def _server(**cfg):
    app = create_app(ServerConfig(ram="400M", n_ctx=512, keep_alive=600, **cfg))
    return app, serving(uvicorn.Server(uvicorn.Config(app, log_level="warning")))


@pytest.fixture(scope="module")
def slots_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(slots_dir):
    app, ctx = _server(slot_save_path=str(slots_dir), cache_ram="64M")
    with ctx as (url, _):
        yield SimpleNamespace(app=app, http=httpx.Client(base_url=url, timeout=120),
                              openai=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))


def _ask(s, messages, n=12):
    r = s.openai.chat.completions.create(model="default", messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens


def _action(s, action, filename=None, slot=0):
    return s.http.post(f"/slots/{slot}", params={"action": action},
                       json={"filename": filename} if filename else None)


def _turn2(answer1):
    return TURN1 + [{"role": "assistant", "content": answer1}, {"role": "user", "content": "And another one?"}]


def test_restore_resumes_the_conversation_as_uninterrupted(server, slots_dir):
    a1, _ = _ask(server, TURN1)
    straight, straight_cached = _ask(server, _turn2(a1))            # the uninterrupted second turn
    assert _action(server, "erase").json()["n_erased"] > 0
    assert _ask(server, TURN1)[0] == a1
    saved = _action(server, "save", "conv1.bin").json()
    assert saved["n_saved"] > 0 and saved["n_written"] == (slots_dir / "conv1.bin").stat().st_size
    assert not list(slots_dir.glob(".*tmp"))                        # written under a temporary name, renamed
    _action(server, "erase")
    _ask(server, OTHER)                                             # another conversation in between
    r = _action(server, "restore", "conv1.bin").json()
    assert r["n_restored"] == saved["n_saved"] and r["n_read"] == saved["n_written"]
    again, again_cached = _ask(server, _turn2(a1))
    assert again == straight and again_cached == straight_cached > 0
    # a restarted server restores from the same file
    app, ctx = _server(slot_save_path=str(slots_dir))
    with ctx as (url, _):
        s2 = SimpleNamespace(http=httpx.Client(base_url=url, timeout=120),
                             openai=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
        assert _action(s2, "restore", "conv1.bin").json()["n_restored"] == saved["n_saved"]
        assert _ask(s2, _turn2(a1)) == (straight, straight_cached)


def test_prompt_cache_resumes_alternating_conversations(server):
    _action(server, "erase")
    _ask(server, TURN1)
    _ask(server, OTHER)
    text, cached = _ask(server, TURN1)                              # back to the first: from the cache
    n_prompt = server.openai.chat.completions.create(model="default", messages=TURN1, max_tokens=1,
                                                     temperature=0).usage.prompt_tokens
    assert cached == n_prompt - 1                                   # all but the last token


def test_bad_slot_actions(server, slots_dir):
    assert _action(server, "save", "x.bin", slot=1).status_code == 400
    assert "Invalid action" in _action(server, "frobnicate", "x.bin").text
    for name in ("../escape.bin", "a/b", ""):
        assert _action(server, "save", name).status_code == 400, name
    assert _action(server, "restore", "missing.bin").status_code == 400
    _ask(server, TURN1, 2)
    _action(server, "save", "ok.bin")
    raw = bytearray((slots_dir / "ok.bin").read_bytes())
    raw[-1] ^= 1
    (slots_dir / "bad.bin").write_bytes(bytes(raw))
    r = _action(server, "restore", "bad.bin")
    assert r.status_code == 400 and "sha256" in r.text, r.text
    assert server.app.state.manager.current.model.engine.n_past == 0     # left empty, not half-filled


def test_slots_need_a_save_path():
    app, ctx = _server()
    with ctx as (url, _):
        r = httpx.post(f"{url}/slots/0", params={"action": "save"}, json={"filename": "x.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.text


def test_slot_files_are_private_regular_and_plainly_named(server, slots_dir):
    import os
    import stat
    import threading
    _action(server, "erase")
    _ask(server, TURN1, 2)
    for name in ("x.bin\n", "x.bin\r", ".", "..", "a b", "ü.bin", "x" * 129):
        r = _action(server, "save", name)
        assert r.status_code == 400 and "Invalid filename" in r.text, name
    assert not (slots_dir / "x.bin").exists()
    budget = server.app.state.manager.current.model.budget
    before = budget.current
    assert _action(server, "save", "private.bin").status_code == 200
    assert stat.S_IMODE((slots_dir / "private.bin").stat().st_mode) == 0o600 and budget.current == before
    # a save never writes through a link, nor over a file that is not a state file
    victim = slots_dir.parent / f"victim-{os.getpid()}.txt"
    victim.write_text("precious")
    (slots_dir / "link.bin").symlink_to(victim)
    (slots_dir / "notes.txt").write_text("mine")
    for name in ("link.bin", "notes.txt"):
        r = _action(server, "save", name)
        assert r.status_code == 400 and "not a ramforge state file" in r.text, r.text
    assert victim.read_text() == "precious" and (slots_dir / "notes.txt").read_text() == "mine"
    # a restore reads only regular files, and a FIFO does not hang it
    os.mkfifo(slots_dir / "pipe.bin")
    (slots_dir / "alias.bin").symlink_to(slots_dir / "private.bin")
    results = {}

    def restore(name):
        results[name] = _action(server, "restore", name)
    threads = [threading.Thread(target=restore, args=(n,), daemon=True) for n in ("pipe.bin", "alias.bin")]
    for t in threads:
        t.start()
        t.join(60)
    assert results["pipe.bin"].status_code == 400 and "not a regular file" in results["pipe.bin"].text
    assert results["alias.bin"].status_code == 400 and "symbolic link" in results["alias.bin"].text
    r = _action(server, "restore", "private.bin").json()
    assert r["n_read"] == (slots_dir / "private.bin").stat().st_size and r["n_restored"] > 0
    assert budget.current == before
    for p in ("link.bin", "notes.txt", "pipe.bin", "alias.bin", "private.bin"):
        (slots_dir / p).unlink()
    victim.unlink()
