"""Hugging Face sources as llama.cpp (`-hf ORG/REPO[:QUANT]`), Ollama (`hf.co/ORG/REPO:QUANT`) and
llama-cpp-python (`Llama.from_pretrained(repo_id, filename)`) name them.

A QUANT is resolved to a file, or a split set `*-00001-of-0000N.gguf`, from the repository's file list
as llama.cpp's common/download.cpp does (`find_best_model`): the first model file whose path matches
`QUANT[.-]` case-insensitively; with no QUANT, Q4_K_M, then Q8_0, then the first model file; mmproj,
imatrix and draft sidecars are never the model; of a split set only shard 1 is picked, then its
shards join it. Downloads go through huggingface_hub (the `hf` extra) into the shared Hugging Face
cache (`models--ORG--REPO/snapshots/<commit>/`), where llama.cpp, llama-cpp-python and `hf` find them;
HF_ENDPOINT (a mirror), HF_TOKEN and the token file of `hf auth login` are honoured; each file is
hashed against the sha256 the Hub lists for it."""
from __future__ import annotations

import fnmatch
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingExtra, ModelNotFound
from .names import (DigestMismatch, DownloadIncomplete, InsecureSource, InvalidModelName, InvalidSource, Progress,
                    PullError, parse_name)
from .transfer import hash_file

PREFIXES = ("hf.co/", "huggingface.co/")
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")                      # llama.cpp's tags when none is given
SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)
_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_QUANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class AuthRequired(PullError):
    """A gated or private repository asked for without a token that may read it."""


class NoMatchingFile(PullError, ModelNotFound):
    """No model file (or more than one) in a repository matches the QUANT, file or glob asked for."""


# ------------------------------------------------------------------------------ names and choice

@dataclass(frozen=True)
class HfRef:
    """What a source asks for: a repository and at most one of a QUANT, an exact file or a glob."""

    repo_id: str
    quant: str | None = None
    filename: str | None = None
    include: str | None = None

    @property
    def source(self) -> str:
        return f"hf.co/{self.repo_id}" + (f":{self.quant}" if self.quant else f"/{self.filename}" if self.filename else "")


@dataclass(frozen=True)
class SplitInfo:
    """llama.cpp's get_gguf_split_info: the path without `.gguf` and `-0000K-of-0000N`, its quant tag."""

    prefix: str
    tag: str
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[:-5], 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return SplitInfo(prefix, t.group(1).upper() if t else "", index, count)


