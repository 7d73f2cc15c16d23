"""Split GGUF models (llama.cpp's gguf-split): shard names, split keys, and joining a model's shards.

A shard is named NAME-00001-of-0000N.gguf and carries `split.no`, `split.count`, `split.tensors.count`
(the metadata in the first). `join_split` finds a file's shards by name; `join` checks shards given in
order belong together (llama_model_loader's rules: SplitShardMissing, SplitMismatch) and adds their
tensors to the first at addresses SHARD_GAP-aligned apart (`GGUFFile.bases`). `gguf` below is a
gguf.reader.GGUFFile, which calls these (not imported here: reader imports this module).
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from ..errors import SplitMismatch, SplitShardMissing
from .constants import GGUFValueType

# llama.cpp's split keys (LLM_KV_SPLIT_*) and shard names (llama_split_path: "%s-%05d-of-%05d.gguf")
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
_SPLIT_NAME = re.compile(r"(.+)-(\d{5,})-of-(\d{5,})\.gguf", re.S)
_INT_TYPES = (GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16, GGUFValueType.UINT32,
              GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64)
SHARD_GAP = 1 << 30             # shard k's addresses start at least this far past shard k-1's last byte


def split_path(prefix: str, no: int, count: int) -> str:
    """llama_split_path: shard `no` (1-based) of `count` of the model named by prefix."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def split_prefix(path: str) -> tuple[str, int, int] | None:
    """(prefix, shard no, count) of a shard's path (llama_split_prefix), None for another name."""
    m = _SPLIT_NAME.fullmatch(os.fspath(path))
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


@dataclass(frozen=True)
class Split:
    """A shard's split keys: no is 0-based as in the file (split.no)."""

    no: int
    count: int
    tensors: int | None


def read_split(gguf) -> Split | None:
    """This file's split keys where split.count > 1 (a shard of a split model), else None."""
    count = gguf.fields.get(SPLIT_COUNT)
    for f in (count, gguf.fields.get(SPLIT_NO), gguf.fields.get(SPLIT_TENSORS)):
        if f is not None and (f.type not in _INT_TYPES or f.value < 0):
            raise gguf._err(f.key, f.value, f.offset, "a non-negative integer (llama.cpp writes u16, u16, i32)")
    if count is None or count.value <= 1:
        return None
    no, n_t = gguf.fields.get(SPLIT_NO), gguf.fields.get(SPLIT_TENSORS)
    if no is None:
        raise SplitMismatch(gguf.path, f"{SPLIT_COUNT} = {count.value} but no {SPLIT_NO}: not a gguf-split shard")
    return Split(no.value, count.value, None if n_t is None else n_t.value)


def join_split(gguf) -> None:
    """Open every shard of the split model this file belongs to (from its first, whichever was
    given), found by llama.cpp's names, and join them (`join`)."""
    sp = gguf.split
    named = split_prefix(gguf.path)
    if named is None or named[1:] != (sp.no + 1, sp.count):
        raise SplitMismatch(gguf.path, f"{SPLIT_NO} = {sp.no}, {SPLIT_COUNT} = {sp.count}, but the name does not end "
                                       f"in -{sp.no + 1:05d}-of-{sp.count:05d}.gguf, so its other shards cannot be "
                                       f"found; rename the shards as gguf-split names them")
    paths = [split_path(named[0], k + 1, sp.count) for k in range(sp.count)]
    if sp.no != 0:                                   # a later shard given: read the set from its first
        gguf.close()
        gguf._open(_shard_file(paths, 0))
    join(gguf, [gguf.path, *(_shard_file(paths, k) for k in range(1, sp.count))])


def join(gguf, given: list) -> None:
    """Join shards given in order (this file is the first, opened from given[0]): each checked to
    belong with the first (llama_model_loader's rules) and its tensors added at its base address."""
    sp = gguf.split
    count = len(given) if sp is None else sp.count
    if len(given) != count:
        raise SplitMismatch(gguf.path, f"{SPLIT_COUNT} = {count}, but {len(given)} files were given")
    first = _check_shard(gguf, gguf, 0, count, None)
    arch = gguf.architecture
    for k in range(1, count):
        shard = type(gguf)(given[k], join_split=False)
        gguf.shards.append(shard)
        _check_shard(gguf, shard, k, count, arch)
        gguf.bases.append(-(-(gguf.bases[-1] + gguf.shards[-2].size + SHARD_GAP) // SHARD_GAP) * SHARD_GAP)
        for name, t in shard.tensors.items():
            if name in gguf.tensors:
                raise SplitMismatch(shard.path, f"tensor {name} is in shard {gguf.tensors[name].file + 1} too")
            gguf.tensors[name] = dataclasses.replace(t, offset=gguf.bases[k] + t.offset, file=k)
    if first.tensors is not None and first.tensors != len(gguf.tensors):
        raise SplitMismatch(gguf.path, f"{SPLIT_TENSORS} = {first.tensors}, but the {count} shards hold "
                                       f"{len(gguf.tensors)} tensors")


def _shard_file(paths: list[str], k: int) -> str:
    if not os.path.isfile(paths[k]):
        raise SplitShardMissing(paths[k], k + 1, len(paths), paths[0])
    return paths[k]


def _check_shard(gguf, shard, k: int, count: int, arch: str | None) -> Split:
    sp = shard.split
    if sp is None or sp.count != count or sp.no != k:
        got = "no split keys" if sp is None else f"{SPLIT_NO} = {sp.no}, {SPLIT_COUNT} = {sp.count}"
        raise SplitMismatch(shard.path, f"shard {k + 1} of {count} has {got} (expected {SPLIT_NO} = {k}, "
                                        f"{SPLIT_COUNT} = {count}): it belongs to another model")
    first = gguf.fields.get(SPLIT_TENSORS)
    if k and sp.tensors is not None and first is not None and sp.tensors != first.value:
        raise SplitMismatch(shard.path, f"{SPLIT_TENSORS} = {sp.tensors}, but the first shard says {first.value}: "
                                        f"it belongs to another model")
    if k and shard.architecture is not None and shard.architecture != arch:
        raise SplitMismatch(shard.path, f"architecture {shard.architecture!r}, but the first shard's is {arch!r}: "
                                        f"it belongs to another model")
    return sp
