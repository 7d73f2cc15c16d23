"""Store names, sources and the store's errors (the typed refusals of names, blobs and pulls)."""
from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, NamedTuple

from ..errors import InvalidArgument, ModelFileError, ModelNotFound, OutOfBudget, RamforgeError


GGUF_MAGIC = b"GGUF"
DEFAULT_TAG = "latest"
MAX_NAME_LENGTH = 128          # base and tag each; the manifest file name stays far below NAME_MAX
CHUNK = 1 << 20
DEFAULT_TIMEOUT = 30.0
USER_AGENT = "ramforge-pull/0.1 (+https://github.com/ramforge)"

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.I)

# phase, bytes done, bytes total (None when unknown)
Progress = Callable[[str, int, "int | None"], None]


# ----------------------------------------------------------------------------------------- errors

class StoreError(RamforgeError):
    """Something about the model store: a name, a manifest, a blob."""


class InvalidModelName(StoreError, InvalidArgument):
    """A store name that is not Ollama's `[host/][namespace/]model[:tag]`; refused before any file is touched."""

    def __init__(self, name, why: str):
        self.name, self.why = name, why
        super().__init__(f"invalid model name {name!r}: {why}; names are [host/][namespace/]model[:tag], each part "
                         f"letters, digits, '.', '_', '-' (starting with a letter or digit, at most "
                         f"{MAX_NAME_LENGTH} characters), e.g. --name qwen3-0.6b:q8_0, user/model:tag or "
                         f"hf.co/org/repo:Q4_K_M")


class NotInStore(StoreError, ModelNotFound):
    """A name with no manifest in the store."""

    def __init__(self, name: str, root: Path):
        self.name = name
        super().__init__(f"no model named {name!r} in the store at {root}; `ramforge list` shows the names, "
                         f"`ramforge pull SOURCE --name {name}` adds one")


class BlobMissing(StoreError, ModelNotFound):
    """A manifest whose blob file is gone."""


class BlobChanged(StoreError, ModelFileError):
    """A pulled file whose size is no longer the one recorded: changed on disk, refused before it is served."""


class CorruptManifest(StoreError, ModelFileError):
    """A manifest file that is not the JSON ramforge writes."""


class DigestMismatch(StoreError, ModelFileError):
    """A file whose sha256 is not the expected one."""

    def __init__(self, what: str, expected: str, actual: str, fix: str):
        self.expected, self.actual = expected, actual
        super().__init__(f"{what}: sha256 mismatch, expected {expected}, got {actual}; {fix}")


class NotGGUF(StoreError, ModelFileError):
    """A downloaded file that does not start with the GGUF magic."""


class PullError(StoreError):
    """A download that failed; `retryable` says whether running the same pull again may succeed."""

    retryable = False


class InvalidSource(PullError, InvalidArgument):
    """A SOURCE that is neither an http(s) URL nor the hf.co/ORG/REPO/FILE.gguf shorthand."""


class InsecureSource(InvalidSource):
    """A plain http:// SOURCE without --insecure (insecure=True)."""


class DownloadIncomplete(PullError):
    """The connection ended (or stalled) early; the .part file is kept and the next pull resumes it."""

    retryable = True


class WontFit(PullError, OutOfBudget):
    """A pull refused before the download: the model's minimum budget exceeds this machine's memory."""

    def __init__(self, what: str, minimum: int, total: int):
        self.minimum, self.total = minimum, total
        super().__init__(f"{what} needs at least {minimum:,} B of RAM to run (its plan's minimum budget, "
                         f"`ramforge plan` shows it), but this machine has {total:,} B in all; nothing was "
                         f"downloaded; pass --force to pull it anyway")


class StoreBusy(PullError):
    """Another process is pulling the same name."""


# ------------------------------------------------------------------------------------------ names

