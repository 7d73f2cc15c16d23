"""gguf-py (the test oracle and fixture writer) for the tests that read a GGUF with it."""
from __future__ import annotations

import functools
import os

import pytest


def gguf_reader(src):
    """gguf-py's reader of the GGUF at path src, parsed once a process while the file stays as it is (its
    inode, size and mtime): parsing a real vocabulary's arrays takes gguf-py 5-10 s. Skips the test where
    gguf-py is missing."""
    st = os.stat(src)
    return _reader(os.fspath(src), (st.st_ino, st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _reader(src: str, version: tuple):
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(src)
