"""The KV cache spilled to storage: older positions in a spill file per layer, read back for attention.

Where the budget cannot hold the context's KV cache (or when asked, `--kv-spill`), each layer's K and V
rows go to a file of their own (memory.kv_types.SpillLayout: K rows of positions 0..n_ctx-1, then V
rows, O_DIRECT where the filesystem allows). New rows are written to RAM first, a ring of the `tail`
most recent positions per layer, and reach the file in whole 4096-byte groups of positions when the
ring needs room (before a pass). Before a layer's attention its spilled rows are read into one of
SPILL_BUFFERS budget-charged buffers by the weights' reader thread (stream.weights.Reader; one of its
own where no layer streams), the next layer's while this one computes; the ring's rows and the
chunk's new rows are copied in beside them, so attention reads the cache's own bytes at their own
positions: bit-exact with the in-RAM cache. A sliding-window layer reads only the window.

Charged at construction: the rings and the buffers (SpillLayout.charged), nothing as the context
fills. The same interface as memory.kv_cache.KVCache, plus the pass hooks begin_pass / end_pass /
abort that Engine._pass calls.

The files: made at their full, planned size (Plan.kv_spill_file_bytes; no write or read past it) with
O_EXCL|O_NOFOLLOW, mode 0600, and unlinked as soon as they are open, so a process killed mid-run
leaves nothing on the disk. A directory on tmpfs or ramfs is refused (KVSpillError): its files would
be RAM outside the budget; the default directory (the system's temp directory) falls back to
/var/tmp when it is one.
"""
from __future__ import annotations

import contextlib
import errno
import os
import queue
import secrets
import tempfile
import time

import numpy as np

from ..errors import InternalError, InvalidArgument, KVSpillError
from ..kernels.kvquant import store_rows
from ..paths import memory_filesystem
from ..profiling import LayerRecord
from .io import aligned_empty, read_full
from ..memory.budget import MemoryBudget
from ..kv.cache import KVBase
from ..kv.types import SPILL_ALIGN, SPILL_BUFFERS, _up, kv_type, row_bytes, spill_layout


class SpillFile:
    """One layer's spill file, created at its full size (posix_fallocate: a full disk fails here, not
    mid-run) under a new name (O_EXCL|O_NOFOLLOW, 0600) and unlinked at once: only this process's
    descriptor holds it. Reads and writes of whole aligned blocks inside that size, O_DIRECT where the
    filesystem takes it."""

    def __init__(self, path: str, nbytes: int):
        self.path, self.size, self.fd, self.direct, self._named = path, nbytes, -1, False, False
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            try:
                self.fd = os.open(path, flags | os.O_DIRECT, 0o600)
                self.direct = True
            except OSError as e:            # tmpfs and some filesystems refuse O_DIRECT
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.fd = os.open(path, flags, 0o600)
            self._named = True
            os.unlink(path)                 # nothing left behind, whatever ends the process
            self._named = False
            os.posix_fallocate(self.fd, 0, nbytes)
        except OSError as e:
            self.close()
            raise _spill_error(e, path, nbytes) from None

    def _check(self, offset: int, n: int) -> None:
        if offset < 0 or offset + n > self.size:
            raise InternalError(f"KV spill: {self.path}: {n:,} B at {offset:,} is outside its planned "
                                f"{self.size:,} B")

    def read_into(self, offset: int, out: np.ndarray) -> int:
        self._check(offset, out.nbytes)
        return read_full(self.fd, out, offset, out.nbytes, lambda m: KVSpillError(f"{self.path}: {m}", self.path),
                         "the spill file was truncated?")

    def write(self, offset: int, data: np.ndarray) -> None:
        view, done = memoryview(data).cast("B"), 0
        self._check(offset, len(view))
        while done < len(view):
            try:
                n = os.pwritev(self.fd, [view[done:]], offset + done)
            except OSError as e:
                raise _spill_error(e, self.path, len(view) - done) from None
            if n <= 0:
                raise KVSpillError(f"{self.path}: a write of {len(view) - done:,} B wrote nothing", self.path)
            done += n

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._named:                     # opened, but the unlink failed
            self._named = False
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _spill_error(e: OSError, path: str, needed: int) -> KVSpillError:
    free = _free_bytes(os.path.dirname(path))
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return KVSpillError(f"KV spill: {path}: the disk is full: {needed:,} B needed, {free:,} B free; free some "
                            f"space, or point --kv-spill at another directory", path, needed, free)
    return KVSpillError(f"KV spill: {path}: {e.strerror or e} ({needed:,} B)", path, needed, free)


