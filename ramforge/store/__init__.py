"""The model store: named GGUF blobs pulled over HTTP(S), resumable and verified, like Ollama's.

Layout under the store root ($RAMFORGE_HOME, else the cache dir of `ramforge.paths.cache_dir()`):

    blobs/sha256-<hex>        finished, verified files, named by content
    blobs/<name>.part         a download in progress (resumed with an HTTP Range request)
    blobs/<name>.part.json    what it was downloaded against: {url, etag, last_modified, sha256}; sent
                              back as If-Range, so a changed upstream file restarts from 0
    manifests/<name>.json     {name, digest, size, source, pulled_at, verified}: a name -> a blob
    splits/<hex>/model-0000K-of-0000N.gguf   links to a split model's blobs (hex: shard 1's), by which the
                              reader finds its shards (manifests list the other shards' digests, in order)

    manifests/<ns>/<model>[:tag].json   a name with '/' (Ollama's `[host/][namespace/]model[:tag]`)

Names follow Ollama's rules (`names.parse_name`: `library/x` is `x`, `user/model:tag`,
`hf.co/org/repo:Q4_K_M`; case-folded; `name:latest` is `name`). Everything else ('..', absolute
paths, backslashes, NUL, overlong parts) is refused before any file is touched, and every path is
checked to stay inside the root. Every write is atomic (a temp file in the same folder, then a rename).

A manifest records its file's size, mtime and sha256; `Store.path_of` (what MODEL arguments and the
server resolve through) hashes a file again whose mtime moved and refuses one whose bytes changed.
Hugging Face sources (`hf.py`) download into the shared Hugging Face cache, and their manifests name
the files there (`path`, `shards` of a split GGUF); `ranged.py` reads a remote header by HTTP ranges.

Sources are https (plain http only with `--insecure`, insecure=True; a redirect from https to http
is refused). `verified` records whether the file was checked against a digest (--sha256, or the
sha256 ETag huggingface sends); without one the pull says so and `ramforge list` and Ollama's
/api/tags show it as unverified.
"""

from __future__ import annotations

from .names import (BlobChanged, BlobMissing, CHUNK, CorruptManifest, DEFAULT_TAG, DEFAULT_TIMEOUT, DigestMismatch,
                    DownloadIncomplete, GGUF_MAGIC, InsecureSource, InvalidModelName, InvalidSource,
                    MAX_NAME_LENGTH, NotGGUF, NotInStore, Progress, PullError, StoreBusy, StoreError,
                    USER_AGENT, ModelName, WontFit, default_name, expand_source, is_valid_name, normalize_name,
                    parse_name)  # noqa: F401
from .blobs import Manifest, Shard, Store, split_urls  # noqa: F401
from .transfer import hash_file  # noqa: F401

__all__ = ['BlobChanged', 'BlobMissing', 'CHUNK', 'CorruptManifest', 'DEFAULT_TAG', 'DEFAULT_TIMEOUT', 'DigestMismatch',
           'DownloadIncomplete', 'GGUF_MAGIC', 'InsecureSource', 'InvalidModelName', 'InvalidSource', 'MAX_NAME_LENGTH', 'NotGGUF',
           'NotInStore', 'Progress', 'PullError', 'StoreBusy', 'StoreError', 'USER_AGENT', 'default_name',
           'expand_source', 'is_valid_name', 'normalize_name', 'parse_name', 'Manifest', 'Store', 'hash_file',
           'ModelName', 'Shard', 'WontFit', 'split_urls']
