"""A remote file read by HTTP range requests: what `plan` parses a GGUF header from before a byte of
weights moves (`gguf.reader.GGUFFile` takes any object with `name`, `size` and `pread`).

Each request asks for at least a read-ahead window, which doubles while the reads run on in order
(READ_AHEAD up to MAX_READ_AHEAD), so a header of a few MB costs a few requests and the transfer is
at most the bytes parsed plus one window. A server that answers without a range is refused before
its body is read; a file that changes between requests (another ETag / Last-Modified) is refused.
An Authorization header goes to the first host only, never across a redirect to another one."""
from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request

from .names import _CONTENT_RANGE, USER_AGENT, DEFAULT_TIMEOUT, DownloadIncomplete, PullError
from .transfer import _RecordRedirects

READ_AHEAD = 1 << 20
MAX_READ_AHEAD = 8 << 20


class RangeUnsupported(PullError):
    """A server that does not answer HTTP range requests, so a header cannot be read alone."""


def _origin(url: str) -> tuple[str, str]:
    u = urllib.parse.urlsplit(url)
    return u.scheme.lower(), u.netloc.lower()


class _KeepAuth(_RecordRedirects):
    """Redirects as transfer does (https never to http); the credentials follow to the same origin only."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if new is not None and auth and _origin(newurl) == _origin(req.full_url):
            new.add_unredirected_header("Authorization", auth)
        return new


class RangeFile:
    """`pread(offset, n)` over HTTP(S) ranges; `size` from the first answer's Content-Range;
    `bytes_fetched` and `requests` count what crossed the wire."""

    def __init__(self, url: str, headers: dict | None = None, timeout: float = DEFAULT_TIMEOUT,
                 read_ahead: int = READ_AHEAD, max_read_ahead: int = MAX_READ_AHEAD):
        self.name = self.url = url
        self.headers = {k: v for k, v in (headers or {}).items() if k.lower() != "authorization"}
        self.auth = next((v for k, v in (headers or {}).items() if k.lower() == "authorization"), None)
        self.timeout, self.window, self.max_window = timeout, read_ahead, max(read_ahead, max_read_ahead)
        self.bytes_fetched = self.requests = 0
        self._start, self._buf = 0, b""
        self._validator: tuple[str, str] | None = None
        self.size = -1
        self._fetch(0, read_ahead)

    def pread(self, offset: int, n: int) -> bytes:
        """Up to n bytes at offset (fewer only at the end of the file)."""
        n = max(0, min(n, self.size - offset))
        lo = offset - self._start
        if 0 <= lo and lo + n <= len(self._buf):
            return self._buf[lo:lo + n]
        if offset == self._start + len(self._buf):          # reading on in order: a wider window
            self.window = min(self.window * 2, self.max_window)
        self._fetch(offset, max(n, self.window))
        return self._buf[:n]

    def _fetch(self, offset: int, n: int) -> None:
        end = offset + n - 1 if self.size < 0 else min(offset + n, self.size) - 1
        req = urllib.request.Request(self.url, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity",
                                                        **self.headers, "Range": f"bytes={offset}-{end}"})
        if self.auth:
            req.add_unredirected_header("Authorization", self.auth)
        self.requests += 1
        try:
            resp = urllib.request.build_opener(_KeepAuth()).open(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            e.close()
            err = PullError(f"HTTP {e.code} {e.reason} reading the header of {self.url}" + {
                401: ": the file needs credentials (a gated or private repo): set HF_TOKEN or run `hf auth login`",
                403: ": access refused (a gated repo whose terms are not accepted yet?)",
                404: ": no such file"}.get(e.code, ""))
            err.retryable = e.code >= 500 or e.code == 429
            raise err from None
        except urllib.error.URLError as e:
            raise (e.reason if isinstance(e.reason, PullError) else
                   DownloadIncomplete(f"cannot reach {self.url}: {e.reason}")) from None
        except (OSError, http.client.HTTPException) as e:
            raise DownloadIncomplete(f"reading the header of {self.url} failed: {type(e).__name__}: {e}") from None
        with resp:
            m = _CONTENT_RANGE.fullmatch((resp.headers.get("Content-Range") or "").strip())
            if resp.status != 206 or not m or int(m.group(1)) != offset or m.group(3) == "*":
                raise RangeUnsupported(f"{self.url} answered {resp.status} without the byte range asked for, so its "
                                       f"header cannot be read alone; download it (`ramforge pull`) and plan the file")
            validator = (resp.headers.get("ETag") or "", resp.headers.get("Last-Modified") or "")
            if self._validator is not None and validator != self._validator:
                raise PullError(f"{self.url} changed while its header was read (ETag / Last-Modified differ); "
                                f"run the command again")
            self._validator = validator
            total = int(m.group(3))
            if self.size >= 0 and total != self.size:
                raise PullError(f"{self.url} changed size while its header was read ({self.size:,} -> {total:,} B)")
            self.size = total
            want = int(m.group(2)) - offset + 1
            try:
                data = resp.read(want + 1)
            except (OSError, http.client.HTTPException) as e:
                raise DownloadIncomplete(f"reading the header of {self.url} broke: {type(e).__name__}: {e}") from None
        if len(data) != want:
            raise DownloadIncomplete(f"{self.url} sent {len(data):,} B for a range of {want:,} B")
        self.bytes_fetched += len(data)
        self._start, self._buf = offset, data

    def close(self) -> None:
        self._buf = b""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
