"""Fuzzing the GGUF reader: mutated small GGUF files never crash it, hang it or make it allocate.

Every input either parses -- and then read_tensor on each tensor works and the descriptors are
consistent with the file -- or is refused with a RamforgeError (GGUFError).  Any other exception is
a failure, and so is a case that runs over TIME_LIMIT_S or allocates (tracemalloc peak) more than
ALLOC_LIMIT beyond the input size, or leaks a file descriptor.

Inputs start from small valid files built with tools/ggufbuild.py (valid_model() and random
builders: every value type, string and numeric arrays, nested arrays, tokenizer keys, tensors of
every ggml type and 1-4 dims, several alignments) and are mutated field-aware -- header fields,
counts, string lengths, value types, array item types and counts, alignment, n_dims, dims, ggml
types, tensor offsets, overwritten with values chosen to trap a naive parser (counts of 2^40,
2^64-1, products that wrap 64 bits) -- and byte-wise: truncation, flips, insertions, deletions,
splices, padding.

The generator is driven by a random.Random-like object, so the same code runs under hypothesis
(st.randoms, shrinkable, derandomized here) and in robustness/fuzz.py (random.Random(seed), 10k+
cases).  One case of robustness/fuzz.py reproduces with ``case_bytes(seed, index)``.  The generator and
run_case live in robustness/gguf_cases.py, which both use.
"""
from __future__ import annotations

import os
import random
import struct
import tempfile
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ramforge.gguf.constants import GGMLType, GGUFValueType as VT
from robustness.gguf_cases import (GTYPES, HOSTILE_I64, HOSTILE_U64, Outcome, TIME_LIMIT_S, U64_MAX,
                                   describe, field_map, gen_case, put_field, random_builder, run_case)
from tools.ggufbuild import GGUFBuilder, valid_model


@pytest.fixture(scope="module")
def case_path():
    with tempfile.TemporaryDirectory(prefix="ramforge-fuzz-") as d:
        yield os.path.join(d, "case.gguf")


def assert_clean(data: bytes, path: str) -> Outcome:
    out = run_case(data, path)
    assert not out.failed, describe(out, data)
    return out


# deadline: hypothesis's own per-case time check (the case itself is also timed against TIME_LIMIT_S)
FUZZ = dict(derandomize=True, database=None, deadline=timedelta(seconds=TIME_LIMIT_S), print_blob=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                   HealthCheck.data_too_large])


@st.composite
def mutated_gguf(draw) -> bytes:
    """A small GGUF built with GGUFBuilder, then mutated field-wise and byte-wise."""
    return gen_case(draw(st.randoms(use_true_random=False)))


@settings(max_examples=160, **FUZZ)
@given(data=mutated_gguf())
def test_mutated_files_parse_or_are_refused(case_path, data):
    assert_clean(data, case_path)


# hostile integers written at the positions a naive parser trusts: (description, builder of bytes)
def _at(kind: str, base: GGUFBuilder | None = None):
    def build(v: int, pad: int) -> bytes:
        data = bytearray((base or valid_model()).build() + bytes(pad))
        fields = [f for f in field_map(bytes(data)) if f.kind == kind]
        put_field(data, fields[0], v % (1 << (8 * fields[0].width)))
        return bytes(data)
    return build


def _array_of(item: VT, values) -> GGUFBuilder:
    return GGUFBuilder().add("a", VT.ARRAY, values, item).tensor("t", [32])


def _nested() -> GGUFBuilder:
    inner = struct.pack("<IQ", VT.UINT8, 2) + b"\x01\x02"
    return GGUFBuilder().kv_raw("n", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) + inner)


TRAP_SITES = {
    "n_kv": _at("n_kv"),
    "n_tensors": _at("n_tensors"),
    "key length": _at("key_len"),
    "string value length": _at("str_len", GGUFBuilder().add("s", VT.STRING, "abc")),
    "string array count": _at("arr_count", _array_of(VT.STRING, ["x", "y"])),
    "string in array length": _at("str_len", _array_of(VT.STRING, ["x", "y"])),
    "uint8 array count": _at("arr_count", _array_of(VT.UINT8, [1, 2])),
    "uint64 array count": _at("arr_count", _array_of(VT.UINT64, [1, 2])),
    "float64 array count": _at("arr_count", _array_of(VT.FLOAT64, [1.0])),
    "bool array count": _at("arr_count", _array_of(VT.BOOL, [True])),
    "nested array outer count": _at("arr_count", _nested()),
    "tensor name length": _at("tname_len"),
    "tensor offset": _at("toffset"),
}


@settings(max_examples=80, **FUZZ)
@given(site=st.sampled_from(sorted(TRAP_SITES)),
       value=st.sampled_from(HOSTILE_U64) | st.integers(0, U64_MAX),
       pad=st.sampled_from([0, 8, 4096, 1 << 16, 1 << 20]))
def test_hostile_counts_and_lengths(case_path, site, value, pad):
    """Counts and lengths up to 2^64-1 (with up to 1 MiB of zeros after them) allocate nothing big."""
    data = TRAP_SITES[site](value, pad)
    out = assert_clean(data, case_path)
    # stricter than the generic bound: nothing near the claimed size, only what the file holds
    assert out.peak <= 3 * len(data) + (1 << 20), describe(out, data)


