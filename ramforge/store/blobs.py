"""The store itself: `Store` over its root's manifests and blobs, and `Manifest` (the layout and the
rules on names and paths are in the package docstring)."""
from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.parse
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..paths import cache_dir
from .names import (CHUNK, DEFAULT_TIMEOUT, GGUF_MAGIC, _HEX64, BlobMissing, CorruptManifest, DigestMismatch,
                    InsecureSource, InvalidModelName, NotGGUF, NotInStore, Progress, PullError, default_name,
                    expand_source, is_valid_name, normalize_name)
from .transfer import hash_file, _PartLock, _download, _drop_if_empty, drop_part_meta


# ------------------------------------------------------------------------------------------ store

@dataclass(frozen=True)
class Manifest:
    name: str
    digest: str          # "sha256:<hex>"
    size: int
    source: str
    pulled_at: str       # ISO 8601, UTC
    verified: bool = False   # checked against --sha256 or the server's sha256 ETag (absent in older manifests)
    config: dict | None = None   # a created model's TEMPLATE / SYSTEM / PARAMETERs (store.modelfile.ModelConfig)

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]

    @classmethod
    def from_json(cls, data, where: str) -> "Manifest":
        try:
            m = cls(name=str(data["name"]), digest=str(data["digest"]), size=int(data["size"]),
                    source=str(data.get("source", "")), pulled_at=str(data.get("pulled_at", "")),
                    verified=data.get("verified") is True,
                    config=data["config"] if isinstance(data.get("config"), dict) else None)
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
        drop_part_meta(part)
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
             retry_delay: float = 1.0, chunk_size: int = CHUNK, insecure: bool = False) -> Manifest:
        """Download `source` into the store as `name`, resuming a .part left by an earlier try.

        Retryable failures (a dropped connection, a timeout, an HTTP 5xx) are retried `retries` times,
        each resuming where the last stopped; after that the .part stays for the next `pull`.
        A plain http:// source needs insecure=True (`--insecure`); the manifest's `verified` says
        whether the file was checked against --sha256 or the server's sha256 ETag.
        """
        url = expand_source(source)
        if urllib.parse.urlsplit(url).scheme.lower() == "http" and not insecure:
            raise InsecureSource(f"SOURCE {url} is plain http: the file could be altered on the way"
                                 f"{'' if sha256 else ' and nothing would notice'}; use https, or pass "
                                 f"--insecure (insecure=True) to pull it anyway")
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
                    hx, size, verified = _download(url, f, part, expected, progress, timeout, chunk_size)
                    break
                except (DigestMismatch, NotGGUF):
                    part.unlink(missing_ok=True)       # resuming cannot fix these: start from zero next time
                    drop_part_meta(part)
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
                drop_part_meta(part)
                raise NotGGUF(f"{url} is not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r}); "
                              f"deleted it; check that SOURCE points at a .gguf file")
            f.flush()
            os.fsync(f.fileno())
            blob = self.blob_path(hx)
            os.replace(part, blob)
            drop_part_meta(part)
            _fsync_dir(self.blobs)
        try:
            old = self.find(canon)
        except CorruptManifest:
            old = None                                 # overwritten below
        m = Manifest(name=canon, digest=f"sha256:{hx}", size=size, source=url,
                     pulled_at=datetime.now(timezone.utc).replace(microsecond=0).isoformat(), verified=verified)
        self._write_manifest(m)
        if old is not None and old.hex != hx:
            self._collect(old.hex)
        return m
