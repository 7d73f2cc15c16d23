"""Weights laid out by the plan: resident tensors, pinned layers, and layers streamed through a pool.

A reader thread reads the next items of the current pass (layers, then output-projection chunks)
into a bounded pool of reusable, budget-charged buffers while the current layer computes. A pass
is a cyclic scan, so after the last item the reader goes on with the first ones of the next pass.
A pinned layer's repackable matrices (kernels.repack: Q4_0, Q4_K, Q8_0) and a resident output
matrix are repacked in place once read at load (same size: nothing more to charge). Streamed layers and
output chunks stay in file order: out of core the reader thread's repacking (~1.4 GB/s of one core)
cost more than the faster decode gained (3B Q4_K_M at --ram 512M: 5.4 against 1.3 s/token);
RAMFORGE_REPACK_STREAMED=1 repacks them on the reader thread for A/B runs. mmap views stay as the file.
"""
from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager

import numpy as np

from .. import flags
from ..errors import InternalError, check_token_ids
from ..gguf.constants import GGMLType
from ..gguf.reader import GGUFFile
from ..kernels.dequant import dequantize
from ..kernels.repack import repack, repack_group, repackable
from ..memory import MemoryBudget
from ..models.weights import EXPERT_TENSORS, Layer, LayerExperts, QTensor, gguf_name, validate_tensors
from .layout import ALIGN, SMALL, block_row_bytes, is_expert_tensor, span_of
from .plan import Plan
from ..profiling import ExpertRecord, LayerRecord, PassRecord
from .expert_view import Experts
from .experts import DEFAULT_POLICY, ExpertCache, Policy
from .io import IOMode, ModelFile, aligned_empty

REPACK_OFF = flags.NO_REPACK.get()                              # keep file order (A/B runs)
REPACK_STREAMED = not REPACK_OFF and flags.REPACK_STREAMED.get()
REPACK_EXPERTS = not REPACK_OFF and not flags.NO_REPACK_EXPERTS.get()     # the expert cache's reads (stream.experts)


class Reader(threading.Thread):
    """Reads jobs into free buffers, in order; results come back in the same order. A job is
    (key, segments, post, pool): read into a free buffer of pool, then post(buf) if given. pool None is
    this reader's own buffers, from its file (the weights); another pool (the KV cache's spill,
    memory.kv_spill) is anything with `free` and `done` queues and `read(key, offset, out) -> bytes`.
    Each pool keeps jobs in flight <= its buffers, so no job waits for a buffer and one pool's jobs
    never hold up another's."""

    def __init__(self, file: ModelFile | None, buffers: list[np.ndarray]):
        super().__init__(name="ramforge-reader", daemon=True)
        self.file = file
        self.free: queue.Queue = queue.Queue()
        for b in buffers:
            self.free.put(b)
        self.jobs: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        self.start()

    def read(self, key, offset: int, out: np.ndarray) -> int:
        return self.file.read_into(offset, out)

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            key, segments, post, pool = job
            pool = pool or self
            buf = pool.free.get()
            t0, n, err = time.perf_counter(), 0, None
            try:
                for off, length, at in segments:
                    n += pool.read(key, off, buf[at:at + length])
                if post is not None:
                    post(buf)
            except BaseException as e:      # handed to the consumer, which raises it
                err = e
            pool.done.put((key, buf, err, n, time.perf_counter() - t0))

    def stop(self) -> None:
        self.jobs.put(None)
        self.join(timeout=10)


