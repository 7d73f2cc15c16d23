"""Hostile clients against `ramforge serve`: web pages, stalling clients and connection floods.

    python robustness/hostile.py                          # every class, 15 s each
    python robustness/hostile.py --only non_reader,flood --seconds 5

Starts `ramforge serve --ram 400M --ctx 512` (the default model) on 127.0.0.1 at a free port with
short deadlines (`--request-timeout 2 --write-timeout 2 --max-connections 64` unless told), or
targets `--url` (loopback only). Each class of attack runs for at most `--seconds`:

  cross_site     cross-site POSTs (text/plain, form, multipart; Origin https://evil.example) to the
                 generation routes: each must be 403; a text/plain body from an allowed origin 415
  bad_origin     GET and preflight with origins not allowed (evil, null, look-alikes, an extension):
                 403; allowed ones (localhost:port, app://, vscode-webview://) get CORS headers
  dns_rebinding  requests naming another Host (a page whose name was rebound to 127.0.0.1): 403;
                 localhost / 127.0.0.1 / [::1] names are served
  slow_loris     connections sending their headers a byte a second: the server must close each
                 within its request timeout (+1.5 s)
  flood          connections opened as fast as it can (up to --flood) and held idle: the server keeps
                 to its --max-connections by closing the longest-waiting ones
  non_reader     streamed generations (with top_logprobs, so each chunk is large) whose clients never
                 read, with a 2 KiB receive buffer: the server must drop each within its write timeout
                 once its buffers are full, and free the model

While each runs, a probe opens a new connection to GET /health every 20 ms (p99 latency, target
100 ms: `--health-p99-ms`), and another client runs one normal generation, which must complete
(200). After each: /health must show the model idle (busy false, waiting 0, generating 0), /api/ps
the same budget (bytes, charges) as after the warm-up, and, for a server started here, as many
open descriptors as before (+2). Exit status 1 if a check fails; the table shows every class.
Bounded: loopback only; at most --flood + 64 sockets of its own; every loop ends by --seconds (and
each request by its own timeout).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import select
import shlex
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

try:
    from robustness.load_server import budget_of, free_port, start_server, stop_server, wait_up
except ImportError:                     # run as a script: robustness/ is sys.path[0]
    from load_server import budget_of, free_port, start_server, stop_server, wait_up

EVIL = "https://evil.example"
CLASSES = ("cross_site", "bad_origin", "dns_rebinding", "slow_loris", "flood", "non_reader")
NORMAL = {"model": "default", "prompt": "Say hello.", "stream": False, "options": {"num_predict": 4, "temperature": 0}}
BIG_STREAM = {"model": "default", "prompt": "Write a long story about the sea.", "stream": True, "logprobs": True,
              "top_logprobs": 20, "options": {"num_predict": 400, "temperature": 0}}


@dataclass
class Result:
    name: str
    tried: int = 0
    as_expected: int = 0
    wrong: list = field(default_factory=list)          # what was not refused or closed as it should be
    health_ms: list = field(default_factory=list)
    health_failed: int = 0
    normal: tuple = (None, 0.0)                        # (status or error, seconds)
    closes: list = field(default_factory=list)         # seconds until the server closed a hostile connection
    failures: list = field(default_factory=list)

    def expect(self, ok: bool, what: str) -> None:
        self.tried += 1
        if ok:
            self.as_expected += 1
        elif len(self.wrong) < 20:
            self.wrong.append(what[:200])


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else float("nan")


# ------------------------------------------------------------------------------------ attacks

async def cross_site(url: str, res: Result, end: float, **_) -> None:
    body = json.dumps({"model": "default", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]})
    cases = [(p, t, EVIL, 403) for p in ("/api/generate", "/api/chat", "/v1/chat/completions")
             for t in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x")]
    cases += [("/api/generate", "text/plain", "http://localhost:8080", 415)]
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        while time.monotonic() < end and res.tried < 2000:
            for path, ctype, origin, want in cases:
                r = await c.post(path, content=body, headers={"Content-Type": ctype, "Origin": origin})
                res.expect(r.status_code == want, f"{path} {ctype} from {origin}: {r.status_code} {r.text[:80]}")


async def bad_origin(url: str, res: Result, end: float, **_) -> None:
    bad = (EVIL, "null", "http://localhost.evil.example", "http://127.0.0.1.nip.io", "chrome-extension://abcdef")
    good = ("http://localhost:3000", "https://127.0.0.1:8443", "app://ui", "vscode-webview://4f2a")
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        while time.monotonic() < end and res.tried < 2000:
            for o in bad:
                r = await c.get("/api/tags", headers={"Origin": o})
                res.expect(r.status_code == 403, f"GET from {o}: {r.status_code}")
                r = await c.options("/api/chat", headers={"Origin": o, **pre})
                res.expect(r.status_code == 403, f"preflight from {o}: {r.status_code}")
            for o in good:
                r = await c.options("/api/chat", headers={"Origin": o, **pre})
                res.expect(r.status_code == 200 and r.headers.get("access-control-allow-origin") == o,
                           f"preflight from allowed {o}: {r.status_code}")


async def dns_rebinding(url: str, res: Result, end: float, **_) -> None:
    port = urlsplit(url).port
    bad = ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}", "attacker.nip.io")
    good = (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}")
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        while time.monotonic() < end and res.tried < 2000:
            for h in bad:
                r = await c.post("/api/generate", json=NORMAL, headers={"Host": h})
                res.expect(r.status_code == 403, f"Host {h}: {r.status_code}")
            for h in good:
                r = await c.get("/api/version", headers={"Host": h})
                res.expect(r.status_code == 200, f"Host {h}: {r.status_code}")


async def _closed_after(reader: asyncio.StreamReader, t0: float, cap: float) -> float | None:
    """Seconds from t0 until the server closed the connection (EOF or reset), None if not by cap."""
    try:
        while True:
            left = t0 + cap - time.monotonic()
            if left <= 0:
                return None
            if not await asyncio.wait_for(reader.read(65536), left):
                return time.monotonic() - t0
    except (asyncio.TimeoutError, TimeoutError):
        return None
    except OSError:
        return time.monotonic() - t0


async def slow_loris(url: str, res: Result, end: float, n: int, request_timeout: float, **_) -> None:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    cap = request_timeout + 1.5

    async def one():
        reader, writer = await asyncio.open_connection(host, port)
        t0 = time.monotonic()
        head = f"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"

        async def drip():
            for b in head.encode():
                writer.write(bytes([b]))
                await asyncio.sleep(1.0)
        dripping = asyncio.ensure_future(drip())
        try:
            closed = await _closed_after(reader, t0, cap + 1)
        finally:
            dripping.cancel()
            writer.close()
        res.closes.append(closed)
        res.expect(closed is not None and closed <= cap, f"slow-loris closed after {closed} s (cap {cap:g})")

    while time.monotonic() + cap < end or res.tried == 0:
        await asyncio.gather(*(one() for _ in range(n)), return_exceptions=False)


async def flood(url: str, res: Result, end: float, n: int, **_) -> None:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    conns, t0 = [], time.monotonic()
    try:
        while len(conns) < n and time.monotonic() < end:
            try:
                conns.append(await asyncio.wait_for(asyncio.open_connection(host, port), 5))
            except (OSError, asyncio.TimeoutError) as e:
                res.expect(False, f"connect failed: {type(e).__name__}: {e}")
        res.expect(True, f"{len(conns)} connections opened in {time.monotonic() - t0:.2f} s")
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        closed = 0
        for reader, _w in conns:                     # the ones the server closed have EOF (or a reset) waiting
            try:
                closed += await asyncio.wait_for(reader.read(1), 0.001) == b""
            except (asyncio.TimeoutError, TimeoutError):
                pass
            except OSError:
                closed += 1
        res.closes.append(closed)
    finally:
        for _r, w in conns:
            w.close()


async def non_reader(url: str, res: Result, end: float, n: int, write_timeout: float, **_) -> None:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    data = json.dumps(BIG_STREAM).encode()
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        s.connect((host, port))
        s.sendall(f"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        socks.append((s, time.monotonic()))
    try:
        poll = select.poll()
        for s, _ in socks:
            poll.register(s, select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0))
        pending = {s.fileno(): t0 for s, t0 in socks}
        while pending and time.monotonic() < end:
            for fd, _ev in poll.poll(0):
                if fd in pending:
                    res.closes.append(time.monotonic() - pending.pop(fd))
                    poll.unregister(fd)
            await asyncio.sleep(0.05)
        for s, _ in socks:
            res.expect(s.fileno() not in pending, f"a client that stopped reading was still connected after "
                                                   f"{end - socks[0][1]:.1f} s (write timeout {write_timeout:g} s)")
    finally:
        for s, _ in socks:
            s.close()


ATTACKS = {"cross_site": cross_site, "bad_origin": bad_origin, "dns_rebinding": dns_rebinding,
           "slow_loris": slow_loris, "flood": flood, "non_reader": non_reader}


# ----------------------------------------------------------------------------- measurements

def probe(url: str, res: Result, stop) -> None:
    """GET /health on a new connection every 20 ms, as a plain socket (a client library's own set-up
    would be measured too), in a thread of its own (the attacks' event loop must not delay it)."""
    u = urlsplit(url)
    request = f"GET /health HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode()
    while not stop.is_set():
        t0, got = time.perf_counter(), b""
        try:
            with socket.create_connection((u.hostname, u.port), timeout=5) as s:
                s.sendall(request)
                while chunk := s.recv(65536):
                    got += chunk
        except OSError:
            pass
        if got.startswith(b"HTTP/1.1 200") and got.rstrip().endswith(b"}"):
            res.health_ms.append(1000 * (time.perf_counter() - t0))
        else:
            res.health_failed += 1
        stop.wait(0.02)


async def normal(url: str, res: Result, deadline: float) -> None:
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=deadline) as c:
            r = await c.post("/api/generate", json=NORMAL)
            res.normal = (r.status_code, time.monotonic() - t0)
    except httpx.HTTPError as e:
        res.normal = (f"{type(e).__name__}", time.monotonic() - t0)


