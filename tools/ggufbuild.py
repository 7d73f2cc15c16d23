"""A byte-level GGUF writer for tests: it writes what it is told, malformed fields included."""
from __future__ import annotations

import struct

from ramforge.gguf.constants import GGML_BLOCK, GGUF_SCALAR, GGMLType, GGUFValueType as VT


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(vtype: VT, value, item: VT | None = None) -> bytes:
    if vtype == VT.STRING:
        return _str(value)
    if vtype == VT.ARRAY:
        body = b"".join(encode_value(item, v) for v in value)
        return struct.pack("<IQ", item, len(value)) + body
    return struct.pack(GGUF_SCALAR[vtype][0], value)


class GGUFBuilder:
    """Collects kv pairs and tensors; build() lays them out with offsets and alignment."""

    def __init__(self, version: int = 3, alignment: int = 32):
        self.version, self.alignment = version, alignment
        self.kv: list[bytes] = []
        self.tensors: list[dict] = []

    def kv_raw(self, key: str | bytes, vtype: int, payload: bytes) -> "GGUFBuilder":
        self.kv.append(_str(key) + struct.pack("<I", vtype) + payload)
        return self

    def add(self, key: str, vtype: VT, value, item: VT | None = None) -> "GGUFBuilder":
        return self.kv_raw(key, vtype, encode_value(vtype, value, item))

    def tensor(self, name: str, dims, gtype: int = GGMLType.F32, data: bytes | None = None,
               offset: int | None = None, raw_type: int | None = None, place: bool = True) -> "GGUFBuilder":
        """offset: the descriptor's offset (default: packed); place=False writes no data for it."""
        if data is None:
            n = 1
            for d in dims:
                n *= d
            block, size = GGML_BLOCK[GGMLType(gtype)]
            data = bytes((i * 7) & 0xFF for i in range(n // block * size))
        self.tensors.append(dict(name=name, dims=list(dims), type=gtype if raw_type is None else raw_type,
                                 data=data if place else b"", offset=offset))
        return self

    def build(self, magic: bytes = b"GGUF", n_tensors: int | None = None, n_kv: int | None = None,
              n_dims: dict | None = None) -> bytes:
        head = magic + struct.pack("<IQQ", self.version, len(self.tensors) if n_tensors is None else n_tensors,
                                   len(self.kv) if n_kv is None else n_kv)
        head += b"".join(self.kv)
        a = self.alignment
        offsets, pos = [], 0
        for t in self.tensors:
            pos = -(-pos // a) * a
            offsets.append(pos if t["offset"] is None else t["offset"])
            pos += len(t["data"])
        infos = b""
        for t, off in zip(self.tensors, offsets):
            nd = (n_dims or {}).get(t["name"], len(t["dims"]))
            infos += _str(t["name"]) + struct.pack("<I", nd) + b"".join(struct.pack("<q", d) for d in t["dims"])
            infos += struct.pack("<IQ", t["type"], off)
        out = bytearray(head + infos)
        data_start = -(-len(out) // a) * a
        out += bytes(data_start - len(out))
        for t, off in zip(self.tensors, offsets):
            end = data_start + off + len(t["data"])
            if len(out) < end:
                out += bytes(end - len(out))
            out[data_start + off:end] = t["data"]
        return bytes(out)


def valid_model() -> GGUFBuilder:
    """A small valid file: typical metadata, a tokenizer, and tensors of several types."""
    b = GGUFBuilder()
    b.add("general.architecture", VT.STRING, "llama")
    b.add("general.alignment", VT.UINT32, 32)
    b.add("llama.block_count", VT.UINT32, 1)
    b.add("llama.embedding_length", VT.UINT32, 64)
    b.add("llama.attention.head_count", VT.UINT32, 4)
    b.add("tokenizer.ggml.tokens", VT.ARRAY, ["a", "b", "c"], VT.STRING)
    b.add("tokenizer.ggml.scores", VT.ARRAY, [0.0, -1.0, -2.0], VT.FLOAT32)
    b.add("tokenizer.ggml.token_type", VT.ARRAY, [1, 1, 1], VT.INT32)
    b.add("flag", VT.BOOL, True)
    b.add("pi", VT.FLOAT64, 3.25)
    b.tensor("token_embd.weight", [64, 3], GGMLType.F16)
    b.tensor("blk.0.attn_q.weight", [64, 64], GGMLType.Q4_0)
    b.tensor("blk.0.ffn_up.weight", [256, 2], GGMLType.Q4_K)
    b.tensor("output_norm.weight", [64], GGMLType.F32)
    return b
