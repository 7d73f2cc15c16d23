"""Numba kernels, bit-exact with llama.cpp's CPU backend. docs/ARCHITECTURE.md ("Kernels, by layer")
maps every file here and what it holds (tests/test_docs.py checks that it names them all).
"""
from .naming import stable_cache_keys as _stable_cache_keys

_stable_cache_keys()        # before any kernel is looked up in numba's disk cache