def open_fds(pid: int | None) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd")) if pid else None
    except OSError:
        return None


def settle(url: str, pid: int | None, budget0, fds0, res: Result, timeout: float = 30) -> None:
    """After a class: the model idle, the budget and the descriptors as before (waiting up to `timeout`)."""
    deadline, h, b, fds = time.monotonic() + timeout, None, None, None
    while time.monotonic() < deadline:
        h = httpx.get(f"{url}/health", timeout=10).json()
        b = budget_of(url)
        fds = open_fds(pid)
        idle = not h["busy"] and not h["waiting"] and not h.get("generating")
        if idle and (b or {}).get("current") == (budget0 or {}).get("current") and \
                (b or {}).get("charges") == (budget0 or {}).get("charges") and (fds is None or fds <= fds0 + 2):
            return
        time.sleep(0.2)
    res.failures.append(f"not back to idle after {timeout:g} s: health {h}, budget {b} (was {budget0}), "
                        f"descriptors {fds} (were {fds0})")


def run_class(name: str, url: str, *, seconds: float, pid: int | None = None, health_p99_ms: float = 100,
              normal_deadline: float = 120, **knobs) -> Result:
    res = Result(name)
    budget0, fds0 = budget_of(url), open_fds(pid)

    async def main():
        stop = threading.Event()
        prober = threading.Thread(target=probe, args=(url, res, stop), daemon=True)
        prober.start()
        other = asyncio.ensure_future(normal(url, res, normal_deadline))
        try:
            await ATTACKS[name](url, res, time.monotonic() + seconds, **knobs)
            await asyncio.wait_for(asyncio.shield(other), normal_deadline)
        finally:
            stop.set()
            prober.join(10)
            other.cancel()

    asyncio.run(main())
    settle(url, pid, budget0, fds0, res)
    if res.wrong:
        res.failures.append(f"{len(res.wrong)} not refused or closed as expected, e.g. {res.wrong[0]}")
    if res.normal[0] != 200:
        res.failures.append(f"the normal request from another client got {res.normal[0]} after {res.normal[1]:.1f} s")
    if res.health_failed:
        res.failures.append(f"{res.health_failed} /health probes failed")
    if res.health_ms and _pct(res.health_ms, 0.99) > health_p99_ms:
        res.failures.append(f"/health p99 {_pct(res.health_ms, 0.99):.0f} ms > {health_p99_ms:g} ms")
    return res


