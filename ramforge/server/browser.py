"""What a web page may do with the server, as Ollama decides it (CVE-2024-28224: DNS rebinding).

- **Origins.** A request carrying an `Origin` that is neither allowed nor the server's own is 403,
  preflight or not, before anything runs (a browser sends `Origin` with every POST, so no page
  of another site can start a generation, whatever its Content-Type). Allowed: Ollama's defaults
  (`DEFAULT_ORIGINS`: http(s)://localhost, 127.0.0.1 and 0.0.0.0 on any port, app://, file://,
  tauri://, vscode-webview://, vscode-file://) and those of `--origins` / `$OLLAMA_ORIGINS`
  (comma-separated, `*` a wildcard within one part, `*` alone: any origin). Allowed origins get
  CORS headers and preflight answers from Starlette's CORSMiddleware.
- **Hosts.** A request that arrives over loopback must name a local host in `Host`: an IP address
  (loopback, private, link-local or unspecified), `localhost`, the machine's hostname, or a name
  under .localhost, .local or .internal (Ollama's `allowedHost`). A page whose name was rebound to
  127.0.0.1 sends its own name and gets 403. A request arriving on another interface is not
  checked (it was bound there on purpose: `--api-key` guards it).
"""
from __future__ import annotations

import ipaddress
import json
import re
import socket
from functools import lru_cache
from typing import Iterable

from .common import error_body

DEFAULT_ORIGINS = tuple(f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "0.0.0.0")
                        for scheme in ("http", "https") for port in ("", ":*")) + (
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
CORS_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def parse_origins(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """The extra origins of `--origins` / $OLLAMA_ORIGINS: comma-separated, quotes and spaces trimmed."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else [p for v in value for p in str(v).split(",")]
    return tuple(p for p in (x.strip().strip("\"'").strip() for x in parts) if p)


def origin_regex(patterns: Iterable[str]) -> str:
    """One regular expression (for CORSMiddleware's allow_origin_regex, fullmatch) of the patterns: `*`
    alone any origin, else `*` any run of characters but '/' (a port, a subdomain, an app's id)."""
    alts = []
    for p in patterns:
        p = p.strip().rstrip("/")
        if p == "*":
            return ".*"
        alts.append("[^/]*".join(re.escape(part) for part in p.lower().split("*")))
    return "(?i)(?:" + "|".join(alts) + ")" if alts else "(?!)"


@lru_cache(maxsize=1)
def _hostname() -> str:
    try:
        return socket.gethostname().lower()
    except OSError:
        return ""


def split_host(value: str) -> str:
    """The host of a Host header without its port: 'a:1' -> 'a', '[::1]:1' -> '::1'."""
    value = value.strip()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def local_host(value: str) -> bool:
    """Whether a Host header names this machine as Ollama's allowedHostsMiddleware accepts it."""
    host = split_host(value).lower().rstrip(".")
    if host in ("", "localhost") or host.endswith(LOCAL_SUFFIXES) or host == _hostname():
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified


def loopback(addr: str | None) -> bool:
    try:
        return addr is not None and ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


async def send_error(send, path: str, status: int, message: str, extra: list | None = None) -> None:
    """A JSON error response (Ollama's shape, OpenAI's under /v1) from a pure ASGI layer."""
    body = json.dumps(error_body(path, status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


class BrowserGate:
    """Pure ASGI, outermost: 403 for a non-local Host on a loopback connection, then for an Origin
    that is not allowed (see the module's docstring); everything else goes on to `app` (the
    CORSMiddleware, then the Guard)."""

    def __init__(self, app, origins: Iterable[str]):
        self.app = app
        self.allowed = re.compile(origin_regex(origins))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        server = scope.get("server") or (None, None)
        if loopback(server[0]) and not local_host(host):
            return await send_error(send, scope.get("path", ""), 403,
                                     f"Host {host[:100]!r} is not a name of this machine: the server is on loopback, "
                                     f"so it answers only localhost, its IP addresses and local names "
                                     f"(a page that rebinds its own name to 127.0.0.1 must not reach it)")
        origin = headers.get(b"origin")
        if origin is not None:
            origin = origin.decode("latin-1")
            if origin not in (f"http://{host}", f"https://{host}") and not self.allowed.fullmatch(origin):
                return await send_error(send, scope.get("path", ""), 403,
                                         f"origin {origin[:100]!r} is not allowed: add it with --origins or "
                                         f"OLLAMA_ORIGINS (comma-separated, '*' a wildcard)")
        await self.app(scope, receive, send)
