"""The warm-up jobs of a loaded engine's kernels (jit.Warmup runs them, in worker processes on a cold
cache): what `serve` makes ready in the background and `run` starts beside its first pass."""
from __future__ import annotations

from ..jit import WarmJob
from ..kernels import fused, qmatmul


def sampler_job(n_vocab: int) -> WarmJob:
    """The sampler's warm-up (top-k's sort: the longest single compile of a first run, 6-8 s), which
    needs only the vocabulary's size: a cold `run` starts it before the model loads."""
    return WarmJob("ramforge.sampling", "warm", (int(n_vocab),))


def early_jobs(md: dict, path: str, prompt: str | int, n_threads: int | None = None, kv=(None, None)) -> list:
    """The warm-up jobs a cold process queues before its model loads, each with the kernels it makes that
    this process may reach while a worker is on it (for jit.Warmup.share): a dry first pass over `prompt`
    (warm_first_pass; a dense model's) and the sampler's, which this process needs last. [(job, kernels)]."""
    from ..kernels import cxxsort
    from ..sampling import libm

    n_vocab = len(md.get("tokenizer.ggml.tokens") or ()) or 32000      # the dummy row's size only
    moe = any(k.endswith(".expert_count") and v for k, v in md.items())
    first = [] if moe else [(WarmJob(__name__, "warm_first_pass", (str(path), prompt, n_threads, *kv)), ())]
    return first + [(sampler_job(n_vocab), (cxxsort.top_sorted, libm.exp_shifted))]


def cold() -> bool:
    """Whether the kernel cache is fresh (the sampler's sort not in it: jit.cached): a first run."""
    from .. import jit
    from ..kernels import cxxsort

    return not jit.cached(cxxsort.top_sorted)


def start_early(md: dict, path: str, prompt: str, n_threads: int | None = None, kv=(None, None)):
    """Warm-up workers (jit.Warmup, on the cores this process leaves, taking more jobs later) started
    before a model loads, with the jobs that need no loaded model (early_jobs), their kernels shared
    with this process (jit.Warmup.share): `run`'s and `serve`'s cold start."""
    from .. import jit

    early = early_jobs(md, path, prompt, n_threads, kv)
    workers = jit.Warmup([job for job, _ in early], jit.worker_count(reserve=1), more=True)
    for job, kernels in early:
        workers.share(job, kernels)
    return workers


DRY_TOKENS = 1024      # the most tokens a dry pass runs (a long prompt's first batch and its remainder's)


def warm_first_pass(path: str, prompt: str | int, n_threads: int | None, type_k=None, type_v=None) -> None:
    """Compile (or load) the kernels a first pass over `prompt` (a text, tokenized as `run` does, or a count
    of tokens) and one decode step take, but the matmuls' (jobs of their own) and the load's: a dry pass
    (kernels.qmatmul.dry, the fused kernels held) of the model mapped (nothing read, nothing repacked),
    in a warm-up worker before the process that queued it has loaded its model: the norms, RoPE, the KV
    cache's stores, attention, the activations' quantization, the FFN's gate, of the sizes it will run."""
    from ..kernels import fused
    from .engine import Engine

    n = min(len(prompt.encode()) + 2 if isinstance(prompt, str) else int(prompt), DRY_TOKENS)
    qmatmul.dry = True
    fused.hold()
    try:
        eng = Engine.load(path, n_ctx=n + 64, io="mmap", n_threads=n_threads, type_k=type_k, type_v=type_v,
                          kv_spill=False)
        try:
            ids = (eng.tokenizer.encode(prompt, add_special=True, parse_special=True) if isinstance(prompt, str)
                   else [max(eng.tokenizer.bos_id, 0)] * max(1, n))
            ub = max(1, int(eng.ubatch))
            ids = ids[:min(n, ub + len(ids) % ub if len(ids) > ub else len(ids))]  # a long prompt's two batch sizes
            eng.eval(ids)
            eng.eval(ids[-1:])
        finally:
            eng.close()
    finally:
        qmatmul.dry = False
        fused.unhold()


def warm_jobs(engine, prefill: bool = True) -> list[WarmJob]:
    """The warm-up jobs of an engine's kernels, first needed first: the sampler's, the fused decode
    kernels (one job per distinct group of a layer's matrices, so workers share them out), the MoE
    kernels and, with prefill, the matmul kernels of every batch size (one job per kernel).
    An engine without local weights (a pipeline on Ray) gets the sampler's only."""
    jobs = [sampler_job(engine.hp.n_vocab)]
    weights = getattr(engine, "weights", None)
    if weights is None:
        return jobs
    parts: dict = {}
    for layer in weights.layer_matrices():
        groups = [names for names in fused.GROUPED if all(n in layer for n in names)]
        rest = [n for n in layer if not any(n in g for g in groups)]
        for names in groups + [(n,) for n in rest]:
            part = tuple((n, layer[n]) for n in names)
            parts.setdefault(part, None)
    # the largest groups first: a first pass reaches the single matrices' kernels first (see cli run)
    jobs += [WarmJob("ramforge.kernels.fused", "warm", ([dict(p)],)) for p in sorted(parts, key=len, reverse=True)]
    moe = list(set(weights.expert_shapes()))
    if moe:
        jobs.append(WarmJob("ramforge.kernels.fused_moe", "warm", (moe,)))
    if prefill:                     # one job a kernel (workers share them out), a decode's first
        jobs += matmul_jobs(engine).values()
    return jobs


