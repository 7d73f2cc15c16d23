"""The warm-up jobs of a loaded engine's kernels (jit.Warmup runs them, in worker processes on a cold
cache): what `serve` makes ready in the background and `run` starts beside its first pass."""
from __future__ import annotations

from ..jit import WarmJob
from ..kernels import fused


def warm_jobs(engine, prefill: bool = True) -> list[WarmJob]:
    """The warm-up jobs of an engine's kernels, first needed first: the sampler's, the fused decode
    kernels (one job per distinct group of a layer's matrices, so workers share them out), the MoE
    kernels and, with prefill, the matmul kernels of every batch size (one job per weight type).
    An engine without local weights (a pipeline on Ray) gets the sampler's only."""
    jobs = [WarmJob("ramforge.sampling", "warm", (int(engine.hp.n_vocab),))]
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
    if prefill:
        by_type: dict = {}
        for shape in weights.matmul_shapes():
            by_type.setdefault(shape[0], []).append(shape)
        jobs += [WarmJob("ramforge.kernels.qmatmul", "warm", (s,)) for s in by_type.values()]
    return jobs


class Deferral:
    """A cold process's fused decode kernels left to the warm-up workers: kernels.fused.hold keeps them
    off (decode runs the per-matrix kernels, the same arithmetic bit for bit, which the prefill has
    compiled already) and each is made ready as the worker job that compiles it ends (`on_job`,
    jit.Warmup's callback; None, the workers' end: all). As a context manager, it unholds at exit."""

    def __init__(self, jobs: list[WarmJob]):
        self._kernels = {id(j): fused.kernels(j.args[0]) for j in jobs
                         if j.module == fused.__name__ and j.function == "warm"}
        fused.hold()

    def on_job(self, job: WarmJob | None) -> None:
        if job is None:
            fused.unhold()
        else:
            fused.ready(self._kernels.get(id(job), ()))

    def release(self) -> None:
        fused.unhold()

    def __enter__(self) -> "Deferral":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
