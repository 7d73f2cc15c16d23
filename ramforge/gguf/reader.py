"""Hardened GGUF reader: header, metadata and tensor descriptors; payload bytes only on request.

Every size is computed with Python ints and checked against the file size before anything is
allocated, and every malformed field raises GGUFError naming the field, value, offset and what
was expected.

Split models (llama.cpp's gguf-split: NAME-00001-of-0000N.gguf, each shard with `split.no`,
`split.count`, `split.tensors.count`; the metadata in the first) open as one GGUFFile from any
shard (gguf.split): its shards are found by name, checked to belong together (SplitShardMissing, SplitMismatch)
and their tensors joined. Each tensor knows its shard (`TensorInfo.file`); its `offset` is an
address in one space where shard k's bytes start at `bases[k]` (0 for the first, so a single file's
addresses are its file offsets), far enough apart that no read span crosses from one shard into
the next. `stream.io.ModelFile` maps an address back to (shard, file offset).
"""
from __future__ import annotations

import os
import struct
from bisect import bisect_right
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GGUFError, SplitMismatch
from . import split as _split
from .split import SHARD_GAP, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS, Split, split_path, split_prefix  # noqa: F401 (re-exported)
from .constants import (GGML_BLOCK, GGML_MAX_DIMS, GGML_MAX_NAME, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC,
                        GGUF_MAX_ALIGNMENT, GGUF_SCALAR, GGUF_VERSIONS, GGMLType, GGUFValueType, Keys)

_READ_AHEAD = 1 << 16           # header bytes fetched per read; header parsing never starts a read in the data section
_INT64_MAX = (1 << 63) - 1
_MIN_KV_BYTES = 8 + 1 + 4 + 1   # key length, 1-byte key, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, name, n_dims, one dim, type, offset

