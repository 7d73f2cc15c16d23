"""CLI commands that talk to a running `ramforge serve`, as the Ollama CLI does: ps (GET /api/ps) and stop
(a keep_alive 0 request). The server is found as serve binds: $RAMFORGE_HOST / $RAMFORGE_PORT, else
$OLLAMA_HOST, else 127.0.0.1:11434; $RAMFORGE_API_KEY is sent as the bearer token."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import click
from rich.markup import escape
from rich.table import Table

from .. import flags
from ..errors import ModelNotFound, RamforgeError
from ..memory.size import format_bytes
from .console import client_url, err, out


class ServerUnreachable(RamforgeError):
    """No `ramforge serve` answers at the address."""


class ServerRefused(RamforgeError):
    """The server answered a `ps` / `stop` request with an error status."""


def _request(method: str, path: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    """One JSON request to the running server (the standard library's HTTP client: no extra needed)."""
    import urllib.error
    import urllib.request

    url = client_url() + path
    headers = {"Content-Type": "application/json"}
    key = flags.API_KEY.get()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        raise ServerUnreachable(f"no ramforge serve answers at {client_url()} ({type(e).__name__}); start one with "
                                f"`ramforge serve`, or set RAMFORGE_HOST / RAMFORGE_PORT or OLLAMA_HOST to "
                                f"where it runs") from None
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {}
    if status >= 400:
        reason = answer.get("error") if isinstance(answer, dict) else None
        raise ServerRefused(f"{method} {url}: HTTP {status}: {reason or text[:200]}")
    return answer


def _until(expires: str | None) -> str:
    """Ollama's UNTIL column: "Forever", "Stopping...", or how long from now."""
    if not expires:
        return "Forever"
    try:
        t = datetime.fromisoformat(expires.replace("Z", "+00:00"))
    except ValueError:
        return expires
    if t.year > 2200:
        return "Forever"
    s = (t - datetime.now(timezone.utc)).total_seconds()
    if s <= 0:
        return "Stopping..."
    return f"{int(s // 60)} minutes from now" if s >= 120 else f"{int(s)} seconds from now"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the server's /api/ps answer.")
def ps(as_json):
    """The models a running `ramforge serve` holds loaded, as ollama ps."""
    data = _request("GET", "/api/ps")
    if as_json:
        print(json.dumps(data, indent=1))
        return
    t = Table(box=None, pad_edge=False)
    for c in ("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"):
        t.add_column(c, no_wrap=True)
    for m in data.get("models", []):
        t.add_row(escape(m.get("name", "")), (m.get("digest") or "")[:12], format_bytes(int(m.get("size") or 0)),
                  "100% CPU", str(m.get("context_length", "")), _until(m.get("expires_at")))
    out.print(t)


@click.command()
@click.argument("model")
def stop(model):
    """Unload MODEL from a running `ramforge serve` now (a keep_alive 0 request), as ollama stop."""
    loaded = [m.get("name") for m in _request("GET", "/api/ps").get("models", [])]
    if model not in loaded and not any(n and n.split(":")[0] == model for n in loaded):
        raise ModelNotFound(f"couldn't find model {model!r} to stop: the server holds "
                            f"{', '.join(map(repr, loaded)) if loaded else 'no model'}")
    _request("POST", "/api/generate", {"model": model, "keep_alive": 0})
    err.print(f"stopped {escape(model)}")


COMMANDS = [ps, stop]
