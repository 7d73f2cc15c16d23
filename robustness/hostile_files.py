"""Hostile files against ramforge's own files: the kernel cache, state (slot) files, KV spill files and
the model store's downloads.

    python robustness/hostile_files.py            # every case; exit status 1 if one is not defended

Each case plants what another local user or a hostile server could (a link, a FIFO, a device, a
group-writable cache, a file changed upstream, an https -> http redirect, ...) in temporary
directories only, runs ramforge against it and checks the outcome: a typed refusal naming the fix, or
the safe result, within a time limit (a case that blocks fails). Nothing outside the temporary
directories is touched. Uses the tiny llama model of tools/make_models.py (made on first use).
Prints one line per case and a summary.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASE_LIMIT_S = 30.0
RESULTS: list[tuple[str, str, bool, float]] = []       # (area, case, defended, seconds)


def case(area: str, name: str):
    """Run the decorated check (returns None or raises AssertionError) in a thread with a time limit."""
    def run(fn):
        out: list = []
        t0 = time.perf_counter()
        th = threading.Thread(target=lambda: out.append(_try(fn)), daemon=True)
        th.start()
        th.join(CASE_LIMIT_S)
        if out and out[0] == SKIP:
            print(f"skip {area:12} {name}", flush=True)
            return fn
        ok = bool(out) and out[0] is None
        why = "blocked" if not out else out[0]
        RESULTS.append((area, name, ok, time.perf_counter() - t0))
        print(f"{'ok  ' if ok else 'FAIL'} {area:12} {name}" + ("" if ok else f"  ({why})"), flush=True)
        return fn
    return run


SKIP = "skip"                                           # what a case returns where it cannot be tried here


def _try(fn):
    try:
        return SKIP if fn() == SKIP else None
    except BaseException as e:             # reported as the case's failure
        return f"{type(e).__name__}: {e}"


def refused(exc_type, fn, *needles):
    try:
        fn()
    except exc_type as e:
        for n in needles:
            assert n in str(e), f"{n!r} not in {e}"
        return e
    raise AssertionError(f"not refused (expected {exc_type.__name__})")


def hostile_headers(header: dict) -> dict:
    """State file headers built to overflow, recurse or mistype the reader (name -> header bytes), from a
    good file's header: each must be refused as damaged (StateError), never OverflowError or RecursionError."""
    def put(key, raw):
        return json.dumps({**header, key: "@RAW@"}).replace('"@RAW@"', raw).encode()

    out = {f"n_tokens {raw[:10]}": put("n_tokens", raw)
           for raw in ("1e999", "-1e999", "NaN", "Infinity", "1e308", "12.0", '"12"', "true", "null", "9" * 5000)}
    out["head_dim_k 1e999"] = put("head_dim_k", "1e999")
    out["model_sha256 nested"] = put("model_sha256", "[[[1]]]")
    out["nested 30,000 deep"] = b"[" * 30_000 + b"]" * 30_000
    out["a list"] = b"[1, 2]"
    out["not UTF-8"] = b'{"n_tokens": "\xff\xfe' + bytes([0xff, 0xfe]) + b'"}'
    return out


def _kernel_cache_cases(root: Path) -> None:
    from ramforge import paths

    # ---- kernel cache -------------------------------------------------------------------
    def import_with_cache(base: Path) -> subprocess.CompletedProcess:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(base))
        return subprocess.run([sys.executable, "-c", "import ramforge, os; print(os.environ['NUMBA_CACHE_DIR'])"],
                              env=env, capture_output=True, text=True, timeout=120)

    @case("kernel cache", "world-writable NUMBA_CACHE_DIR: warned, not used")
    def _():
        base = root / "open-cache"
        base.mkdir()
        os.chmod(base, 0o777)
        r = import_with_cache(base)
        assert r.returncode == 0 and "KernelCacheWarning" in r.stderr and f"chmod go-w {base}" in r.stderr
        assert not r.stdout.strip().startswith(str(base)) and list(base.iterdir()) == []

    @case("kernel cache", "prune spares unmarked kernels-* and links")
    def _():
        base = root / "prune"
        base.mkdir()
        old = time.time() - 3 * paths.PRUNE_AFTER_S
        theirs = [base / f"{paths.KERNEL_DIR_PREFIX}x{i}" for i in range(paths.KEEP_KERNEL_DIRS + 2)]
        for d in theirs:
            (d / "keep").mkdir(parents=True)
            os.utime(d, (old, old))
        (base / f"{paths.KERNEL_DIR_PREFIX}link").symlink_to(root)
        paths.prune_kernel_dirs(base, base / "current", now=time.time())
        assert all((d / "keep").is_dir() for d in theirs) and root.is_dir()


