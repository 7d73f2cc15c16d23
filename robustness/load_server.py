"""Load and abuse test of `ramforge serve`: concurrent valid and malformed requests, plus stalled clients.

    python robustness/load_server.py                       # 50 clients, 60 s, 5 stalled connections
    python robustness/load_server.py --clients 10 --seconds 5 --stalled 2 --request-timeout 2

Starts `ramforge serve --ram 400M --ctx 512` (the default model) in a subprocess on 127.0.0.1 and a
free port (or targets `--url`, loopback only), warms it up, then runs `--clients` client tasks for
`--seconds`. Each picks at random a valid request (small /api/generate and /v1/chat/completions with
num_predict / max_tokens <= 8, streaming or not, /api/tags, /health) or a malformed one (bad JSON,
wrong types, out-of-range numbers, too many or too long stop strings, bodies over the limit with a
Content-Length or chunked, unknown models, '../' names, missing fields). Meanwhile waves of
`--stalled` connections connect and send nothing, part of the headers, or the headers and part of a
body, then stall: the server must close each within its request timeout while the others proceed.

Checks (exit status 1 if one fails):
  - the server is alive at the end and /health answers 200;
  - every malformed request got a 4xx with a JSON error reason;
  - every valid request got a 2xx (503, the queue being full, is counted apart), and every stream ended
    with its final chunk and no in-band error;
  - no request timed out or failed at the transport level (valid or malformed);
  - every stalled connection was closed by the server within its request timeout (+1 s), and /health
    requests made meanwhile completed;
  - no leaked budget charge: /api/ps `budget` (current bytes, live charges) once idle equals its value
    after the warm-up request;
  - no traceback in the server's log.
Prints a table per category (tried / 2xx / 503 / 4xx / 5xx / errors / timeouts, latency percentiles)
and the command that reproduces the run. Bounded: at most `--clients` + `--stalled` connections, the
run ends `--seconds` after its start plus at most `--request-deadline` for the requests in flight.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

MAX_BODY = 1 << 20                 # ramforge serve's default --max-body (1M)
PROMPTS = ["Name three colours.", "Say hello.", "What is 2+2?", "Write a haiku about rain.", "Count to five."]


# --------------------------------------------------------------------------------- the requests

def _gen(stream: bool, rng: random.Random) -> dict:
    return {"model": "default", "prompt": rng.choice(PROMPTS), "stream": stream,
            "options": {"num_predict": rng.randint(1, 8), "temperature": rng.choice([0, 0.7]), "seed": 1}}


def _chat(stream: bool, rng: random.Random) -> dict:
    return {"model": "default", "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.randint(1, 8), "temperature": rng.choice([0, 0.7]), "stream": stream}


def valid_request(kind: str, rng: random.Random) -> tuple[str, str, dict | None]:
    """(method, path, json body) of a valid request of `kind`."""
    return {"health": lambda: ("GET", "/health", None),
            "tags": lambda: ("GET", "/api/tags", None),
            "generate": lambda: ("POST", "/api/generate", _gen(False, rng)),
            "generate_stream": lambda: ("POST", "/api/generate", _gen(True, rng)),
            "chat_v1": lambda: ("POST", "/v1/chat/completions", _chat(False, rng)),
            "chat_v1_stream": lambda: ("POST", "/v1/chat/completions", _chat(True, rng))}[kind]()


VALID = {"health": 2, "tags": 1, "generate": 2, "generate_stream": 2, "chat_v1": 2, "chat_v1_stream": 2}
GEN, CHAT = "/api/generate", "/v1/chat/completions"


def _opt(**o) -> dict:
    return {"model": "default", "prompt": "hi", "stream": False, "options": o}


# Each: (path, raw body bytes, or a dict sent as JSON, or ("chunked", n) for a chunked body of n bytes)
MALFORMED: dict[str, list] = {
    "bad_json": [(GEN, b'{"model": "default", "prompt": '), (GEN, b"not json at all"), (CHAT, b"\xff\xfe\x00{"),
                 (CHAT, b'{"model": "default", "messages": [}'), (GEN, b"[1, 2, 3]"), (GEN, b'"a string"'),
                 (GEN, b"[" * 100_000 + b"]" * 100_000), (CHAT, b'{"messages": NaN}')],
    "wrong_types": [(GEN, {"model": "default", "prompt": 123}), (GEN, {"model": 5, "prompt": "hi"}),
                    (GEN, {"model": "default", "prompt": "hi", "options": "fast"}),
                    (GEN, {"model": "default", "prompt": "hi", "stream": [1]}),
                    (GEN, _opt(num_predict="many")), (GEN, _opt(temperature={"x": 1})),
                    (CHAT, {"model": "default", "messages": "hello"}),
                    (CHAT, {"model": "default", "messages": [{"role": "user", "content": 7}]}),
                    (CHAT, {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.5})],
    "bad_numbers": [(GEN, _opt(num_predict=-5)), (GEN, _opt(num_predict=1 << 40)), (GEN, _opt(num_ctx=0)),
                    (GEN, _opt(num_ctx=-1)), (GEN, _opt(num_ctx=1 << 40)), (GEN, _opt(top_k=-1)),
                    (GEN, _opt(top_k=1 << 40)), (GEN, _opt(temperature=-1)), (GEN, _opt(top_p=7)),
                    (GEN, b'{"model": "default", "prompt": "hi", "options": {"temperature": NaN}}'),
                    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}),
                    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1 << 40}),
                    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "top_k": 1 << 40}),
                    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 3})],
    "stop_strings": [(GEN, _opt(stop=[f"s{i}" for i in range(17)])), (GEN, _opt(stop=["x" * 2000])),
                     (GEN, _opt(stop=[""])),
                     (CHAT, {"messages": [{"role": "user", "content": "hi"}], "stop": [str(i) for i in range(100)]})],
    "oversized": [(GEN, {"model": "default", "prompt": "x" * (MAX_BODY + 10)}),
                  (CHAT, {"messages": [{"role": "user", "content": "y" * (2 * MAX_BODY)}]}),
                  (GEN, ("chunked", MAX_BODY + 4096))],
    "unknown_model": [(GEN, {"model": "no-such-model", "prompt": "hi", "stream": False}),
                      (CHAT, {"model": "nothing:latest", "messages": [{"role": "user", "content": "hi"}]}),
                      (GEN, {"model": "m" * 5000, "prompt": "hi"})],
    "path_names": [(GEN, {"model": "../../etc/passwd", "prompt": "hi", "stream": False}),
                   (GEN, {"model": "/etc/passwd", "prompt": "hi", "stream": False}),
                   (CHAT, {"model": "..\\..\\x", "messages": [{"role": "user", "content": "hi"}]}),
                   (CHAT, {"model": "a/../../b", "messages": [{"role": "user", "content": "hi"}]}),
                   ("/api/show", {"model": "../default"})],
    "missing_fields": [(CHAT, {"model": "default"}), (CHAT, {"model": "default", "messages": []}),
                       (CHAT, {"messages": [{"content": "hi"}]}), ("/v1/completions", {"model": "default"}),
                       ("/api/show", {}), (GEN, b"")],
}


# ------------------------------------------------------------------------------------ recording

@dataclass
class Stats:
    results: dict = field(default_factory=lambda: defaultdict(list))   # category -> [(status|kind, latency, end)]
    failures: list = field(default_factory=list)                       # (category, what) of failed checks

    def add(self, cat: str, outcome, latency: float, ok: bool = True, why: str = "") -> None:
        self.results[cat].append((outcome, latency, time.monotonic()))
        if not ok and len(self.failures) < 10_000:
            self.failures.append((cat, f"{outcome}: {why}"[:300]))


def _error_reason(body: bytes) -> str | None:
    """The error message of a JSON error body (Ollama's or OpenAI's), or None."""
    try:
        e = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(e, dict):
        e = e.get("message")
    return e if isinstance(e, str) and e else None


def _stream_ok(path: str, body: bytes) -> str | None:
    """Why a 200 stream is not a complete, error-free one (None when it is)."""
    text = body.decode("utf-8", "replace")
    if path == GEN:
        lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        if any("error" in x for x in lines):
            return "in-band error"
        return None if lines and lines[-1].get("done") is True else "no final chunk"
    events = [x[6:] for x in text.split("\n\n") if x.startswith("data: ")]
    if any('"error"' in x for x in events):
        return "in-band error"
    return None if events and events[-1] == "[DONE]" else "no [DONE]"


async def one_request(client: httpx.AsyncClient, stats: Stats, rng: random.Random, deadline_s: float) -> float:
    """Send one random request and record it; returns how long to pause before the next."""
    if rng.random() < 0.6:
        cat = rng.choices(list(VALID), weights=list(VALID.values()))[0]
        method, path, body = valid_request(cat, rng)
        malformed = False
        kwargs = {"json": body} if body is not None else {}
    else:
        cat = rng.choice(list(MALFORMED))
        path, body = rng.choice(MALFORMED[cat])
        method, malformed = "POST", True
        if isinstance(body, tuple):               # a chunked body: no Content-Length
            n = body[1]

            async def chunks(n=n):
                for i in range(0, n, 65536):
                    yield b"x" * min(65536, n - i)
            kwargs = {"content": chunks(), "headers": {"content-type": "application/json"}}
        elif isinstance(body, bytes):
            kwargs = {"content": body, "headers": {"content-type": "application/json"}}
        else:
            kwargs = {"json": body}
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(deadline_s):
            async with client.stream(method, path, **kwargs) as r:
                data = await r.aread()
    except (TimeoutError, httpx.TimeoutException):
        stats.add(cat, "timeout", time.monotonic() - t0, False, f"{method} {path}: no answer in {deadline_s} s")
        return 0.0
    except httpx.HTTPError as e:
        stats.add(cat, "error", time.monotonic() - t0, False, f"{method} {path}: {type(e).__name__}: {e}")
        return 0.0
    dt, st = time.monotonic() - t0, r.status_code
    if malformed:
        ok = 400 <= st < 500 and _error_reason(data) is not None
        stats.add(cat, st, dt, ok, f"{path} {str(body)[:80]!r} -> {data[:160]!r}")
    elif st == 503:
        stats.add(cat, st, dt, _error_reason(data) is not None, f"503 without a reason: {data[:160]!r}")
        return rng.uniform(0.1, 0.4)              # the queue is full: back off a little
    elif 200 <= st < 300:
        why = _stream_ok(path, data) if cat.endswith("_stream") else None
        stats.add(cat, st if why is None else "error", dt, why is None, why or "")
    else:
        stats.add(cat, st, dt, False, f"{method} {path} -> {data[:200]!r}")
    return rng.uniform(0.0, 0.05)


async def client_loop(i: int, url: str, stats: Stats, end: float, seed: int, deadline_s: float) -> None:
    rng = random.Random(seed * 1000 + i)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(deadline_s)) as client:
        while time.monotonic() < end:
            pause = await one_request(client, stats, rng, deadline_s)
            if pause:
                await asyncio.sleep(pause)


# ------------------------------------------------------------------------------ stalled clients

STALLS = ["nothing sent", "partial headers", "partial body"]


async def stalled_conn(host: str, port: int, kind: str, cap: float) -> float | None:
    """Open a connection that stalls as `kind`; seconds until the server closed it (None: not within cap)."""
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.monotonic()
    if kind == "partial headers":
        writer.write(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
    elif kind == "partial body":
        writer.write(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 200\r\n\r\n{\"model\": \"default\", \"pro")
    await writer.drain()
    try:
        async with asyncio.timeout(cap):
            while await reader.read(65536):
                pass
        return time.monotonic() - t0
    except (ConnectionError, OSError):
        return time.monotonic() - t0
    except TimeoutError:
        return None
    finally:
        writer.close()


async def stall_waves(url: str, n: int, timeout: float, end: float, stats: Stats, waves: list) -> None:
    """Waves of n stalled connections while time remains; each wave records its close times and the
    /health latencies measured while it was open."""
    u = urlsplit(url)
    cap = timeout + 10
    async with httpx.AsyncClient(base_url=url, timeout=cap) as probe:
        while n and time.monotonic() + timeout + 1 < end:
            t0 = time.monotonic()
            tasks = [asyncio.create_task(stalled_conn(u.hostname, u.port, STALLS[i % len(STALLS)], cap))
                     for i in range(n)]
            health = []
            while not all(t.done() for t in tasks):
                h0 = time.monotonic()
                try:
                    r = await probe.get("/health")
                    health.append((r.status_code, time.monotonic() - h0))
                except httpx.HTTPError as e:
                    health.append((type(e).__name__, time.monotonic() - h0))
                await asyncio.sleep(0.2)
            closes = [t.result() for t in tasks]
            t1 = time.monotonic()
            done_2xx = sum(1 for cat, rs in stats.results.items() if cat in VALID and cat != "health"
                           for st, _, e in rs if isinstance(st, int) and 200 <= st < 300 and t0 <= e <= t1)
            waves.append({"closes": closes, "health": health, "gen_2xx_meanwhile": done_2xx, "span": t1 - t0})
            for kind, c in zip((STALLS[i % len(STALLS)] for i in range(n)), closes):
                if c is None or c > timeout + 1:
                    stats.failures.append(("stalled", f"{kind}: closed after {c} s (timeout {timeout} s)"))
            bad_h = [h for h in health if h[0] != 200 or h[1] > timeout]
            if bad_h:
                stats.failures.append(("stalled", f"/health while stalled: {bad_h[:5]}"))


# --------------------------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log_path: str, *flags: str) -> subprocess.Popen:
    """`ramforge serve` on the default model at 127.0.0.1:port (400M, ctx 512, Ollama's 404 for an unknown
    model name on every API: --strict-names) with these further flags, its output to log_path; every
    harness's server (stop_server ends it)."""
    cmd = [sys.executable, "-m", "ramforge", "serve", "--host", "127.0.0.1", "--port", str(port), "--ram", "400M",
           "--ctx", "512", "--log-level", "warning", "--strict-names", *flags]
    return subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop_server(proc: subprocess.Popen | None, log_path: str | None) -> None:
    """Terminate a server start_server started (killed if it does not exit in 15 s) and remove its log."""
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    if log_path and os.path.exists(log_path):
        os.unlink(log_path)


