"""Several sequences in one KV cache, and llama.cpp's memory API over its cells (`Engine.eval_batch`,
`seq_rm`, `seq_add`, `seq_cp`, `seq_pos_max`, `context_shift`).

llama.cpp's configuration reproduced: llama-server with an explicit `--parallel N` (kv_unified =
false): one stream of PAD(n_ctx / N, 256) cells per sequence (memory/cells.py). A batch is split
into ubatches as llama_batch_allocr::split_equal(n_ubatch, sequential) does (n_stream > 1) or
split_simple (one stream); each ubatch's weight matmuls are one batch of its tokens (the engine's
batch path), its attention one matmul per stream (single: one token per stream). seq_add's
K-shift is applied at the start of the next evaluation, as llama_decode's memory update does:
RoPE of the cached F16 keys by each cell's delta, rounded back to f16.
"""
from __future__ import annotations

import numpy as np

from .. import cancel
from ..errors import EmptyPrompt, InvalidArgument, NotReproduced, check_token_ids
from ..kernels.batch import Batch
from ..kernels.ops import _rope_params, rope
from ..kv.cells import pad_cells, place
from .ubatch import Chunk, chunks

def seq_tokens(eng, s: int) -> list:
    """The token ids of sequence s, by position (sequence 0's list is eng.tokens)."""
    return eng.tokens if s == 0 else eng.seq_tokens.setdefault(s, [])


def _cells_on(eng) -> None:
    """The cache in its cells mode, each cell knowing its token (kv.cell_tok)."""
    kv = eng.kv
    if not kv.celled:
        kv.cells_on()
        kv.cell_tok[:kv.n_past] = eng.tokens[:kv.n_past]


def _sync_tokens(eng, s: int) -> None:
    """seq_tokens(s) <- the tokens of sequence s's cells, by position."""
    kv = eng.kv
    cp = kv.stream_pos(s)
    live = np.nonzero(cp >= 0)[0]
    live = live[np.argsort(cp[live], kind="stable")]
    seq_tokens(eng, s)[:] = kv.cell_tok[s * kv.n_ctx_seq + live].tolist()


def _check_seq(eng, s: int) -> int:
    if not (isinstance(s, (int, np.integer)) and 0 <= s < eng.kv.n_seq):
        raise InvalidArgument(f"sequence id {s!r} out of range: this engine holds {eng.kv.n_seq} (load n_seq=)")
    return int(s)


def _window(eng) -> tuple[int, int]:
    """(the sliding window of llama.cpp's iswa cache, its size per stream) or (0, 0)."""
    hp, kv = eng.hp, eng.kv
    if not eng.arch.iswa or hp.sliding_window <= 0:
        return 0, 0
    return hp.sliding_window, pad_cells(min(kv.n_ctx_seq, hp.sliding_window + eng.ubatch))