def _state_file_cases(root: Path, tiny: str) -> None:
    from ramforge.engine.engine import Engine
    from ramforge.errors import StateError
    from ramforge.generation.session import load_state_file, write_state_file

    # ---- state files ----------------------------------------------------------------------
    eng = Engine.load(tiny, n_ctx=512)
    eng.eval(list(range(1, 100)))
    states = root / "states"
    states.mkdir()
    good = states / "good.bin"
    write_state_file(good, eng)
    victim = root / "victim.txt"
    victim.write_text("precious")
    budget0 = eng.budget.current

    @case("state files", "saved 0600, no temporary left")
    def _():
        assert (good.stat().st_mode & 0o777) == 0o600 and not list(states.glob(".*tmp"))

    for name, make in (("a symlink to another file", lambda p: p.symlink_to(victim)),
                       ("a file that is no state file", lambda p: p.write_text("mine")),
                       ("a FIFO", os.mkfifo)):
        @case("state files", f"save over {name}: refused")
        def _(name=name, make=make):
            target = states / f"t-{abs(hash(name))}.bin"
            make(target)
            refused(StateError, lambda: write_state_file(target, eng), "not a ramforge state file")
            assert victim.read_text() == "precious"

    devnull = Path("/dev/null")
    fifo = states / "fifo.bin"
    os.mkfifo(fifo)
    (states / "link.bin").symlink_to(good)
    raw = good.read_bytes()
    flipped = bytearray(raw)
    flipped[-5] ^= 1
    bad = {"truncated.bin": raw[:-9], "flipped.bin": bytes(flipped), "header.bin": raw[:16] + b"\xff\xff\xff\x7f"}
    for n, data in bad.items():
        (states / n).write_bytes(data)
    for path, why in ((fifo, "not a regular file"), (states / "link.bin", "symbolic link"),
                      (devnull, "not a regular file"), (states, "not a regular file"),
                      (states / "truncated.bin", "truncated"), (states / "flipped.bin", "sha256"),
                      (states / "header.bin", "damaged")):
        if not path.exists() and not path.is_symlink():
            continue

        @case("state files", f"restore {path.name}: refused, left empty, budget as before")
        def _(path=path, why=why):
            refused(StateError, lambda: load_state_file(eng, path), why)
            assert eng.n_past == 0 and eng.tokens == [] and eng.budget.current <= budget0

    @case("state files", "headers with 1e999, NaN, 5,000 digits, 30,000-deep nesting: refused as damaged")
    def _():
        import struct

        from ramforge.generation.session import MAGIC
        body = len(MAGIC) + 4 + struct.unpack("<I", raw[len(MAGIC):len(MAGIC) + 4])[0]
        for i, (name, h) in enumerate(hostile_headers(json.loads(raw[len(MAGIC) + 4:body])).items()):
            p = states / f"hostile-header-{i}.bin"
            p.write_bytes(MAGIC + struct.pack("<I", len(h)) + h + raw[body:])
            refused(StateError, lambda: load_state_file(eng, p))
            assert eng.n_past == 0 and eng.budget.current <= budget0, name

    @case("state files", "slot names: the whole name checked")
    def _():
        from types import SimpleNamespace

        from ramforge.errors import InvalidArgument
        from ramforge.server.slots import _file
        cfg = SimpleNamespace(slot_save_path=str(states))
        for name in ("x.bin\n", "..", "a/b", "../x", "x\x00", ""):
            refused(InvalidArgument, lambda: _file(cfg, name), "Invalid filename")
        assert _file(cfg, "ok-1.bin").name == "ok-1.bin"
    eng.close()


