"""The expert cache's eviction policy as compiled steps (stream.experts.ExpertCache keeps the state): the
decayed use counts of LFU, and the choice of the slot to evict. In NumPy each was ~10 array calls, 20-110
us a layer turn at 1,203 slots (the 48-layer Qwen3-30B-A3B shape at 1/4); compiled, a few us.

LFU's count of expert e at layer row r: freq[r, e] uses, each weighing 1 when made and halving every
half_life tokens, as of token freq_t[r, e]; at token `now` it weighs freq[r, e] * 2^((freq_t[r, e] - now) /
half_life)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def count_uses(freq, freq_t, r, ids, now, half_life):
    # one use of each of ids i64[m] at layer row r, at token now: freq, freq_t f64[n_layers, n_expert]
    # (every new count from the old ones first, so a repeated id counts once, as a NumPy fancy assignment)
    new = np.empty(ids.shape[0])
    for i in range(ids.shape[0]):
        e = ids[i]
        new[i] = freq[r, e] * np.exp2((freq_t[r, e] - now) / half_life) + 1.0
    for i in range(ids.shape[0]):
        freq[r, ids[i]] = new[i]
        freq_t[r, ids[i]] = now


@njit(cache=True)
def pick_victim(held, where, freq, freq_t, now, half_life, used, lfu):
    # the slot to evict, -1 if every slot is held (held bool[n_slots]: protected or being read). LRU: the
    # least recently used (used f64[n_slots]: the clock of its last use); LFU: among the slots whose decayed
    # count is the lowest (within a relative 1e-9), the least recently used. where i64[n_slots, 2]: the
    # slot's (layer row, expert). Ties go to the lowest slot.
    n = held.shape[0]
    low = np.inf
    score = np.zeros(n)
    if lfu:
        for s in range(n):
            if not held[s]:
                r, e = where[s, 0], where[s, 1]
                score[s] = freq[r, e] * np.exp2((freq_t[r, e] - now) / half_life)
                low = min(low, score[s])
    best, last = -1, np.inf
    for s in range(n):
        if held[s] or lfu and not score[s] <= low * (1 + 1e-9):
            continue
        if used[s] < last:
            best, last = s, used[s]
    return best
