"""One HTTP(S) transfer into a .part file: resumed with Range where the server allows it, restarted
cleanly where it does not, hashed as it streams, and checked against the expected size and sha256.

A resume is only sent for the same upstream file: the first response's validator (a strong ETag,
else Last-Modified) is kept beside the part (<name>.part.json) and sent as If-Range, so a server
whose file changed answers 200 with the whole new file and the pull starts over; a part with no
recorded validator is resumed only where a --sha256 will catch a splice, else restarted from 0.
A redirect from https to http is refused."""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..gguf.split import split_path, split_prefix
from .names import (CHUNK, Progress, GGUF_MAGIC, USER_AGENT, _CONTENT_RANGE, DigestMismatch, DownloadIncomplete,
                    InvalidSource, NotGGUF, PullError, StoreBusy, _etag_sha256)

try:  # POSIX: one pull per name at a time
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


def hash_file(path: Path, progress: Progress | None = None, phase: str = "verify", f=None):
    """(sha256 object, size) of a file, read in chunks (from `f`, an open binary handle, when given)."""
    h, done = hashlib.sha256(), 0
    total = os.fstat(f.fileno()).st_size if f is not None else path.stat().st_size
    own = f is None
    if own:
        f = open(path, "rb")
    try:
        f.seek(0)
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(phase, done, total)
    finally:
        if own:
            f.close()
    return h, done


def _drop_if_empty(part: Path, f) -> None:
    """Remove a .part that holds nothing (a failed connect), so failed pulls leave no litter."""
    try:
        if os.fstat(f.fileno()).st_size == 0:
            part.unlink(missing_ok=True)
            drop_part_meta(part)
    except OSError:
        pass