def _kv_spill_cases(root: Path, tiny: str) -> None:
    from ramforge.engine.engine import Engine
    from ramforge.errors import KVSpillError
    from ramforge.memory import MemoryBudget

    # ---- KV spill -------------------------------------------------------------------------
    from ramforge.paths import memory_filesystem

    @case("kv spill", "a tmpfs directory: refused")
    def _():
        if not (os.path.isdir("/dev/shm") and memory_filesystem("/dev/shm")):
            return SKIP                              # no tmpfs here to try
        b = MemoryBudget()
        refused(KVSpillError, lambda: Engine.load(tiny, n_ctx=1024, budget=b, kv_spill="/dev/shm"),
                "tmpfs", "--kv-spill")
        assert b.current == 0

    @case("kv spill", "SIGKILL mid-run leaves no file")
    def _():
        d = root / "spill"
        d.mkdir()
        code = ("import sys; from ramforge.engine.engine import Engine; e = Engine.load(sys.argv[1], n_ctx=1024, "
                "kv_spill=sys.argv[2]); e.eval(list(range(1, 450))); print(e.kv.spilled, flush=True); "
                "sys.stdin.read()")
        with subprocess.Popen([sys.executable, "-c", code, tiny, str(d)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
            try:
                assert int(child.stdout.readline() or 0) > 0, child.stderr.read()
                assert list(d.iterdir()) == []           # spilling, and nothing in the directory
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait(30)
        assert list(d.iterdir()) == []


def main() -> int:
    from tools.make_models import ensure_model

    tiny = str(ensure_model("llama", "F16"))
    root = Path(tempfile.mkdtemp(prefix="ramforge-hostile-"))
    try:
        _kernel_cache_cases(root)
        _state_file_cases(root, tiny)
        _kv_spill_cases(root, tiny)
        _store_cases(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bad = [r for r in RESULTS if not r[2]]
    print(f"\n{len(RESULTS)} cases, {len(RESULTS) - len(bad)} defended, {len(bad)} not; "
          f"slowest {max(r[3] for r in RESULTS):.2f} s")
    return 1 if bad else 0


class _Upstream(http.server.BaseHTTPRequestHandler):
    """/f.gguf: version v of the file, Range and If-Range (Last-Modified) honoured; /down: 302 to `to`."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        st = self.server.st
        st["seen"].append(self.path)
        if self.path == "/down":
            self.send_response(302)
            self.send_header("Location", st["to"])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data, lm = st["files"][st["v"]], f"Mon, 0{st['v'] + 1} Jan 2024 00:00:00 GMT"
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and self.headers.get("If-Range") in (None, lm):
            start = int(rng[6:-1])
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Last-Modified", lm)
        self.end_headers()
        if st["cut"]:
            st["cut"] = False
            self.wfile.write(data[start:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data[start:])


@contextlib.contextmanager
def _serve(handler, tls: tuple[Path, Path] | None = None):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    if tls:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*tls)
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def _store_cases(root: Path) -> None:
    from ramforge.store import DownloadIncomplete, InsecureSource, InvalidSource, Store
    files = [b"GGUF" + os.urandom(1 << 20), b"GGUF" + os.urandom(1 << 20)]
    store = Store(root / "store")
    with _serve(_Upstream) as up:
        up.st = {"files": files, "v": 0, "cut": False, "seen": [], "to": ""}
        url = f"http://127.0.0.1:{up.server_address[1]}/f.gguf"

        @case("store", "plain http without --insecure: refused before any request")
        def _():
            refused(InsecureSource, lambda: store.pull(url, "plain"), "--insecure")
            assert up.st["seen"] == []

        @case("store", "file changed upstream mid-download: downloaded again, no splice")
        def _():
            up.st["cut"] = True
            try:
                store.pull(url, "changing", insecure=True)
                raise AssertionError("the cut download did not fail")
            except DownloadIncomplete:
                pass
            up.st["v"] = 1
            m = store.pull(url, "changing", insecure=True)
            assert m.hex == hashlib.sha256(files[1]).hexdigest() and not m.verified

        @case("store", "no digest to check: recorded as unverified")
        def _():
            assert store.pull(url, "plain2", insecure=True).verified is False
            assert store.pull(url, "checked", hashlib.sha256(files[1]).hexdigest(), insecure=True).verified

        if shutil.which("openssl") is None:
            return
        key, cert = root / "key.pem", root / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       capture_output=True, timeout=60, check=True)
        os.environ["SSL_CERT_FILE"] = str(cert)
        with _serve(_Upstream, (cert, key)) as tls:
            tls.st = dict(up.st, seen=[], to=url)
            up.st["seen"].clear()

            @case("store", "https redirected to http: refused, even with --insecure")
            def _():
                down = f"https://127.0.0.1:{tls.server_address[1]}/down"
                refused(InvalidSource, lambda: store.pull(down, "down", insecure=True), "from https to plain http")
                assert up.st["seen"] == [] and store.find("down") is None


if __name__ == "__main__":
    warnings.simplefilter("default")
    sys.exit(main())