@settings(max_examples=60, **FUZZ)
@given(n_dims=st.sampled_from([0, 1, 2, 3, 4, 5, 2**32 - 1]),
       dims=st.lists(st.sampled_from(HOSTILE_I64) | st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=5),
       gtype=st.sampled_from(GTYPES) | st.integers(0, 2**32 - 1),
       offset=st.sampled_from([0, 1, 32, 2**32, 2**63, 2**64 - 32, U64_MAX]) | st.integers(0, 2**20),
       pad=st.sampled_from([0, 4096, 1 << 20]))
def test_hostile_tensor_descriptors(case_path, n_dims, dims, gtype, offset, pad):
    """Any n_dims/dims/type/offset: byte counts that overflow int64 or wrap 64 bits are refused."""
    b = GGUFBuilder()
    b.tensor("t", dims, GGMLType.F32, data=b"", raw_type=gtype % 2**32)
    data = bytearray(b.build(n_dims={"t": n_dims}) + bytes(pad))
    at = 24 + 9 + 4 + 8 * len(dims) + 4      # header, name "t", n_dims, dims, type: then the offset
    data[at:at + 8] = struct.pack("<Q", offset)
    data = bytes(data)
    out = assert_clean(data, case_path)
    assert out.peak <= 3 * len(data) + (1 << 20), describe(out, data)


# inputs that would make a naive parser allocate (or loop) by the claimed count: each is refused
# before anything of that size exists
NAIVE_TRAPS = [
    ("n_kv 2^40", valid_model().build(n_kv=2**40)),
    ("n_tensors 2^64-1", valid_model().build(n_tensors=U64_MAX)),
    ("key length 2^63", TRAP_SITES["key length"](2**63, 0)),
    ("string length 2^64-1", TRAP_SITES["string value length"](U64_MAX, 4096)),
    ("uint64 array 2^40 items", TRAP_SITES["uint64 array count"](2**40, 4096)),
    ("uint64 array 2^61+1 items (count*8 wraps to 8)", TRAP_SITES["uint64 array count"](2**61 + 1, 4096)),
    ("string array 2^40 items", TRAP_SITES["string array count"](2**40, 1 << 20)),
    ("string array 2^61 items (count*8 wraps to 0)", TRAP_SITES["string array count"](2**61, 4096)),
    ("nested array 2^40 items", TRAP_SITES["nested array outer count"](2**40, 4096)),
    ("dims 2^32 x 2^32", GGUFBuilder().tensor("t", [2**32, 2**32], data=b"").build()),
    ("dims product wraps 2^64", GGUFBuilder().tensor("t", [2**62, 4, 2], data=b"").build()),
    ("dims 2^40 x 2^20", GGUFBuilder().tensor("t", [2**40, 2**20], data=b"").build()),
    ("n_dims 2^32-1", GGUFBuilder().tensor("t", [32]).build(n_dims={"t": 2**32 - 1})),
    ("offset 2^64-32 (offset+size wraps)", TRAP_SITES["tensor offset"](2**64 - 32, 0)),
]


@pytest.mark.parametrize("data", [c[1] for c in NAIVE_TRAPS], ids=[c[0] for c in NAIVE_TRAPS])
def test_naive_parser_traps_are_refused_cheaply(case_path, data):
    out = assert_clean(data, case_path)
    assert out.status == "refused" and out.exc == "GGUFError", describe(out, data)
    assert out.peak < 3 * len(data) + (256 << 10), describe(out, data)
    assert out.elapsed < 0.2, describe(out, data)


def test_string_array_allocation_is_linear_in_the_file(case_path):
    """The worst legal metadata: ~29k one-byte non-UTF-8 strings in 256 KiB.  Python objects cost more
    than their bytes (str of a lone surrogate escape: ~76 B for 9 file bytes), but it stays linear."""
    n = (1 << 18) // 9
    payload = struct.pack("<IQ", VT.STRING, n) + (struct.pack("<Q", 1) + b"\x80") * n
    data = GGUFBuilder().kv_raw("s", VT.ARRAY, payload).build()
    out = assert_clean(data, case_path)
    assert out.status == "ok"
    assert out.peak < 10 * len(data) + (1 << 20), describe(out, data)


def test_every_generator_path_builds_parseable_bases():
    """Sanity of the fuzzer itself: unmutated random bases mostly parse (the mutations start from
    valid files), and the field map finds each kind of field."""
    rng = random.Random(0)
    kinds, ok = set(), 0
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "b.gguf")
        for _ in range(60):
            data = random_builder(rng).build()
            kinds |= {f.kind for f in field_map(data)}
            out = run_case(data, p)
            assert not out.failed, describe(out, data)
            ok += out.status == "ok"
    assert ok >= 30
    assert kinds >= {"version", "n_tensors", "n_kv", "key_len", "vtype", "arr_type", "arr_count", "str_len",
                     "value", "alignment", "tname_len", "n_dims", "dim", "ggml_type", "toffset"}
