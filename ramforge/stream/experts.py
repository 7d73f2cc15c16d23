"""The expert cache: a mixture of experts' experts as their own unit of residency.

When a plan streams experts apart from their layers (plan.experts_apart), an expert (its rows of
ffn_gate_exps, ffn_up_exps and ffn_down_exps: three contiguous byte ranges, each read aligned) is
read alone into one of `n_slots` budget-charged slots. Reads run on reader threads; the compute
thread does all the bookkeeping, so a slot is never reused while a kernel reads it.

A layer's turn (`layer`): the experts its router picked are protected; the ones not cached are
queued for reading (as many as free or evictable slots allow, the rest as earlier ones finish);
the cached ones are handed out first, so compute overlaps the reads (the misses then go a batch at a
time: the next one awaited, with every other whose read has finished, `take_arrived`). A prediction for the next
layer (`predict`: its router applied to this layer's hidden state, models.moe) queues the
predicted experts that are not cached behind this layer's own reads. Compute always uses the true
routing: a wrong guess costs bandwidth only, and is counted as a wasted prefetch (cancelled if its read
has not begun). Every guess is scored; reads ahead are made only while recent guesses name at least
READ_AHEAD_FROM of the picks (on random-weight models they name about a third, and reading them ahead
was slower than not), and while at least READ_AHEAD_PRECISION of the guesses not cached (the ones a read
would fetch) were picked: on a skew-routed model the cached guesses are the popular experts, and right,
the others mostly wrong (the 6-layer skew file at 1/4: 15 wasted reads a token for 4 read-ahead hits;
gated, 36 MB read a token instead of 66-73, at the same s/token). While reads ahead are off, one layer turn in
GUESS_EVERY still guesses (`wants_guess`), to go on scoring: a guess is a router's matvec over the layer's state
(~80 us a layer on the 48-layer shape: 4 ms a token where it guessed every turn), and on the skew-routed files
reads ahead are off most of the time.

An expert whose matrices take kernels.repack's layout (Q4_0, Q4_K, Q8_0) is repacked in its slot at its
second use after its read (PACK_AT_USE), as llama.cpp repacks its expert tensors at load, by the compute
threads together (kernels.repack.repack_many): its later uses run the repacked kernels, 2-3x faster than
rows in file order. The repack costs about one file-order use, so an expert used once per read (at 1/4
of a random-routed model, many are) is not repacked; on a reader thread the repacks slowed the compute
threads' parallel regions more than they saved. (Repacking used experts while the compute thread waited
for a read, on one thread, was tried: it turned waiting into repacking, and no token got faster.)

Eviction (`Policy`): LRU, or LFU, a frequency-aware policy: the fewest uses, each use's weight
halving every `HALF_LIFE` tokens, the least recently used among equals. Replayed offline
(tools/replay_routing.py) on routing traces of random- and skew-routed Qwen3-30B-A3B shapes, with caches
of 6-38% of the experts, a half-life of 12 tokens missed at most 4% more than the best half-life of each
case; 64 up to 61% more (a cache of 20% on the skew-routed 48 layers, where recency matters), and LRU
up to 65% more (a small cache, where frequency does).
"""
from __future__ import annotations

import enum
import time
from typing import NamedTuple
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import numba
import numpy as np

from ..errors import InternalError, InvalidArgument
from ..gguf.reader import GGUFFile
from ..kernels.repack import repack_group, repack_many, repackable
from ..models.weights import EXPERT_TENSORS, QTensor, gguf_name
from .eviction import count_uses, pick_victim
from .expert_view import NONE_HANDED, Handed
from .layout import Span, expert_span
from ..profiling import ExpertRecord
from .io import ModelFile, aligned_empty

HALF_LIFE = 12.0        # tokens: a use's weight in LFU halves over this many tokens (see Eviction, above)
READ_AHEAD_FROM = 0.5   # read ahead only while at least this share of recent picks was guessed ...
ACCURACY_TURNS = 32     # ... recent: a moving average over about this many layer turns
READ_AHEAD_PRECISION = 0.5   # ... and while at least this share of the guesses not cached was picked
READERS = 2             # reader threads: more than one read in flight keeps a fast SSD busy
PACK_AT_USE = 2         # an expert's use (since its read) at which it is repacked
GUESS_EVERY = 8         # while reads ahead are off, one layer turn in this many still guesses (to score)