def is_model_file(path: str) -> bool:
    """A .gguf that is a model, not a projector, an importance matrix or a draft head (by file name)."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(s in name for s in SIDECARS)


def split_set(paths: list[str], first: str) -> list[str]:
    """`first` and the other shards of its split set (same prefix and count), shard 1 first."""
    info = split_info(first)
    if info is None or info.count <= 1:
        return [first]
    same = [p for p in paths if (i := split_info(p)) and i.count == info.count and i.prefix == info.prefix]
    return sorted(same, key=lambda p: split_info(p).index)


def _first_shard(p: str) -> bool:
    i = split_info(p)
    return i is not None and (i.count <= 1 or i.index == 1)


def find_best_model(paths: list[str], quant: str | None) -> str | None:
    """llama.cpp's find_best_model: the path a QUANT (or no QUANT) picks from a repository's list."""
    for tag in ([quant] if quant else DEFAULT_QUANTS):
        pattern = re.compile(f"{tag}[.-]", re.I)          # a regex, as llama.cpp builds it (tags are [A-Za-z0-9_.-])
        for p in paths:
            if is_model_file(p) and pattern.search(p) and _first_shard(p):
                return p
    if not quant:
        return next((p for p in paths if is_model_file(p) and _first_shard(p)), None)
    return None


def choose(paths: list[str], ref: HfRef) -> list[str]:
    """The files of the one model `ref` asks for (shard 1 first); NoMatchingFile listing the choices."""
    ggufs = [p for p in paths if is_model_file(p)]
    listing = "; the repository has " + (", ".join(ggufs[:20]) + (" ..." if len(ggufs) > 20 else "")
                                         if ggufs else "no model .gguf file")
    if ref.filename:
        if ref.filename not in paths:
            raise NoMatchingFile(f"no file {ref.filename!r} in {ref.repo_id} (names are case-sensitive){listing}")
        return split_set(paths, ref.filename)
    if ref.include:
        hits = [p for p in ggufs if fnmatch.fnmatch(p, ref.include)]
        models = {(i.prefix, i.count) for i in map(split_info, hits)}
        if len(models) != 1:
            raise NoMatchingFile(f"--include {ref.include!r} matches {len(models)} models in {ref.repo_id}"
                                 + (f" ({', '.join(hits[:10])})" if hits else "") + f", not one{listing}")
        first = next((p for p in hits if _first_shard(p)), hits[0])
        return split_set(paths, first)
    best = find_best_model(paths, ref.quant)
    if best is None:
        raise NoMatchingFile(f"no model file in {ref.repo_id} matches the quant {ref.quant!r}{listing}" if ref.quant
                             else f"no model .gguf file in {ref.repo_id}{listing}")
    return split_set(paths, best)


def parse_source(source: str, hf: bool = False, include: str | None = None) -> HfRef | None:
    """An HfRef for `hf.co/ORG/REPO[:QUANT]`, `hf.co/ORG/REPO/FILE.gguf` (or huggingface.co/...), or
    with hf=True (`--hf`) `ORG/REPO[:QUANT]`; None for anything else (a URL). InvalidSource when malformed."""
    s = source.strip() if isinstance(source, str) else ""
    low = s.lower()
    prefix = next((p for p in PREFIXES if low.startswith(p)), None)
    if prefix is None and not hf:
        if include:
            raise InvalidSource("--include selects files of a Hugging Face repository: pass hf.co/ORG/REPO")
        return None
    rest = s[len(prefix):] if prefix else s
    parts = rest.split("/")
    if len(parts) < 2:
        raise InvalidSource(f"SOURCE {source!r}: expected hf.co/ORG/REPO[:QUANT] or hf.co/ORG/REPO/FILE.gguf")
    org, repo, *file = parts
    quant = None
    if not file and ":" in repo:
        repo, quant = repo.split(":", 1)
        if not _QUANT.fullmatch(quant):
            raise InvalidSource(f"SOURCE {source!r}: the quant {quant!r} is not letters, digits, '_', '.', '-'")
    for p in (org, repo):
        if not _REPO_PART.fullmatch(p) or ".." in p or "--" in p:
            raise InvalidSource(f"SOURCE {source!r}: {p!r} is not a Hugging Face organisation or repository name")
    if file and any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in file):
        raise InvalidSource(f"SOURCE {source!r}: the file path must be plain names separated by '/'")
    if include and (quant or file):
        raise InvalidSource("pass either a :QUANT, a file or --include, not two of them")
    return HfRef(f"{org}/{repo}", quant, "/".join(file) or None, include)


def store_name(ref: HfRef, files: list[str]) -> str:
    """The store name Ollama gives a pull: `hf.co/ORG/REPO:QUANT` (`:latest` without one); an exact file
    or a glob is named by the file's quant tag. InvalidModelName (pass --name) where the repository's
    name breaks Ollama's rules."""
    tag = ref.quant or (split_info(files[0]).tag if (ref.filename or ref.include) else "") or "latest"
    return str(parse_name(f"hf.co/{ref.repo_id}:{tag}"))


# ------------------------------------------------------------------------------- the Hub, the cache