class Weights:
    """Tensors as `plan` says; `layer(il)` yields a Layer, streaming it in if it is not pinned."""

    def __init__(self, f: GGUFFile, plan: Plan, hp, arch, budget: MemoryBudget, io: IOMode | str = IOMode.DIRECT,
                 expert_policy: Policy | str | None = None, expert_prefetch: bool = True):
        self.f, self.plan, self.hp, self.arch, self.budget = f, plan, hp, arch, budget   # arch: models.arch.Arch
        self.expert_policy, self.expert_prefetch = Policy.parse(expert_policy or DEFAULT_POLICY), bool(expert_prefetch)
        self.tensors = arch.layer_tensors(hp)
        self.layer_names = arch.layer_names(hp)
        validate_tensors(f, hp, arch, plan.layers)
        self.file = ModelFile.of(f, io)          # every shard of a split model
        self.mmap = self.file.mode == IOMode.MMAP
        self.apart = plan.experts_apart and not self.mmap  # experts in the expert cache, not their layers
        self.expert_cache: ExpertCache | None = None
        self.predictors: dict[int, tuple[QTensor, QTensor]] = {}   # layer -> (ffn_norm, router), resident
        self._charges, self._reader, self._pass, self._cursor = [], None, [], 0
        self._inflight: list = []          # keys submitted and not yet taken, in order
        self._held: dict[int, Layer] = {}  # the layers `layer()` holds now
        self._rep: dict[int, dict] = {}     # layer -> its repackable matrices (_repackable)
        self.record: PassRecord | None = None   # the pass being profiled
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # ---- loading --------------------------------------------------------------------------
    def _charge(self, name: str, nbytes: int):
        c = self.budget.charge(name, nbytes)
        self._charges.append(c)
        return c

    def _read(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        if self.mmap:
            return self.file.view(offset, nbytes)
        lo, n = self.file.span(offset, nbytes)
        buf = aligned_empty(n)
        self.file.read_into(lo, buf)
        self.file.drop_cache(lo, n)
        return buf[offset - lo:offset - lo + nbytes]

    def _vector(self, name: str) -> QTensor | None:
        t = self.f.tensors.get(name)
        if t is None:
            return None
        self._charge(name, 4 * t.n_elements)
        vec = dequantize(t.ggml_type, self._read(name, t.offset, t.nbytes), n_elements=t.n_elements)
        return QTensor(name, GGMLType.F32, t.dims, vec)

    def _matrix(self, name: str) -> QTensor:
        t = self.f.tensors[name]
        if not self.mmap:
            self._charge(name, t.nbytes)
        return QTensor(name, t.ggml_type, t.dims, self._read(name, t.offset, t.nbytes))

    def _load(self) -> None:
        p, f = self.plan, self.f
        a, b = p.layers
        last = b == self.hp.n_layer
        self.out_name = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
        self.resident = {n: self._matrix(n) for n in p.resident}      # read first: the largest, no kernel
        self.output_norm = self._vector(SMALL[0]) if last else None   # (dequantizing may wait for numba's
        self.rope_freqs = self._vector(SMALL[1])                      # set-up, jit.prepare_in_background)
        self.vectors = {t: self._vector(t) for t in self.arch.global_vectors}             # Arch.global_vectors
        self.matrices = {t: self._matrix(t) if t in self.f.tensors else None for t in self.arch.global_matrices}
        self.token_embd = self.resident.get("token_embd.weight") if a == 0 else None
        self.output = self.resident.get(self.out_name) if last else None
        out = self.resident.get("output.weight")          # (a tied embedding keeps its rows for get_rows)
        if out is not None and not self.mmap and not REPACK_OFF and repackable(out.ggml_type, out.dims):
            out.repacked = repack(out.ggml_type, out.data, out.dims)
        if p.embd_row_bytes:
            self._charge("embedding rows", p.embd_row_bytes)
        self.spans = {i: span_of(i, [t for n, t in f.tensors.items() if n.startswith(f"blk.{i}.")
                                     and not (self.apart and is_expert_tensor(n))]) for i in range(a, b)}
        if self.apart:
            self._charge("expert cache", p.expert_slots * p.expert_slot_bytes)
            self.expert_cache = ExpertCache(f, self.file, range(a, b), p.expert_slots, p.expert_slot_bytes,
                                            self.expert_policy, self.expert_prefetch, repacked=REPACK_EXPERTS)
            for il in range(a + 1, b):       # what predicts layer il's experts from layer il-1 (plan.predictor_bytes)
                self.predictors[il] = (self._vector(gguf_name(self.arch.ffn_norm, il)),
                                       self._matrix(gguf_name("ffn_gate_inp", il)))
        self.pinned = {}
        for il in (range(a, b) if self.mmap else p.pinned):
            self.pinned[il] = self._pinned_layer(il)
        self.streamed = [il for il in range(a, b) if il not in self.pinned]
        buffers = []
        for i in range(p.n_buffers if self.streamed or self._out_streamed() else 0):
            self._charge(f"stream buffer {i}", p.buffer_bytes)
            buffers.append(aligned_empty(p.buffer_bytes, fault_in=1))   # not by the first token's reads
        self._buffers = buffers
        if buffers:
            self._reader = Reader(self.file, buffers)

    def _pinned_layer(self, il: int) -> Layer:
        s = self.spans[il]
        if self.mmap:
            return self._layer_from(il, None)
        buf = aligned_empty(s.nbytes)
        self._charge(f"pinned layer {il}", s.nbytes)
        for off, n, at in s.segments:
            self.file.read_into(off, buf[at:at + n])
            self.file.drop_cache(off, n)
        self._repack(il, buf)
        return self._layer_from(il, buf, True)

    def _repackable(self, il: int) -> dict:
        """Layer il's matrices that take kernels.repack's layout, name -> tensor (none where tensors are
        file views)."""
        if il not in self._rep:
            ts = [self.f.tensors.get(gguf_name(s, il)) for s in self.tensors]
            self._rep[il] = {} if self.mmap or REPACK_OFF else {
                t.name: t for t in ts if t is not None and repackable(t.ggml_type, t.dims[:2])
                and (len(t.dims) == 2 or not self.apart)}   # a 3-D expert tensor: each expert's matrix alone
        return self._rep[il]

    def _repack(self, il: int, buf: np.ndarray) -> None:
        """Repack layer il's repackable matrices in its buffer, in place (after every read of it); an
        expert tensor expert by expert (its 2-D matrices one after another), as llama.cpp repacks it."""
        for t in self._repackable(il).values():
            at = self.spans[il].offsets[t.name]
            n = t.dims[2] if len(t.dims) == 3 else 1
            per = t.nbytes // n
            for e in range(n):
                repack(t.ggml_type, buf[at + e * per:at + (e + 1) * per], t.dims[:2])

    def _layer_from(self, il: int, buf: np.ndarray | None, repacked: bool = False) -> Layer:
        layer = Layer(il, self.layer_names)
        for s in self.tensors:
            name = gguf_name(s, il)
            t = self.f.tensors.get(name)
            if t is None or (self.apart and s in EXPERT_TENSORS):
                continue
            raw = self.file.view(t.offset, t.nbytes) if buf is None else buf[self.spans[il].offsets[name]:][:t.nbytes]
            if len(t.dims) == 1:
                layer.tensors[s] = QTensor(name, GGMLType.F32, t.dims, dequantize(t.ggml_type, raw, n_elements=t.n_elements))
            else:
                rep = self._groups(il, t, repacked and buf is not None)
                layer.tensors[s] = QTensor(name, t.ggml_type, t.dims, raw, rep)
        return layer

    def _groups(self, il: int, t, repacked: bool) -> int:
        """The rows in a repacked group of layer il's matrix t where the layer is repacked (0: file order)."""
        return repack_group(t.dims[1]) if repacked and t.name in self._repackable(il) else 0

    def matmul_shapes(self) -> set[tuple]:
        """(type, n_out, n_in, repacked) of the file's matrices as a pass may multiply by them, in file
        order and in kernels.repack's groups where they may take it (kernels.qmatmul.warm)."""
        out = set()
        for t in self.f.tensors.values():
            if len(t.dims) >= 2:
                out.add((t.ggml_type, t.dims[1], t.dims[0], 0))
                if len(t.dims) == 2 and repackable(t.ggml_type, t.dims):
                    out.add((t.ggml_type, t.dims[1], t.dims[0], repack_group(t.dims[1])))
        return out

    def expert_shapes(self) -> set[tuple]:
        """(gate type, up type, down type, n_embd, n_ff, repacked groups) of each layer's experts as a
        decode token multiplies by them (kernels.fused_moe.warm); empty for a dense model."""
        out = set()
        for il in range(*self.plan.layers):
            ts = [self.f.tensors.get(gguf_name(s, il)) for s in EXPERT_TENSORS]
            if None in ts:
                continue
            repacked = (il in self.pinned or REPACK_STREAMED) and not self.mmap
            g, u, d = ts
            layouts = ({self.expert_cache.reps[il], (0, 0, 0)} if self.apart      # a cached expert: file order
                       else {tuple(self._groups(il, t, repacked) for t in ts)})  # until its second use
            out |= {(g.ggml_type, u.ggml_type, d.ggml_type, g.dims[0], g.dims[1], reps) for reps in layouts}
        return out

    def layer_matrices(self) -> list[dict]:
        """Each layer's matrices as a pass multiplies by them, {suffix: (type, n_out, n_in, repacked)},
        and {"output": ...} for a resident output matrix (kernels.fused.warm)."""
        out = []
        for il in range(*self.plan.layers):
            repacked = (il in self.pinned or REPACK_STREAMED) and not self.mmap    # (as `layer` makes it)
            ts = ((s, self.f.tensors.get(gguf_name(s, il))) for s in self.tensors)
            out.append({s: (t.ggml_type, t.dims[1], t.dims[0], self._groups(il, t, repacked))
                        for s, t in ts if t is not None and len(t.dims) == 2})
        o = getattr(self, "output", None)       # (resident; streamed chunks vary in rows)
        if o is not None:
            out.append({"output": (o.ggml_type, o.dims[1], o.dims[0], o.repacked)})
        return out

    @property
    def reader(self) -> "Reader | None":
        """The reader thread of the streamed layers (None when nothing streams); the KV spill shares it."""
        return self._reader

    # ---- passes ---------------------------------------------------------------------------
    def _out_streamed(self) -> bool:
        return self.plan.layers[1] == self.hp.n_layer and self.output is None

    def _out_chunks(self) -> list[tuple[int, int]]:
        t = self.f.tensors[self.out_name]
        rb = block_row_bytes(t)
        rows = max(1, (self.plan.buffer_bytes - 2 * ALIGN) // rb)
        rows = rows // 16 * 16 if rows >= 16 else rows        # whole repacked groups (_out_repack)
        return [(r, min(t.dims[1], r + rows)) for r in range(0, t.dims[1], rows)]

    def _job(self, key):
        if key[0] == "L":
            il = key[1]
            return key, self.spans[il].segments, (lambda buf: self._repack(il, buf)) if REPACK_STREAMED and self._repackable(il) else None
        t = self.f.tensors[self.out_name]
        rb = block_row_bytes(t)
        r0, r1 = key[1]
        lo, n = self.file.span(t.offset + r0 * rb, (r1 - r0) * rb)
        return key, [(lo, n, 0)], self._out_repack(t, r0, r1, t.offset + r0 * rb - lo)

    def _out_repack(self, t, r0: int, r1: int, skip: int):
        """The reader's repacking of output rows r0..r1 read at `skip` in a buffer (None: kept in file order)."""
        dims = (t.dims[0], r1 - r0)
        if self.mmap or not REPACK_STREAMED or t.name != "output.weight" or not repackable(t.ggml_type, dims):
            return None
        return lambda buf: repack(t.ggml_type, buf[skip:skip + (r1 - r0) * block_row_bytes(t)], dims)

    def begin_pass(self, logits: bool) -> None:
        """Start a forward pass; the reader may already hold its first items from the last one."""
        self.file.check_unchanged()
        items = [("L", il) for il in self.streamed]
        if logits and self._out_streamed():
            items += [("O", c) for c in self._out_chunks()]
        if items != self._pass or not self._inflight or self._inflight[0] != items[0]:
            self._drain()
            self._pass, self._cursor = items, 0
        self._fill()

    def _fill(self) -> None:
        while self._pass and len(self._inflight) < len(self._buffers):
            key = self._pass[self._cursor % len(self._pass)]
            self._cursor += 1
            self._reader.jobs.put((*self._job(key), None))
            self._inflight.append(key)

    def _drain(self) -> None:
        while self._inflight:
            key, buf, err, n, dt = self._reader.done.get()
            self._inflight.pop(0)
            self._reader.free.put(buf)
            self._drop(key)
        self._cursor = 0

    def _drop(self, key) -> None:
        if self.file.mode == IOMode.BUFFERED:
            for off, length, _ in self._job(key)[1]:
                self.file.drop_cache(off, length)

    @contextmanager
    def _take(self, key, label):
        if not self._inflight or self._inflight[0] != key:
            self._drain()
            self._pass, self._cursor = [key], 0
            self._fill()
        t0 = time.perf_counter()
        got, buf, err, n, read_s = self._reader.done.get()
        self._inflight.pop(0)
        rec = LayerRecord(label, False, n, read_s, time.perf_counter() - t0)
        if err is not None:
            self._reader.free.put(buf)
            self._drain()
            self._pass = []
            raise err
        t1 = time.perf_counter()
        try:
            yield buf
        finally:
            rec.compute_s = time.perf_counter() - t1
            if self.record is not None:
                self.record.layers.append(rec)
            self._reader.free.put(buf)
            self._drop(key)
            self._fill()

    @contextmanager
    def layer(self, il: int):
        if il in self.pinned:
            t0 = time.perf_counter()
            self._held[il] = self.pinned[il]
            try:
                yield self.pinned[il]
            finally:
                self._held.pop(il, None)
            if self.record is not None:
                self.record.layers.append(LayerRecord(il, True, compute_s=time.perf_counter() - t0))
            return
        with self._take(("L", il), il) as buf:
            self._held[il] = layer = self._layer_from(il, buf, REPACK_STREAMED)
            try:
                yield layer
            finally:
                self._held.pop(il, None)

    @contextmanager
    def experts(self, il: int, ids, n_tokens: int):
        """Layer il's experts `ids` (the ones its router picked, ascending) as an `Experts`: iterate it for
        (e, (gate, up, down)), 2-D QTensors of expert e's rows, valid until the next. Served from the
        layer's 3-D tensors as loaded (resident, or streamed with the layer that `layer(il)` holds now),
        or by the expert cache, which reads the ones it lacks meanwhile."""
        if self.expert_cache is not None:
            rec = ExpertRecord(il)
            c = self.expert_cache
            t0 = time.perf_counter()
            try:
                yield Experts(self, il, c.layer(il, ids, n_tokens, rec), rec)
            finally:
                rec.compute_s = time.perf_counter() - t0 - rec.wait_s
                c.end(rec)
                if self.record is not None:
                    self.record.experts.append(rec)
            return
        layer = self._held.get(il)
        if layer is None:
            raise InternalError(f"the experts of layer {il} were asked for outside `layer({il})`")
        yield Experts(self, il, [(il, int(e)) for e in ids], None, LayerExperts(layer))

    def output_rows(self, y: np.ndarray, x: np.ndarray, batch=None) -> np.ndarray:
        """logits y f32[n, n_vocab] = x f32[n, n_embd] @ output^T, resident or in streamed row chunks; in
        the arithmetic of `batch` (a kernels.batch.Batch; None: x's rows are a batch of their own)."""
        if self.output is not None:
            return self.output.rows(y, x, batch)
        t = self.f.tensors[self.out_name]
        rb = block_row_bytes(t)
        for r0, r1 in self._out_chunks():
            with self._take(("O", (r0, r1)), f"output[{r0}:{r1}]") as buf:
                lo, _ = self.file.span(t.offset + r0 * rb, (r1 - r0) * rb)
                skip = t.offset + r0 * rb - lo
                rep = repack_group(r1 - r0) if self._out_repack(t, r0, r1, skip) else 0
                part = QTensor(t.name, t.ggml_type, (t.dims[0], r1 - r0), buf[skip:skip + (r1 - r0) * rb], rep)
                part.rows(y[:, r0:r1], x, batch)
        return y

    def embed(self, tokens, out: np.ndarray) -> np.ndarray:
        """Embedding rows of tokens into out f32[n, n_embd]: from memory, or read row by row."""
        if self.token_embd is not None:
            return self.token_embd.get_rows(tokens, out)
        t = self.f.tensors["token_embd.weight"]
        rb = block_row_bytes(t)
        check_token_ids(tokens, t.dims[1])
        for i, tok in enumerate(tokens):
            raw = self._read(t.name, t.offset + int(tok) * rb, rb)
            dequantize(t.ggml_type, raw, out=out[i])
            if self.record is not None:
                self.record.layers.append(LayerRecord("embedding", False, rb))
        return out

    def abort(self) -> None:
        """After an error mid-pass: return every buffer so the next pass starts clean."""
        if self._reader is not None:
            self._drain()
            self._pass = []
        if self.expert_cache is not None:
            self.expert_cache.abort()

    def close(self) -> None:
        if self._reader is not None:
            self.abort()
            self._reader.stop()
            self._reader = None
        if self.expert_cache is not None:
            self.expert_cache.close()
            self.expert_cache = None
        for c in self._charges:
            c.release()
        self._charges.clear()
        self.pinned, self.resident = {}, {}
        self.file.close()
