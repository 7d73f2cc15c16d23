"""llama-cpp-python's ggml libraries through ctypes: what the live oracle tests, the fixture quantizer and
the matvec benchmark share (the libraries, ggml_init's parameters, typed function lookups).

Tools, tests and benchmarks only; the ramforge package never imports this.
"""
from __future__ import annotations

import ctypes
import functools
import os

P = ctypes.c_void_p


class Params(ctypes.Structure):
    """struct ggml_init_params."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@functools.lru_cache(maxsize=1)
def libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(libggml-base, libggml-cpu) as llama-cpp-python ships them (ImportError without llama_cpp,
    OSError if they do not load)."""
    import llama_cpp  # noqa: PLC0415

    d = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    return base, cpu


def fn(lib: ctypes.CDLL, name: str, res, args: list):
    """lib.name with its result and argument types set."""
    f = getattr(lib, name)
    f.restype, f.argtypes = res, args
    return f