def _split(order: list[int], left: dict, n_ubatch: int) -> tuple[list[int], int]:
    """The next ubatch of split_equal(sequential): sequences in batch order with consecutive ids, the
    same number of tokens each (their fewest left, at most n_ubatch in all)."""
    cur = []
    for s in order:
        if left[s] > 0 and (not cur or s == cur[-1] + 1):
            cur.append(s)
    return cur, max(1, min(min(left[s] for s in cur), n_ubatch // len(cur)))


def eval_batch(eng, batch) -> dict[int, np.ndarray]:
    """Evaluate one llama_decode holding tokens of several sequences: batch lists (seq_id, tokens),
    each sequence's tokens continuing it (from its seq_pos_max + 1), the last one of each an output.
    Returns {seq_id: logits f32[n_vocab]}."""
    kv = eng.kv
    if eng.layers != (0, eng.hp.n_layer):
        raise InvalidArgument(f"this engine runs layers {eng.layers}; eval_batch needs the whole model")
    toks, order = {}, []
    for s, t in batch:
        s = _check_seq(eng, s)
        if s in toks:
            raise InvalidArgument(f"sequence {s} appears twice in one batch")
        a = np.asarray(t, dtype=np.int64).reshape(-1)
        if a.size == 0:
            raise EmptyPrompt(f"sequence {s}: no tokens")
        check_token_ids(a, eng.hp.n_vocab)
        toks[s] = a
        order.append(s)
    if not order:
        raise EmptyPrompt("eval_batch needs at least one sequence")
    _cells_on(eng)
    apply_k_shift(eng)
    if 0 in toks:
        eng._prompt = []
    window, swa_size = _window(eng)
    left, done, out = {s: toks[s].size for s in order}, {s: 0 for s in order}, {}
    B = eng.plan.batch
    try:
        while any(left.values()):
            cancel.check()                                   # between ubatches: whole ones stay cached
            cur, n = _split(order, left, eng.ubatch)
            ids = np.concatenate([toks[s][done[s]:done[s] + n] for s in cur])
            pl = place(kv, [(s, n) for s in cur], single=n == 1, window=window, swa_size=swa_size)
            kv.cell_tok[pl.rows] = ids
            try:
                for s in cur:                                # each slot charged for its own cells
                    kv.reserve(int(pl.rows[pl.stream == s].max()) - s * kv.n_ctx_seq + 1, s)
                if len(cur) == 1:
                    s = cur[0]
                    want = done[s] + n == toks[s].size
                    parts = chunks(n, 0, B, eng.ubatch, as_batch=True)
                    if not want:
                        parts = [Chunk(c.start, c.stop, c.view, None, slice(c.size, c.size), c.kind) for c in parts]
                else:
                    N = len(cur) * n                         # sequence i's tokens: rows i*n .. i*n + n-1
                    if N > B:
                        raise NotReproduced(f"a ubatch of {len(cur)} sequences x {n} tokens exceeds the engine's "
                                            f"chunk of {B} tokens under this budget; evaluate their prompts in turns")
                    want = [i * n + n - 1 for i, s in enumerate(cur) if left[s] == n]    # output rows
                    if len(want) == N:
                        only = None
                    elif not want:
                        only = slice(N, N)
                    elif want == list(range(want[0], want[-1] + 1)):
                        only = slice(want[0], want[-1] + 1)              # llama.cpp's inp_out_ids, as a view
                    else:
                        only = np.asarray(want, np.int64)                # gathered to rows 0.. by output_rows
                    rows = None if not want else (slice(0, len(want)) if isinstance(only, np.ndarray)
                                                  else slice(want[0], want[-1] + 1))
                    parts = [Chunk(0, N, Batch(N, 0), rows, only, "decode" if n == 1 else "prefill")]
                res = []
                for c in parts:
                    kv.ub = pl.part(c.start, c.stop)
                    try:
                        r = eng.run_chunk(ids[c.start:c.stop], c)
                    finally:
                        kv.ub = None
                    if r is not None:
                        res.append(r)
            except BaseException:
                kv.cell_pos[pl.rows] = -1                    # the ubatch leaves no cells behind
                raise
            got = 0
            for s in cur:
                done[s] += n
                left[s] -= n
                if left[s] == 0:                             # its output: the next row of the last result
                    out[s] = res[-1][got if len(cur) > 1 else -1].copy()
                    got += 1
    finally:
        for s in order:
            _sync_tokens(eng, s)
        kv.n_past = kv.pos_max(0) + 1
    return out


def seq_pos_max(eng, s: int) -> int:
    """llama_memory_seq_pos_max: the largest cached position of sequence s (-1: none)."""
    return eng.kv.pos_max(_check_seq(eng, s))


def seq_rm(eng, s: int, p0: int = -1, p1: int = -1) -> None:
    """llama_memory_seq_rm: forget sequence s's positions [p0, p1) (negative: from 0 / to the end)."""
    s, kv = _check_seq(eng, s), eng.kv
    p0, p1 = max(p0, 0), (np.iinfo(np.int32).max if p1 < 0 else p1)
    if p0 >= p1:
        return
    _cells_on(eng)
    cp = kv.stream_pos(s)
    gone = np.nonzero((cp >= p0) & (cp < p1))[0]
    if gone.size:
        cp[gone] = -1
        kv.cell_shift[s * kv.n_ctx_seq + gone] = 0
        kv.heads[s] = min(kv.heads[s], int(gone[0]))
    _sync_tokens(eng, s)
    if s == 0:
        eng._prompt = []
    kv.plain_again()


def seq_add(eng, s: int, p0: int, p1: int, delta: int) -> None:
    """llama_memory_seq_add: positions [p0, p1) of sequence s move by delta; their keys are rotated by
    delta (the K-shift) at the next evaluation. Cells moved below 0 are freed."""
    s, kv = _check_seq(eng, s), eng.kv
    p0, p1 = max(p0, 0), (np.iinfo(np.int32).max if p1 < 0 else p1)
    if delta == 0 or p0 == p1:
        return
    _shift_rope(eng)                                         # refuse before anything moves
    _cells_on(eng)
    cp = kv.stream_pos(s)
    sh = kv.cell_shift[s * kv.n_ctx_seq:(s + 1) * kv.n_ctx_seq]
    hit = np.nonzero((cp >= p0) & (cp < p1))[0]
    cp[hit] += delta
    sh[hit] += delta
    freed = hit[cp[hit] < 0]
    cp[freed], sh[freed] = -1, 0
    kv.heads[s] = int(freed[0]) if freed.size else 0
    _sync_tokens(eng, s)
    if s == 0:
        eng._prompt = []
    kv.n_past = kv.pos_max(0) + 1


def seq_cp(eng, src: int, dst: int) -> None:
    """llama_memory_seq_cp between streams: the whole of sequence src (its cells, keys, values and
    pending shifts) replaces sequence dst. Partial copies are llama.cpp's unified cache's: refused there."""
    src, dst, kv = _check_seq(eng, src), _check_seq(eng, dst), eng.kv
    if src == dst:
        return
    _cells_on(eng)
    S = kv.n_ctx_seq
    a, b = slice(src * S, (src + 1) * S), slice(dst * S, (dst + 1) * S)
    n = kv.caps[src]                                         # the source's charged rows
    if (kv.cell_pos[a] >= 0).any():                          # (an empty source: only the cells)
        kv.reserve(n, dst)
        kv.k[:, dst * S:dst * S + n], kv.v[:, dst * S:dst * S + n] = kv.k[:, src * S:src * S + n], \
            kv.v[:, src * S:src * S + n]
    kv.cell_pos[b], kv.cell_shift[b], kv.cell_tok[b] = kv.cell_pos[a], kv.cell_shift[a], kv.cell_tok[a]
    kv.heads[dst] = kv.heads[src]
    _sync_tokens(eng, dst)
    kv.plain_again()


def _shift_rope(eng):
    """il -> (base, neox, freq_factors, RopeScale) of layer il's keys, as llama.cpp's build_rope_shift
    rotates them (the record's RoPE kind, each layer's base and scale: Arch.layer_rope, and rope_freqs'
    factors where its RoPE takes them); NotReproduced where ramforge does not rotate cached keys as
    llama.cpp would (Arch.k_shift)."""
    hp, kv, arch = eng.hp, eng.kv, eng.arch
    if kv.type_k != "f16":
        raise NotReproduced(f"a K-shift (seq_add, context shift) over a {kv.type_k} K cache (dequantize, "
                            f"rotate, requantize) is not reproduced; use an f16 K cache")
    if not arch.k_shift:
        raise NotReproduced(f"a K-shift (seq_add, context shift) for {hp.arch} is not reproduced")
    ff = eng.weights.rope_freqs.data if arch.rope_freqs and eng.weights.rope_freqs is not None else None

    def args(il: int):
        base, scale = arch.layer_rope(hp, il)
        return base, arch.rope_neox, ff, scale
    return args


def apply_k_shift(eng) -> None:
    """The pending K-shift (llama_kv_cache::update): every charged row's key rotated by its cell's
    shift (f16 -> f32, RoPE, f16), as ggml_rope_ext_inplace on the F16 cache; then no shift pending."""
    kv = eng.kv
    if not kv.cell_shift.any():
        return
    args = _shift_rope(eng)
    S = kv.n_ctx_seq
    every = np.concatenate([np.arange(s * S, s * S + c) for s, c in enumerate(kv.caps)])   # charged rows
    for il in range(*eng.layers):
        base, neox, ff, scale = args(il)
        unit = _rope_params(eng.hp.rope_dim, float(base), scale)[1] == np.float32(1.0)
        rows = every[kv.cell_shift[every] != 0] if unit else every   # rope by 0 is the identity at magnitude 1
        i = il - kv.first
        x = kv.k[i, rows].view(np.float16).astype(np.float32)       # f32[n, n_head_kv, hd_k]
        rope(x, kv.cell_shift[rows].astype(np.int32), eng.hp.rope_dim, base, neox, ff, scale)
        kv.k[i, rows] = x.astype(np.float16).view(np.uint16)
    kv.cell_shift[:] = 0


def context_shift(eng, n_keep: int) -> int:
    """llama-server's context shift of sequence 0 (its pre_decode): keep n_keep tokens (plus BOS where
    the vocabulary adds one; at most n_ctx - 4), discard half of the rest: seq_rm(n_keep, n_keep +
    n_discard), seq_add(n_keep + n_discard, n_past, -n_discard). Returns n_discard."""
    n_ctx = eng.kv.n_ctx_seq
    if n_keep < 0 or n_keep >= n_ctx:
        raise InvalidArgument(f"n_keep = {n_keep} is beyond the context of {n_ctx} tokens")
    vocab = getattr(eng.tokenizer, "vocab", eng.tokenizer)
    keep = min(n_ctx - 4, n_keep + int(bool(getattr(vocab, "add_bos", False))))
    n_past = eng.kv.pos_max(0) + 1
    n_left = n_past - keep
    n_discard = min(max(n_left // 2, 0), max(0, n_left - 1))
    seq_rm(eng, 0, keep, keep + n_discard)
    seq_add(eng, 0, keep + n_discard, n_past, -n_discard)
    return n_discard