def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise MissingExtra("Hugging Face sources need huggingface_hub: pip install 'ramforge[hf]'") from None
    return huggingface_hub


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_cache() -> Path:
    """The Hugging Face hub cache, as huggingface_hub finds it, read now (HF_HUB_CACHE, HF_HOME, XDG)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expanduser(os.environ[var]))
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expanduser(home)) / "hub"


def token() -> str | None:
    """HF_TOKEN, else the token file `hf auth login` writes (huggingface_hub.get_token)."""
    return _hub().get_token()


@dataclass(frozen=True)
class HfFile:
    path: str
    size: int | None
    sha256: str | None          # the Hub's LFS sha256 (None for a file kept in git itself)


@dataclass(frozen=True)
class HfModel:
    """A resolved source: the commit, and the files of the model (shard 1 first)."""

    ref: HfRef
    revision: str
    files: tuple[HfFile, ...]
    endpoint: str

    def urls(self) -> list[str]:
        from urllib.parse import quote
        return [f"{self.endpoint}/{self.ref.repo_id}/resolve/{self.revision}/{quote(f.path)}" for f in self.files]

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)


def _check_endpoint(insecure: bool) -> str:
    ep = endpoint()
    if ep.lower().startswith("http://") and not insecure:
        raise InsecureSource(f"HF_ENDPOINT {ep} is plain http: files and tokens could be read or altered on the "
                             f"way; use https, or pass --insecure (insecure=True)")
    if not ep.lower().startswith(("http://", "https://")):
        raise InvalidSource(f"HF_ENDPOINT {ep!r} is not an http(s) URL")
    return ep


def _hub_error(e: Exception, what: str) -> PullError:
    hub = _hub()
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, hub.utils.GatedRepoError) or status in (401, 403):
        err: PullError = AuthRequired(
            f"{what}: HTTP {status}, the repository is gated or private; "
            f"{'the token sent may not read it (accept its terms on the Hub?)' if token() else 'no token was sent'}: "
            f"set HF_TOKEN or run `hf auth login`")
    elif isinstance(e, (hub.utils.RepositoryNotFoundError, hub.utils.EntryNotFoundError,
                        hub.utils.RevisionNotFoundError)) or status == 404:
        err = NoMatchingFile(f"{what}: not found on {endpoint()} (check ORG/REPO; names are case-sensitive)")
    elif status is not None and status < 500 and status != 429:
        err = PullError(f"{what}: HTTP {status}: {e}")
    else:
        err = DownloadIncomplete(f"{what}: {type(e).__name__}: {e}; run the same command again")
    return err


def resolve(ref: HfRef, insecure: bool = False) -> HfModel:
    """The repository's current commit and file list (one request), and the files `ref` picks."""
    ep = _check_endpoint(insecure)
    hub = _hub()
    try:
        info = hub.HfApi(endpoint=ep).model_info(ref.repo_id, files_metadata=True, token=token())
    except Exception as e:                                  # huggingface_hub's HTTP and network errors
        if isinstance(e, (KeyboardInterrupt, MemoryError)):
            raise
        raise _hub_error(e, f"listing {ref.repo_id}") from None
    siblings = {s.rfilename: s for s in info.siblings or ()}
    picked = choose(list(siblings), ref)
    files = tuple(HfFile(p, siblings[p].lfs.size if siblings[p].lfs else siblings[p].size,
                         siblings[p].lfs.sha256 if siblings[p].lfs else None) for p in picked)
    if not info.sha:
        raise PullError(f"{ep} listed {ref.repo_id} without a commit; cannot pin the files")
    return HfModel(ref, info.sha, files, ep)


def auth_headers() -> dict:
    tok = token()
    return {"Authorization": f"Bearer {tok}"} if tok else {}


def _watch(folder: Path, total: int | None, label: str, progress: Progress, stop: threading.Event) -> None:
    """Report the growth of huggingface_hub's `.incomplete` blob (its own bars are turned off)."""
    while not stop.wait(0.25):
        sizes = [p.stat().st_size for p in folder.glob("*.incomplete") if p.exists()]
        if sizes:
            progress(label, max(sizes), total)


def download_model(model: HfModel, progress: Progress | None = None) -> list[tuple[Path, str, bool]]:
    """Each file into the Hugging Face cache (resumed from its `.incomplete` blob by huggingface_hub),
    then hashed: [(snapshot path, sha256, checked against the Hub's sha256)]. A file whose hash is not
    the Hub's is deleted from the cache and refused (DigestMismatch)."""
    hub = _hub()
    hub.utils.disable_progress_bars()
    cache = hub_cache()
    blobs = cache / f"models--{model.ref.repo_id.replace('/', '--')}" / "blobs"
    out = []
    for f in model.files:
        stop = threading.Event()
        watcher = None
        if progress:
            blobs.mkdir(parents=True, exist_ok=True)
            watcher = threading.Thread(target=_watch, args=(blobs, f.size, "download", progress, stop), daemon=True)
            watcher.start()
        try:
            path = Path(hub.hf_hub_download(model.ref.repo_id, f.path, revision=model.revision, cache_dir=cache,
                                            endpoint=model.endpoint, token=token()))
        except Exception as e:
            if isinstance(e, (KeyboardInterrupt, MemoryError)):
                raise
            raise _hub_error(e, f"downloading {f.path} of {model.ref.repo_id}") from None
        finally:
            stop.set()
            if watcher:
                watcher.join()
        h, size = hash_file(path, progress, "verify")
        hx = h.hexdigest()
        if f.sha256 and hx != f.sha256.lower():
            real = path.resolve()
            path.unlink(missing_ok=True)
            real.unlink(missing_ok=True)
            raise DigestMismatch(f"{f.path} of {model.ref.repo_id} ({size:,} B)", f.sha256, hx,
                                 "the download is not the file the Hub lists; deleted it from the cache: run the "
                                 "pull again")
        out.append((path, hx, f.sha256 is not None))
    return out


