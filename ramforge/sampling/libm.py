"""The C library's float math, as llama-sampler.cpp calls it (glibc's expf, logf, log2f, powf).

numpy's float32 exp and log are its own SIMD approximations and differ from glibc in the last bit
for a third of the inputs, enough to move a top-p cut or a draw; these are glibc's. Arrays go
through small numba loops (numba lowers math.exp on float32 to a call of expf), scalars through
ctypes. The kernels here call nothing from other files, so numba's per-file cache is exact for them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
from numba import njit

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
for _name, _n in (("expf", 1), ("logf", 1), ("log2f", 1), ("powf", 2)):
    _f = getattr(_libm, _name)
    _f.restype, _f.argtypes = ctypes.c_float, [ctypes.c_float] * _n

F32 = np.float32


def expf(x) -> np.float32:
    return F32(_libm.expf(float(x)))


def logf(x) -> np.float32:
    return F32(_libm.logf(float(x)))


def log2f(x) -> np.float32:
    return F32(_libm.log2f(float(x)))


def powf(x, y) -> np.float32:
    return F32(_libm.powf(float(x), float(y)))


@njit(cache=True)
def exp_shifted(x, m):
    """expf(x[i] - m) for float32 x and m."""
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = math.exp(x[i] - m)
    return out


@njit(cache=True)
def log_each(x):
    """logf(x[i]) for float32 x."""
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = math.log(x[i])
    return out


@njit(cache=True)
def first_surprise_over(p, mu):
    """The first i with -log2f(p[i]) > mu (p.size if none): mirostat v2's cut."""
    for i in range(p.size):
        if -math.log2(p[i]) > mu:
            return i
    return p.size


@njit(cache=True)
def sum_sq_f32(d):
    """float acc; acc += pow(d[i], 2) (a double): top-n-sigma's sum of squares."""
    acc = np.float32(0)
    for i in range(d.size):
        x = np.float64(d[i])
        acc = np.float32(np.float64(acc) + x * x)
    return acc
