"""A model cut into N contiguous layer ranges, one per stage, each under its own budget (no Ray here).

The ranges are chosen by bytes: each stage's weights (its layers' read spans, the embedding for the
first, the output projection for the last) plus its KV cache, over its budget, with the largest ratio
as small as it can be (a linear partition). Equal budgets (or none) give equal bytes; a node with twice
the RAM gets twice the layers' bytes. Each range is then planned as its stage will load it
(plan.plan_for_budget), so the verdict, the minimum and the bytes per token are the runtime's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidArgument, StageBudgetTooSmall
from ..gguf.reader import GGUFFile
from ..memory.size import format_bytes, parse_memory_size
from ..models.config import HParams
from ..stream.plan import Plan, make_plan, n_vocab_of, plan_for_budget

HIDDEN_BYTES = 4                    # a hidden state crosses between stages as float32
LOGIT_BYTES = 4                     # the logits row the last stage returns to the driver


def parse_budgets(spec, n_stages: int) -> list[int | None]:
    """One budget per stage from None (unlimited), a size ("4G", bytes), or a list / comma-separated
    sizes, one per stage."""
    if spec is None or spec == "":
        return [None] * n_stages
    parts = spec.split(",") if isinstance(spec, str) else list(spec) if isinstance(spec, (list, tuple)) else [spec]
    sizes = [parse_memory_size(p.strip() if isinstance(p, str) else p) for p in parts]
    if len(sizes) == 1:
        return sizes * n_stages
    if len(sizes) != n_stages:
        raise InvalidArgument(f"{len(sizes)} stage budgets for {n_stages} stages: give one size for all, or one "
                              f"per stage")
    return sizes


def check_stages(n_stages, n_layer: int) -> int:
    if not isinstance(n_stages, int) or not 1 <= n_stages <= n_layer:
        raise InvalidArgument(f"--stages {n_stages!r}: a model of {n_layer} layers splits into 1 to {n_layer} stages")
    return n_stages


def split_layers(costs: list[int], first: int, last: int, budgets: list[int | None]) -> list[tuple[int, int]]:
    """Contiguous ranges of len(costs) layers over len(budgets) stages minimising the largest
    (bytes / budget); `first` and `last` are the bytes only the first and the last stage hold."""
    n, L = len(budgets), len(costs)
    pre = [0]
    for c in costs:
        pre.append(pre[-1] + c)
    scale = [1.0 / b if b else 1.0 for b in budgets]

    def load(i, a, b):                       # stage i holding layers [a, b)
        return (pre[b] - pre[a] + (first if a == 0 else 0) + (last if b == L else 0)) * scale[i]

    inf = (float("inf"), 0.0)
    best = [[inf] * (L + 1) for _ in range(n + 1)]        # best[i][b]: stages 0..i-1 over layers [0, b):
    cut = [[0] * (L + 1) for _ in range(n + 1)]           # (the largest load, then the sum of squares)
    best[0][0] = (0.0, 0.0)
    for i in range(1, n + 1):
        for b in range(i, L - (n - i) + 1):
            for a in range(i - 1, b):
                w = load(i - 1, a, b)
                v = (max(best[i - 1][a][0], w), best[i - 1][a][1] + w * w)
                if v < best[i][b]:
                    best[i][b], cut[i][b] = v, a
    ranges, b = [], L
    for i in range(n, 0, -1):
        a = cut[i][b]
        ranges.append((a, b))
        b = a
    return ranges[::-1]


@dataclass
class StagePlan:
    index: int
    layers: tuple[int, int]
    budget: int | None
    plan: Plan

    @property
    def streams(self) -> bool:
        return self.plan.verdict == "streaming"


@dataclass
class ClusterPlan:
    path: str
    n_layer: int
    n_embd: int
    n_vocab: int
    stages: list[StagePlan] = field(default_factory=list)

    def estimate(self, storage_gb_s: float | list[float], compute_gb_s: float, net_gbit_s: float,
                 latency_ms: float) -> dict:
        """Seconds per decoded token: per stage max(compute, I/O) (the reader thread reads the next
        layer while this one computes), plus (N-1) hops of a hidden state, plus the logits row back
        to the driver (zero when the driver runs beside the last stage)."""
        n = len(self.stages)
        bw = storage_gb_s if isinstance(storage_gb_s, (list, tuple)) else [storage_gb_s] * n
        net = net_gbit_s * 1e9 / 8
        rows = []
        for s, disk in zip(self.stages, bw):
            compute = s.plan.active_bytes_per_token / (compute_gb_s * 1e9)
            io = s.plan.expected_bytes_per_token / (disk * 1e9) if s.streams else 0.0
            rows.append({"stage": s.index, "compute_s": compute, "io_s": io, "stage_s": max(compute, io)})
        hop = latency_ms / 1e3 + self.n_embd * HIDDEN_BYTES / net
        logits = latency_ms / 1e3 + self.n_vocab * LOGIT_BYTES / net
        stages_s = sum(r["stage_s"] for r in rows)
        return {"stages": rows, "hop_s": hop, "hops_s": (n - 1) * hop, "logits_s": logits,
                "s_per_token": stages_s + (n - 1) * hop, "s_per_token_remote_driver": stages_s + (n - 1) * hop + logits,
                "assumed": {"storage_gb_s": bw, "compute_gb_s": compute_gb_s, "net_gbit_s": net_gbit_s,
                            "latency_ms": latency_ms}}

    def to_json(self) -> dict:
        return {"path": self.path, "n_layer": self.n_layer, "stages": [
            {"stage": s.index, "layers": list(s.layers), "budget": s.budget, "verdict": s.plan.verdict,
             "min_budget": s.plan.min_budget, "resident_budget": s.plan.resident_budget,
             "planned_peak": s.plan.planned_peak, "batch": s.plan.batch,
             "active_bytes_per_token": s.plan.active_bytes_per_token,
             "expected_bytes_per_token": s.plan.expected_bytes_per_token} for s in self.stages]}


def plan_stages(f: GGUFFile, n_stages: int, budgets=None, n_ctx: int | None = None,
                ranges: list[tuple[int, int]] | None = None, batch: int | None = None) -> ClusterPlan:
    """The stages of f: layer ranges (given, or split by bytes), each planned under its budget.
    StageBudgetTooSmall names the first stage whose budget is below its minimum."""
    hp = HParams.from_metadata(f.metadata, n_vocab_of(f))
    if ranges is not None:
        n_stages = len(ranges)
        _check_ranges(ranges, hp.n_layer)
    check_stages(n_stages, hp.n_layer)
    budgets = parse_budgets(budgets, n_stages)
    if ranges is None:
        whole = make_plan(f, None, n_ctx, 1)
        kv = whole.kv_bytes // hp.n_layer
        out = "output.weight" if "output.weight" in whole.persistent else "token_embd.weight"
        ranges = split_layers([b + kv for b in whole.layer_bytes], whole.persistent.get("token_embd.weight", 0),
                              whole.persistent.get(out, 0), budgets)
    cp = ClusterPlan(str(f.path), hp.n_layer, hp.n_embd, hp.n_vocab)
    for i, (r, budget) in enumerate(zip(ranges, budgets)):
        p = plan_for_budget(f, budget, n_ctx, tuple(r), batch)
        if p.verdict == "insufficient":
            raise StageBudgetTooSmall(
                f"stage {i} (layers {r[0]}-{r[1] - 1}) needs at least {format_bytes(p.min_budget)} ({p.min_budget:,} B) "
                f"at context {p.n_ctx}; its budget is {format_bytes(budget)} ({budget:,} B): raise its budget, add "
                f"stages or lower --ctx", stage=i, minimum=p.min_budget)
        cp.stages.append(StagePlan(i, tuple(r), budget, p))
    return cp


def _check_ranges(ranges, n_layer: int) -> None:
    b = 0
    for a, e in ranges:
        if a != b or e <= a:
            raise InvalidArgument(f"layer ranges {list(ranges)} must be contiguous and non-empty from layer 0")
        b = e
    if b != n_layer:
        raise InvalidArgument(f"layer ranges {list(ranges)} end at {b}, the model has {n_layer} layers")