def matmul_jobs(engine) -> dict:
    """{kernel: job} of the matmul kernels any batch of its own may take (one qmatmul.warm job each, of the
    sizes in qmatmul._WARM_TOKENS, a decode's first). Empty for an engine without local weights."""
    weights = getattr(engine, "weights", None)
    kernels: dict = {}
    if weights is None:
        return kernels
    for n in qmatmul._WARM_TOKENS:
        for shape in sorted(weights.matmul_shapes(), key=lambda s: (s[0].value, s[1:])):
            _add_matmul_job(kernels, shape, n)
    return kernels


class Deferral:
    """A cold process's kernels left to the warm-up workers, each run in another's place, the same
    arithmetic bit for bit, until the worker job that compiles it ends (`on_job`, jit.Warmup's callback;
    None, the workers' end: all): the fused decode kernels (kernels.fused.hold: decode runs the per-matrix
    kernels, which the prefill has compiled already) and, by `defer`, the batch matmul kernels with a
    stand-in (qmatmul.deferred). As a context manager, it releases them all at exit."""

    def __init__(self, jobs: list[WarmJob]):
        self._kernels = {id(j): fused.kernels(j.args[0]) for j in jobs
                         if j.module == fused.__name__ and j.function == "warm"}
        self._matmuls: dict = {}            # id(job) -> its batch kernel, in qmatmul.deferred until the job ends
        fused.hold()

    def defer(self, pending: dict) -> dict:
        """Of pending matmul kernels ({kernel: job}, queued for the workers), leave those with a stand-in to
        the workers, batches running the stand-in meanwhile; the rest ({kernel: job}), this process shares
        with them (Shared)."""
        rest = {}
        for kernel, job in pending.items():
            sub = stand_in(kernel)
            if sub is None:
                rest[kernel] = job
            else:
                self._matmuls[id(job)] = kernel
                qmatmul.deferred[kernel] = sub
        return rest

    def on_job(self, job: WarmJob | None) -> None:
        if job is None:
            self.release()
        else:
            fused.ready(self._kernels.get(id(job), ()))
            qmatmul.deferred.pop(self._matmuls.pop(id(job), None), None)   # its next call: from the cache

    def release(self) -> None:
        fused.unhold()
        while self._matmuls:                # (popitem: the feeder thread's on_job may pop meanwhile)
            qmatmul.deferred.pop(self._matmuls.popitem()[1], None)

    def __enter__(self) -> "Deferral":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def first_pass_jobs(engine, n_prompt: int) -> dict:
    """{kernel: job} of the matmul kernels a first pass over n_prompt tokens and its decode take
    (per-matrix, as a held pass runs: Deferral), one qmatmul.warm job each, in the order the pass first
    calls them. Empty for an engine without local weights."""
    weights = getattr(engine, "weights", None)
    if weights is None:
        return {}
    ub = max(1, int(engine.ubatch))
    sizes = dict.fromkeys(n for n in (min(n_prompt, ub), n_prompt % ub, 1) if n > 0)
    out: dict = {}
    for n in sizes:
        for layer in weights.layer_matrices():
            for name, shape in layer.items():
                _add_matmul_job(out, shape, 1 if name == "output" else n)   # a prompt's logits: its last token's
    return out


def _add_matmul_job(jobs: dict, shape, n: int) -> None:
    """jobs[kernel] = the qmatmul.warm job of the kernel a weight shape takes for n tokens (its first
    shape kept), where the shape has an integer-dot kernel."""
    kernel = qmatmul.own_kernel(shape, n)
    if kernel is not None:
        jobs.setdefault(kernel, WarmJob(qmatmul.__name__, "warm", ([shape], None, (n,))))


def stand_in(kernel):
    """The packed matmul kernel of a grouped kernel's type, variants and layout (qmatmul.deferred: the same
    arithmetic, bit for bit; 1-2.4 s to compile where a grouped one takes 5-8 s), or None where it has none:
    a packed kernel already, scalar IR, or a variant without a packed-row intrinsic."""
    from ..kernels.registry import kernels_for
    from ..kernels.variants import raw_row_id

    key = next((k for k, v in qmatmul._KERNELS.items() if v is kernel), None)
    if key is None:
        return None
    t, vec, lo, hi, packed, rep = key
    raw = kernels_for(t).qdot.raw
    if packed or not vec or raw_row_id(raw, lo) < 0 or raw_row_id(raw, hi) < 0:
        return None
    return qmatmul._kernel(t, vec, lo, hi, True, rep)


class Shared:
    """Matmul kernels shared with the warm-up workers that have their jobs queued ({kernel: job}, a
    jit.Warmup): at this process's first call of one (qmatmul.first_call), it takes the job back if no
    worker has started it (and compiles the kernel itself), or waits for the worker that is on it and
    loads the kernel from the disk cache, so that nothing compiles twice. The hook goes once every kernel
    has been met, or at `release` (as a context manager: at exit)."""

    def __init__(self, pending: dict, warmup):
        self._warmup = warmup
        self._pending = dict(pending)
        if self._pending:
            qmatmul.first_call = self._first_call

    def _first_call(self, kernel) -> None:
        job = self._pending.pop(kernel, None)
        if job is not None:
            self._warmup.take(job)
        if not self._pending:
            self.release()

    def release(self) -> None:
        if qmatmul.first_call == self._first_call:
            qmatmul.first_call = None

    def __enter__(self) -> "Shared":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class FirstPass(Shared):
    """A cold first pass's matmul kernels shared with the warm-up workers (a jit.Warmup with more=True):
    queued for them last-needed first, while this process meets them first-needed first (Shared): the two
    ends meet in the middle; those with a stand-in are the deferral's (Deferral.defer)."""

    def __init__(self, engine, n_prompt: int, warmup, deferral: Deferral):
        pending = first_pass_jobs(engine, n_prompt)
        warmup.add(reversed(list(pending.values())))
        super().__init__(deferral.defer(pending), warmup)
