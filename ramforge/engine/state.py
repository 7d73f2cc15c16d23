"""The engine's per-chunk activations (State, allocated once and charged) and the timings of a call."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models.config import HParams
from ..stream.plan import state_shapes


@dataclass
class State:
    """Activations for a chunk of up to `batch` tokens, allocated once and charged to the budget
    (plan.state_shapes holds the shapes, so the plan counts exactly these)."""

    x: np.ndarray        # f32[batch, n_embd]        residual stream
    xb: np.ndarray       # f32[batch, n_embd]        normed input / projection output
    q: np.ndarray        # f32[batch, n_head, hd_k]
    k: np.ndarray        # f32[batch, n_head_kv, hd_k]
    v: np.ndarray        # f32[batch, n_head_kv, hd_v]
    att: np.ndarray      # f32[batch, n_head, hd_v]  attention output
    gate: np.ndarray     # f32[batch, n_ff_dense]    dense FFN (or shared expert)
    up: np.ndarray       # f32[batch, n_ff_dense]
    hn: np.ndarray       # f32[batch, n_embd]        final norm
    prompt_logits: np.ndarray  # f32[n_vocab]        the last prompt's final logits (see generate)
    # mixture of experts (models.moe); absent for a dense model
    router: np.ndarray | None = None   # f32[batch, n_expert]  router logits
    sel: np.ndarray | None = None      # i32[batch, k]         the chosen experts, by rank (slot)
    wts: np.ndarray | None = None      # f32[batch, k]         their weights
    xe: np.ndarray | None = None       # f32[batch, n_embd]    the rows routed to one expert
    ge: np.ndarray | None = None       # f32[batch * k, n_ff_exp]  its gate (batch kernels: every pair's) ...
    ue: np.ndarray | None = None       # f32[batch * k, n_ff_exp]  ... and up projections
    ye: np.ndarray | None = None       # f32[batch, n_embd]    its output
    ex: np.ndarray | None = None       # f32[batch, k, n_embd] each slot's expert output
    shgate: np.ndarray | None = None   # f32[batch, 1]         the shared expert's gate (qwen2moe)
    fused: np.ndarray | None = None    # f32[batch * width]    a fused QKV / gate-up output (phi3)

    @classmethod
    def allocate(cls, hp: HParams, batch: int) -> "State":
        return cls(**{name: np.zeros(shape, np.int32 if name == "sel" else np.float32)
                      for name, shape in state_shapes(hp, batch).items()})


@dataclass
class Timings:
    """Seconds of the last load and generate call. Kernel compilation (a first run, see ramforge.jit)
    is counted in compile_s alone, not in load_s, prompt_s or gen_s."""

    load_s: float = 0.0
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0
    compile_s: float = 0.0        # compiling kernels during the load and this call
    spec: object = None           # speculative.SpecStats of a generate call with a drafter

    def as_dict(self) -> dict:
        rate = lambda n, s: n / s if s > 0 else 0.0  # noqa: E731
        return {"load_s": self.load_s, "compile_s": self.compile_s, "prompt_tokens": self.prompt_tokens,
                "prompt_s": self.prompt_s, "prefill_tok_s": rate(self.prompt_tokens, self.prompt_s),
                "gen_tokens": self.gen_tokens, "gen_s": self.gen_s,
                "decode_tok_s": rate(self.gen_tokens, self.gen_s),
                **({"speculative": self.spec.as_dict()} if self.spec is not None else {})}
