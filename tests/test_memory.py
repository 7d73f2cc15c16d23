"""Memory sizes, the budget and the bounded cache, with property tests over random sequences."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ramforge.errors import BudgetExceeded, MemorySizeError, RamforgeError
from ramforge.memory import BoundedCache, MemoryBudget, parse_memory_size

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


@pytest.mark.parametrize("text,expected", [
    ("8G", 8 * GiB), ("8GiB", 8 * GiB), ("8192M", 8 * GiB), ("512MiB", 512 * MiB), ("1.5G", 3 * GiB // 2),
    ("800K", 800 * KiB), ("800KiB", 800 * KiB), ("800KB", 800_000), ("2MB", 2_000_000), ("2GB", 2 * 10**9),
    ("4gib", 4 * GiB), (" 16 M ", 16 * MiB), ("1048576", MiB), ("100B", 100), ("1T", 1 << 40), (".5G", GiB // 2),
    (4096, 4096),
])
def test_parse_memory_size(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "8X", "8 G B", "-1G", "1e9", "eight", "8GiBs", "1..5G", True, -5])
def test_parse_memory_size_refuses(text):
    with pytest.raises(MemorySizeError) as e:
        parse_memory_size(text)
    assert isinstance(e.value, RamforgeError)


def test_budget_exceeded_names_request_current_and_budget():
    b = MemoryBudget(1000)
    b.charge("kv cache", 600)
    with pytest.raises(BudgetExceeded) as e:
        b.charge("layer 3", 500)
    msg = str(e.value)
    assert "layer 3" in msg and "500" in msg and "600" in msg and "1,000" in msg
    assert (e.value.request, e.value.current, e.value.budget) == (500, 600, 1000)
    assert b.current == 600


def test_charge_releases_on_error_and_settles():
    b = MemoryBudget("1K")
    with pytest.raises(ZeroDivisionError):
        with b.charge("read", 1000) as c:
            c.settle(10)
            assert b.current == 10
            1 / 0
    assert b.current == 0 and b.peak == 1000 and b.charges() == []
    c = b.charge("x", 10)
    with pytest.raises(BudgetExceeded):
        c.settle(2000)
    assert c.nbytes == 10 and b.current == 10
    c.release(), c.release()
    assert b.current == 0
    with pytest.raises(RamforgeError):
        c.settle(5)
    for bad in (-1, 1.5, "3"):
        with pytest.raises(RamforgeError):
            b.charge("bad", bad)
    with pytest.raises(RamforgeError):
        MemoryBudget(0)


def test_unlimited_budget_still_tracks():
    b = MemoryBudget()
    with b.charge("a", 10**12):
        assert b.current == 10**12 and b.available is None
    assert b.peak == 10**12 and b.current == 0


def test_cache_evicts_lru_and_releases_exactly():
    b = MemoryBudget(1000)
    cache = BoundedCache(b, capacity=300)
    assert cache.put("a", "A", 100) and cache.put("b", "B", 100) and cache.put("c", "C", 100)
    assert cache.get("a") == "A"                  # a is now most recent
    assert cache.put("d", "D", 150)               # evicts b then c
    assert "b" not in cache and "c" not in cache and "a" in cache and b.current == 250 == cache.size
    assert cache.get("zzz") is None and cache.hits == 1 and cache.misses == 1
    assert not cache.put("huge", "H", 301) and b.current == 250
    cache.clear()
    assert b.current == 0 and len(cache) == 0


def test_cache_pins_and_refuses_over_budget():
    b = MemoryBudget(250)
    cache = BoundedCache(b, capacity=400)
    assert cache.put("p", 1, 200, pin=True)
    assert not cache.put("q", 2, 250)             # only the pinned entry could be evicted
    with pytest.raises(BudgetExceeded):
        cache.put("r", 3, 100)                    # fits the capacity, not the budget
    assert "r" not in cache and b.current == 200 == cache.size


class BudgetMachine(RuleBasedStateMachine):
    """Random charges, settles, releases, failures inside charges, and cache traffic."""

    def __init__(self):
        super().__init__()
        self.budget = MemoryBudget(10_000)
        self.cache = BoundedCache(self.budget, capacity=4_000)
        self.live = []

    @rule(n=st.integers(0, 6_000))
    def charge(self, n):
        before = self.budget.current
        try:
            self.live.append(self.budget.charge(f"c{n}", n))
        except BudgetExceeded:
            assert self.budget.current == before and before + n > self.budget.limit

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), n=st.integers(0, 8_000))
    def settle(self, i, n):
        c = self.live[i % len(self.live)]
        old, before = c.nbytes, self.budget.current
        try:
            c.settle(n)
        except BudgetExceeded:
            assert c.nbytes == old and self.budget.current == before

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def release(self, i):
        self.live.pop(i % len(self.live)).release()

    @rule(n=st.integers(0, 6_000), m=st.integers(0, 6_000))
    def failure_inside_charge(self, n, m):
        before = self.budget.current
        try:
            with self.budget.charge("io", n) as c:
                c.settle(m)
                raise OSError("injected EIO")
        except (OSError, BudgetExceeded):
            pass
        assert self.budget.current == before

    @rule(key=st.integers(0, 20), n=st.integers(0, 5_000), pin=st.booleans())
    def cache_put(self, key, n, pin):
        try:
            self.cache.put(key, object(), n, pin=pin)
        except BudgetExceeded:
            pass

    @rule(key=st.integers(0, 20))
    def cache_pop(self, key):
        if key in self.cache:
            self.cache.pop(key)

    @invariant()
    def books_balance(self):
        live = sum(c.nbytes for c in self.live)
        assert self.budget.current == live + self.cache.size
        assert sum(n for _, n in self.budget.charges()) == self.budget.current
        assert self.budget.current <= self.budget.peak <= self.budget.limit
        assert self.cache.size <= self.cache.capacity

    def teardown(self):
        self.cache.clear()
        for c in self.live:
            c.release()
        assert self.budget.current == 0


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.integers(0, 3_000), max_size=30), st.integers(1, 20_000))
def test_peak_never_exceeds_budget(sizes, limit):
    b = MemoryBudget(limit)
    held = []
    for n in sizes:
        try:
            held.append(b.charge("x", n))
        except BudgetExceeded:
            held and held.pop(0).release()
    assert b.peak <= limit
    for c in held:
        c.release()
    assert b.current == 0
