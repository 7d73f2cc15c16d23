"""The sorts llama.cpp's samplers call, as GCC 12's libstdc++ runs them, so that equal keys end up
in the same order as there (std::sort and std::partial_sort are not stable, and the order of equal
logits decides which tokens a cut keeps and where the draw's running sum passes them).

Each sorts an array of positions `a` in place by `key[a[i]]`, comparing with > (logits, best first);
an ascending sort compares the negated keys (the same answers). NaN keys compare false both ways, as
in C++. Self-contained (numba's
per-file cache is exact for it).
"""
from __future__ import annotations

import numpy as np
from numba import njit

_THRESHOLD = 16


@njit(cache=True, inline="always")
def _less(key, x, y):
    return key[x] > key[y]


@njit(cache=True)
def _push_heap(a, first, hole, top, value, key):
    parent = (hole - 1) // 2
    while hole > top and _less(key, a[first + parent], value):
        a[first + hole] = a[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[first + hole] = value


@njit(cache=True)
def _adjust_heap(a, first, hole, n, value, key):
    top = hole
    child = hole
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if _less(key, a[first + child], a[first + child - 1]):
            child -= 1
        a[first + hole] = a[first + child]
        hole = child
    if (n & 1) == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole] = a[first + child - 1]
        hole = child - 1
    _push_heap(a, first, hole, top, value, key)


@njit(cache=True)
def partial_sort(a, first, middle, last, key):
    """std::partial_sort(a + first, a + middle, a + last): heap select, then sort the heap."""
    n = middle - first
    if n >= 2:                                          # __make_heap
        parent = (n - 2) // 2
        while True:
            _adjust_heap(a, first, parent, n, a[first + parent], key)
            if parent == 0:
                break
            parent -= 1
    for i in range(middle, last):                       # __heap_select
        if _less(key, a[i], a[first]):
            v = a[i]
            a[i] = a[first]
            _adjust_heap(a, first, 0, n, v, key)
    end = middle                                        # __sort_heap
    while end - first > 1:
        end -= 1
        v = a[end]
        a[end] = a[first]
        _adjust_heap(a, first, 0, end - first, v, key)


@njit(cache=True)
def _introsort_loop(a, first, last, depth, key):
    """libstdc++'s recursion on the right part, kept on a stack (disjoint ranges: same result)."""
    stack = np.empty((2 * depth + 2, 3), np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2] = first, last, depth
    sp = 1
    while sp > 0:
        sp -= 1
        first, last, depth = stack[sp, 0], stack[sp, 1], stack[sp, 2]
        while last - first > _THRESHOLD:
            if depth == 0:
                partial_sort(a, first, last, last, key)
                break
            depth -= 1
            mid = first + (last - first) // 2           # __move_median_to_first(first, first+1, mid, last-1)
            x, y, z = first + 1, mid, last - 1
            if _less(key, a[x], a[y]):
                if _less(key, a[y], a[z]):
                    m = y
                elif _less(key, a[x], a[z]):
                    m = z
                else:
                    m = x
            elif _less(key, a[x], a[z]):
                m = x
            elif _less(key, a[y], a[z]):
                m = z
            else:
                m = y
            a[first], a[m] = a[m], a[first]
            lo, hi = first + 1, last                    # __unguarded_partition, pivot at first
            while True:
                while _less(key, a[lo], a[first]):
                    lo += 1
                hi -= 1
                while _less(key, a[first], a[hi]):
                    hi -= 1
                if not lo < hi:
                    break
                a[lo], a[hi] = a[hi], a[lo]
                lo += 1
            stack[sp, 0], stack[sp, 1], stack[sp, 2] = lo, last, depth
            sp += 1
            last = lo


@njit(cache=True)
def _linear_insert(a, i, key):
    v = a[i]
    j = i - 1
    while _less(key, v, a[j]):
        a[j + 1] = a[j]
        j -= 1
    a[j + 1] = v


@njit(cache=True)
def _insertion_sort(a, first, last, key):
    for i in range(first + 1, last):
        if _less(key, a[i], a[first]):
            v = a[i]
            a[first + 1:i + 1] = a[first:i].copy()
            a[first] = v
        else:
            _linear_insert(a, i, key)


@njit(cache=True)
def sort(a, first, last, key):
    """std::sort(a + first, a + last): introsort, then the final insertion sort."""
    n = last - first
    if n <= 1:
        return
    lg = 0
    while (n >> (lg + 1)) > 0:
        lg += 1
    _introsort_loop(a, first, last, 2 * lg, key)
    if n > _THRESHOLD:
        _insertion_sort(a, first, first + _THRESHOLD, key)
        for i in range(first + _THRESHOLD, last):
            _linear_insert(a, i, key)
    else:
        _insertion_sort(a, first, last, key)


@njit(cache=True)
def bucket_top(logit, npartial):
    """llama_token_data_array_partial_sort: positions of the npartial best logits, best first
    (128 buckets over [-10, 10], the upper ones sorted whole, the boundary one partially)."""
    nb = 128
    scale = np.float32(nb / 20.0)
    inter = np.float32(10.0) * scale
    n = logit.size
    bidx = np.empty(n, np.int64)
    histo = np.zeros(nb, np.int64)
    for i in range(n):
        ib = int(scale * logit[i] + inter)              # float32 arithmetic, truncated
        ib = max(0, min(nb - 1, ib))
        bidx[i] = ib
        histo[ib] += 1
    nhave = 0
    ib = nb - 1
    while ib >= 0:
        nhave += histo[ib]
        if nhave >= npartial:
            break
        ib -= 1
    ib = max(ib, 0)
    start = np.zeros(nb, np.int64)                      # where each bucket starts in the result
    pos = 0
    for j in range(nb - 1, ib - 1, -1):
        start[j] = pos
        pos += histo[j]
    res = np.empty(nhave, np.int64)
    fill = start.copy()
    for i in range(n):
        j = bidx[i]
        if j >= ib:
            res[fill[j]] = i
            fill[j] += 1
    done = 0
    for j in range(nb - 1, ib, -1):
        sort(res, start[j], start[j] + histo[j], logit)
        done += histo[j]
    partial_sort(res, start[ib], start[ib] + npartial - done, start[ib] + histo[ib], logit)
    return res[:npartial]


@njit(cache=True)
def top_sorted(logit, npartial):
    """llama_token_data_array_partial_sort_inplace: positions of the npartial best, best first."""
    if npartial <= 128:
        a = np.arange(logit.size)
        partial_sort(a, 0, npartial, logit.size, logit)
        return a[:npartial].copy()
    return bucket_top(logit, npartial)


@njit(cache=True)
def argsort_asc(key):
    """std::sort of positions 0..n-1 by key ascending (typical's shifted scores)."""
    a = np.arange(key.size)
    sort(a, 0, key.size, -key)
    return a
