"""The store itself: `Store` over its root's manifests and blobs, and `Manifest` (the layout and the
rules on names and paths are in the package docstring)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
import urllib.parse
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from ..gguf.reader import GGUFFile
from ..paths import cache_dir
from .names import (CHUNK, DEFAULT_TIMEOUT, GGUF_MAGIC, _HEX64, BlobChanged, BlobMissing, CorruptManifest, DigestMismatch,
                    InsecureSource, InvalidModelName, NotGGUF, NotInStore, Progress, PullError, default_name,
                    expand_source, is_valid_name, normalize_name)
from .transfer import hash_file, _PartLock, _download, _drop_if_empty, drop_part_meta, split_urls


# ------------------------------------------------------------------------------------------ store

@dataclass(frozen=True)
class Shard:
    """Another file of a split GGUF (`*-0000K-of-0000N.gguf`) a manifest serves, as recorded at pull:
    a file outside the store (`path`), or, where the manifest's own `path` is "", blobs/sha256-<sha256>."""

    path: str
    size: int
    mtime_ns: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    name: str
    digest: str          # "sha256:<hex>" of the (first) file
    size: int            # bytes of the (first) file
    source: str
    pulled_at: str       # ISO 8601, UTC
    verified: bool = False   # checked against --sha256 or the server's sha256 ETag (absent in older manifests)
    mtime_ns: int | None = None   # the file's mtime when its sha256 was last computed (None: older manifests)
    path: str = ""       # the file, when it lives outside blobs/ (the Hugging Face cache); "" for blobs/sha256-<hex>
    shards: tuple[Shard, ...] = ()    # shards 2..N of a split GGUF, in order: beside `path`, or blobs (path "")
    config: dict | None = None   # a created model's TEMPLATE / SYSTEM / PARAMETERs (store.modelfile.ModelConfig)

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]

    @property
    def total_size(self) -> int:
        return self.size + sum(s.size for s in self.shards)

    @property
    def blob_hexes(self) -> list[str]:
        """The sha256 of each of its files kept in blobs/ (none for files outside the store), shard 1 first."""
        return [] if self.path else [self.hex, *(s.sha256 for s in self.shards)]

    @classmethod
    def from_json(cls, data, where: str) -> "Manifest":
        try:
            mt = data.get("mtime_ns")
            m = cls(name=str(data["name"]), digest=str(data["digest"]), size=int(data["size"]),
                    source=str(data.get("source", "")), pulled_at=str(data.get("pulled_at", "")),
                    verified=data.get("verified") is True, mtime_ns=None if mt is None else int(mt),
                    path=str(data.get("path") or ""),
                    shards=tuple(Shard(str(s["path"]), int(s["size"]), int(s["mtime_ns"]), str(s["sha256"]))
                                 for s in data.get("shards") or ()),
                    config=data["config"] if isinstance(data.get("config"), dict) else None)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptManifest(f"manifest {where} is missing or mangles {e}; delete it and pull again") from None
        algo, _, hx = m.digest.partition(":")
        if algo != "sha256" or not _HEX64.fullmatch(hx):   # the digest becomes a path: check it first
            raise CorruptManifest(f"manifest {where} has digest {m.digest!r}, expected 'sha256:' and 64 hex "
                                  f"digits; delete it and pull again")
        if m.size < 0 or any(s.size < 0 or not _HEX64.fullmatch(s.sha256) for s in m.shards):
            raise CorruptManifest(f"manifest {where} has a negative size or a bad shard digest; delete it and "
                                  f"pull again")
        if m.path and not all(os.path.isabs(p) for p in [m.path, *(s.path for s in m.shards)]):
            raise CorruptManifest(f"manifest {where} names a file by a relative path; delete it and pull again")
        if not m.path and any(s.path for s in m.shards):         # shards in blobs/ are named by their digest
            raise CorruptManifest(f"manifest {where} names a shard by path beside a blob; delete it and pull again")
        return m


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


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
        """manifests/[host/][namespace/]model[:tag].json (a name's '/' are folders, as in Ollama's store)."""
        return self._inside(self.manifests / f"{normalize_name(name)}.json")

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
        for p in sorted(self.manifests.rglob("*.json")):
            try:
                out.append(Manifest.from_json(json.loads(p.read_text()), str(p)))
            except (OSError, ValueError, CorruptManifest) as e:
                out.append((p, str(e)))
        return out

    def _write_manifest(self, m: Manifest) -> None:
        self._ensure()
        path = self.manifest_path(m.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, (json.dumps(asdict(m), indent=1) + "\n").encode())

    def _referenced(self, hx: str, ignore: Path | None = None) -> bool:
        """Whether any manifest (other than `ignore`) refers to blob `hx`; unreadable ones count if they mention it."""
        if not self.manifests.is_dir():
            return False
        for p in self.manifests.rglob("*.json"):
            if ignore is not None and p == ignore:
                continue
            try:
                text = p.read_text()
            except OSError:
                continue
            try:
                m = Manifest.from_json(json.loads(text), str(p))
                if hx in m.blob_hexes:                  # a file outside blobs/ keeps no blob
                    return True
            except (ValueError, CorruptManifest):
                if hx in text:            # unsure: keep the blob
                    return True
        return False

    def _collect(self, hx: str) -> bool:
        """Delete blob `hx` when no manifest refers to it; True when deleted."""
        if self._referenced(hx):
            return False
        blob = self.blob_path(hx)
        links = self._inside(self.root / "splits" / hx)
        if links.is_dir():                             # the links of a split model whose shard 1 this was
            shutil.rmtree(links, ignore_errors=True)
        try:
            blob.unlink()
            return True
        except FileNotFoundError:
            return False

    def _collect_all(self, old: Manifest | None, new: Manifest | None = None) -> bool:
        """Collect each blob of `old` that `new` does not keep; True when any was deleted."""
        keep = set(new.blob_hexes) if new is not None else set()
        return any([self._collect(hx) for hx in dict.fromkeys(old.blob_hexes if old else ()) if hx not in keep])

    # split models in blobs/ ------------------------------------------------------------------
    def files_of(self, m: Manifest) -> list[tuple[Path, int, int | None, str]]:
        """(path, size, mtime_ns, sha256) of each file of a manifest, shard 1 first."""
        if m.path:
            rest = [(Path(s.path), s.size, s.mtime_ns, s.sha256) for s in m.shards]
        else:
            rest = [(self.blob_path(s.sha256), s.size, s.mtime_ns, s.sha256) for s in m.shards]
        return [(self.file_of(m), m.size, m.mtime_ns, m.hex), *rest]

    def split_links(self, m: Manifest) -> Path:
        """Shard 1 of a split model kept in blobs/, as splits/<sha256 of shard 1>/model-0000K-of-0000N.gguf:
        a folder of relative links to the blobs under llama.cpp's shard names, by which gguf.reader finds
        the set (made, or mended, here)."""
        folder = self._inside(self.root / "splits" / m.hex)
        folder.mkdir(parents=True, exist_ok=True)
        n = 1 + len(m.shards)
        for k, hx in enumerate(m.blob_hexes, 1):
            link, target = folder / f"model-{k:05d}-of-{n:05d}.gguf", f"../../blobs/sha256-{hx}"
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            tmp = folder / f".{link.name}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)
            os.symlink(target, tmp)
            os.replace(tmp, link)
        return folder / f"model-00001-of-{n:05d}.gguf"

    # commands ------------------------------------------------------------------------------
    def file_of(self, m: Manifest) -> Path:
        """The (first) file of a manifest: blobs/sha256-<hex>, or the file it names outside the store."""
        return Path(m.path) if m.path else self.blob_path(m.digest)

    def open_path(self, m: Manifest) -> Path:
        """The path MODEL arguments open: the first file, or a split model's link in splits/ (`split_links`)."""
        return self.split_links(m) if m.shards and not m.path else self.file_of(m)

    def path_of(self, name: str, progress: Progress | None = None) -> Path:
        """The (first) file of a pulled name, checked before it is served (`checked`)."""
        return self.checked(self.get(name), progress)

    def checked(self, m: Manifest, progress: Progress | None = None) -> Path:
        """Verify on load, cheaply: each file's size and mtime against the manifest's record. A file whose
        mtime moved is hashed again (same sha256: the new mtime is recorded; another: DigestMismatch); a
        file of another size is refused (BlobChanged) without reading it; a missing one is BlobMissing."""
        files = self.files_of(m)
        first = files[0][0]
        again = f"`ramforge rm {m.name}` and `ramforge pull {m.source or 'SOURCE'} --name {m.name}` again"
        moved: dict[str, int] = {}
        for path, size, mtime, hx in files:
            try:
                st = path.stat()
            except OSError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):
                raise BlobMissing(f"model {m.name!r} refers to {path}, which is missing; run {again}")
            if st.st_size != size:
                raise BlobChanged(f"model {m.name!r}: {path} is {st.st_size:,} B, but {size:,} B were pulled: the "
                                  f"file changed on disk; run {again}")
            if st.st_mtime_ns == mtime:
                continue
            h, _ = hash_file(path, progress, "verify")
            if h.hexdigest() != hx:
                raise DigestMismatch(f"model {m.name!r} ({path}, modified on disk since it was pulled)", hx,
                                     h.hexdigest(), f"the file changed: run {again}")
            moved[str(path)] = st.st_mtime_ns
        if moved:                       # the same bytes under a new mtime: no re-hash next time
            shards = tuple(replace(s, mtime_ns=moved.get(str(p), s.mtime_ns)) for s, (p, *_) in zip(m.shards, files[1:]))
            self._write_manifest(replace(m, mtime_ns=moved.get(str(first), m.mtime_ns), shards=shards))
        return self.open_path(m)

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
        for d in mpath.parents:                 # the folders of a name with '/', once empty
            if d == self.manifests or self.manifests not in d.parents:
                break
            try:
                d.rmdir()
            except OSError:
                break
        result["manifest"] = True
        if m is not None and m.path:
            result["external"] = m.path         # a file in the Hugging Face cache stays: other tools share it
        elif m is not None:
            result["blob"] = m.digest
            result["blob_deleted"] = self._collect_all(m)      # every shard's blob no other name keeps
        return result

    def verify(self, name: str, progress: Progress | None = None) -> Manifest:
        """Re-hash a name's blob; DigestMismatch when it is not the manifest's digest."""
        m = self.get(name)
        for path, want_size, _, want in self.files_of(m):
            if not path.is_file():
                raise BlobMissing(f"model {m.name!r} refers to {path}, which is missing; run `ramforge rm {m.name}` "
                                  f"and `ramforge pull {m.source or 'SOURCE'} --name {m.name}` again")
            h, size = hash_file(path, progress, "verify")
            if h.hexdigest() != want or size != want_size:
                raise DigestMismatch(f"model {m.name!r} ({path}, {size:,} B, manifest says {want_size:,} B)",
                                     want, h.hexdigest(),
                                     f"the file is corrupt: `ramforge rm {m.name}` and "
                                     f"`ramforge pull {m.source or 'SOURCE'} --name {m.name}` again")
        return m

    def register(self, name: str, files: list[tuple[Path, str]], source: str, verified: bool) -> Manifest:
        """Name files that live outside blobs/ (a Hugging Face cache snapshot): `files` is [(path, sha256)],
        the first file first, each hashed by the caller; their sizes and mtimes are recorded now."""
        canon = normalize_name(name)
        self.manifest_path(canon)
        recs = []
        for path, hx in files:
            st = Path(path).stat()
            recs.append(Shard(os.path.abspath(path), st.st_size, st.st_mtime_ns, hx))
        first, rest = recs[0], tuple(recs[1:])
        m = Manifest(name=canon, digest=f"sha256:{first.sha256}", size=first.size, source=source,
                     pulled_at=_now(), verified=verified, mtime_ns=first.mtime_ns, path=first.path, shards=rest)
        try:
            old = self.find(canon)
        except CorruptManifest:
            old = None
        self._write_manifest(m)
        self._collect_all(old, m)
        return m

    def part_path(self, name: str, shard: int = 1) -> Path:
        """blobs/<name>.part (shard k > 1 of a split set: <name>%k.part), the name's '/' written as '%2f'
        (no name holds a '%')."""
        stem = normalize_name(name).replace('/', '%2f') + (f"%{shard}" if shard > 1 else "")
        return self._inside(self.blobs / f"{stem}.part")

    def pull(self, source: str, name: str | None = None, sha256: str | None = None, *,
             progress: Progress | None = None, timeout: float = DEFAULT_TIMEOUT, retries: int = 0,
             retry_delay: float = 1.0, chunk_size: int = CHUNK, insecure: bool = False) -> Manifest:
        """Download `source` into the store as `name`, resuming a .part left by an earlier try.

        A split GGUF's shard (`PREFIX-0000K-of-0000N.gguf`) brings its set: every shard's URL by
        llama.cpp's naming rule, each a blob, checked to belong together (gguf.reader) before the
        manifest names them in order.
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
        urls = split_urls(url)
        canon = normalize_name(name) if name is not None else default_name(urls[0])
        expected = None
        if sha256 is not None:
            expected = sha256.strip().lower().removeprefix("sha256:")
            if not _HEX64.fullmatch(expected):
                raise PullError(f"--sha256 {sha256!r} is not 64 hex digits")
            if len(urls) > 1:
                raise PullError(f"--sha256 names one file, but {url} is a shard of a set of {len(urls)}; pull it "
                                f"without --sha256 (each shard is checked against the server's sha256 ETag if it "
                                f"sends one)")
        self.manifest_path(canon)                     # every path validated before any I/O
        parts = [self.part_path(canon, k) for k in range(1, len(urls) + 1)]
        self._ensure()
        got = []
        for k, (u, part) in enumerate(zip(urls, parts), 1):
            phase = "download" if len(urls) == 1 else f"download {k}/{len(urls)}"
            report = progress and (lambda p, d, t, ph=phase: progress(ph if p == "download" else p, d, t))
            got.append(self._fetch(u, part, expected, report, timeout, retries, retry_delay, chunk_size))
        try:
            old = self.find(canon)
        except CorruptManifest:
            old = None                                 # overwritten below
        (hx, size, verified, mtime), rest = got[0], got[1:]
        m = Manifest(name=canon, digest=f"sha256:{hx}", size=size, source=url, pulled_at=_now(),
                     verified=all(g[2] for g in got), mtime_ns=mtime,
                     shards=tuple(Shard("", s, mt, h) for h, s, _, mt in rest))
        if rest:
            self._check_split(m)
        self._write_manifest(m)
        self._collect_all(old, m)
        return m

    def _check_split(self, m: Manifest) -> None:
        """Open a split model's blobs as one GGUF (the reader's checks: numbering, counts, architecture);
        the blobs go again when they do not belong together (and no name keeps them)."""
        try:
            GGUFFile(self.split_links(m)).close()
        except Exception:
            for hx in m.blob_hexes:
                self._collect(hx)
            raise

    def _fetch(self, url: str, part: Path, expected: str | None, progress, timeout: float, retries: int,
               retry_delay: float, chunk_size: int) -> tuple[str, int, bool, int]:
        """One file into blobs/sha256-<hex> through `part`: (hex, size, verified, mtime_ns)."""
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
        return hx, size, verified, blob.stat().st_mtime_ns

