"""The GGUF reader: valid files agree with gguf-py; every malformed field is a GGUFError."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ramforge.errors import GGUFError, RamforgeError
from ramforge.gguf.constants import GGMLType, GGUFValueType as VT
from ramforge.gguf.reader import GGUFFile
from tests.ggufpy import gguf_reader
from tools.ggufbuild import GGUFBuilder, valid_model


def write(tmp_path, data: bytes, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def open_bytes(tmp_path, data: bytes) -> GGUFFile:
    return GGUFFile(write(tmp_path, data))


def test_valid_file_metadata_and_tensors(tmp_path):
    f = open_bytes(tmp_path, valid_model().build())
    md = f.metadata
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == 1
    assert md["tokenizer.ggml.tokens"] == ["a", "b", "c"]
    assert md["tokenizer.ggml.scores"].dtype == np.float32 and md["tokenizer.ggml.scores"].tolist() == [0, -1, -2]
    assert md["flag"] is True and md["pi"] == 3.25
    t = f.tensors["blk.0.attn_q.weight"]
    assert t.ggml_type == GGMLType.Q4_0 and t.dims == (64, 64) and t.shape == (64, 64)
    assert t.nbytes == 64 * 64 // 32 * 18 and t.offset % 32 == 0
    raw = f.read_tensor(t)
    assert raw.dtype == np.uint8 and raw.tobytes() == bytes((i * 7) & 0xFF for i in range(t.nbytes))
    assert f.read_tensor(t, 18, 18).tobytes() == raw[18:36].tobytes()


def test_version_2_is_read(tmp_path):
    b = valid_model()
    b.version = 2
    assert len(open_bytes(tmp_path, b.build()).tensors) == 4


def test_agrees_with_gguf_py(tmp_path):
    gguf = pytest.importorskip("gguf")
    p = write(tmp_path, valid_model().build())
    ours, theirs = GGUFFile(p), gguf.GGUFReader(p)
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.offset == t.data_offset and mine.nbytes == t.n_bytes
        assert mine.dims == tuple(int(x) for x in t.shape) and int(mine.ggml_type) == int(t.tensor_type)
        assert np.array_equal(ours.read_tensor(mine), np.asarray(t.data).view(np.uint8).reshape(-1))


# raw strings: empty, NUL inside, invalid and truncated UTF-8, and long enough to cross a read's end
_RAW_STRINGS = st.lists(st.one_of(st.binary(max_size=12), st.text(max_size=6).map(lambda t: t.encode()),
                                  st.sampled_from([b"", b"\x00", b"a\x00b", b"\xe2\x82", b"\xac", b"\xff\xfe",
                                                   b"\xf0\x9f\x98", b"\xed\xa0\x80"])),
                        max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_RAW_STRINGS, pad=st.integers(0, 40))
def test_string_array_decodes_each_string_alone(tmp_path, monkeypatch, raw, pad):
    """The batched vocabulary decode (_decode_strings: one decode split on NUL) gives what decoding each
    string alone gives, across buffer refills (a 64-byte read here) and strings that hold a NUL."""
    import ramforge.gguf.reader as reader

    monkeypatch.setattr(reader, "_READ_AHEAD", 64)
    payload = struct.pack("<IQ", VT.STRING, len(raw)) + b"".join(struct.pack("<Q", len(r)) + r for r in raw)
    f = open_bytes(tmp_path, GGUFBuilder().add("pad", VT.STRING, "p" * pad).kv_raw("s", VT.ARRAY, payload)
                   .add("after", VT.UINT32, 7).build())
    assert f.metadata["s"] == [r.decode("utf-8", "surrogateescape") for r in raw]
    assert f.metadata["after"] == 7


def test_string_array_of_a_real_vocabulary_matches_gguf_py(default_model):
    ours = GGUFFile(default_model).metadata["tokenizer.ggml.tokens"]
    field = gguf_reader(default_model).fields["tokenizer.ggml.tokens"]
    theirs = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
    assert len(ours) == 262144 and ours == theirs


def test_default_model_descriptors_match_gguf_py(default_model):
    ours, theirs = GGUFFile(default_model), gguf_reader(default_model)
    assert len(ours.tensors) == len(theirs.tensors) == 236
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert (mine.offset, mine.nbytes, int(mine.ggml_type)) == (t.data_offset, t.n_bytes, int(t.tensor_type))
    assert ours.metadata["tokenizer.ggml.tokens"][:3] == ["<pad>", "<eos>", "<bos>"]


def test_opening_reads_no_payload(default_model, monkeypatch):
    reads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: reads.append((off, n)) or real(fd, n, off))
    f = GGUFFile(default_model)
    assert reads and all(off < f.data_offset for off, _ in reads), "a header read started in the data section"
    header_bytes = sum(n for _, n in reads)
    assert f.bytes_read == header_bytes < 1.1 * f.data_offset < f.size / 10
    assert max(off + n for off, n in reads) <= f.data_offset + (1 << 16), "read ahead more than 64 KiB"
    t = f.tensors["blk.0.attn_q.weight"]
    f.read_tensor(t, 0, 1000)
    assert f.bytes_read == header_bytes + 1000


# ---- malformed files: each case is (description, bytes, substring of the error) -------------

def _kv(key, vtype, payload):
    return GGUFBuilder().kv_raw(key, vtype, payload).build()


def _tensor_case(**kw):
    b = GGUFBuilder()
    b.tensor("t", **kw)
    return b.build()


def _two_tensors(off2):
    b = GGUFBuilder()
    b.tensor("a", [32]).tensor("b", [32], offset=off2)
    return b.build()


def _dup_tensor():
    return GGUFBuilder().tensor("a", [32]).tensor("a", [32]).build()


def _align(vtype, value):
    return GGUFBuilder().add("general.alignment", vtype, value).tensor("t", [32]).build()


def _version(v):
    b = valid_model()
    b.version = v
    return b.build()


BIG = 2**64 - 1
MALFORMED = [
    ("under 24 bytes", b"GGUF\x03\x00\x00\x00" + bytes(8), "file size"),
    ("bad magic", b"GGML" + valid_model().build()[4:], "magic"),
    ("version 0", _version(0), "version"),
    ("version 1", _version(1), "version"),
    ("version 4", _version(4), "version"),
    ("big-endian", b"GGUF" + struct.pack(">I", 3) + valid_model().build()[8:], "big-endian"),
    ("n_tensors too large", valid_model().build(n_tensors=2**40), "n_tensors"),
    ("n_kv too large", valid_model().build(n_kv=2**40), "n_kv"),
    ("n_kv more than present", valid_model().build(n_kv=11), ""),
    ("key length past EOF", GGUFBuilder().build(n_kv=1)[:24] + struct.pack("<Q", 1000) + bytes(20), "key length"),
    ("key length 2^64-1", GGUFBuilder().build(n_kv=1)[:24] + struct.pack("<Q", BIG) + bytes(20), "key length"),
    ("string value length 2^64-1", _kv("s", VT.STRING, struct.pack("<Q", BIG) + b"x"), "s length"),
    ("string value past EOF", _kv("s", VT.STRING, struct.pack("<Q", 50) + b"x"), "s length"),
    ("unknown value type", _kv("x", 99, b"\0" * 8), "x value type"),
    ("array of arrays", _kv("x", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) + struct.pack("<IQ", VT.UINT8, 0)), "arrays of arrays"),
    ("unknown array type", _kv("x", VT.ARRAY, struct.pack("<IQ", 77, 1)), "x array type"),
    ("array count overflow", _kv("x", VT.ARRAY, struct.pack("<IQ", VT.UINT64, 2**62) + bytes(16)), "x array count"),
    ("array past EOF", _kv("x", VT.ARRAY, struct.pack("<IQ", VT.UINT32, 100) + bytes(16)), "x array count"),
    ("string array count 2^64-1", _kv("x", VT.ARRAY, struct.pack("<IQ", VT.STRING, BIG) + bytes(16)), "x array count"),
    ("string in array past EOF", _kv("x", VT.ARRAY, struct.pack("<IQQ", VT.STRING, 2, 1) + b"a" + struct.pack("<Q", 99)), "x[1] length"),
    ("bool out of range", _kv("b", VT.BOOL, b"\x07"), "BOOL"),
    ("empty key", _kv("", VT.UINT8, b"\x01"), "non-empty key"),
    ("duplicate key", GGUFBuilder().add("k", VT.UINT8, 1).add("k", VT.UINT8, 2).build(), "unique key"),
    ("key not UTF-8", _kv(b"\xff\xfe", VT.UINT8, b"\x01"), "UTF-8"),
    ("alignment not UINT32", _align(VT.UINT64, 32), "general.alignment type"),
    ("alignment 0", _align(VT.UINT32, 0), "power of two"),
    ("alignment not a power of two", _align(VT.UINT32, 48), "power of two"),
    ("alignment over 1 MiB", _align(VT.UINT32, 1 << 21), "power of two"),
    ("duplicate tensor name", _dup_tensor(), "unique tensor name"),
    ("tensor name of 64 bytes", GGUFBuilder().tensor("x" * 64, [32]).build(), "shorter than 64"),
    ("empty tensor name", GGUFBuilder().tensor("", [32]).build(), "non-empty name"),
    ("n_dims 0", GGUFBuilder().tensor("t", [32]).build(n_dims={"t": 0}), "n_dims"),
    ("n_dims 5", GGUFBuilder().tensor("t", [32, 1, 1, 1, 1]).build(), "n_dims"),
    ("dim 0", _tensor_case(dims=[32, 0], data=b""), "positive dimension"),
    ("negative dim", _tensor_case(dims=[32, -4], data=b""), "positive dimension"),
    ("element count overflow", _tensor_case(dims=[2**32, 2**32], data=b""), "element count"),
    ("byte count past file size", _tensor_case(dims=[2**20, 2**20], data=b""), "byte count"),
    ("ne0 not a block multiple", _tensor_case(dims=[33], gtype=GGMLType.Q4_0, data=b""), "block size 32"),
    ("MXFP4 block count does not divide", _tensor_case(dims=[48, 4], gtype=GGMLType.MXFP4, data=b""),
     "field t ne0 = 48 at byte 37: expected a multiple of MXFP4's block size 32"),
    ("unknown ggml type", _tensor_case(dims=[32], raw_type=99, data=bytes(128)), "known ggml type"),
    ("removed ggml type 4", _tensor_case(dims=[32], raw_type=4, data=bytes(128)), "known ggml type"),
    ("misaligned offset", _tensor_case(dims=[32], offset=4), "multiple of the alignment"),
    ("overlapping tensors", _two_tensors(0), "no overlap"),
    ("offset past EOF", _tensor_case(dims=[32], offset=1 << 20, place=False), "data section"),
    ("truncated data", valid_model().build()[:-100], "data section"),
    ("tokens not strings", valid_model().add("tokenizer.ggml.merges", VT.ARRAY, [1, 2], VT.INT32).build(), "tokenizer.ggml.merges type"),
    ("tokens wrong value type", GGUFBuilder().add("tokenizer.ggml.tokens", VT.STRING, "abc").build(), "tokenizer.ggml.tokens type"),
    ("scores of another length", GGUFBuilder().add("tokenizer.ggml.tokens", VT.ARRAY, ["a", "b"], VT.STRING)
        .add("tokenizer.ggml.scores", VT.ARRAY, [0.0], VT.FLOAT32).build(), "tokenizer.ggml.scores length"),
    ("token_type of another length", GGUFBuilder().add("tokenizer.ggml.tokens", VT.ARRAY, ["a"], VT.STRING)
        .add("tokenizer.ggml.token_type", VT.ARRAY, [1, 1], VT.INT32).build(), "tokenizer.ggml.token_type length"),
    ("token_type wrong element type", GGUFBuilder().add("tokenizer.ggml.tokens", VT.ARRAY, ["a"], VT.STRING)
        .add("tokenizer.ggml.token_type", VT.ARRAY, [1.0], VT.FLOAT32).build(), "tokenizer.ggml.token_type type"),
]


@pytest.mark.parametrize("data,needle", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_file_is_refused(tmp_path, data, needle):
    with pytest.raises(GGUFError) as e:
        open_bytes(tmp_path, data)
    msg = str(e.value)
    assert needle in msg and "expected" in msg and str(tmp_path) in msg
    assert e.value.field and isinstance(e.value, RamforgeError)


def test_read_tensor_range_is_checked(tmp_path):
    f = open_bytes(tmp_path, valid_model().build())
    t = f.tensors["output_norm.weight"]
    with pytest.raises(GGUFError, match="range"):
        f.read_tensor(t, 200, 100)


def test_file_truncated_after_open_is_a_clear_error(tmp_path):
    p = write(tmp_path, valid_model().build())
    f = GGUFFile(p)
    t = f.tensors["output_norm.weight"]
    os.truncate(p, t.offset + 8)
    with pytest.raises(GGUFError, match="truncated or changed"):
        f.read_tensor(t)