def wait_up(url: str, proc: subprocess.Popen | None, timeout: float = 300) -> None:
    """Until /health answers 200: the model loaded and its kernels warm (503 meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not start")


def budget_of(url: str) -> dict | None:
    models = httpx.get(f"{url}/api/ps", timeout=30).json()["models"]
    return models[0].get("budget") if models else None


def wait_idle(url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = httpx.get(f"{url}/health", timeout=10).json()
        if not h["busy"] and not h["waiting"] or time.monotonic() > deadline:
            return h
        time.sleep(0.1)


# ------------------------------------------------------------------------------------ the run

def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else float("nan")


def run_load(url: str, *, clients: int = 50, seconds: float = 60, stalled: int = 5, request_timeout: float = 10,
             seed: int = 0, request_deadline: float = 120) -> dict:
    """Warm up, run the load against `url`, and check; returns a report (report['failures'] empty when
    every check passed; the caller checks the process and its log)."""
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"loopback only: {url}")
    warm = httpx.post(f"{url}/api/generate", json=_gen(False, random.Random(0)), timeout=300)
    warm.raise_for_status()
    wait_idle(url)
    before = budget_of(url)
    stats, waves = Stats(), []

    async def main():
        end = time.monotonic() + seconds
        tasks = [asyncio.create_task(client_loop(i, url, stats, end, seed, request_deadline)) for i in range(clients)]
        tasks.append(asyncio.create_task(stall_waves(url, stalled, request_timeout, end, stats, waves)))
        await asyncio.gather(*tasks)

    t0 = time.monotonic()
    asyncio.run(main())
    wall = time.monotonic() - t0
    idle = wait_idle(url)
    after = budget_of(url)
    failures = list(stats.failures)
    if idle["busy"] or idle["waiting"]:
        failures.append(("server", f"still busy after the load: {idle}"))
    if before is None or after is None:
        failures.append(("budget", f"no loaded model to read: before {before}, after {after}"))
    elif (after["current"], after["charges"]) != (before["current"], before["charges"]):
        failures.append(("budget", f"leak: before {before}, after {after}"))
    h = httpx.get(f"{url}/health", timeout=10)
    if h.status_code != 200:
        failures.append(("server", f"/health {h.status_code} at the end"))
    return {"stats": stats, "waves": waves, "wall": wall, "budget_before": before, "budget_after": after,
            "failures": failures}


def table(report: dict) -> str:
    res = report["stats"].results
    rows = [("category", "tried", "2xx", "503", "4xx", "5xx", "errors", "timeouts", "p50 ms", "p95 ms", "p99 ms",
             "max ms")]
    total = defaultdict(int)
    for cat in list(VALID) + list(MALFORMED):
        rs = res.get(cat, [])
        c = {"tried": len(rs),
             "2xx": sum(1 for s, _, _ in rs if isinstance(s, int) and 200 <= s < 300),
             "503": sum(1 for s, _, _ in rs if s == 503),
             "4xx": sum(1 for s, _, _ in rs if isinstance(s, int) and 400 <= s < 500),
             "5xx": sum(1 for s, _, _ in rs if isinstance(s, int) and s >= 500 and s != 503),
             "errors": sum(1 for s, _, _ in rs if s == "error"),
             "timeouts": sum(1 for s, _, _ in rs if s == "timeout")}
        for k, v in c.items():
            total[k] += v
        ok = cat in VALID and "2xx" or "4xx"
        lat = [d * 1000 for s, d, _ in rs if isinstance(s, int) and (200 <= s < 300 if ok == "2xx" else 400 <= s < 500)]
        rows.append((("  " if cat in VALID else "! ") + cat, *map(str, c.values()),
                     *(f"{_pct(lat, q):.0f}" for q in (0.5, 0.95, 0.99, 1.0))))
    rows.append(("total", *(str(total[k]) for k in ("tried", "2xx", "503", "4xx", "5xx", "errors", "timeouts")),
                 "", "", "", ""))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w[i]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(r)) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    lines.append("(  valid: 2xx expected, 503 = queue full; ! malformed: 4xx with a JSON reason expected; "
                 "latencies of the expected answers)")
    for i, wv in enumerate(report["waves"]):
        closes = ", ".join("never" if c is None else f"{c:.1f}" for c in wv["closes"])
        hl = [d for s, d in wv["health"] if s == 200]
        lines.append(f"stalled wave {i + 1}: {len(wv['closes'])} connections ({' / '.join(STALLS)}) closed after "
                     f"[{closes}] s; meanwhile {wv['gen_2xx_meanwhile']} generations/tags completed and "
                     f"{len(hl)}/{len(wv['health'])} /health probes answered 200 (max {max(hl, default=0) * 1000:.0f} ms)")
    b0, b1 = report["budget_before"], report["budget_after"]
    if b0 and b1:
        lines.append(f"budget after warm-up: current {b0['current']:,} B in {b0['charges']} charges, limit "
                     f"{b0['limit']:,} B; after the load, idle: current {b1['current']:,} B in {b1['charges']} charges "
                     f"(peak {b1['peak']:,} B)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--stalled", type=int, default=5, help="stalled connections per wave")
    ap.add_argument("--request-timeout", type=float, default=10, help="the server's --request-timeout")
    ap.add_argument("--request-deadline", type=float, default=120, help="client-side limit per request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", default=None, help="an already running server (loopback) instead of starting one")
    a = ap.parse_args(argv)
    a.clients = max(1, min(a.clients, 500))
    a.stalled = max(0, min(a.stalled, 50))
    proc, log_path = None, None
    url = a.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = tempfile.mktemp(prefix="ramforge-load-", suffix=".log")
        proc = start_server(port, log_path, "--request-timeout", str(a.request_timeout))
    try:
        wait_up(url, proc)
        report = run_load(url, clients=a.clients, seconds=a.seconds, stalled=a.stalled,
                          request_timeout=a.request_timeout, seed=a.seed, request_deadline=a.request_deadline)
        failures = report["failures"]
        if proc is not None:
            if proc.poll() is not None:
                failures.append(("server", f"the server process exited with {proc.returncode}"))
            log = open(log_path, "rb").read().decode("utf-8", "replace")
            if "Traceback" in log:
                failures.append(("server", "a traceback in the server log: " + log[log.index("Traceback"):][:1500]))
        print(table(report))
        print(f"\n{a.clients} clients for {a.seconds:g} s (wall {report['wall']:.1f} s), {a.stalled} stalled per wave, "
              f"server request timeout {a.request_timeout:g} s; server alive: {proc is None or proc.poll() is None}")
        if failures:
            print(f"\nFAILED: {len(failures)} checks")
            for cat, what in failures[:30]:
                print(f"  {cat}: {what}")
        else:
            print("\nall checks passed")
        cmd = ["python", "robustness/load_server.py", "--clients", str(a.clients), "--seconds", f"{a.seconds:g}",
               "--stalled", str(a.stalled), "--request-timeout", f"{a.request_timeout:g}", "--seed", str(a.seed)]
        print("reproduce:", shlex.join(cmd))
        return 1 if failures else 0
    finally:
        stop_server(proc, log_path)


if __name__ == "__main__":
    sys.exit(main())
