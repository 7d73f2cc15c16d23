"""What Ollama's /api/show reports beyond the GGUF's header: the capabilities (as Ollama's
ggufCapabilities and chatTemplateCapabilities decide them, plus `insert` where the vocabulary has FIM
tokens) and `parameters` (the GGUF's `general.sampling.*` defaults as llama.cpp reads them, then its
end-of-generation tokens as `stop`), in Ollama's text (`%-30s %#v` per line).
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

import numpy as np

from ..generation.reasoning import parser_for
from .common import read_info
from ..generation.fim import has_fim


@lru_cache(maxsize=8)
def show_extras(path: str, size: int, mtime_ns: int) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
    """A GGUF's Ollama capabilities and parameters (sampling defaults, then its end-of-generation
    tokens as stop strings), read from its header once per file version."""
    from ..gguf.reader import GGUFFile
    from ..sampling.gguf_defaults import gguf_sampling_defaults
    from ..tokenizer import load_tokenizer

    with GGUFFile(path) as f:
        md = f.metadata
    tok = load_tokenizer(md)
    template = read_info(path)["template"] or ""
    arch = md.get("general.architecture") or ""
    caps = ["embedding"] if f"{arch}.pooling_type" in md else ["completion"]      # as Ollama's ggufCapabilities
    if "tools" in template or "tool_call" in template:                            # chatTemplateHasToolSupport
        caps.append("tools")
    if has_fim(tok):
        caps.append("insert")                                                     # fill-in-the-middle: suffix
    if parser_for(template):
        caps.append("thinking")
    params = list(gguf_sampling_defaults(md).items())
    params += [("stop", tok.token_text(t)) for t in sorted(tok.eog_ids)]
    return tuple(caps), tuple(params)


def parameters_text(params) -> str:
    """Ollama's `parameters` text: one `%-30s %#v` line per value, as its show handler writes them."""
    def go(v):
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):       # Go's shortest form, of the float32 llama.cpp reads
            return np.format_float_positional(np.float32(v), trim="-") if math.isfinite(v) else \
                ("+Inf" if v > 0 else "-Inf" if v < 0 else "NaN")
        return json.dumps(v)
    return "\n".join(f"{k:<30} {go(v)}" for k, v in params)