def _free_bytes(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def spill_mode(kv_spill) -> bool | None:
    """Engine.load's kv_spill as the plan takes it: None (when needed), True or False; InvalidArgument else."""
    if kv_spill is None or isinstance(kv_spill, bool):
        return kv_spill
    if isinstance(kv_spill, (str, os.PathLike)) and str(kv_spill).strip():
        return True
    raise InvalidArgument(f"kv_spill must be None, True, False or a directory, got {kv_spill!r}")


def spill_dir(kv_spill) -> str | None:
    """The directory Engine.load's kv_spill names, if it names one."""
    return os.fspath(kv_spill) if isinstance(kv_spill, (str, os.PathLike)) else None


def _in_memory_error(d: str, fs: str, needed: int, auto: bool) -> KVSpillError:
    where = f"the default spill directory {d}" if auto else f"KV spill directory {d}"
    return KVSpillError(f"{where} is on {fs}, which keeps its files in RAM: {needed:,} B of spill files there "
                        f"would use memory outside the --ram budget; point --kv-spill (Model(kv_spill=)) at a "
                        f"directory on a disk{' (or set TMPDIR to one)' if auto else ''}", d, needed)


def spill_directory(parent: str | None, needed: int) -> str:
    """The directory for the spill files: parent, made if missing, or by default the system's temp
    directory (/var/tmp where that is tmpfs), after checking that it is writable, not in RAM (tmpfs,
    ramfs) and that its disk has `needed` bytes free; KVSpillError otherwise."""
    if parent:
        d = os.path.abspath(parent)
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
        except OSError as e:
            raise KVSpillError(f"KV spill directory {d} is not writable: {e.strerror or e}", d, needed) from None
        if fs := memory_filesystem(d):
            raise _in_memory_error(d, fs, needed, False)
    else:
        tried = [tempfile.gettempdir(), "/var/tmp"]
        on_disk = [t for t in tried if os.path.isdir(t) and not memory_filesystem(t)]
        if not on_disk:
            raise _in_memory_error(tried[0], memory_filesystem(tried[0]) or "tmpfs", needed, True)
        d = on_disk[0]
    if not os.access(d, os.W_OK | os.X_OK):
        raise KVSpillError(f"KV spill directory {d} is not writable by this user; point --kv-spill at another "
                           f"directory", d, needed)
    free = _free_bytes(d)
    if free is not None and free < needed:
        raise KVSpillError(f"KV spill directory {d}: its disk has {free:,} B free, the spill files need "
                           f"{needed:,} B; free some space or point --kv-spill at another directory",
                           d, needed, free)
    return d


class SpilledKVCache(KVBase):
    """k[i], v[i]: layer i's ring of the `tail` most recent positions [tail, n_head_kv, row] (f16 bits u16,
    or quantized blocks u8), position p at slot p % tail; positions 0..spilled-1 are in the files."""

    def __init__(self, budget: MemoryBudget, n_layer: int, n_ctx: int, n_head_kv: int, hd_k: int, hd_v: int,
                 first_layer: int = 0, type_k: str | int = "f16", type_v: str | int = "f16", batch: int = 64,
                 directory: str | None = None, reader=None, windows: list[int] | None = None,
                 tail: int | None = None, file_bytes: int | None = None):
        self.type_k, self.type_v = kv_type(type_k), kv_type(type_v)
        rbk, rbv = row_bytes(self.type_k, hd_k), row_bytes(self.type_v, hd_v)
        self.n_ctx, self.first, self.budget, self.n_layer = n_ctx, first_layer, budget, n_layer
        self.n_ctx_seq = n_ctx
        self.bytes_per_pos = n_layer * n_head_kv * (rbk + rbv)
        self.lay = lay = spill_layout(n_ctx, n_head_kv, hd_k, hd_v, self.type_k, self.type_v, batch, tail)
        self.windows = list(windows or [0] * n_layer)      # each layer's attention window (0: all positions)
        if len(self.windows) != n_layer or n_ctx <= 0 or n_layer <= 0:
            raise InvalidArgument(f"a spilled KV cache of {n_layer} layers and {n_ctx} positions: "
                                  f"{len(self.windows)} windows given")
        self.shape_k, self.shape_v = (n_head_kv, rbk // 2 if self.type_k == "f16" else rbk), \
                                     (n_head_kv, rbv // 2 if self.type_v == "f16" else rbv)
        self.dt_k, self.dt_v = (np.uint16 if t == "f16" else np.uint8 for t in (self.type_k, self.type_v))
        if file_bytes is not None and n_layer * lay.buffer_bytes > file_bytes:
            raise InternalError(f"KV spill: the files would take {n_layer * lay.buffer_bytes:,} B, the plan said "
                                f"{file_bytes:,} B")
        self.charge = budget.charge("kv cache (spill: tails, buffers)", lay.charged(n_layer))   # before anything
        self.files: list[SpillFile] = []
        self.dir, self._own_reader, self.reader = None, False, None
        self.n_past = 0            # positions 0..n_past-1 hold valid entries
        self.spilled = 0           # positions 0..spilled-1 are in the files (a multiple of lay.group)
        self.capacity = n_ctx      # everything is charged up front
        self.bytes_read = self.bytes_written = 0
        self.record = None         # the PassRecord being profiled (Engine._pass)
        self._items: list = []     # (layer, segments) of this pass not yet submitted
        self._inflight: list[int] = []
        self._held = None          # (layer, buffer, k view, v view) of the layer in attention
        self._direct = False       # this pass's positions all in the rings, unwrapped: attention reads them there
        try:
            self.k = self._ring(lay.kpos, self.dt_k, self.shape_k)
            self.v = self._ring(lay.vpos, self.dt_v, self.shape_v)
            self.free: queue.Queue = queue.Queue()
            self.done: queue.Queue = queue.Queue()
            for _ in range(SPILL_BUFFERS):
                self.free.put(aligned_empty(lay.buffer_bytes, fault_in=1))   # not by the first pass's reads
            self.dir = spill_directory(directory, n_layer * lay.buffer_bytes)
            stem = f".ramforge-kv-{os.getpid()}-{secrets.token_hex(6)}"
            for i in range(n_layer):        # appended one by one: a failure closes those made
                self.files.append(SpillFile(os.path.join(self.dir, f"{stem}-layer{first_layer + i}.kv"),
                                            lay.buffer_bytes))
            if reader is None:
                from .weights import Reader
                reader, self._own_reader = Reader(None, []), True
            self.reader = reader
        except BaseException:
            self.close()
            raise

    def _ring(self, pos_bytes: int, dtype, shape) -> np.ndarray:
        # one aligned block per layer: a group of positions is whole 4096-byte blocks (O_DIRECT writes)
        raw = aligned_empty(self.n_layer * self.lay.tail * pos_bytes)
        return raw.view(dtype).reshape(self.n_layer, self.lay.tail, *shape)

    # ---- KVBase's interface: everything is charged at construction, one sequence, row = position ----
    def reserve(self, positions: int) -> None:
        """Everything is charged at construction."""

    def shrink(self, positions: int) -> None:
        """Nothing to give back: the charge does not grow."""

    def cells_on(self) -> None:
        raise InvalidArgument("a context shift, parallel sequences or a moved or removed middle of the sequence "
                              "need the KV cache in RAM, and it spills to storage: --kv-spill off (with a larger "
                              "--ram or a smaller --ctx)")

    def layer(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) of model layer il at positions 0..n_ctx-1: the read buffer `store` filled (valid for the
        positions attention reads in this pass)."""
        if self._held is None or self._held[0] != il - self.first:
            raise InternalError(f"the spilled KV cache's layer {il} was asked for outside its store() in a pass")
        return self._held[2], self._held[3]

    def store(self, il: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write f32 keys/values k [n, n_head_kv, hd_k], v likewise for positions pos0.. (rounded to the cache
        types) into the ring, and make layer il's buffer whole: its spilled rows (read meanwhile), the ring's."""
        i, n = il - self.first, k.shape[0]
        self._release()
        if self._direct:                         # slot = position: the rings are the cache
            store_rows(self.k[i, pos0:pos0 + n], k, self.type_k, True)
            store_rows(self.v[i, pos0:pos0 + n], v, self.type_v, False)
            self._held = (i, None, self.k[i], self.v[i])
            return
        _, buf, kb, vb = self._held = self._take(i)
        store_rows(kb[pos0:pos0 + n], k, self.type_k, True)
        store_rows(vb[pos0:pos0 + n], v, self.type_v, False)
        self._to_ring(i, pos0, pos0 + n, kb, vb)
        lo = max(self.spilled, self._lo(i, pos0))
        self._from_ring(i, lo, pos0, kb, vb)

    def export(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of positions 0..n-1 as the cache holds them (read back from the files):
        k [layers, n, n_head_kv, row_k], v likewise."""
        k = np.empty((self.n_layer, n, *self.shape_k), self.dt_k)
        v = np.empty((self.n_layer, n, *self.shape_v), self.dt_v)
        s = min(self.spilled, n)
        with self._scratch() as buf:
            for i in range(self.n_layer):
                kb, vb = self._views(buf)
                if s:
                    self._read(i, buf, 0, s)
                    k[i, :s], v[i, :s] = kb[:s], vb[:s]
                self._from_ring(i, s, n, k[i], v[i])
        return k, v

    def restore(self, k: np.ndarray, v: np.ndarray, n: int) -> None:
        """Positions 0..n-1 from export's arrays (shapes checked by the caller): whole groups to the
        files, the rest to the rings; n_past = n (0 if writing fails)."""
        self.n_past = self.spilled = 0
        s = n // self.lay.group * self.lay.group
        with self._scratch() as buf:
            kb, vb = self._views(buf)
            for i in range(self.n_layer):
                if s:
                    kb[:s], vb[:s] = k[i, :s], v[i, :s]
                    self._write(i, buf, 0, s)
                kb[s:n], vb[s:n] = k[i, s:n], v[i, s:n]
                self._to_ring(i, s, n, kb, vb)
        self.spilled, self.n_past = s, n

    # ---- state files (session.write_state_file / load_state_file): a layer at a time ----------
    def _part(self, which: str, buf: np.ndarray):
        """(rows view of buf, ring, file offset, bytes per position) of K ('k') or V ('v')."""
        kb, vb = self._views(buf)
        return (kb, self.k, 0, self.lay.kpos) if which == "k" else (vb, self.v, self.lay.kb, self.lay.vpos)

    @contextlib.contextmanager
    def rows_out(self, which: str, i: int, n: int):
        """Layer i's K or V rows of positions 0..n-1 as the cache holds them, in one of the charged read
        buffers (between passes): a state file streams the cache a layer at a time, never whole in RAM."""
        with self._scratch() as buf:
            rows, ring, base, r = self._part(which, buf)
            s = min(self.spilled, n)
            if s:
                self.bytes_read += self.files[i].read_into(base, buf[base:base + _up(s * r)])
            for s0, s1, p in self._slots(s, n):
                rows[p:p + s1 - s0] = ring[i, s0:s1]
            yield rows[:n]

    def begin_restore(self) -> None:
        """Before rows_in: the cache empty."""
        self.abort()
        self.n_past = self.spilled = 0

    @contextlib.contextmanager
    def rows_in(self, which: str, i: int, n: int):
        """A buffer for layer i's K or V rows of positions 0..n-1, filled by the caller; on exit its whole
        groups go to the file, the rest to the ring. end_restore(n) once every layer's K and V are in."""
        s = n // self.lay.group * self.lay.group
        with self._scratch() as buf:
            rows, ring, base, r = self._part(which, buf)
            yield rows[:n]
            if s:
                self.files[i].write(base, buf[base:base + s * r])
            for s0, s1, p in self._slots(s, n):
                ring[i, s0:s1] = rows[p:p + s1 - s0]

    def end_restore(self, n: int) -> None:
        self.spilled, self.n_past = n // self.lay.group * self.lay.group, n

    def close(self) -> None:
        self.abort()
        if self._own_reader and self.reader is not None:
            self.reader.stop()
        self.reader = None
        for f in self.files:
            f.close()
        self.files = []
        self.charge.release()

    # ---- passes ----------------------------------------------------------------------------
    def begin_pass(self, pos0: int, n: int) -> None:
        """Before a pass of n tokens at pos0 (= n_past): bring back positions a reset forgot past the files'
        end, write the oldest ring positions out until the chunk has room, and start reading the layers."""
        if self._inflight or self._held is not None:
            self.abort()
        if pos0 < self.spilled:
            self._rewind(pos0)
        to = self.lay.spilled_at(pos0, n, self.spilled)
        if to > self.spilled:
            self._flush(to)
        self._direct = self.spilled == 0 and pos0 + n <= self.lay.tail
        self._items = [] if self._direct else [(i, self._segments(i, pos0)) for i in range(self.n_layer)]
        self._fill()

    def end_pass(self) -> None:
        self._release()
        if self._items or self._inflight:
            self.abort()

    def abort(self) -> None:
        """After an error mid-pass (or at close): every buffer back in the pool, nothing in flight."""
        if self._held is not None:
            if self._held[1] is not None:
                self.free.put(self._held[1])
            self._held = None
        self._items = []
        while self._inflight:
            _, buf, _, _, _ = self.done.get()
            self._inflight.pop(0)
            self.free.put(buf)

    def read(self, key: int, offset: int, out: np.ndarray) -> int:
        """The reader thread's read of layer key's file (stream.weights.Reader's pool interface)."""
        return self.files[key].read_into(offset, out)

    # ---- inside ----------------------------------------------------------------------------
    def _lo(self, i: int, pos0: int) -> int:
        """The first position layer i's attention reads for queries from pos0 on (its sliding window)."""
        w = self.windows[i]
        return 0 if w <= 0 else max(0, pos0 - w + 1)

    def _segments(self, i: int, pos0: int) -> list[tuple[int, int, int]]:
        """Layer i's spilled rows this pass needs: (file offset, length, buffer offset), whole aligned blocks."""
        lo, hi = self._lo(i, pos0), self.spilled
        if lo >= hi:
            return []
        L = self.lay
        return [(base + a, b - a, base + a) for base, r in ((0, L.kpos), (L.kb, L.vpos))
                for a, b in [(lo * r // SPILL_ALIGN * SPILL_ALIGN, -(-hi * r // SPILL_ALIGN) * SPILL_ALIGN)]]

    def _fill(self) -> None:
        while self._items and len(self._inflight) + (self._held is not None) < SPILL_BUFFERS:
            i, segs = self._items.pop(0)
            self.reader.jobs.put((i, segs, None, self))
            self._inflight.append(i)

    def _take(self, i: int):
        if not self._inflight or self._inflight[0] != i:
            raise InternalError(f"the spilled KV cache expected layer {self._inflight[:1]} in this pass, got {i}")
        t0 = time.perf_counter()
        key, buf, err, n, read_s = self.done.get()
        self._inflight.pop(0)
        if err is not None:
            self.free.put(buf)
            self.abort()
            raise err
        self.bytes_read += n
        if self.record is not None and n:
            self.record.kv.append(LayerRecord(f"kv {self.first + i}", False, n, read_s, time.perf_counter() - t0))
        return (i, buf, *self._views(buf))

    def _release(self) -> None:
        if self._held is not None:
            if self._held[1] is not None:
                self.free.put(self._held[1])
            self._held = None
            self._fill()

    def _views(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        L = self.lay
        kb = buf[:self.n_ctx * L.kpos].view(self.dt_k).reshape(self.n_ctx, *self.shape_k)
        vb = buf[L.kb:L.kb + self.n_ctx * L.vpos].view(self.dt_v).reshape(self.n_ctx, *self.shape_v)
        return kb, vb

    def _scratch(self):
        """A free read buffer for export / restore / rewind (between passes: none is in flight)."""
        @contextlib.contextmanager
        def held():
            self.abort()
            buf = self.free.get()
            try:
                yield buf
            finally:
                self.free.put(buf)
        return held()

    def _slots(self, a: int, b: int):
        """Ring slot ranges (slot0, slot1, position0) holding positions a..b-1."""
        t, p = self.lay.tail, a
        while p < b:
            s0 = p % t
            m = min(b - p, t - s0)
            yield s0, s0 + m, p
            p += m

    def _to_ring(self, i: int, a: int, b: int, kb: np.ndarray, vb: np.ndarray) -> None:
        for s0, s1, p in self._slots(a, b):
            self.k[i, s0:s1] = kb[p:p + s1 - s0]
            self.v[i, s0:s1] = vb[p:p + s1 - s0]

    def _from_ring(self, i: int, a: int, b: int, kb: np.ndarray, vb: np.ndarray) -> None:
        for s0, s1, p in self._slots(a, b):
            kb[p:p + s1 - s0] = self.k[i, s0:s1]
            vb[p:p + s1 - s0] = self.v[i, s0:s1]

    def _flush(self, to: int) -> None:
        """Write positions spilled..to-1 (whole groups) from the rings to the files."""
        L, a = self.lay, self.spilled
        for i, f in enumerate(self.files):
            for s0, s1, p in self._slots(a, to):
                f.write(p * L.kpos, self.k[i, s0:s1].reshape(-1).view(np.uint8))
                f.write(L.kb + p * L.vpos, self.v[i, s0:s1].reshape(-1).view(np.uint8))
                self.bytes_written += (s1 - s0) * (L.kpos + L.vpos)
        self.spilled = to

    def _read(self, i: int, buf: np.ndarray, a: int, b: int) -> None:
        """Positions a..b-1 of layer i's file into buf (at their own offsets), on this thread."""
        L = self.lay
        for base, r in ((0, L.kpos), (L.kb, L.vpos)):
            lo, hi = a * r // SPILL_ALIGN * SPILL_ALIGN, -(-b * r // SPILL_ALIGN) * SPILL_ALIGN
            self.bytes_read += self.files[i].read_into(base + lo, buf[base + lo:base + hi])

    def _write(self, i: int, buf: np.ndarray, a: int, b: int) -> None:
        """Positions a..b-1 (whole groups) of buf to layer i's file."""
        L = self.lay
        for base, r in ((0, L.kpos), (L.kb, L.vpos)):
            self.files[i].write(base + a * r, buf[base + a * r:base + b * r])

    def _rewind(self, n_past: int) -> None:
        """A reset forgot positions the files hold: the group holding n_past goes back to the rings."""
        s = n_past // self.lay.group * self.lay.group
        with self._scratch() as buf:
            kb, vb = self._views(buf)
            for i in range(self.n_layer):
                self._read(i, buf, s, n_past)
                self._to_ring(i, s, n_past, kb, vb)
        self.spilled = s
