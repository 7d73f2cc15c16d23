"""How fast a mixture of experts can decode out of core when each layer's expert reads are known only
once its router has run (no reading ahead): the causal bound that benchmarks/moe_out_of_core.py sets
beside each out-of-core run, from figures measured in the same invocation.

A token in RAM takes T seconds, E of them in its experts' matmuls (the "experts ..." ops of
ramforge.profiling; E / L a layer, E / (L k) an expert), D = T - E in everything else (attention,
norms, routers, the output matrix). Out of core a layer's misses can be read only after its router,
one after another at the device's bandwidth for expert-sized reads (x seconds an expert), and the
next layer needs this one's output: they overlap nothing but the layer's own expert matmuls, and the
last one's matmuls follow its read. So a layer of m misses takes at least max(E / L, m x + E / (L k))
of expert time, and a token at least

    D + the sum over its layers of that

with each layer's misses from the run's routing trace (`--trace-routing`'s file) replayed through a
cache of the run's slot count: under the run's own policy (tools/replay_routing.py's lfu is the
engine's; its hit rate matches the engine's), and under Belady's evictions (evict the expert used
again furthest in the future), which bound every policy. The issue's roofline, max(T, reads / the
bandwidth), assumes every read overlapped with any compute, which a read known only after its router
cannot be.
"""
from __future__ import annotations

from dataclasses import dataclass

from ramforge.models.routing_trace import Trace
from tools.replay_routing import decode_passes, simulate, token_clock


@dataclass(frozen=True)
class Replay:
    """A cache of `slots` over a trace's measured decode tokens: each (token, layer) step's misses."""
    policy: str
    slots: int
    misses: list[int]           # per measured decode step, in order
    n_tokens: int
    n_layers: int

    @property
    def misses_per_token(self) -> float:
        return sum(self.misses) / self.n_tokens


def replay(trace_path, slots: int, policy: str, skip_decode: int = 1) -> Replay:
    """The misses of one pool of `slots` (keys (layer, expert), as the engine's expert cache) under
    policy over the trace, for the decode passes after the first skip_decode (the benchmark's warm-up,
    as it measures); the prompt and the warm-up fill the cache."""
    steps = Trace.load(trace_path).steps()
    measured = set(sorted(decode_passes(steps))[skip_decode:])
    counted = [s.pass_ in measured for s in steps]
    per: list[int] = []
    simulate(steps, slots, policy, counted, token_clock(steps), per)
    return Replay(policy, slots, [m for m, c in zip(per, counted) if c], len(measured),
                  len({s.layer for s in steps}))


def causal_bound(t_ram: float, e_ram: float, k: int, read_s: float, r: Replay) -> float:
    """Seconds a token at least: in RAM t_ram, e_ram of it in expert matmuls (k experts a token and layer);
    read_s to read one expert; r the layers' misses (the module's docstring)."""
    layer = e_ram / r.n_layers
    experts = sum(max(layer, m * read_s + layer / k) if m else layer for m in r.misses)
    return t_ram - e_ram + experts / r.n_tokens
