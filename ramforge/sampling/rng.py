"""llama.cpp's random numbers: std::mt19937 and libstdc++'s (GCC 12) distributions over it, bit for bit.

- `MT19937(seed)`: the 32-bit Mersenne Twister as std::mt19937(seed) seeds and tempers it.
- `canonical_double()`: std::uniform_real_distribution<double>(0, 1), i.e. generate_canonical<double,
  53>: two draws, (x0 + x1 * 2^32) / 2^64 rounded once to double, 1.0 turned into the double below.
- `canonical_float()`: uniform_real_distribution<float>(0, 1): one draw, float(x) / 2^32.
- `discrete(rng, p)`: std::discrete_distribution<int>(p...)(rng): fewer than 2 weights return 0
  without a draw; else the weights (as double) are summed, each divided by the sum, accumulated, the
  last cumulative forced to 1, and the first cumulative >= a canonical double is the index.
"""
from __future__ import annotations

import math

import numpy as np

_N, _M = 624, 397
_U32 = np.uint32


class MT19937:
    """std::mt19937. `next()` is one 32-bit output; outputs are made 624 at a time."""

    def __init__(self, seed: int):
        self.seed(seed)

    def seed(self, seed: int) -> None:
        mt = [int(seed) & 0xFFFFFFFF]
        for i in range(1, _N):
            prev = mt[-1]
            mt.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self._mt = np.array(mt, dtype=_U32)
        self._out: list[int] = []
        self._pos = 0

    def _twist(self) -> None:
        mt = self._mt
        upper, lower = _U32(0x80000000), _U32(0x7FFFFFFF)
        mag = _U32(0x9908B0DF)
        # element i reads mt[i + 1] and mt[i + 397] (mod 624): chunks of at most 227 read only
        # elements already final (earlier chunks) or not yet rewritten (later indices)
        for lo, hi, src in ((0, 227, 397), (227, 454, 0), (454, 623, 227)):
            y = (mt[lo:hi] & upper) | (mt[lo + 1:hi + 1] & lower)
            mt[lo:hi] = mt[src:src + hi - lo] ^ (y >> _U32(1)) ^ np.where(y & _U32(1), mag, _U32(0))
        y = (mt[623] & upper) | (mt[0] & lower)
        mt[623] = mt[396] ^ (y >> _U32(1)) ^ (mag if y & _U32(1) else _U32(0))
        y = mt.copy()
        y ^= y >> _U32(11)
        y ^= (y << _U32(7)) & _U32(0x9D2C5680)
        y ^= (y << _U32(15)) & _U32(0xEFC60000)
        y ^= y >> _U32(18)
        self._out = y.tolist()
        self._pos = 0

    def next(self) -> int:
        if self._pos >= len(self._out):
            self._twist()
        self._pos += 1
        return self._out[self._pos - 1]

    def copy(self) -> "MT19937":
        other = MT19937.__new__(MT19937)
        other._mt, other._out, other._pos = self._mt.copy(), self._out, self._pos
        return other


_ONE_BELOW = math.nextafter(1.0, 0.0)
_ONE_BELOW_F = np.nextafter(np.float32(1), np.float32(0))


def canonical_double(rng: MT19937) -> float:
    x0 = rng.next()
    r = (float(x0) + float(rng.next()) * 4294967296.0) / 18446744073709551616.0
    return _ONE_BELOW if r >= 1.0 else r


def canonical_float(rng: MT19937) -> np.float32:
    r = np.float32(rng.next()) / np.float32(4294967296.0)
    return _ONE_BELOW_F if r >= 1 else r


def discrete(rng: MT19937, p: np.ndarray) -> int:
    """std::discrete_distribution<int>(p.begin(), p.end())(rng) for float weights p."""
    if p.size < 2:
        return 0
    w = p.astype(np.float64)
    cp = np.cumsum(w / np.cumsum(w)[-1])          # sequential sums, as std::accumulate / partial_sum
    cp[-1] = 1.0
    return int(np.searchsorted(cp, canonical_double(rng), side="left"))
