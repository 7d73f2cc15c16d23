"""File I/O for streaming weights: O_DIRECT, buffered with posix_fadvise, or mmap; page-cache residency.
A model is one file or the shards of a split GGUF (`ModelFile.of(gguf)`), read by address.

Reads release the GIL (os.preadv), so a reader thread overlaps them with the kernels.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import sys
import time
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

import numpy as np

from ..errors import ModelFileError
from ..flags import DIRECT_ALIGN  # noqa: F401  (O_DIRECT offset, length and buffer alignment)


class IOMode(str, Enum):
    DIRECT = "direct"        # O_DIRECT: the page cache never holds the model
    BUFFERED = "buffered"    # pread, then posix_fadvise(DONTNEED) on what was read
    MMAP = "mmap"            # map the file: the kernel's page cache holds what it likes


class IOError_(ModelFileError):
    """A read failed or came back short: names the file, offset and what was expected."""


class ModelChanged(ModelFileError):
    """The model file changed on disk (size or mtime) while ramforge was using it."""


def read_full(fd: int, out: np.ndarray, offset: int, want: int, error, hint: str) -> int:
    """Fill the first `want` bytes of out (contiguous) from fd at offset, preadv by preadv (the GIL let go);
    a failed or short read raises error(message), a short one with `hint` (what may have happened)."""
    view, done = memoryview(out).cast("B"), 0
    while done < want:
        try:
            n = os.preadv(fd, [view[done:]], offset + done)   # the whole rest: O_DIRECT lengths stay aligned
        except OSError as e:
            raise error(f"read of {want - done:,} B at offset {offset + done:,} failed: {e.strerror or e}") from None
        if n <= 0:
            raise error(f"short read at offset {offset + done:,}: got {done:,} of {want:,} B ({hint})")
        done += n
    return done


def aligned_empty(nbytes: int, align: int = DIRECT_ALIGN, fault_in: int = 0) -> np.ndarray:
    """A uint8 buffer of nbytes whose address is a multiple of align; with fault_in, its pages faulted in now
    on that many threads (populate: a buffer reads will fill again and again, on the decode's path)."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    skip = (-raw.ctypes.data) % align
    buf = raw[skip:skip + nbytes]
    if fault_in:
        populate(buf, fault_in)
    return buf


class _Part:
    """One open file of a model (a shard of a split one), in the set's I/O mode."""

    def __init__(self, path: str, mode: IOMode):
        self.path, self.mode = path, mode
        st = os.stat(path)
        self.size, self.mtime_ns = st.st_size, st.st_mtime_ns
        self.direct = False
        if mode == IOMode.DIRECT:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                self.direct = True
            except OSError as e:            # tmpfs and some filesystems refuse O_DIRECT
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.fd = os.open(path, os.O_RDONLY)
                self.mode = IOMode.BUFFERED
        else:
            self.fd = os.open(path, os.O_RDONLY)
        if self.mode == IOMode.BUFFERED:       # reads are explicit and large: no kernel read-ahead
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.map = mmap.mmap(self.fd, 0, prot=mmap.PROT_READ) if self.mode == IOMode.MMAP else None

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:         # arrays still view it; the mapping goes when they do
                pass
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ModelFile:
    """A model's open files in one I/O mode: one file, or the shards of a split GGUF (`paths` with their
    `bases`, gguf.reader's addresses: shard k's byte i is address bases[k] + i). `read_into` fills a
    buffer from the addresses [offset, offset+len), which lie in one file (reader.SHARD_GAP apart)."""

    def __init__(self, path: str | list[str], mode: IOMode | str = IOMode.DIRECT, bases: list[int] | None = None):
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        self.paths, self.bases = [os.fspath(p) for p in paths], list(bases or [0])
        if len(self.bases) != len(self.paths) or self.bases[0] != 0 or any(b % DIRECT_ALIGN for b in self.bases):
            raise ValueError(f"bases {self.bases} for {len(self.paths)} files: 0 first, each a multiple of {DIRECT_ALIGN}")
        self.path = self.paths[0]
        self.parts: list[_Part] = []
        try:
            for p in self.paths:
                self.parts.append(_Part(p, IOMode(mode)))
        except BaseException:
            self.close()
            raise
        self.mode = self.parts[0].mode
        if any(p.mode != self.mode for p in self.parts):     # one shard on a filesystem without O_DIRECT
            self.close()
            self.parts = [_Part(p, IOMode.BUFFERED) for p in self.paths]
            self.mode = IOMode.BUFFERED
        self.direct = self.mode == IOMode.DIRECT
        self.size, self.mtime_ns = self.parts[0].size, self.parts[0].mtime_ns
        self.bytes_read = 0

    @classmethod
    def of(cls, f, mode: IOMode | str = IOMode.DIRECT) -> "ModelFile":
        """The files of an open gguf.reader.GGUFFile (all the shards of a split model)."""
        return cls(f.paths, mode, f.bases)

    def _at(self, offset: int) -> tuple[_Part, int]:
        """(the file, its byte offset) of an address."""
        k = bisect_right(self.bases, offset) - 1
        return self.parts[k], offset - self.bases[k]

    def check_unchanged(self) -> None:
        for part in self.parts:
            try:
                st = os.stat(part.path)
            except OSError as e:
                raise ModelChanged(f"{part.path} is no longer readable: {e}") from None
            if (st.st_size, st.st_mtime_ns) != (part.size, part.mtime_ns):
                raise ModelChanged(f"{part.path} changed on disk while in use (size {part.size} -> {st.st_size}, "
                                   f"mtime changed: {st.st_mtime_ns != part.mtime_ns}); reload the model")

    def span(self, offset: int, nbytes: int) -> tuple[int, int]:
        """The range actually read for [offset, offset+nbytes): aligned out under O_DIRECT."""
        if not self.direct:
            return offset, nbytes
        lo = offset - offset % DIRECT_ALIGN
        hi = -(-(offset + nbytes) // DIRECT_ALIGN) * DIRECT_ALIGN
        return lo, hi - lo

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """mmap mode: a read-only view of the file bytes, no copy."""
        part, at = self._at(offset)
        return np.frombuffer(part.map, dtype=np.uint8, count=nbytes, offset=at)

    def read_into(self, offset: int, out: np.ndarray) -> int:
        """Fill out (uint8, contiguous) from offset; a short read or an error is IOError_.

        An aligned span may run past the end of its file (the last tensors of a shard, O_DIRECT's blocks):
        only the bytes the file had when opened are required.
        """
        part, at = self._at(offset)
        want = min(out.nbytes, part.size - at)
        done = read_full(part.fd, out, at, want,
                         lambda m: IOError_(f"{part.path}: {m}"), "file truncated or changed while in use?")
        self.bytes_read += done
        return done

    def drop_cache(self, offset: int, nbytes: int) -> None:
        """Tell the kernel the range is no longer needed (buffered mode keeps the page cache clean)."""
        if self.mode == IOMode.BUFFERED:
            part, at = self._at(offset)
            os.posix_fadvise(part.fd, at, nbytes, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        for part in self.parts:
            part.close()


_libc = None
MADV_POPULATE_WRITE = 23            # Linux >= 5.14: fault a range in, writable, in one call


def _c():
    """libc through ctypes (its calls let go of the GIL), loaded once."""
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc = libc
    return _libc


def populate(buf: np.ndarray, threads: int = 1) -> None:
    """Fault every page of buf (uint8, contiguous, page-aligned; contents not yet needed) in now, in `threads`
    parts at once. A buffer that reads fill later (the expert cache's slots) would otherwise take its page
    faults on the decode's path: O_DIRECT faults in the pages a read fills, on the reader thread, while the
    compute threads wait for that read. (Measured on a VM: 3 MiB of fresh memory took 0.5-10 ms to fault,
    2-10x the expert's read.) madvise(MADV_POPULATE_WRITE) where Linux has it (the GIL let go), else (EINVAL:
    a kernel before 5.14; other systems) a write to each page; any other refusal (ENOMEM) leaves the pages to
    fault in as they are used."""
    n, page = buf.nbytes, mmap.PAGESIZE
    if n == 0:
        return
    if sys.platform.startswith("linux"):
        libc, base = _c(), buf.ctypes.data
        step = -(-n // max(threads, 1))                         # a thread's part, in whole pages
        step += -step % page
        parts = [(a, min(n, a + step)) for a in range(0, n, step)]

        def advise(part: tuple[int, int]) -> int:
            ok = libc.madvise(base + part[0], part[1] - part[0], MADV_POPULATE_WRITE) == 0
            return 0 if ok else ctypes.get_errno()

        with ThreadPoolExecutor(len(parts)) as pool:
            if errno.EINVAL not in set(pool.map(advise, parts)):
                return
    buf[::page] = 0                      # older kernels, other systems: one write a page


def _resident(addr: int, nbytes: int) -> int:
    """Bytes of the pages in [addr, addr + nbytes) (addr page-aligned) that are in memory: mincore(2)."""
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((nbytes + page - 1) // page))()
    if _c().mincore(addr, nbytes, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return int((np.frombuffer(vec, dtype=np.uint8) & 1).sum()) * page


def memory_residency(buf: np.ndarray) -> int:
    """Bytes of buf's pages (buf contiguous, page-aligned) that are in memory now."""
    return _resident(buf.ctypes.data, buf.nbytes)


def page_cache_residency(path: str) -> tuple[int, int]:
    """(resident bytes, file bytes) of path in the page cache, via mincore(2) on a fresh mapping."""
    libc = _c()
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            resident = _resident(addr, size)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(resident, size), size


def evict(path: str) -> None:
    """Drop path's pages from the page cache (as `dd iflag=nocache count=0`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def probe_read_speed(path: str, nbytes: int = 256 << 20, chunk: int = 8 << 20) -> float:
    """Bytes per second of O_DIRECT reads of up to nbytes from the middle of the file."""
    f = ModelFile(path, IOMode.DIRECT)
    try:
        n = min(nbytes, f.size) // DIRECT_ALIGN * DIRECT_ALIGN     # whole O_DIRECT blocks
        start = ((f.size - n) // 2) // DIRECT_ALIGN * DIRECT_ALIGN
        buf = aligned_empty(chunk)
        t0 = time.perf_counter()
        done = 0
        while done < n:
            done += f.read_into(start + done, buf[:min(chunk, n - done)])
        f.drop_cache(start, n)
        return done / max(time.perf_counter() - t0, 1e-9)
    finally:
        f.close()