# Known keys whose value type is fixed: key -> (value type, array element type or None)
_TYPED_KEYS = {
    Keys.ALIGNMENT: (GGUFValueType.UINT32, None),
    Keys.ARCHITECTURE: (GGUFValueType.STRING, None),
    Keys.TOKENIZER_MODEL: (GGUFValueType.STRING, None),
    Keys.TOKENIZER_PRE: (GGUFValueType.STRING, None),
    Keys.TOKENS: (GGUFValueType.ARRAY, GGUFValueType.STRING),
    Keys.SCORES: (GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
    Keys.TOKEN_TYPE: (GGUFValueType.ARRAY, GGUFValueType.INT32),
    Keys.MERGES: (GGUFValueType.ARRAY, GGUFValueType.STRING),
    Keys.CHAT_TEMPLATE: (GGUFValueType.STRING, None),
}
_PARALLEL_ARRAYS = (Keys.SCORES, Keys.TOKEN_TYPE)  # must have as many entries as TOKENS

@dataclass(frozen=True)
class Field:
    """One metadata key/value pair; `offset` is where the key starts in the file."""

    key: str
    type: GGUFValueType
    value: Any                      # int/float/bool/str; list[str] or np.ndarray for arrays
    offset: int
    item_type: GGUFValueType | None = None  # element type of an ARRAY


@dataclass(frozen=True)
class TensorInfo:
    """A tensor descriptor. dims are in GGUF order (ne0, the contiguous one, first)."""

    name: str
    ggml_type: GGMLType
    dims: tuple[int, ...]
    offset: int                     # its address: the byte offset in the file (+ its shard's base, GGUFFile.bases)
    nbytes: int
    file: int = 0                   # the shard that holds it (0: the first, or the only file)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy (row-major) order: the reverse of dims."""
        return tuple(reversed(self.dims))

    @property
    def n_blocks(self) -> int:
        return self.n_elements // GGML_BLOCK[self.ggml_type][0]


class _Cursor:
    """Sequential little-endian decoder over the header, reading ahead in bounded chunks."""

    def __init__(self, gguf: "GGUFFile"):
        self.g = gguf
        self.pos = 0                # absolute offset of the next byte to decode
        self.buf = b""
        self.buf_start = 0

    def take(self, n: int, field: str) -> bytes:
        lo = self._fill(n, field)
        self.pos += n
        return self.buf[lo:lo + n]

    def scalar(self, vtype: GGUFValueType, field: str):
        fmt, size, _ = GGUF_SCALAR[vtype]
        return struct.unpack(fmt, self.take(size, field))[0]

    def u32(self, field: str) -> int:
        return self.scalar(GGUFValueType.UINT32, field)

    def u64(self, field: str) -> int:
        return self.scalar(GGUFValueType.UINT64, field)

    def remaining(self) -> int:
        return self.g.size - self.pos

    def _fill(self, n: int, field: str) -> int:
        """Make n bytes at pos available in buf; return their index in buf."""
        lo = self.pos - self.buf_start
        if lo + n <= len(self.buf):
            return lo
        if self.pos + n > self.g.size:
            raise GGUFError(field, n, self.pos, f"{n} bytes, but the file ends at byte {self.g.size}", self.g.path)
        self.buf = self.g._pread(self.pos, min(max(n, _READ_AHEAD), self.g.size - self.pos))
        self.buf_start = self.pos
        if len(self.buf) < n:
            raise GGUFError(field, len(self.buf), self.pos, f"{n} readable bytes (short read)", self.g.path)
        return 0

    def string_array(self, count: int, field: str) -> list[str]:
        """count length-prefixed strings (a vocabulary: 262k of them). Per chunk of buf, a Python loop
        finds where each string's length field starts; the strings are then decoded in one call."""
        out: list[str] = []
        unpack, size = struct.Struct("<Q").unpack_from, self.g.size
        while len(out) < count:
            i = len(out)
            lo = self._fill(8, f"{field}[{i}] length")
            buf, heads, p = self.buf, array("q"), lo
            add = heads.append
            try:                                      # the hot loop: where each length field starts
                for _ in range(count - i):
                    n = unpack(buf, p)[0]             # struct.error, OverflowError: no 8 bytes at p in buf
                    add(p)
                    p += 8 + n
            except (struct.error, OverflowError):
                pass
            while heads and p > len(buf):             # the last string runs past buf
                p = heads.pop()
            if heads:
                out += _decode_strings(buf, heads, p)
                self.pos = self.buf_start + p
                continue
            (n,) = unpack(buf, lo)                    # one string that buf does not hold
            if n > size - self.pos - 8:
                raise GGUFError(f"{field}[{i}] length", n, self.pos, f"at most {size - self.pos - 8} (bytes left in the file)", self.g.path)
            self.pos += 8
            out.append(self.take(n, f"{field}[{i}]").decode("utf-8", "surrogateescape"))
        return out

    def string(self, field: str, strict: bool = False) -> str:
        at = self.pos
        n = self.u64(f"{field} length")
        if n > self.remaining():
            raise GGUFError(f"{field} length", n, at, f"at most {self.remaining()} (bytes left in the file)", self.g.path)
        raw = self.take(n, field)
        try:
            return raw.decode("utf-8", errors="strict" if strict else "surrogateescape")
        except UnicodeDecodeError as e:
            raise GGUFError(field, raw[:64], at, f"valid UTF-8 ({e.reason})", self.g.path) from None


def _decode_strings(buf: bytes, heads: array, end: int) -> list[str]:
    """The strings whose u64 length fields start at buf[heads] (the last one ends at buf[end]), decoded
    as UTF-8 with surrogateescape. Each length field becomes one NUL and the whole run is decoded and
    split on NUL: the same strings as decoding each alone (a NUL cannot continue a UTF-8 sequence, and
    surrogateescape escapes invalid bytes one by one), unless a string holds a NUL itself."""
    h0 = heads[0]
    h = np.frombuffer(heads, np.int64) - h0
    run = np.frombuffer(buf, np.uint8, end - h0, h0).copy()
    keep = np.ones(run.size, bool)
    for k in range(1, 8):
        keep[h + k] = False
    run[h] = 0
    run = run[keep]
    if np.count_nonzero(run == 0) != len(heads):      # a string holds a NUL: decode one by one
        return [buf[p + 8:e].decode("utf-8", "surrogateescape") for p, e in zip(heads, [*heads[1:], end])]
    return run[1:].tobytes().decode("utf-8", "surrogateescape").split("\x00")


class GGUFFile:
    """A parsed GGUF file. Opening reads the header, metadata and tensor descriptors only.

    >>> with GGUFFile("model.gguf") as f:                # doctest: +SKIP
    ...     f.metadata["general.architecture"], len(f.tensors)
    ('gemma3', 236)
    """

    def __init__(self, path, join_split: bool = True):
        """path: a file (any shard of a split model opens them all, found by name), a source with `name`,
        `size` and `pread(offset, n)` (store.ranged.RangeFile: a header read over HTTP ranges; the payload
        is then read through it too), or a list of either: a split model's shards given explicitly, in
        order (files under other names, remote shards), joined with the same checks."""
        self._fd = -1
        self.shards: list[GGUFFile] = [self]     # a split model's shards, in order (GGUFFile each)
        self.bases: list[int] = [0]              # the address of each shard's byte 0
        given = list(path) if isinstance(path, (list, tuple)) else None
        if given is not None and not given:
            raise SplitMismatch("(no files)", "an empty list of shards")
        self._open(given[0] if given else path)
        try:
            if given is not None and (len(given) > 1 or self.split is not None):
                self._join(given)
            elif given is None and join_split and self._src is None and self.split is not None:
                self._join_split()
        except BaseException:
            self.close()
            raise

    def _open(self, path) -> None:
        self._src = path if hasattr(path, "pread") else None
        self.path = self._src.name if self._src else os.fspath(path)
        self._fd = -1 if self._src else os.open(self.path, os.O_RDONLY)
        try:
            if self._src:
                self.size, self.mtime_ns = self._src.size, 0
            else:
                st = os.fstat(self._fd)
                self.size, self.mtime_ns = st.st_size, st.st_mtime_ns
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)   # no kernel read-ahead into the payload
            self.bytes_read = 0          # every byte this object has read, header and payload
            self.fields: dict[str, Field] = {}
            self.tensors: dict[str, TensorInfo] = {}
            self._parse()
            if not self._src:
                os.posix_fadvise(self._fd, 0, self.data_offset, os.POSIX_FADV_DONTNEED)   # keep the page cache clean
        except BaseException:
            self.close()
            raise

    # ---- public -------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        return {k: f.value for k, f in self.fields.items()}

    @property
    def architecture(self) -> str | None:
        return self.metadata.get(Keys.ARCHITECTURE)

    @property
    def split(self) -> Split | None:
        """This file's split keys where split.count > 1 (a shard of a split model), else None."""
        return _split.read_split(self)

    @property
    def paths(self) -> list[str]:
        """The files of the model: the shards of a split one, in order."""
        return [s.path for s in self.shards]

    @property
    def total_size(self) -> int:
        return sum(s.size for s in self.shards)

    def file_offset(self, t: TensorInfo) -> tuple[str, int]:
        """(path, byte offset in that file) of a tensor."""
        return self.shards[t.file].path, t.offset - self.bases[t.file]

    def read_tensor(self, t: TensorInfo | str, start: int = 0, nbytes: int | None = None) -> np.ndarray:
        """The raw bytes [start, start+nbytes) of a tensor as a new uint8 array."""
        t = self.tensors[t] if isinstance(t, str) else t
        nbytes = t.nbytes - start if nbytes is None else nbytes
        if start < 0 or nbytes < 0 or start + nbytes > t.nbytes:
            raise GGUFError(f"{t.name} byte range", (start, nbytes), t.offset, f"a range within 0..{t.nbytes}", self.path)
        out = np.empty(nbytes, dtype=np.uint8)
        self.read_into(t.offset + start, out)
        return out

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """Fill a contiguous uint8 buffer from an address (a file offset, in a split model's shard at
        bases[k] + its offset); a short read is an error."""
        k = bisect_right(self.bases, offset) - 1
        shard, offset = self.shards[k], offset - self.bases[k]
        view = memoryview(out).cast("B")
        done = 0
        while done < len(view):
            if shard._src:
                data = shard._src.pread(offset + done, len(view) - done)
                view[done:done + len(data)] = data
                n = len(data)
            else:
                n = os.preadv(shard._fd, [view[done:]], offset + done)
            if n <= 0:
                raise GGUFError("tensor data", offset + done, offset + done,
                                f"{len(view) - done} more bytes (file truncated or changed while in use)", shard.path)
            done += n
        self.bytes_read += done

    def close(self) -> None:
        for shard in getattr(self, "shards", ())[1:]:
            shard.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- split models (gguf.split) ----------------------------------------------------------
    def _join_split(self) -> None:
        _split.join_split(self)

    def _join(self, given: list) -> None:
        _split.join(self, given)

    # ---- parsing ------------------------------------------------------------------------
    def _pread(self, offset: int, n: int) -> bytes:
        data = self._src.pread(offset, n) if self._src else os.pread(self._fd, n, offset)
        self.bytes_read += len(data)
        return data

    def _err(self, field: str, value, offset: int | None, expected: str) -> GGUFError:
        return GGUFError(field, value, offset, expected, self.path)

    def _parse(self) -> None:
        if self.size < 24:
            raise self._err("file size", self.size, 0, "at least 24 bytes (magic, version, tensor and kv counts)")
        c = _Cursor(self)
        magic = c.take(4, "magic")
        if magic != GGUF_MAGIC:
            raise self._err("magic", magic, 0, f"{GGUF_MAGIC!r}")
        version = c.u32("version")
        if version not in GGUF_VERSIONS:
            hint = " (this looks like a big-endian file; only little-endian is supported)" if version & 0xFFFF == 0 and version else ""
            raise self._err("version", version, 4, f"one of {GGUF_VERSIONS}{hint}")
        self.version = version
        n_tensors, n_kv = c.u64("n_tensors"), c.u64("n_kv")
        room = self.size - 24
        if n_kv * _MIN_KV_BYTES > room:
            raise self._err("n_kv", n_kv, 16, f"at most {room // _MIN_KV_BYTES} key/value pairs in a {self.size}-byte file")
        if n_tensors * _MIN_TENSOR_INFO_BYTES > room - n_kv * _MIN_KV_BYTES:
            raise self._err("n_tensors", n_tensors, 8, f"at most {room // _MIN_TENSOR_INFO_BYTES} tensors in a {self.size}-byte file")
        for _ in range(n_kv):
            self._read_kv(c)
        self._check_typed_keys()
        self.alignment = self.fields[Keys.ALIGNMENT].value if Keys.ALIGNMENT in self.fields else GGUF_DEFAULT_ALIGNMENT
        infos = [self._read_tensor_info(c) for _ in range(n_tensors)]
        self.data_offset = -(-c.pos // self.alignment) * self.alignment
        self._place_tensors(infos)

    def _read_kv(self, c: _Cursor) -> None:
        at = c.pos
        key = c.string("key", strict=True)
        if not key:
            raise self._err("key", key, at, "a non-empty key")
        if key in self.fields:
            raise self._err("key", key, at, "a unique key (it appears twice)")
        vt_at = c.pos
        vtype = self._value_type(c.u32(f"{key} value type"), f"{key} value type", vt_at)
        if vtype == GGUFValueType.ARRAY:
            value, item = self._read_array(c, key)
        else:
            value, item = self._read_value(c, vtype, key), None
        self.fields[key] = Field(key, vtype, value, at, item)

    def _value_type(self, raw: int, field: str, at: int) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self._err(field, raw, at, f"a GGUF value type 0..{max(GGUFValueType)}") from None

    def _read_value(self, c: _Cursor, vtype: GGUFValueType, key: str):
        if vtype == GGUFValueType.STRING:
            return c.string(key)
        at = c.pos
        v = c.scalar(vtype, key)
        if vtype == GGUFValueType.BOOL and c.buf[at - c.buf_start] > 1:
            raise self._err(key, c.buf[at - c.buf_start], at, "a BOOL of 0 or 1")
        return v

    def _read_array(self, c: _Cursor, key: str):
        at = c.pos
        item = self._value_type(c.u32(f"{key} array type"), f"{key} array type", at)
        if item == GGUFValueType.ARRAY:
            raise self._err(f"{key} array type", "ARRAY", at, "a scalar or string element type (arrays of arrays are refused)")
        count_at = c.pos
        count = c.u64(f"{key} array count")
        if item == GGUFValueType.STRING:
            if count * 8 > c.remaining():
                raise self._err(f"{key} array count", count, count_at, f"at most {c.remaining() // 8} strings in the bytes left")
            return c.string_array(count, key), item
        _, size, dtype = GGUF_SCALAR[item]
        if count * size > c.remaining():
            raise self._err(f"{key} array count", count, count_at,
                            f"count x {size} B within the {c.remaining()} bytes left in the file")
        arr = np.frombuffer(c.take(count * size, key), dtype=dtype).copy()
        if item == GGUFValueType.BOOL:
            if arr.size and arr.max() > 1:
                raise self._err(key, int(arr.max()), count_at + 8, "BOOL elements of 0 or 1")
            arr = arr.astype(bool)
        return arr, item

    def _check_typed_keys(self) -> None:
        for key, (vtype, item) in _TYPED_KEYS.items():
            f = self.fields.get(key)
            if f is None:
                continue
            if f.type != vtype or f.item_type != item:
                got = f.type.name + (f"[{f.item_type.name}]" if f.item_type is not None else "")
                want = vtype.name + (f"[{item.name}]" if item is not None else "")
                raise self._err(f"{key} type", got, f.offset, want)
        align = self.fields.get(Keys.ALIGNMENT)
        if align is not None:
            a = align.value
            if a == 0 or a & (a - 1) or a > GGUF_MAX_ALIGNMENT:
                raise self._err(Keys.ALIGNMENT, a, align.offset, f"a power of two between 1 and {GGUF_MAX_ALIGNMENT}")
        tokens = self.fields.get(Keys.TOKENS)
        for key in _PARALLEL_ARRAYS:
            f = self.fields.get(key)
            if f is not None and (tokens is None or len(f.value) != len(tokens.value)):
                n_tok = None if tokens is None else len(tokens.value)
                raise self._err(f"{key} length", len(f.value), f.offset, f"{n_tok} entries, one per token of {Keys.TOKENS}")

    def _read_tensor_info(self, c: _Cursor) -> tuple:
        at = c.pos
        name = c.string("tensor name", strict=True)
        if not name or len(name.encode()) >= GGML_MAX_NAME:
            raise self._err("tensor name", name, at, f"a non-empty name shorter than {GGML_MAX_NAME} bytes")
        if name in self.tensors:
            raise self._err("tensor name", name, at, "a unique tensor name")
        nd_at = c.pos
        n_dims = c.u32(f"{name} n_dims")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise self._err(f"{name} n_dims", n_dims, nd_at, f"1..{GGML_MAX_DIMS}")
        dims = []
        for i in range(n_dims):
            d_at = c.pos
            d = c.scalar(GGUFValueType.INT64, f"{name} dim {i}")
            if d <= 0:
                raise self._err(f"{name} dim {i}", d, d_at, "a positive dimension")
            dims.append(d)
        n_el = 1
        for d in dims:
            n_el *= d
        if n_el > _INT64_MAX:
            raise self._err(f"{name} element count", n_el, nd_at, f"at most {_INT64_MAX} (int64)")
        t_at = c.pos
        raw_type = c.u32(f"{name} type")
        try:
            gtype = GGMLType(raw_type)
        except ValueError:
            raise self._err(f"{name} type", raw_type, t_at, "a known ggml type id") from None
        block, bsize = GGML_BLOCK[gtype]
        if dims[0] % block:
            raise self._err(f"{name} ne0", dims[0], nd_at + 4, f"a multiple of {gtype.name}'s block size {block}")
        nbytes = n_el // block * bsize
        if nbytes > self.size:
            raise self._err(f"{name} byte count", nbytes, nd_at, f"at most the file size {self.size}")
        off_at = c.pos
        rel = c.u64(f"{name} offset")
        # mark the name as seen now so a duplicate later in the list is caught
        self.tensors[name] = None  # type: ignore[assignment]
        return name, gtype, tuple(dims), rel, nbytes, off_at

    def _place_tensors(self, infos: list[tuple]) -> None:
        data_size = self.size - self.data_offset
        for name, gtype, dims, rel, nbytes, off_at in infos:
            if rel % self.alignment:
                raise self._err(f"{name} offset", rel, off_at, f"a multiple of the alignment {self.alignment}")
            if rel + nbytes > data_size:
                raise self._err(f"{name} offset", rel, off_at,
                                f"offset + {nbytes} B within the {max(data_size, 0)} B data section (file truncated?)")
            self.tensors[name] = TensorInfo(name, gtype, dims, self.data_offset + rel, nbytes)
        end, prev = self.data_offset, None
        for t in sorted(self.tensors.values(), key=lambda t: t.offset):
            if t.offset < end:
                raise self._err(f"{t.name} offset", t.offset - self.data_offset, None,
                                f"no overlap with {prev} (which ends at data byte {end - self.data_offset})")
            end, prev = t.offset + t.nbytes, t.name

    def describe(self) -> str:
        shards = f" in {len(self.shards)} shards" if len(self.shards) > 1 else ""
        return f"{self.path}: GGUF v{self.version}, {len(self.fields)} keys, {len(self.tensors)} tensors{shards}"
