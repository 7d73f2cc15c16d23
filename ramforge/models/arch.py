"""`Arch`: every fact about one architecture that code outside its forward pass asks, in one record.

Each model module (models/llama.py, gemma3.py, ...) defines `ARCH = Arch(...)` beside its forward
pass; models/__init__.py collects them in `ARCHS`. The engine, the planner, the KV cache, the
mixture of experts and the metadata reader (models/config.py) ask the record; nothing else names an
architecture. Adding one: docs/ARCHITECTURE.md, "Adding an architecture".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..kernels.moe import Gating


@dataclass(frozen=True)
class SoftCaps:
    """Which logit soft-caps an architecture's llama.cpp graph applies, and their defaults when the key is
    absent (None: the key is not read, no cap). A cap of 0 in the file means none where the default is 0
    (gemma3's final cap: llama.cpp tests it for nonzero); where the graph always caps (gemma2), 0 or a
    negative value is refused."""

    attn: float | None          # {arch}.attn_logit_softcapping's default
    final: float | None         # {arch}.final_logit_softcapping's default


NO_CAPS = SoftCaps(None, None)  # neither key is read (a file that sets one is refused by the engine)


@dataclass(frozen=True)
class MoEArch:
    """How an architecture's experts are described and routed (llama.cpp's load_arch_hparams,
    load_arch_tensors, build_moe_ffn)."""

    required: bool              # experts are the FFN (qwen*moe, gpt-oss), else optional (llama: Mixtral)
    ff_key: bool                # expert width from {arch}.expert_feed_forward_length (else feed_forward_length)
    shared: bool                # a shared expert, {arch}.expert_shared_feed_forward_length wide (default n_ff)
    norm_w: bool                # the k weights divided by their sum (build_moe_ffn's norm_w)
    gating: Gating = Gating.SOFTMAX     # build_moe_ffn's gating_op


@dataclass(frozen=True)
class Arch:
    """One architecture ramforge executes (GGUF general.architecture `name`)."""

    name: str                   # GGUF general.architecture
    forward: Callable           # forward(m, s, n, pos0, out=None): the layers, in place on s.x (llama.forward)
    embed: Callable             # embed(m, x, tokens): x f32[n, n_embd] <- the token embeddings
    tensors: tuple[str, ...]    # a layer's tensor suffixes (blk.N.<suffix>.weight, `_bias`: .bias)
    optional: frozenset[str] = frozenset()       # of `tensors`, those a file may lack (read as None)
    also_read: frozenset[str] = frozenset()      # names a shared forward pass looks up that this
                                # architecture never has (read as None: llama.forward's qwen3 norms)
    tensors_with_experts: tuple[str, ...] | None = None   # a layer's tensors when the file has experts
                                # (llama: Mixtral's router and experts for the FFN); None: `tensors`
    global_vectors: tuple[str, ...] = ()         # whole-model tensors of its own beside output_norm and
                                # rope_freqs, by GGUF name (phi3's LongRoPE factors, bert's position embeddings):
                                # read as float32 at load (Weights.vectors; None where the file lacks one)
    aliases: tuple[str, ...] = ()                # other general.architecture names run by this record
    rope_neox: bool = False     # NEOX-style RoPE (pairs i, i + n_rot/2) rather than normal (2i, 2i + 1)
    rope_freqs: bool = False    # its RoPE takes rope_freqs.weight's frequency factors (the K-shift does too)
    swa_pattern: int = 0        # layers with il % p < p - 1 attend over {arch}.attention.sliding_window
                                # (llama.cpp's iswa cache); 0: no layer slides
    reads_sliding_window: bool = False   # {arch}.attention.sliding_window is read (phi3 reads it and turns
                                # it off); elsewhere a file that sets it is refused
    sliding_window_default: int = 0      # the window when that key is absent (gemma2: 4096)
    rope_base_swa: float | None = None   # the sliding layers' RoPE base when {arch}.rope.freq_base_swa is
                                # absent (gemma3: 10000); None: the file's rope base
    rope_freq_scale_swa: float | None = None   # the sliding layers' freq_scale (gemma3: 1, unscaled);
                                # None: the file's RoPE scaling, as the global layers
    softcaps: SoftCaps = NO_CAPS                 # logit soft-caps the graph applies
    moe: MoEArch | None = None  # how its experts are read and routed; None: experts are refused
    fused_projections: bool = False   # one attn_qkv and one gate|up ffn_up matmul (phi3): a state buffer
                                # for their outputs, ffn_up 2 * n_ff wide
    ffn_norm: str = "ffn_norm"  # the norm before a layer's FFN (the expert guess norms with it)
    longrope: bool = False      # LongRoPE scaling reproduced (rope_factors_long/short chosen per context)
    k_shift: bool = False       # llama.cpp's K-shift (seq_add, context shift) reproduced for its cached keys
    causal: bool = True         # False: an encoder (bert): every token attends to its whole sequence, no KV
                                # cache, the sequence in one pass (the engine's batch is the ubatch)
    has_output: bool = True     # output_norm and an output matrix (an encoder has neither: no logits)
    global_matrices: tuple[str, ...] = ()        # whole-model matrices of its own (bert's classifier head),
                                # read at load where the file has them (Weights.matrices; None where absent)
    check_metadata: Callable | None = None       # check_metadata(md): refuses keys of its own it cannot run
    hidden_out: Callable | None = None           # hidden_out(m, x): the hidden state (llama.cpp's t_embd) from
                                # the last layer's output; None: the output norm of it
    rank_head: Callable | None = None            # rank_head(m, h f32[k, n_embd]) -> scores: rank pooling's head
                                # (on the first token of each sequence; a causal model's: the last)
    pooled_out: Callable | None = None           # pooled_out(m, v f32[k, n_embd]) -> f32[k, d]: projections after
                                # pooling (llama.cpp's build_dense_out: gemma-embedding's dense_2, dense_3)
    shapes: Callable | None = None               # shapes(hp) -> {suffix: GGUF dims} over models.weights.layer_shapes'
                                # (jina-bert-v2: n_embd-wide q/k norms, its attn_norm_2)

    @property
    def iswa(self) -> bool:
        """llama.cpp keeps this architecture's sliding layers in a cache of their own (iswa)."""
        return self.swa_pattern > 0

    def layer_tensors(self, hp) -> tuple[str, ...]:
        """A layer's tensor suffixes for these hyperparameters (HParams: n_expert)."""
        return self.tensors_with_experts if hp.n_expert and self.tensors_with_experts is not None else self.tensors

    def layer_names(self, hp) -> frozenset[str]:
        """The names a Layer answers: its tensors and `also_read`."""
        return frozenset(self.layer_tensors(hp)) | self.also_read

    def is_swa(self, hp, il: int) -> bool:
        """Layer il attends over a sliding window (hp.sliding_window > 0 and the pattern says so)."""
        p = self.swa_pattern
        return p > 0 and hp.sliding_window > 0 and il % p < p - 1

    def windows(self, hp, layers: tuple[int, int]) -> list[int]:
        """Each layer's attention window, as the forward pass passes it (0: the whole context)."""
        return [hp.sliding_window if self.is_swa(hp, il) else 0 for il in range(*layers)]

    def layer_rope(self, hp, il: int):
        """(RoPE base, RopeScale) of layer il's keys and queries: a sliding layer's own base and scale
        (rope_base_swa, rope_freq_scale_swa), else the file's."""
        if not self.is_swa(hp, il):
            return hp.rope_base, hp.rope_scale
        scale = hp.rope_scale if self.rope_freq_scale_swa is None else \
            hp.rope_scale._replace(freq_scale=self.rope_freq_scale_swa)
        return hp.rope_base_swa, scale
