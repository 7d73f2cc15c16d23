"""The sampler defaults a GGUF recommends (`general.sampling.*`), which llama.cpp's common_params applies
when no flag sets the value (the CLI and llama-server; not llama-cpp-python). Named as
ramforge.sampling.params' table. `general.sampling.sequence` (a sampler order) is not applied: ramforge's
chains keep llama.cpp's default order."""
from __future__ import annotations

import numbers

# GGUF key -> (the table's name, type)
KEYS = {
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.xtc_probability": ("xtc_probability", float),
    "general.sampling.xtc_threshold": ("xtc_threshold", float),
    "general.sampling.temp": ("temperature", float),
    "general.sampling.penalty_last_n": ("repeat_last_n", int),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
    "general.sampling.mirostat": ("mirostat", int),
    "general.sampling.mirostat_tau": ("mirostat_tau", float),
    "general.sampling.mirostat_eta": ("mirostat_eta", float),
}


def gguf_sampling_defaults(metadata: dict) -> dict:
    """{table name: value} of the general.sampling.* keys present with a number (others are left out,
    as llama.cpp skips a key of the wrong type)."""
    out = {}
    for key, (name, kind) in KEYS.items():
        v = metadata.get(key)
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            continue
        out[name] = kind(v)
    return out
