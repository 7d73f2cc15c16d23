"""Compatibility with the clients of Ollama and llama-server (issue 41): the GGUF's sampling defaults,
Ollama's tolerant request models, llama-server's endpoints, fill-in-the-middle."""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.sampling.gguf_defaults import gguf_sampler_sequence, gguf_sampling_defaults, meta_text, strtof
from ramforge.sampling.params import sampler_params


# ------------------------------------------------------------------------- general.sampling.*

def test_gguf_sampling_defaults_as_llama_cpp_reads_them():
    md = {"general.sampling.top_k": 20, "general.sampling.top_p": float(np.float32(0.95)),
          "general.sampling.temp": 0.123456789,            # a float64: "%f" keeps six decimals
          "general.sampling.penalty_last_n": 40.7,         # an integer key stored as a float: strtol("40.700000")
          "general.sampling.min_p": "0.05x",               # a string: strtof reads its number
          "general.sampling.mirostat": True,               # "true": not a number, skipped
          "general.sampling.xtc_threshold": [0.1, 0.2],    # an array: skipped
          "general.sampling.penalty_repeat": "abc",        # skipped
          "general.name": "x"}
    got = gguf_sampling_defaults(md)
    assert got == {"top_k": 20, "top_p": float(np.float32(0.95)), "temperature": float(np.float32(0.123457)),
                   "repeat_last_n": 40, "min_p": float(np.float32(0.05))}
    assert sampler_params({}, got).top_k == 20          # usable as defaults beneath a request's values
    assert gguf_sampling_defaults({}) == {}


def test_gguf_sampling_int_keys_wrap_as_int32_and_floats_parse_as_strtof():
    assert gguf_sampling_defaults({"general.sampling.top_k": 2 ** 31})["top_k"] == -(2 ** 31)
    assert gguf_sampling_defaults({"general.sampling.top_k": " -3"})["top_k"] == -3
    assert strtof("0x1p-2") == 0.25 and strtof("  -inf") == float("-inf") and strtof(".5e1z") == 5.0
    assert strtof("e5") is None and strtof("") is None
    assert meta_text(np.float32(0.1)) == "0.100000" and meta_text(False) == "false"


def test_gguf_sampler_sequence_names():
    md = {"general.sampling.sequence": "penalties;Top-K;nucleus;bogus;temp"}
    assert gguf_sampler_sequence(md) == ["penalties", "top_k", "top_p", "temperature"]
    assert gguf_sampler_sequence({}) is None and gguf_sampler_sequence({"general.sampling.sequence": ""}) is None