def run(url: str, classes=CLASSES, *, seconds: float = 15, pid: int | None = None, request_timeout: float = 2,
        write_timeout: float = 2, loris: int = 20, flood_n: int = 200, readers: int = 2, health_p99_ms: float = 100,
        normal_deadline: float = 120) -> list[Result]:
    """Every class in turn against the server at url (warmed up first); [Result]."""
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"{url}: loopback only")
    warm = {**NORMAL, "prompt": " ".join(f"w{i}" for i in range(130)), "raw": True}   # ~480 tokens: the KV cache
    httpx.post(f"{url}/api/generate", json=warm, timeout=300).raise_for_status()      # at its full size from here
    knobs = {"slow_loris": {"n": loris, "request_timeout": request_timeout}, "flood": {"n": flood_n},
             "non_reader": {"n": readers, "write_timeout": write_timeout}}
    return [run_class(c, url, seconds=seconds, pid=pid, health_p99_ms=health_p99_ms, normal_deadline=normal_deadline,
                      **knobs.get(c, {})) for c in classes]


def table(results: list[Result]) -> str:
    lines = [f"{'class':14} {'tried':>6} {'as expected':>11} {'health n':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
             f"{'normal':>12}  closes"]
    for r in results:
        closes = [c for c in r.closes if c is not None]
        cl = "" if not r.closes else (f"{sum(closes)} closed by the server" if r.name == "flood" else
                                      f"{len(closes)}/{len(r.closes)} after {min(closes):.1f}-{max(closes):.1f} s"
                                      if closes else f"0/{len(r.closes)}")
        hm = r.health_ms
        lines.append(f"{('! ' if r.failures else '  ') + r.name:14} {r.tried:6} {r.as_expected:11} {len(hm):8} "
                     f"{_pct(hm, .5):7.0f} {_pct(hm, .99):7.0f} {max(hm, default=float('nan')):7.0f} "
                     f"{str(r.normal[0]) + f' {r.normal[1]:.1f}s':>12}  {cl}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(CLASSES), help=f"comma-separated classes of {', '.join(CLASSES)}")
    ap.add_argument("--seconds", type=float, default=15, help="each class runs this long at most")
    ap.add_argument("--request-timeout", type=float, default=2)
    ap.add_argument("--write-timeout", type=float, default=2)
    ap.add_argument("--max-connections", type=int, default=64)
    ap.add_argument("--loris", type=int, default=20, help="slow-loris connections at once")
    ap.add_argument("--flood", type=int, default=300, help="connections the flood opens")
    ap.add_argument("--readers", type=int, default=2, help="clients that stop reading their stream")
    ap.add_argument("--health-p99-ms", type=float, default=100)
    ap.add_argument("--url", default=None, help="a running server (loopback) instead of starting one")
    a = ap.parse_args(argv)
    classes = [c.strip() for c in a.only.split(",") if c.strip()]
    if unknown := set(classes) - set(CLASSES):
        ap.error(f"unknown classes {sorted(unknown)}")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    a.flood = max(1, min(a.flood, 2000, soft - 128))
    a.loris, a.readers = max(1, min(a.loris, 200)), max(1, min(a.readers, 16))
    proc, log_path, url = None, None, a.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = tempfile.mktemp(prefix="ramforge-hostile-", suffix=".log")
        proc = start_server(port, log_path, "--request-timeout", str(a.request_timeout), "--write-timeout",
                            str(a.write_timeout), "--max-connections", str(a.max_connections))
    try:
        wait_up(url, proc)
        results = run(url, classes, seconds=a.seconds, pid=proc.pid if proc else None,
                      request_timeout=a.request_timeout, write_timeout=a.write_timeout, loris=a.loris,
                      flood_n=a.flood, readers=a.readers, health_p99_ms=a.health_p99_ms)
        failures = [(r.name, f) for r in results for f in r.failures]
        if proc is not None:
            if proc.poll() is not None:
                failures.append(("server", f"the server process exited with {proc.returncode}"))
            log = open(log_path, "rb").read().decode("utf-8", "replace")
            if "Traceback" in log:
                failures.append(("server", "a traceback in the server log: " + log[log.index("Traceback"):][:1500]))
        print(table(results))
        print("\nFAILED:\n" + "\n".join(f"  {c}: {f}" for c, f in failures) if failures else "\nall checks passed")
        cmd = ["python", "robustness/hostile.py", "--only", ",".join(classes), "--seconds", f"{a.seconds:g}",
               "--request-timeout", f"{a.request_timeout:g}", "--write-timeout", f"{a.write_timeout:g}",
               "--max-connections", str(a.max_connections), "--flood", str(a.flood)]
        print("reproduce:", shlex.join(cmd))
        return 1 if failures else 0
    finally:
        stop_server(proc, log_path)


if __name__ == "__main__":
    sys.exit(main())
