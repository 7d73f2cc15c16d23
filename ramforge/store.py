"""The model store: named GGUF blobs pulled over HTTP(S), resumable and verified, like Ollama's.

Layout under the store root ($RAMFORGE_HOME, else the cache dir of `ramforge.resolve.cache_dir()`):

    blobs/sha256-<hex>        finished, verified files, named by content
    blobs/<name>.part         a download in progress (resumed with an HTTP Range request)
    manifests/<name>.json     {name, digest, size, source, pulled_at}: a name -> a blob

Names are `[a-z0-9][a-z0-9._-]*` with an optional `:tag` (case-folded; `name:latest` is `name`).
Everything else is refused before any file is touched, and every path is checked to stay inside
the root. Every write is atomic (a temp file in the same folder, then a rename).
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .errors import ModelNotFound, RamforgeError
from .resolve import cache_dir

try:  # POSIX: one pull per name at a time
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

GGUF_MAGIC = b"GGUF"
DEFAULT_TAG = "latest"
MAX_NAME_LENGTH = 128          # base and tag each; the manifest file name stays far below NAME_MAX
CHUNK = 1 << 20
DEFAULT_TIMEOUT = 30.0
USER_AGENT = "ramforge-pull/0.1 (+https://github.com/ramforge)"

_PART_RE = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME_RE = re.compile(rf"({_PART_RE})(?::({_PART_RE}))?")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.I)

# phase, bytes done, bytes total (None when unknown)
Progress = Callable[[str, int, "int | None"], None]


# ----------------------------------------------------------------------------------------- errors

class StoreError(RamforgeError):
    """Something about the model store: a name, a manifest, a blob."""


class InvalidModelName(StoreError, ValueError):
    """A store name that is not `[a-zA-Z0-9][a-zA-Z0-9._-]*[:tag]`; refused before any file is touched."""

    def __init__(self, name, why: str):
        self.name, self.why = name, why
        super().__init__(f"invalid model name {name!r}: {why}; names are letters, digits, '.', '_', '-' "
                         f"(starting with a letter or digit, at most {MAX_NAME_LENGTH} characters) with an "
                         f"optional ':tag', e.g. --name qwen3-0.6b:q8_0")


class NotInStore(StoreError, ModelNotFound):
    """A name with no manifest in the store."""

    def __init__(self, name: str, root: Path):
        self.name = name
        super().__init__(f"no model named {name!r} in the store at {root}; `ramforge list` shows the names, "
                         f"`ramforge pull SOURCE --name {name}` adds one")


class BlobMissing(StoreError, ModelNotFound):
    """A manifest whose blob file is gone."""


class CorruptManifest(StoreError):
    """A manifest file that is not the JSON ramforge writes."""


class DigestMismatch(StoreError):
    """A file whose sha256 is not the expected one."""

    def __init__(self, what: str, expected: str, actual: str, fix: str):
        self.expected, self.actual = expected, actual
        super().__init__(f"{what}: sha256 mismatch, expected {expected}, got {actual}; {fix}")


class NotGGUF(StoreError):
    """A downloaded file that does not start with the GGUF magic."""


class PullError(StoreError):
    """A download that failed; `retryable` says whether running the same pull again may succeed."""

    retryable = False


class InvalidSource(PullError):
    """A SOURCE that is neither an http(s) URL nor the hf.co/ORG/REPO/FILE.gguf shorthand."""


class DownloadIncomplete(PullError):
    """The connection ended (or stalled) early; the .part file is kept and the next pull resumes it."""

    retryable = True


class StoreBusy(PullError):
    """Another process is pulling the same name."""


# ------------------------------------------------------------------------------------------ names

def parse_name(name) -> tuple[str, str]:
    """(base, tag), case-folded, for a store name; InvalidModelName for anything else. Pure: no I/O."""
    if not isinstance(name, str):
        raise InvalidModelName(name, "not a string")
    if name == "":
        raise InvalidModelName(name, "empty")
    for bad, why in (("\x00", "contains NUL"), ("/", "contains '/'"), ("\\", "contains a backslash"),
                     ("..", "contains '..'")):
        if bad in name:
            raise InvalidModelName(name, why)
    m = _NAME_RE.fullmatch(name)
    if not m:
        raise InvalidModelName(name, "contains a character outside [a-zA-Z0-9._-] or does not start with a "
                                     "letter or digit")
    base, tag = m.group(1), m.group(2) or DEFAULT_TAG
    for part in (base, tag):
        if len(part) > MAX_NAME_LENGTH:
            raise InvalidModelName(name, f"a part is {len(part)} characters long, over {MAX_NAME_LENGTH}")
    return base.lower(), tag.lower()


def normalize_name(name) -> str:
    """The canonical form of a store name: lower case, without ':latest'."""
    base, tag = parse_name(name)
    return base if tag == DEFAULT_TAG else f"{base}:{tag}"


def is_valid_name(name) -> bool:
    try:
        parse_name(name)
    except InvalidModelName:
        return False
    return True


def default_name(source: str) -> str:
    """The name a pull gets without --name: the file's stem, lower-cased, odd characters made '-'."""
    path = urllib.parse.urlsplit(expand_source(source)).path
    stem = urllib.parse.unquote(path.rstrip("/").rsplit("/", 1)[-1])
    if stem.lower().endswith(".gguf"):
        stem = stem[:-5]
    clean = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).lstrip("._-")
    clean = re.sub(r"\.{2,}", ".", clean)[:MAX_NAME_LENGTH].rstrip("._-")
    if not clean:
        raise InvalidModelName(stem, f"no usable name in the source {source!r}; pass --name")
    return normalize_name(clean)