def part_meta_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _load_meta(part: Path) -> dict:
    """What the part was downloaded against: {url, etag, last_modified, sha256} ({} when unknown)."""
    try:
        meta = json.loads(part_meta_path(part).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _save_meta(part: Path, url: str, resp, tag: str | None) -> dict:
    etag = (resp.headers.get("ETag") or "").strip()
    meta = {"url": url, "etag": etag if etag and not etag.startswith("W/") else None,
            "last_modified": (resp.headers.get("Last-Modified") or "").strip() or None, "sha256": tag}
    tmp = part.with_name(part.name + ".json.tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, part_meta_path(part))
    return meta


def drop_part_meta(part: Path) -> None:
    part_meta_path(part).unlink(missing_ok=True)


def _validator(meta: dict) -> str | None:
    """The If-Range value: the strong ETag, else Last-Modified."""
    return meta.get("etag") or meta.get("last_modified") or None


def _changed(meta: dict, resp) -> bool:
    """Whether a 206 comes from another version of the file than the part's (a server that ignored If-Range)."""
    etag, lm = (resp.headers.get("ETag") or "").strip(), (resp.headers.get("Last-Modified") or "").strip()
    return bool((meta.get("etag") and etag and etag != meta["etag"])
                or (meta.get("last_modified") and lm and lm != meta["last_modified"]))


class _PartLock:
    """Open (creating) a .part file for append + read, holding an exclusive lock on it."""

    def __init__(self, part: Path):
        self.part, self.f = part, None

    def __enter__(self):
        for _ in range(5):
            f = open(self.part, "a+b")
            if fcntl is None:
                self.f = f
                return f
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                raise StoreBusy(f"another `ramforge pull` is writing {self.part}; wait for it to finish") from None
            try:   # the file we locked must still be the one at the path (a finished pull renames it)
                same = os.stat(self.part).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.f = f
                return f
            f.close()
        raise StoreBusy(f"{self.part} keeps changing under another process; try again")

    def __exit__(self, *exc):
        if self.f is not None:
            try:
                self.f.flush()
            finally:
                self.f.close()
        return False


class _RecordRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects like urllib does, remembering the sha256 huggingface puts on the redirect."""

    def __init__(self):
        self.linked_etag: str | None = None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        tag = _etag_sha256(headers.get("X-Linked-Etag"))
        if tag:
            self.linked_etag = tag
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            raise InvalidSource(f"{req.full_url} redirects to {newurl}, which is not http(s)")
        if scheme == "http" and urllib.parse.urlsplit(req.full_url).scheme.lower() == "https":
            raise InvalidSource(f"{req.full_url} redirects to {newurl}: from https to plain http, where the file "
                                f"could be altered on the way; refused (download it yourself if you trust it)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str, offset: int, timeout: float, if_range: str | None = None):
    """(response, etag sha256 or None); HTTP errors become PullError, 416 is returned as (None, total)."""
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if if_range:
            headers["If-Range"] = if_range
    redirects = _RecordRedirects()
    opener = urllib.request.build_opener(redirects)
    try:
        resp = opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416:
            m = re.fullmatch(r"bytes\s+\*/(\d+)", (e.headers.get("Content-Range") or "").strip())
            e.close()
            return None, (int(m.group(1)) if m else None)
        e.close()
        err = PullError(f"HTTP {e.code} {e.reason} from {e.url or url}; " + {
            401: "the file needs credentials (a gated or private repo?); ramforge pull sends none: "
                 "download it yourself and pass its path as MODEL",
            403: "access refused (a gated or private repo?); download it yourself and pass its path as MODEL",
            404: "no such file: check ORG/REPO/FILE (file names are case-sensitive)",
        }.get(e.code, "check the URL" if e.code < 500 else "a server error: run the same pull again to resume"))
        err.retryable = e.code >= 500 or e.code == 429
        raise err from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, InvalidSource):
            raise e.reason from None
        raise DownloadIncomplete(f"cannot reach {url}: {e.reason}; check the address and network, then run "
                                 f"the same pull again") from None
    except (OSError, http.client.HTTPException) as e:
        raise DownloadIncomplete(f"connecting to {url} failed: {type(e).__name__}: {e}; run the same pull "
                                 f"again to resume") from None
    tag = redirects.linked_etag or _etag_sha256(resp.headers.get("X-Linked-Etag")) \
        or _etag_sha256(resp.headers.get("ETag"))
    return resp, tag


def _download(url, f, part: Path, expected, progress, timeout, chunk_size) -> tuple[str, int, bool]:
    """Bring the locked .part (open as `f`) to the full file; (sha256 hex, size, verified) of the result."""
    size = os.fstat(f.fileno()).st_size
    meta = _load_meta(part)
    if size and not (meta.get("url") == url and _validator(meta)) and not expected:
        f.truncate(0)                                  # nothing tells this part is of the same file: start over
        size = 0
    if not size:
        meta = {}
    if size and progress:
        progress("checking partial download", 0, size)
    h, offset = hash_file(part, progress, "checking partial download", f=f) if size else (hashlib.sha256(), 0)
    resp, tag = _open(url, offset, timeout, _validator(meta))
    if resp is None:                                   # 416: nothing left past `offset`
        total = tag
        if total is not None and total == offset:
            return _finish(url, h, offset, expected, meta.get("sha256"))
        f.truncate(0)                                  # the part is not a prefix of this file: start over
        h, offset = hashlib.sha256(), 0
        resp, tag = _open(url, 0, timeout)
        if resp is None:
            raise PullError(f"{url} answers 416 to a request without Range; check the URL")
    with resp:
        enc = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc not in ("identity", ""):
            raise PullError(f"{url} sent Content-Encoding {enc!r} although ramforge asked for identity; "
                            f"the bytes would not hash to the file's digest; use another mirror")
        length = resp.headers.get("Content-Length")
        length = int(length) if length and length.strip().isdigit() else None
        total = None
        if resp.status == 206:
            m = _CONTENT_RANGE.fullmatch((resp.headers.get("Content-Range") or "").strip())
            if not m or int(m.group(1)) != offset or _changed(meta, resp):
                # a range we did not ask for, or of another version: restart from zero without Range
                resp.close()
                f.truncate(0)
                h, offset = hashlib.sha256(), 0
                resp2, tag = _open(url, 0, timeout)
                with resp2:
                    _save_meta(part, url, resp2, tag)
                    return _stream(url, resp2, f, h, 0, _length(resp2), tag, expected, progress, chunk_size)
            total = None if m.group(3) == "*" else int(m.group(3))
            if length is not None and total is not None and offset + length != total:
                raise PullError(f"{url}: Content-Range {m.group(0)!r} and Content-Length {length} disagree")
            if total is None and length is not None:
                total = offset + length
            tag = tag or meta.get("sha256")
        else:                                          # 200: the whole file from byte 0 (If-Range: it changed)
            if offset:
                f.truncate(0)
                h, offset = hashlib.sha256(), 0
            total = length
            _save_meta(part, url, resp, tag)
        return _stream(url, resp, f, h, offset, total, tag, expected, progress, chunk_size)


def _length(resp) -> int | None:
    v = resp.headers.get("Content-Length")
    return int(v) if v and v.strip().isdigit() else None


def _stream(url, resp, f, h, offset, total, tag, expected, progress, chunk_size) -> tuple[str, int, bool]:
    done = reported = offset
    if progress:
        progress("download", done, total)
    read = getattr(resp, "read1", resp.read)   # read1: what has arrived, so a stall loses nothing received
    try:
        while True:
            chunk = read(chunk_size)
            if not chunk:
                break
            if done < 4 and done + len(chunk) >= 4:      # fail fast on an HTML page or similar
                f.seek(0)
                head = (f.read(done) + chunk)[:4]
                if head != GGUF_MAGIC:
                    f.truncate(0)
                    raise NotGGUF(f"{url} is not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r}); "
                                  f"check that SOURCE points at a .gguf file")
            f.write(chunk)
            h.update(chunk)
            done += len(chunk)
            if progress and done - reported >= chunk_size:
                progress("download", done, total)
                reported = done
            if total is not None and done > total:
                raise PullError(f"{url} sent more than the {total:,} B it announced")
    except (socket.timeout, TimeoutError) as e:
        f.flush()
        raise DownloadIncomplete(f"{url} stalled after {done:,} B ({e}); the partial file is kept: run the "
                                 f"same pull again to resume") from None
    except (OSError, http.client.HTTPException) as e:
        f.flush()
        raise DownloadIncomplete(f"the connection to {url} broke after {done:,} B ({type(e).__name__}: {e}); "
                                 f"the partial file is kept: run the same pull again to resume") from None
    f.flush()
    if progress:
        progress("download", done, total)
    if total is not None and done < total:
        raise DownloadIncomplete(f"{url} ended after {done:,} of {total:,} B; the partial file is kept: run "
                                 f"the same pull again to resume")
    return _finish(url, h, done, expected, tag)


def _finish(url, h, size, expected, tag) -> tuple[str, int, bool]:
    """(sha256 hex, size, verified: checked against --sha256 or the server's sha256 ETag)."""
    hx = h.hexdigest()
    for want, where in ((expected, "--sha256"), (tag, "the server's ETag")):
        if want and want != hx:
            raise DigestMismatch(f"{url} ({size:,} B)", want, hx,
                                 f"the download does not match {where}; the partial file was deleted, "
                                 f"run the pull again (or check --sha256)")
    return hx, size, bool(expected or tag)


def split_urls(url: str) -> list[str]:
    """The URLs of a split GGUF's shards from one shard's URL (llama.cpp's PREFIX-0000K-of-0000N.gguf, the
    query kept); [url] for any other file."""
    u = urllib.parse.urlsplit(url)
    head, _, last = u.path.rpartition("/")
    named = split_prefix(urllib.parse.unquote(last))
    if named is None or named[2] <= 1:
        return [url]
    prefix, _, count = named
    return [urllib.parse.urlunsplit(u._replace(path=f"{head}/{urllib.parse.quote(split_path(prefix, k, count))}"))
            for k in range(1, count + 1)]
