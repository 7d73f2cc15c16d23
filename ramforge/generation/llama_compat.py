"""llama-cpp-python's Llama constructor keywords (those accepted as no-ops, those refused unless at their
defaults), its metadata strings, and its logits processors in front of a Sampler (generation/llama.py uses these)."""
from __future__ import annotations

import numpy as np

from ..sampling import Sampler

# Keyword: llama-cpp-python's default. Accepted; nothing in ramforge depends on them (one warning).
NO_OP_KEYWORDS = {"n_gpu_layers": 0, "split_mode": 1, "main_gpu": 0, "tensor_split": None, "use_mlock": False,
                  "offload_kqv": True, "op_offload": None, "swa_full": None, "no_perf": False, "numa": False,
                  "rpc_servers": None, "penalize_nl": True}
# Keyword: default. A value other than the default changes the model's output: refused.
REFUSED_KEYWORDS = {"vocab_only": False, "kv_overrides": None, "rope_scaling_type": -1,
                    "attention_type": -1, "rope_freq_base": 0.0, "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0,
                    "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0,
                    "lora_base": None, "lora_path": None, "lora_scale": 1.0, "tokenizer": None}


class _Processed:
    """A Sampler behind llama-cpp-python's logits processors (callables (input_ids, scores) -> scores),
    which run first in its chain, before the logit bias and the penalties."""

    def __init__(self, sampler: Sampler, processors):
        self.sampler, self.processors = sampler, list(processors)

    def sample(self, logits, history) -> int:
        scores = np.array(logits, dtype=np.float32)
        ids = np.asarray(history, dtype=np.intc)
        for p in self.processors:
            scores = np.asarray(p(ids, scores), dtype=np.float32)
        return self.sampler.sample(scores, history)


def _metadata_strings(md: dict) -> dict[str, str]:
    """The GGUF's scalar metadata as llama.cpp's llama_model_meta_val_str prints it (arrays left out)."""
    out = {}
    for k, v in md.items():
        if isinstance(v, (list, tuple, np.ndarray)):
            continue
        if isinstance(v, (bool, np.bool_)):
            out[k] = "true" if v else "false"
        elif isinstance(v, (float, np.floating)):
            out[k] = f"{float(v):f}"                   # std::to_string
        elif isinstance(v, bytes):
            out[k] = v.decode("utf-8", "replace")
        else:
            out[k] = str(v)
    return out