REGISTRY_HOST = "registry.ollama.ai"     # Ollama's default host and namespace: `library/x` is `x`
LIBRARY = "library"
_MAX_FILE_NAME = 255                     # the manifest's file name `<model>:<tag>.json` (NAME_MAX)


class ModelName(NamedTuple):
    """A store name as Ollama parses one, `[host/][namespace/]model[:tag]`, case-folded, with Ollama's
    defaults dropped (`registry.ollama.ai/library/x:latest` is `x`). Unpacks as (base, tag)."""

    base: str          # `[host/][namespace/]model`
    tag: str

    @property
    def parts(self) -> list[str]:
        return self.base.split("/")

    @property
    def host(self) -> str | None:
        return self.parts[0] if len(self.parts) == 3 else None

    @property
    def namespace(self) -> str | None:
        return self.parts[-2] if len(self.parts) > 1 else None

    @property
    def model(self) -> str:
        return self.parts[-1]

    def __str__(self) -> str:
        return self.base if self.tag == DEFAULT_TAG else f"{self.base}:{self.tag}"


def parse_name(name) -> ModelName:
    """The ModelName of a store name; InvalidModelName for anything else. Pure: no I/O.

    Ollama's rules (types/model/name.go): up to three '/'-separated parts, host, namespace and model,
    then an optional ':tag'; each part letters, digits, '.', '_', '-' (a namespace without '.'),
    starting with a letter or digit, at most MAX_NAME_LENGTH characters; no '..' anywhere. Nothing
    that could leave a folder gets through: no NUL, backslash, absolute path, empty or dot part."""
    if not isinstance(name, str):
        raise InvalidModelName(name, "not a string")
    if name == "":
        raise InvalidModelName(name, "empty")
    if len(name) > 3 * MAX_NAME_LENGTH + 3:
        raise InvalidModelName(name[:40] + "...", f"{len(name)} characters long, over {3 * MAX_NAME_LENGTH + 3}")
    for bad, why in (("\x00", "contains NUL"), ("\\", "contains a backslash"), ("..", "contains '..'")):
        if bad in name:
            raise InvalidModelName(name, why)
    if name.startswith("/"):
        raise InvalidModelName(name, "an absolute path")
    base, colon, tag = name.rpartition(":") if ":" in name.rpartition("/")[2] else (name, "", "")
    if colon and not tag:
        raise InvalidModelName(name, "an empty tag after ':'")
    parts = base.split("/")
    if len(parts) > 3:
        raise InvalidModelName(name, f"{len(parts)} parts separated by '/', at most 3 (host/namespace/model)")
    for i, part in enumerate([*parts, *([tag] if colon else [])]):
        kind = "tag" if i == len(parts) else ("host", "namespace", "model")[i + 3 - len(parts)]
        if not _PART.fullmatch(part):
            raise InvalidModelName(name, f"its {kind} {part!r} is empty, contains a character outside "
                                         f"[a-zA-Z0-9._-] or does not start with a letter or digit")
        if kind == "namespace" and "." in part:
            raise InvalidModelName(name, f"its namespace {part!r} contains '.'")
        if len(part) > MAX_NAME_LENGTH:
            raise InvalidModelName(name, f"a part is {len(part)} characters long, over {MAX_NAME_LENGTH}")
    parts = [p.lower() for p in parts]
    if len(parts) == 3 and parts[0] == REGISTRY_HOST:
        parts = parts[1:]
    if len(parts) == 2 and parts[0] == LIBRARY:
        parts = parts[1:]
    tag = tag.lower() or DEFAULT_TAG
    if len(f"{parts[-1]}:{tag}.json".encode()) > _MAX_FILE_NAME:
        raise InvalidModelName(name, f"model and tag together are over {_MAX_FILE_NAME - 6} characters")
    return ModelName("/".join(parts), tag)


def normalize_name(name) -> str:
    """The canonical form of a store name: lower case, without ':latest' or Ollama's `library/`."""
    return str(parse_name(name))


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
