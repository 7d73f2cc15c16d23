"""The model store: named GGUF blobs pulled over HTTP(S), resumable and verified, like Ollama's.

Layout under the store root ($RAMFORGE_HOME, else the cache dir of `ramforge.paths.cache_dir()`):

    blobs/sha256-<hex>        finished, verified files, named by content
    blobs/<name>.part         a download in progress (resumed with an HTTP Range request)
    blobs/<name>.part.json    what it was downloaded against: {url, etag, last_modified, sha256}; sent
                              back as If-Range, so a changed upstream file restarts from 0
    manifests/<name>.json     {name, digest, size, source, pulled_at, verified}: a name -> a blob

Names are `[a-z0-9][a-z0-9._-]*` with an optional `:tag` (case-folded; `name:latest` is `name`).
Everything else is refused before any file is touched, and every path is checked to stay inside
the root. Every write is atomic (a temp file in the same folder, then a rename).

Sources are https (plain http only with `--insecure`, insecure=True; a redirect from https to http
is refused). `verified` records whether the file was checked against a digest (--sha256, or the
sha256 ETag huggingface sends); without one the pull says so and `ramforge list` and Ollama's
/api/tags show it as unverified.
"""

from __future__ import annotations

from .names import (BlobMissing, CHUNK, CorruptManifest, DEFAULT_TAG, DEFAULT_TIMEOUT, DigestMismatch,
                    DownloadIncomplete, GGUF_MAGIC, InsecureSource, InvalidModelName, InvalidSource,
                    MAX_NAME_LENGTH, NotGGUF, NotInStore, Progress, PullError, StoreBusy, StoreError,
                    USER_AGENT, default_name, expand_source, is_valid_name, normalize_name, parse_name)  # noqa: F401
from .blobs import Manifest, Store  # noqa: F401
from .transfer import hash_file  # noqa: F401

__all__ = ['BlobMissing', 'CHUNK', 'CorruptManifest', 'DEFAULT_TAG', 'DEFAULT_TIMEOUT', 'DigestMismatch',
           'DownloadIncomplete', 'GGUF_MAGIC', 'InsecureSource', 'InvalidModelName', 'InvalidSource', 'MAX_NAME_LENGTH', 'NotGGUF',
           'NotInStore', 'Progress', 'PullError', 'StoreBusy', 'StoreError', 'USER_AGENT', 'default_name',
           'expand_source', 'is_valid_name', 'normalize_name', 'parse_name', 'Manifest', 'Store', 'hash_file']
