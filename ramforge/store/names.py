"""Store names, sources and the store's errors (the typed refusals of names, blobs and pulls)."""
from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from ..errors import InvalidArgument, ModelFileError, ModelNotFound, RamforgeError


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


class InvalidModelName(StoreError, InvalidArgument):
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