def download(repo_id: str, filename: str, *, insecure: bool = False, progress: Progress | None = None) -> Path:
    """llama-cpp-python's `Llama.from_pretrained(repo_id, filename)`: the file (a glob picks one model,
    `*Q4_K_M*`), downloaded with its split set into the Hugging Face cache; its path (shard 1)."""
    glob = any(c in filename for c in "*?[")
    ref = parse_source(f"hf.co/{repo_id}", include=filename if glob else None)
    if not glob:
        ref = HfRef(ref.repo_id, filename=filename)
    return download_model(resolve(ref, insecure), progress)[0][0]


def pull(ref: HfRef, store, name: str | None = None, *, insecure: bool = False, progress: Progress | None = None,
         model: HfModel | None = None):
    """Download the model `ref` picks into the Hugging Face cache and name it in `store` (its files'
    sizes, mtimes and sha256 recorded for the check on load). The Manifest."""
    model = model or resolve(ref, insecure)
    paths = [f.path for f in model.files]
    canon = name if name is not None else store_name(ref, paths)
    store.manifest_path(canon)                           # the name is checked before a byte moves
    got = download_model(model, progress)
    return store.register(canon, [(p, hx) for p, hx, _ in got], f"hf.co/{ref.repo_id}/{paths[0]}",
                          verified=all(ok for _, _, ok in got))


# -------------------------------------------------------------------------------- what is cached

@dataclass(frozen=True)
class CachedModel:
    """A model file (shard 1) in the Hugging Face cache, and the name it answers to."""

    name: str
    repo_id: str
    path: Path
    size: int           # all its shards


def _snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    try:
        commit = ref.read_text().strip()
    except OSError:
        snaps = sorted((repo_dir / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) \
            if (repo_dir / "snapshots").is_dir() else []
        return snaps[-1] if snaps else None
    snap = repo_dir / "snapshots" / commit
    return snap if re.fullmatch(r"[0-9a-f]{40}", commit) and snap.is_dir() else None


def _cached_files(repo_id: str) -> tuple[Path, list[str]] | None:
    snap = _snapshot(hub_cache() / f"models--{repo_id.replace('/', '--')}")
    if snap is None:
        return None
    return snap, sorted(str(p.relative_to(snap)) for p in snap.rglob("*.gguf") if p.is_file())


def find_cached(ref: HfRef) -> list[Path] | None:
    """The files `ref` picks among those already in the Hugging Face cache (its main snapshot), or None."""
    found = _cached_files(ref.repo_id)
    if found is None:
        return None
    snap, paths = found
    try:
        picked = choose(paths, ref)
    except NoMatchingFile:
        return None
    info = split_info(picked[0])
    if info and info.count > len(picked):                 # a split set only partly downloaded
        return None
    return [snap / p for p in picked]


def cached_models() -> list[CachedModel]:
    """Every model GGUF (shard 1 of a split set) in the main snapshots of the Hugging Face cache."""
    out = []
    root = hub_cache()
    if not root.is_dir():
        return out
    for repo_dir in sorted(root.glob("models--*--*")):
        repo_id = repo_dir.name[len("models--"):].replace("--", "/", 1)
        found = _cached_files(repo_id)
        if found is None:
            continue
        snap, paths = found
        for p in paths:
            if not (is_model_file(p) and _first_shard(p)):
                continue
            shards = split_set(paths, p)
            try:
                name = str(parse_name(f"hf.co/{repo_id}:{split_info(p).tag or 'latest'}"))
            except InvalidModelName:                      # a repository name outside Ollama's rules
                name = f"hf.co/{repo_id}/{p}"
            out.append(CachedModel(name, repo_id, snap / p, sum((snap / s).stat().st_size for s in shards)))
    return out