# ---------------------------------------------------------------------------------------- sources

def expand_source(source: str) -> str:
    """An http(s) URL as given; `hf.co/ORG/REPO/FILE.gguf` (or `huggingface.co/...`) to its resolve URL."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidSource("empty SOURCE; pass an http(s) URL or hf.co/ORG/REPO/FILE.gguf")
    s = source.strip()
    for prefix in ("hf.co/", "huggingface.co/"):
        if s.lower().startswith(prefix):
            parts = s[len(prefix):].split("/")
            if len(parts) < 3 or any(p in ("", ".", "..") for p in parts):
                raise InvalidSource(f"SOURCE {source!r}: the shorthand is hf.co/ORG/REPO/FILE.gguf "
                                    f"(ORG, REPO and FILE all non-empty)")
            org, repo, *file = parts
            quoted = "/".join(urllib.parse.quote(p) for p in file)
            return f"https://huggingface.co/{urllib.parse.quote(org)}/{urllib.parse.quote(repo)}/resolve/main/{quoted}"
    u = urllib.parse.urlsplit(s)
    if u.scheme.lower() not in ("http", "https") or not u.netloc:
        raise InvalidSource(f"SOURCE {source!r} is not an http(s) URL; pass https://... or "
                            f"hf.co/ORG/REPO/FILE.gguf (a local file needs no pull: pass its path as MODEL)")
    return s


def _etag_sha256(value: str | None) -> str | None:
    """The sha256 in an ETag / X-Linked-Etag header, only when it is exactly 64 hex digits."""
    if not value:
        return None
    v = value.strip()
    if v.startswith("W/"):
        return None                     # a weak tag says nothing about the bytes
    v = v.strip('"').lower()
    return v if _HEX64.fullmatch(v) else None


# ------------------------------------------------------------------------------------------ store

@dataclass(frozen=True)
class Manifest:
    name: str
    digest: str          # "sha256:<hex>"
    size: int
    source: str
    pulled_at: str       # ISO 8601, UTC

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]

    @classmethod
    def from_json(cls, data, where: str) -> "Manifest":
        try:
            m = cls(name=str(data["name"]), digest=str(data["digest"]), size=int(data["size"]),
                    source=str(data.get("source", "")), pulled_at=str(data.get("pulled_at", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptManifest(f"manifest {where} is missing or mangles {e}; delete it and pull again") from None
        algo, _, hx = m.digest.partition(":")
        if algo != "sha256" or not _HEX64.fullmatch(hx):   # the digest becomes a path: check it first
            raise CorruptManifest(f"manifest {where} has digest {m.digest!r}, expected 'sha256:' and 64 hex "
                                  f"digits; delete it and pull again")
        if m.size < 0:
            raise CorruptManifest(f"manifest {where} has size {m.size}; delete it and pull again")
        return m


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


class Store:
    """The store at `root` (default: $RAMFORGE_HOME, else the ramforge cache dir)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir()

    # paths ---------------------------------------------------------------------------------
    @property
    def blobs(self) -> Path:
        return self.root / "blobs"

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    def _inside(self, path: Path) -> Path:
        """`path` when, made absolute and normalised, it lies inside the root (store folders may be symlinks)."""
        root = os.path.normpath(os.path.abspath(self.root))
        full = os.path.normpath(os.path.abspath(path))
        if os.path.commonpath([root, full]) != root or full == root:
            raise InvalidModelName(path.name, f"its path {full} leaves the store root {root}")
        return path

    def manifest_path(self, name: str) -> Path:
        return self._inside(self.manifests / f"{normalize_name(name)}.json")

    def part_path(self, name: str) -> Path:
        return self._inside(self.blobs / f"{normalize_name(name)}.part")

    def blob_path(self, digest: str) -> Path:
        hx = digest.split(":", 1)[-1]
        if not _HEX64.fullmatch(hx):
            raise CorruptManifest(f"digest {digest!r} is not 64 hex digits")
        return self._inside(self.blobs / f"sha256-{hx}")

    def _ensure(self) -> None:
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.manifests.mkdir(parents=True, exist_ok=True)

    # manifests -----------------------------------------------------------------------------
    def get(self, name: str) -> Manifest:
        """The manifest of `name`, or NotInStore."""
        path = self.manifest_path(name)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise NotInStore(normalize_name(name), self.root) from None
        try:
            data = json.loads(text)
        except ValueError as e:
            raise CorruptManifest(f"manifest {path} is not JSON ({e}); delete it and pull again") from None
        return Manifest.from_json(data, str(path))

    def find(self, name: str) -> Manifest | None:
        """The manifest of `name`, None when there is none (or `name` is not a valid store name)."""
        if not is_valid_name(name):
            return None
        try:
            return self.get(name)
        except NotInStore:
            return None

    def models(self) -> list[Manifest]:
        """Every readable manifest, sorted by name (unreadable ones are skipped; `entries` reports them)."""
        return [m for m in self.entries() if isinstance(m, Manifest)]

    def entries(self) -> list[Manifest | tuple[Path, str]]:
        """Manifests, and (path, problem) for each file in manifests/ that is not a readable one."""
        out: list = []
        if not self.manifests.is_dir():
            return out
        for p in sorted(self.manifests.glob("*.json")):
            try:
                out.append(Manifest.from_json(json.loads(p.read_text()), str(p)))
            except (OSError, ValueError, CorruptManifest) as e:
                out.append((p, str(e)))
        return out

    def _write_manifest(self, m: Manifest) -> None:
        self._ensure()
        _atomic_write(self.manifest_path(m.name), (json.dumps(asdict(m), indent=1) + "\n").encode())

    def _referenced(self, hx: str, ignore: Path | None = None) -> bool:
        """Whether any manifest (other than `ignore`) refers to blob `hx`; unreadable ones count if they mention it."""
        if not self.manifests.is_dir():
            return False
        for p in self.manifests.glob("*.json"):
            if ignore is not None and p == ignore:
                continue
            try:
                text = p.read_text()
            except OSError:
                continue
            try:
                if Manifest.from_json(json.loads(text), str(p)).hex == hx:
                    return True
            except (ValueError, CorruptManifest):
                if hx in text:            # unsure: keep the blob
                    return True
        return False

    def _collect(self, hx: str) -> bool:
        """Delete blob `hx` when no manifest refers to it; True when deleted."""
        if self._referenced(hx):
            return False
        try:
            self.blob_path(hx).unlink()
            return True
        except FileNotFoundError:
            return False

    # commands ------------------------------------------------------------------------------
    def path_of(self, name: str) -> Path:
        """The blob file of a pulled name."""
        m = self.get(name)
        blob = self.blob_path(m.digest)
        if not blob.is_file():
            raise BlobMissing(f"model {m.name!r} refers to {blob}, which is missing; run `ramforge rm {m.name}` "
                              f"and `ramforge pull {m.source or 'SOURCE'} --name {m.name}` again")
        return blob

    def remove(self, name: str) -> dict:
        """Delete a name's manifest (and its .part), and its blob when no other name refers to it."""
        canon = normalize_name(name)
        mpath, part = self.manifest_path(canon), self.part_path(canon)
        result = {"name": canon, "manifest": False, "blob": None, "blob_deleted": False, "part_deleted": False}
        if part.exists():
            part.unlink()
            result["part_deleted"] = True
        if not mpath.exists():
            if result["part_deleted"]:
                return result
            raise NotInStore(canon, self.root)
        try:
            m = self.get(canon)
        except CorruptManifest:
            m = None
        mpath.unlink()
        _fsync_dir(mpath.parent)
        result["manifest"] = True
        if m is not None:
            result["blob"] = m.digest
            result["blob_deleted"] = self._collect(m.hex)
        return result

    def verify(self, name: str, progress: Progress | None = None) -> Manifest:
        """Re-hash a name's blob; DigestMismatch when it is not the manifest's digest."""
        m = self.get(name)
        blob = self.path_of(m.name)
        h, size = hash_file(blob, progress, "verify")
        if h.hexdigest() != m.hex or size != m.size:
            raise DigestMismatch(f"model {m.name!r} ({blob}, {size:,} B, manifest says {m.size:,} B)",
                                 m.hex, h.hexdigest(),
                                 f"the file is corrupt: `ramforge rm {m.name}` and "
                                 f"`ramforge pull {m.source or 'SOURCE'} --name {m.name}` again")
        return m

    def pull(self, source: str, name: str | None = None, sha256: str | None = None, *,
             progress: Progress | None = None, timeout: float = DEFAULT_TIMEOUT, retries: int = 0,
             retry_delay: float = 1.0, chunk_size: int = CHUNK) -> Manifest:
        """Download `source` into the store as `name`, resuming a .part left by an earlier try.

        Retryable failures (a dropped connection, a timeout, an HTTP 5xx) are retried `retries` times,
        each resuming where the last stopped; after that the .part stays for the next `pull`.
        """
        url = expand_source(source)
        canon = normalize_name(name) if name is not None else default_name(url)
        expected = None
        if sha256 is not None:
            expected = sha256.strip().lower().removeprefix("sha256:")
            if not _HEX64.fullmatch(expected):
                raise PullError(f"--sha256 {sha256!r} is not 64 hex digits")
        self.manifest_path(canon)                     # both paths validated before any I/O
        part = self.part_path(canon)
        self._ensure()
        with _PartLock(part) as f:
            attempt = 0
            while True:
                try:
                    hx, size = _download(url, f, part, expected, progress, timeout, chunk_size)
                    break
                except (DigestMismatch, NotGGUF):
                    part.unlink(missing_ok=True)       # resuming cannot fix these: start from zero next time
                    raise
                except PullError as e:
                    if not e.retryable or attempt >= retries:
                        _drop_if_empty(part, f)
                        raise
                    attempt += 1
                    if progress:
                        progress(f"retry {attempt}/{retries}: {e}", 0, None)
                    time.sleep(retry_delay * attempt)
                except BaseException:                  # Ctrl-C, a bug: keep what arrived for the next pull
                    _drop_if_empty(part, f)
                    raise
            # finished: check the magic, then give the part its content name
            f.seek(0)
            if f.read(4) != GGUF_MAGIC:
                f.seek(0)
                head = f.read(4)
                part.unlink(missing_ok=True)
                raise NotGGUF(f"{url} is not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r}); "
                              f"deleted it; check that SOURCE points at a .gguf file")
            f.flush()
            os.fsync(f.fileno())
            blob = self.blob_path(hx)
            os.replace(part, blob)
            _fsync_dir(self.blobs)
        try:
            old = self.find(canon)
        except CorruptManifest:
            old = None                                 # overwritten below
        m = Manifest(name=canon, digest=f"sha256:{hx}", size=size, source=url,
                     pulled_at=datetime.now(timezone.utc).replace(microsecond=0).isoformat())
        self._write_manifest(m)
        if old is not None and old.hex != hx:
            self._collect(old.hex)
        return m


