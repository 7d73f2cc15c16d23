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


class CpuBackend:
    """ggml's graph API as a mul_mat on its CPU backend needs it, typed, and one CPU backend of `threads`
    threads (AttributeError where a symbol is missing)."""

    def __init__(self, threads: int):
        base, cpu = libraries()
        c = ctypes
        self.Params = Params
        self.init = fn(base, "ggml_init", P, [Params])
        self.new2d = fn(base, "ggml_new_tensor_2d", P, [P, c.c_int, c.c_int64, c.c_int64])
        self.mul_mat = fn(base, "ggml_mul_mat", P, [P, P, P])
        self.new_graph = fn(base, "ggml_new_graph", P, [P])
        self.build = fn(base, "ggml_build_forward_expand", None, [P, P])
        self.alloc = fn(base, "ggml_backend_alloc_ctx_tensors_from_buft", P, [P, P])
        self.tset = fn(base, "ggml_backend_tensor_set", None, [P, P, c.c_size_t, c.c_size_t])
        self.tget = fn(base, "ggml_backend_tensor_get", None, [P, P, c.c_size_t, c.c_size_t])
        self.compute = fn(base, "ggml_backend_graph_compute", c.c_int, [P, P])
        self.buf_free = fn(base, "ggml_backend_buffer_free", None, [P])
        self.free = fn(base, "ggml_free", None, [P])
        self.cpu_buft = fn(base, "ggml_backend_cpu_buffer_type", P, [])
        self.repack_buft = fn(cpu, "_Z35ggml_backend_cpu_repack_buffer_typev", P, [])
        self.backend = fn(cpu, "ggml_backend_cpu_init", P, [])()
        fn(cpu, "ggml_backend_cpu_set_n_threads", None, [P, c.c_int])(self.backend, threads)