class ExpertRead(NamedTuple):
    """An expert's read plan (made at its first read): its file segments into a slot, and where in the slot
    its gate, up and down rows land."""
    span: Span
    offs: tuple[int, int, int]


class Policy(str, enum.Enum):
    LRU = "lru"         # evict the least recently used
    LFU = "lfu"         # evict the least often used (uses decay with HALF_LIFE), LRU among equals

    @classmethod
    def parse(cls, value) -> "Policy":
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise InvalidArgument(f"expert cache policy {value!r}: one of {', '.join(p.value for p in cls)}") from None


DEFAULT_POLICY = Policy.LFU


class ExpertCache:
    """Experts (layer, id) in n_slots buffers of slot_bytes, read by reader threads."""

    def __init__(self, f: GGUFFile, file: ModelFile, layers: range, n_slots: int, slot_bytes: int,
                 policy: Policy | str = DEFAULT_POLICY, prefetch: bool = True, readers: int = READERS,
                 repacked: bool = True):
        if n_slots < 1:
            raise InternalError("the expert cache needs at least one slot")
        self.file, self.layers = file, layers
        self.policy = Policy.parse(policy)
        self.tensors = {il: [f.tensors[gguf_name(s, il)] for s in EXPERT_TENSORS] for il in layers}
        self.n_expert = self.tensors[layers[0]][0].dims[2]
        self.reps = {il: tuple(repack_group(t.dims[1]) if repacked and repackable(t.ggml_type, t.dims[:2]) else 0
                               for t in ts) for il, ts in self.tensors.items()}   # (gate, up, down) groups, 0: file order
        self.pool = aligned_empty(n_slots * slot_bytes,     # every slot's buffer, one after another, its pages
                                  fault_in=numba.get_num_threads())   # faulted in now, not by a decode's reads
        self.buffers = [self.pool[i * slot_bytes:(i + 1) * slot_bytes] for i in range(n_slots)]
        self.slot_bytes = slot_bytes
        self._slot: dict[tuple[int, int], int] = {}          # (layer, expert) -> slot
        self._key: list[tuple[int, int] | None] = [None] * n_slots
        self._free = list(range(n_slots - 1, -1, -1))      # slots holding no expert (popped from the end)
        self._reads: dict[tuple[int, int], ExpertRead] = {}     # key -> its read plan, made on first read
        self._loading: dict[int, Future] = {}               # slot -> its read, until taken
        self._failed: list[Future] = []                     # reads that ended in an error or were cancelled
        self._protected = np.zeros(n_slots, bool)          # in use by this layer, or a pending prefetch
        self._held = np.zeros(n_slots, bool)               # scratch: protected or being read (_victim)
        self._used = np.zeros(n_slots)                      # clock of the last use (LRU)
        self._packed = np.zeros(n_slots, bool)             # its expert repacked (self.reps) since its read
        self._uses = np.zeros(n_slots, np.int64)           # its expert's uses since its read
        self._where = np.zeros((n_slots, 2), np.int64)      # slot -> (layer - layers[0], expert), for LFU
        self._at = np.zeros((3, n_slots), np.int64)        # slot -> its expert's gate, up, down offsets in pool:
                                                            # where handing out, repacking and _tensors find them
        self._freq = np.zeros((len(layers), self.n_expert))  # decayed use counts, at _freq_t
        self._freq_t = np.zeros((len(layers), self.n_expert))
        self._prefetched: dict[tuple[int, int], int] = {}  # key -> slot, read for a layer not yet run
        self._kept: dict[tuple[int, int], int] = {}        # key -> slot, cached and predicted: kept from eviction
        self._predicted: dict[int, set[int]] = {}          # layer -> its predicted experts, until it runs
        self._unseen: dict[int, set[int]] = {}             # ... those of them not cached when guessed
        self._pool = ThreadPoolExecutor(readers, thread_name_prefix="ramforge-experts")
        self._turn: list[tuple[int, int]] = []              # this layer's keys, in compute order
        self._todo: list[tuple[int, int]] = []              # ... those that were misses
        self._taken: int | None = None                      # the slot handed out last
        self.tokens = 0.0                                   # the clock: tokens routed through layers[0]
        self._tick = 0                                      # orders uses within a token
        self.totals = ExpertRecord("all")
        self.prefetch = prefetch                            # guess the next layer's experts ...
        self.accuracy = 1.0                                 # ... and read them ahead while guesses are right
        self.precision = 1.0                                # ... and the guesses a read would fetch
        self._gated = 0                                     # layer turns asked while reads ahead were off

    @property
    def n_slots(self) -> int:
        return len(self.buffers)

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._slot

    # ---- a layer's turn -------------------------------------------------------------------
    def layer(self, il: int, ids: np.ndarray, n_tokens: int, rec: ExpertRecord) -> list[tuple[int, int]]:
        """Begin layer il's turn with its picked experts ids: protect the cached ones, queue reads of the
        others. Returns the keys in the order to compute them (cached first); `take` each in that order,
        then `end` the turn. rec collects the layer's figures."""
        if il not in self.tensors:
            raise InternalError(f"layer {il} has no experts in this cache")
        es = self._checked(il, ids)
        if il == self.layers[0]:
            self.tokens += n_tokens
        self._count(il, ids)
        keys = [(il, e) for e in es]
        picked = set(keys)
        guess = self._predicted.pop(il, None)
        if guess is not None:
            right = sum(e in guess for _, e in keys)
            rec.predicted += len(keys)
            rec.predicted_right += right
            self.accuracy += (right / max(len(keys), 1) - self.accuracy) / ACCURACY_TURNS
        unseen = self._unseen.pop(il, None)
        if unseen:
            right = sum(e in unseen for _, e in keys)
            rec.unseen_guessed += len(unseen)
            rec.unseen_right += right
            self.precision += (right / len(unseen) - self.precision) / ACCURACY_TURNS
        for k in [k for k in self._kept if k[0] == il]:
            self._protected[self._kept.pop(k)] = False
        for k in [k for k in self._prefetched if k[0] == il and k not in picked]:
            slot = self._prefetched.pop(k)                      # read ahead for this layer, not picked
            self._protected[slot] = False
            rec.prefetch_wasted += 1
            fut = self._loading.get(slot)
            if fut is not None and fut.cancel():                # still queued: never read
                self._evict(slot)
            else:
                rec.bytes_read += self._reads[k].span.nbytes
        cached = [k for k in keys if k in self._slot]
        for k in cached:
            if self._prefetched.pop(k, None) is not None:
                rec.prefetch_hits += 1
                rec.bytes_read += self._reads[k].span.nbytes
            else:
                rec.hits += 1
            self._protected[self._slot[k]] = True
        self._todo = [k for k in keys if k not in self._slot]   # misses, read in this order
        rec.misses += len(self._todo)
        self._turn = cached + self._todo
        self._taken = None
        self._submit(self._todo, rec)
        return list(self._turn)

    def take(self, key: tuple[int, int], rec: ExpertRecord) -> tuple[QTensor, QTensor, QTensor]:
        """Expert key's (gate, up, down), waiting for its read; the previous one taken is given up."""
        self._release_taken(rec)
        if key in self._todo:
            self._todo.remove(key)
        slot = self._wait(key, rec)
        self._use(slot)
        self._pack([slot])
        self._taken = slot
        return self._tensors(key, slot)

    def take_ready(self, keys: list[tuple[int, int]], rec: ExpertRecord) -> Handed:
        """Of this turn's keys, those whose bytes are in their slot now (cached, or read ahead and done), with
        where they lie in `pool` and their layouts; marked used. They stay protected until `release`."""
        out = []
        for k in keys:
            slot = self._slot.get(k)
            if slot is None or k in self._todo or not self._arrived(slot, rec):   # (a read ahead not done: `take`)
                continue
            self._use(slot)
            out.append(k)
        return self._handed(out)

    def take_arrived(self, keys: list[tuple[int, int]], rec: ExpertRecord) -> Handed:
        """Of this turn's keys not yet taken (in compute order), the first, waiting for its read, and every
        other whose read has finished by then: as take_ready gives them (a prefill's misses, a batch at a
        time as they arrive). None handed when keys is empty, or when the first cannot get a slot until an
        expert held elsewhere in the turn is given up (then `take` them in order)."""
        if not keys:
            return NONE_HANDED
        first = keys[0]
        self._submit([first], rec)
        if first not in self._slot and not any(not self._protected[sl] and not f.done() for sl, f in self._loading.items()):
            return NONE_HANDED
        got = [first]
        self._wait(first, rec)
        for k in keys[1:]:
            slot = self._slot.get(k)
            if slot is not None and self._arrived(slot, rec):  # (else left for a later batch)
                got.append(k)
        for k in got:
            if k in self._todo:
                self._todo.remove(k)
            self._use(self._slot[k])
        return self._handed(got)

    def _arrived(self, slot: int, rec: ExpertRecord) -> bool:
        """Whether slot's bytes are in: no read pending, or one done and sound (then settled: its seconds
        counted); a read still running, cancelled or failed is left to `take` / `_wait`."""
        fut = self._loading.get(slot)
        if fut is None:
            return True
        if not fut.done() or fut.cancelled() or fut.exception() is not None:
            return False
        del self._loading[slot]
        rec.read_s += fut.result()[1]
        return True

    def _handed(self, keys: list[tuple[int, int]]) -> Handed:
        """keys (in their slots, marked used) handed out, those at their PACK_AT_USE'th use repacked first."""
        if not keys:
            return NONE_HANDED
        slots = [self._slot[k] for k in keys]
        self._pack(slots)
        at = np.array(slots, np.int64)
        return Handed(keys, np.take(self._at, at, axis=1), self._packed[at])   # (take: C-contiguous rows)

    def layout(self, slot: int) -> tuple[int, int, int]:
        """The repacked groups (gate, up, down) of the expert in slot as it is now (0: file order)."""
        return self.reps[self._key[slot][0]] if self._packed[slot] else (0, 0, 0)

    def release(self, keys: list[tuple[int, int]], rec: ExpertRecord) -> None:
        """The keys taken by take_ready are computed: their slots may be reused (as `take` gives up the one
        before), and misses waiting for a slot are read."""
        self._unprotect(keys)
        self._submit(self._todo, rec)

    def _unprotect(self, keys) -> None:
        """keys' slots may be evicted again, except those kept for a later layer (read ahead or predicted)."""
        held = set(self._prefetched.values()) | set(self._kept.values())
        for k in keys:
            slot = self._slot.get(k)
            if slot is not None and slot not in held:
                self._protected[slot] = False

    def end(self, rec: ExpertRecord) -> None:
        """End the layer's turn (after an error too): its experts are no longer protected."""
        self._release_taken(rec, submit=False)
        self._unprotect(self._turn)
        self._turn, self._todo = [], []
        self._settle_failed()
        self.totals.add(rec)

    def _release_taken(self, rec: ExpertRecord, submit: bool = True) -> None:
        if self._taken is not None:
            self._protected[self._taken] = False
            self._taken = None
            if submit:
                self._submit(self._todo, rec)

    def wants_guess(self) -> bool:
        """Whether this layer turn should guess the next layer's experts (ask once a turn): every turn while
        reads ahead are on; while recent guesses keep them off, one turn in GUESS_EVERY, which scores them."""
        if not self.prefetch:
            return False
        if self.accuracy >= READ_AHEAD_FROM and self.precision >= READ_AHEAD_PRECISION:
            return True
        self._gated += 1
        return self._gated % GUESS_EVERY == 0

    def predict(self, il: int, ids: np.ndarray, rec: ExpertRecord) -> None:
        """Queue reads of layer il's predicted experts `ids` (best first) that are not cached, in the
        slots that are free or evictable now; cached ones are kept from eviction until layer il runs."""
        if not self.prefetch or il not in self.tensors:
            return
        es = self._checked(il, ids)
        self._predicted[il] = set(es)                           # scored when layer il runs
        self._unseen[il] = {e for e in es if (il, e) not in self._slot}
        if self.accuracy < READ_AHEAD_FROM:                     # guesses mostly wrong lately: reads would
            rec.prefetch_skipped += 1                           # cost more than they save
            return
        reads = self.precision >= READ_AHEAD_PRECISION
        if not reads and self._unseen[il]:
            rec.prefetch_skipped += 1
        for e in es:
            k = (il, e)
            slot = self._slot.get(k)
            if slot is not None:                            # cached: keep it for layer il
                if not self._protected[slot]:
                    self._protected[slot] = True
                    self._kept[k] = slot
                continue
            if not reads:
                continue
            if not self._start(k):
                return
            self._prefetched[k] = self._slot[k]
            rec.prefetch_issued += 1

    # ---- slots ----------------------------------------------------------------------------
    def _submit(self, todo: list, rec: ExpertRecord) -> None:
        """Start reads for the misses in todo that have no slot yet, while slots can be had."""
        for k in todo:
            if k in self._slot:
                continue
            if not self._start(k):
                return
            rec.bytes_read += self._reads[k].span.nbytes

    def _victim(self) -> int | None:
        """A free slot, else the policy's choice among the unprotected ones (None: every slot is in use)."""
        if self._free:
            return self._free.pop()
        held = self._held
        np.copyto(held, self._protected)
        for slot, fut in self._loading.items():    # a read still running (a wasted read-ahead) keeps its slot
            if not fut.done():
                held[slot] = True
        slot = pick_victim(held, self._where, self._freq, self._freq_t, float(self.tokens), HALF_LIFE, self._used,
                           self.policy is Policy.LFU)
        if slot < 0:
            return None
        self._evict(slot)
        return self._free.pop()

    def _evict(self, slot: int) -> None:
        k = self._key[slot]
        del self._slot[k]
        self._key[slot] = None
        self._loading.pop(slot, None)              # a finished read of the evicted expert
        self._free.append(slot)

    def _start(self, key: tuple[int, int]) -> bool:
        """Start reading expert key into a free or evicted slot (protected); False if every slot is in use."""
        il, e = key
        plan = self._reads.get(key)
        if plan is None:                                    # (e was range-checked where it came in: _checked)
            span = expert_span(self.tensors[il], e)
            if span.nbytes > self.slot_bytes:
                raise InternalError(f"expert {key} needs {span.nbytes:,} B, above the slot of {self.slot_bytes:,}")
            plan = self._reads[key] = ExpertRead(span, tuple(span.offsets[t.name] for t in self.tensors[il]))
        slot = self._victim()
        if slot is None:
            return False
        self._slot[key], self._key[slot] = slot, key
        self._protected[slot] = True                        # until taken, or its layer's turn
        self._packed[slot] = False
        self._uses[slot] = 0
        self._where[slot] = il - self.layers[0], e
        self._at[:, slot] = [slot * self.slot_bytes + o for o in plan.offs]
        fut = self._loading[slot] = self._pool.submit(self._read, self.buffers[slot], plan.span)
        fut.add_done_callback(self._note_failed)
        return True

    def _read(self, buf: np.ndarray, span: Span) -> tuple[int, float]:
        """On a reader thread: the expert's aligned segments into its slot."""
        t0, n = time.perf_counter(), 0
        for off, length, at in span.segments:
            n += self.file.read_into(off, buf[at:at + length])
            self.file.drop_cache(off, length)
        return n, time.perf_counter() - t0

    def _pack(self, slots: list[int]) -> None:
        """Repack the repackable matrices (self.reps) of the experts in slots at their PACK_AT_USE'th use
        since their read (or later, not yet repacked), all at once on the compute threads."""
        todo = []
        for slot in slots:
            if self._packed[slot] or self._uses[slot] < PACK_AT_USE:
                continue
            self._packed[slot] = True
            il = self._key[slot][0]
            todo += [(t.ggml_type, at, t.dims[:2])
                     for t, g, at in zip(self.tensors[il], self.reps[il], self._at[:, slot].tolist()) if g]
        if todo:
            repack_many(self.pool, todo, numba.get_num_threads())

    def _wait(self, key, rec: ExpertRecord) -> int:
        while key not in self._slot:                       # not started yet: every slot was busy
            self._submit([key], rec)
            running = [f for sl, f in self._loading.items() if not self._protected[sl] and not f.done()]
            if key not in self._slot:
                if not running:
                    raise InternalError(f"no expert slot free for {key}: {self.n_slots} slots all in use")
                wait(running, return_when=FIRST_COMPLETED)  # a wasted read-ahead still holds its slot
        slot = self._slot[key]
        fut = self._loading.pop(slot, None)
        if fut is not None:
            t0 = time.perf_counter()
            try:
                _, read_s = fut.result()
            except BaseException:
                self._evict(slot)
                self._protected[slot] = False
                raise
            rec.wait_s += time.perf_counter() - t0
            rec.read_s += read_s
        return slot

    def _note_failed(self, fut: Future) -> None:
        """A read's done-callback (on its reader thread, or here for one cancelled): failures are noted for
        _settle_failed (list.append is atomic), so it never scans every read in flight."""
        if fut.cancelled() or fut.exception() is not None:
            self._failed.append(fut)

    def _settle_failed(self) -> None:
        """Reads that finished with an error free their slots (the error was or will be raised)."""
        while self._failed:
            fut = self._failed.pop()
            for slot, f in list(self._loading.items()):
                if f is fut:
                    self._prefetched.pop(self._key[slot], None)
                    self._evict(slot)
                    self._protected[slot] = False

    def _checked(self, il: int, ids) -> list[int]:
        """Layer il's picked or guessed expert ids as ints, each checked below n_expert (LFU indexes by them)."""
        es = [int(e) for e in ids]                          # (Python's min and max of a few ints: NumPy's cost more)
        if es and not (0 <= min(es) and max(es) < self.n_expert):
            raise InternalError(f"layer {il}: expert ids {min(es)}..{max(es)} are out of range for {self.n_expert} experts")
        return es

    def _use(self, slot: int) -> None:
        self._tick += 1
        self._used[slot] = self._tick
        self._uses[slot] += 1

    def _count(self, il: int, ids) -> None:
        """One use of each of ids at layer il, now: the LFU counts."""
        count_uses(self._freq, self._freq_t, il - self.layers[0], np.asarray(ids, dtype=np.int64), float(self.tokens),
                   HALF_LIFE)

    def _tensors(self, key, slot: int) -> tuple[QTensor, QTensor, QTensor]:
        il, e = key
        return tuple(QTensor(f"{t.name}[{e}]", t.ggml_type, t.dims[:2], self.pool[at:at + t.nbytes // t.dims[2]], g)
                     for t, g, at in zip(self.tensors[il], self.layout(slot), self._at[:, slot].tolist()))

    # ---- the end --------------------------------------------------------------------------
    def abort(self) -> None:
        """After an error mid-pass: wait for reads in flight; pending prefetches are dropped."""
        for slot, fut in list(self._loading.items()):
            fut.cancel()
            try:
                fut.result()
            except BaseException:
                self._evict(slot)
        for pending in (self._prefetched, self._kept, self._predicted, self._unseen):
            pending.clear()
        self._protected[:] = False

    def close(self) -> None:
        self.abort()
        self._pool.shutdown(wait=True)

    def stats(self) -> dict:
        t = self.totals
        return {"policy": self.policy.value, "slots": self.n_slots, "slot_bytes": self.slot_bytes,
                "prefetch": self.prefetch, **t.as_dict()}