def _drop_if_empty(part: Path, f) -> None:
    """Remove a .part that holds nothing (a failed connect), so failed pulls leave no litter."""
    try:
        if os.fstat(f.fileno()).st_size == 0:
            part.unlink(missing_ok=True)
    except OSError:
        pass


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
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise InvalidSource(f"{req.full_url} redirects to {newurl}, which is not http(s)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str, offset: int, timeout: float):
    """(response, etag sha256 or None); HTTP errors become PullError, 416 is returned as (None, total)."""
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
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


def _download(url, f, part: Path, expected, progress, timeout, chunk_size) -> tuple[str, int]:
    """Bring the locked .part (open as `f`) to the full file; (sha256 hex, size) of the result."""
    size = os.fstat(f.fileno()).st_size
    if size and progress:
        progress("checking partial download", 0, size)
    h, offset = hash_file(part, progress, "checking partial download", f=f) if size else (hashlib.sha256(), 0)
    resp, tag = _open(url, offset, timeout)
    if resp is None:                                   # 416: nothing left past `offset`
        total = tag
        if total is not None and total == offset:
            return _finish(url, h, offset, expected, None)
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
            if not m or int(m.group(1)) != offset:
                # a range we did not ask for: restart from zero without Range
                resp.close()
                f.truncate(0)
                h, offset = hashlib.sha256(), 0
                resp2, tag = _open(url, 0, timeout)
                with resp2:
                    return _stream(url, resp2, f, h, 0, _length(resp2), tag, expected, progress, chunk_size)
            total = None if m.group(3) == "*" else int(m.group(3))
            if length is not None and total is not None and offset + length != total:
                raise PullError(f"{url}: Content-Range {m.group(0)!r} and Content-Length {length} disagree")
            if total is None and length is not None:
                total = offset + length
        else:                                          # 200: the whole file from byte 0
            if offset:
                f.truncate(0)
                h, offset = hashlib.sha256(), 0
            total = length
        return _stream(url, resp, f, h, offset, total, tag, expected, progress, chunk_size)


def _length(resp) -> int | None:
    v = resp.headers.get("Content-Length")
    return int(v) if v and v.strip().isdigit() else None


def _stream(url, resp, f, h, offset, total, tag, expected, progress, chunk_size) -> tuple[str, int]:
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


def _finish(url, h, size, expected, tag) -> tuple[str, int]:
    hx = h.hexdigest()
    for want, where in ((expected, "--sha256"), (tag, "the server's ETag")):
        if want and want != hx:
            raise DigestMismatch(f"{url} ({size:,} B)", want, hx,
                                 f"the download does not match {where}; the partial file was deleted, "
                                 f"run the pull again (or check --sha256)")
    return hx, size
