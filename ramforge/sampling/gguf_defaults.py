"""A GGUF's own sampling defaults (`general.sampling.*`), read as llama.cpp reads them.

llama.cpp (common/common.cpp, `common_init_sampler_from_model`) reads each key through
`llama_model_meta_val_str`, i.e. the value as
text (`gguf_kv_to_str`: an integer in decimal, a float with `std::to_string` = "%f", a bool as
"true"/"false", a string as it is, an array as "[...]"), then parses that text with `strtol`
(integer keys, into an int32) or `strtof` (float keys); text that does not start with a number is
skipped. It applies them only where the user set no value. So a float key stored as 0.95 is
0.95f, a float stored with more than six decimals is rounded to six, an integer key stored as a
float ("40.000000") is 40, and a string "0.7" works too: all reproduced here.

`gguf_sampling_defaults(metadata)` gives the values under ramforge.sampling.params' names (only
the keys present and readable), unvalidated: the caller builds them through `sampler_params` as
defaults beneath the user's values. `gguf_sampler_sequence(metadata)` gives
`general.sampling.sequence` ("top_k;top_p;...", split on ';') as llama.cpp's canonical sampler
names, unknown names dropped (llama.cpp warns), or None.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np

PREFIX = "general.sampling."

# general.sampling.<key> -> (the table's name, int or float), in llama.cpp's order
KEYS: dict[str, tuple[str, type]] = {
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "xtc_probability": ("xtc_probability", float),
    "xtc_threshold": ("xtc_threshold", float),
    "temp": ("temperature", float),
    "penalty_last_n": ("repeat_last_n", int),
    "penalty_repeat": ("repeat_penalty", float),
    "mirostat": ("mirostat", int),
    "mirostat_tau": ("mirostat_tau", float),
    "mirostat_eta": ("mirostat_eta", float),
}

# common_sampler_types_from_names: canonical names, their kebab-case and no-dash spellings, and aliases
_CANONICAL = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill",
              "penalties", "adaptive_p")
_SAMPLER_NAMES = {n: n for n in _CANONICAL}
for _n in _CANONICAL:
    if "_" in _n:
        _SAMPLER_NAMES.setdefault(_n.replace("_", "-"), _n)
        _SAMPLER_NAMES.setdefault(_n.replace("_", ""), _n)
_SAMPLER_NAMES.update({"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"})

_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")
_FLOAT = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.I)
_HEX = re.compile(r"[ \t\n\v\f\r]*([+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?)")


def meta_text(value: Any) -> str:
    """A metadata value as llama_model_meta_val_str writes it (gguf_kv_to_str)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return ("-" if v < 0 else "") + ("inf" if math.isinf(v) else "nan") if not math.isfinite(v) else f"{v:f}"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return "[...]"                       # an array: "[" never parses as a number


def strtol_int32(text: str) -> int | None:
    """strtol(text, &end, 10) stored into an int32_t (None: no number at the start)."""
    m = _INT.match(text)
    if m is None:
        return None
    v = max(-(2 ** 63), min(2 ** 63 - 1, int(m.group(1))))      # long saturates at LONG_MIN / LONG_MAX
    return (v + 2 ** 31) % 2 ** 32 - 2 ** 31                     # then wraps into int32_t


def strtof(text: str) -> float | None:
    """strtof(text, &end) as a Python float of its float32 value (None: no number at the start)."""
    m = _HEX.match(text)
    if m is not None:
        s = m.group(1)
        sign = -1.0 if s.startswith("-") else 1.0
        body = s.lstrip("+-")
        v = sign * float.fromhex(body if re.search("[pP]", body) else body + "p0")
    else:
        m = _FLOAT.match(text)
        if m is None:
            return None
        v = float(m.group(1))
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def gguf_sampling_defaults(metadata: Mapping[str, Any]) -> dict[str, int | float]:
    """The GGUF's `general.sampling.*` values under ramforge.sampling.params' names (only those present
    and readable as llama.cpp reads them; unvalidated)."""
    out: dict[str, int | float] = {}
    for key, (name, kind) in KEYS.items():
        if PREFIX + key not in metadata:
            continue
        text = meta_text(metadata[PREFIX + key])
        v = strtol_int32(text[:63]) if kind is int else strtof(text[:127])     # llama.cpp's 64 / 128-byte buffers
        if v is not None:
            out[name] = v
    return out


def gguf_sampler_sequence(metadata: Mapping[str, Any]) -> list[str] | None:
    """`general.sampling.sequence` as llama.cpp's canonical sampler names (unknown ones dropped), or None."""
    if PREFIX + "sequence" not in metadata:
        return None
    text = meta_text(metadata[PREFIX + "sequence"])[:511]
    if not text:
        return None
    names = [_SAMPLER_NAMES.get(part.lower()) for part in text.split(";")]
    return [n for n in names if n is not None]
