"""The command line: inspect, support, plan, and one-line errors without tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools.ggufbuild import valid_model


def ramforge(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ramforge", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_inspect_default_json():
    r = ramforge("inspect", "default", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["tensor_count"] == 236
    assert d["types"] == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
    assert (d["architecture"], d["block_count"], d["embedding_length"]) == ("gemma3", 18, 640)
    tokens = d["metadata"]["tokenizer.ggml.tokens"]
    assert tokens["length"] == 262144 and tokens["head"][:2] == ["<pad>", "<eos>"]


def test_inspect_table_without_model_argument():
    r = ramforge("inspect")
    assert r.returncode == 0, r.stderr
    assert "gemma3" in r.stdout and "Q4_K" in r.stdout and "blk.17.ffn_down.weight" in r.stdout
    assert "262,144 items" in r.stdout


def test_support_lists_types():
    r = ramforge("support", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"Q4_K", "IQ4_XS", "BF16", "Q8_K", "MXFP4", "TQ1_0", "TQ2_0", "IQ1_S", "IQ1_M"} <= set(
        d["quant_types"]["executable"])
    assert {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"} <= set(d["quant_types"]["executable"])
    assert {"Q8_1", "I8", "F64"} <= set(d["quant_types"]["refused"])
    assert ramforge("support").returncode == 0


@pytest.mark.parametrize("ram,verdict,kv_positions,spill", [
    ("1G", "resident", 2048, None), ("100M", "streaming", 2048, None), ("30M", "streaming", 2048, None),
    ("30M", "streaming", 1280, "off"), ("8M", "insufficient", 2048, None)])
def test_plan_verdicts(ram, verdict, kv_positions, spill):
    from ramforge.kv.types import spill_layout
    r = ramforge("plan", "default", "--ram", ram, "--ctx", "2048", "--json", *(("--kv-spill", spill) if spill else ()))
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["verdict"] == verdict and p["n_ctx"] == 2048
    # a budget short of the whole context's KV cache spills it to storage (its tails and read buffers
    # charged); with --kv-spill off the cache grows as the context fills: the plan holds the positions it can
    assert p["kv_spill"] == (ram == "30M" and spill is None)
    want = (spill_layout(2048, 1, 256, 256, "f16", "f16", p["batch"], p["kv_tail"]).charged(18) if p["kv_spill"]
            else 18 * kv_positions * 1 * (256 + 256) * 2)
    assert p["kv_positions"] == kv_positions and p["kv_bytes"] == want
    if verdict != "insufficient":
        assert p["planned_peak"] <= p["budget"]
        assert p["planned_peak"] == (p["kv_bytes"] + p["state_bytes"] + p["small_bytes"] + p["n_buffers"] * p["buffer_bytes"]
                                     + sum(p["persistent"][n] for n in p["resident"]) + p["embd_row_bytes"]
                                     + sum(p["layer_bytes"][i] for i in p["pinned"]))
    else:
        assert p["min_budget"] > p["budget"]
    text = ramforge("plan", "--ram", ram, "--ctx", "2048")
    assert text.returncode == 0 and verdict in text.stdout


def test_plan_minimum_matches_the_engine_refusal():
    p = json.loads(ramforge("plan", "default", "--ram", "1M", "--ctx", "512", "--json").stdout)
    r = ramforge("run", "-p", "hi", "--ram", "1M", "--ctx", "512")
    assert r.returncode == 1 and f"{p['min_budget']:,}" in r.stderr


def test_run_profile_and_memory_report_json():
    r = ramforge("run", "-p", "Hello", "-n", "3", "--temp", "0", "--ram", "60M", "--ctx", "256",
                 "--profile", "--memory-report", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    prof, mem = d["profile"], d["memory"]
    assert prof["misses"] > 0 and prof["bytes_read"] > 0 and any(k.startswith("matvec") for k in prof["ops_s"])
    assert mem["managed_peak"] <= mem["budget"] == 60 * 2**20 and mem["managed_peak"] == mem["planned_peak"]
    assert 0 <= mem["page_cache_fraction"] <= 1
    # Python (orchestration) time and compiled calls per decode token; gemma-3-270m has 18 layers
    decode = [p for p in prof["passes"] if p["kind"] == "decode"]
    assert decode and all(p["kernel_s"] >= 0 and p["python_s"] >= 0 and p["kernel_calls"] >= 18 for p in decode)
    assert all(abs(p["kernel_s"] + p["python_s"] - p["seconds"]) < 1e-9 for p in decode)
    assert prof["decode_python_s"] >= 0 and prof["decode_kernel_s"] >= 0 and 0 <= prof["decode_python_fraction"] <= 1
    assert 18 <= prof["decode_kernel_calls"] < 100 * 18           # ~24 per layer: norms, quantize, matmuls, ...
    r = ramforge("run", "-p", "Hello", "-n", "2", "--ram", "60M", "--ctx", "256", "--profile", "--memory-report")
    assert r.returncode == 0 and "per layer" in r.stderr and "page cache holds" in r.stderr
    assert "python overhead per decode token" in r.stderr and "compiled kernel calls per token" in r.stderr


def test_bench_json_and_token_latency_percentiles():
    """bench runs (its engine loaded by keyword: --kv-type and --kv-spill where load_engine takes them) and
    reports each decode token's latency percentiles; --profile gives them too."""
    r = ramforge("bench", "--prompt-tokens", "8", "--gen", "6", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["prompt_tokens"] == 8 and d["gen_tokens"] == 6 and d["decode_tok_s"] > 0
    p50, p90, p99 = d["decode_token_p50_s"], d["decode_token_p90_s"], d["decode_token_p99_s"]
    assert 0 < p50 <= p90 <= p99 <= d["decode_s"]
    r = ramforge("run", "-p", "Hello", "-n", "4", "--temp", "0", "--profile", "--json")
    assert r.returncode == 0, r.stderr
    prof = json.loads(r.stdout)["profile"]
    assert 0 < prof["decode_token_p50_s"] <= prof["decode_token_p90_s"] <= prof["decode_token_p99_s"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's /proc")
def test_peak_rss_is_the_process_own_not_its_parents():
    """--memory-report's peak RSS: a child started by a large parent reports its own high-water mark
    (ru_maxrss would carry the parent's RSS at fork across the exec)."""
    import numpy as np

    big = np.ones(512 * 2**20 // 8)                            # 512 MiB resident in this process
    r = subprocess.run([sys.executable, "-c", "from ramforge.cli.report import peak_rss; print(peak_rss())"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert 0 < int(r.stdout) < 400 * 2**20, int(r.stdout) >> 20
    del big


def test_profile_kernel_clock_counts_only_while_enabled():
    """--profile times calls into compiled kernels; off, numba's C call is back (nothing to pay)."""
    import numpy as np
    from numba.core.dispatcher import Dispatcher

    from ramforge.kernels.ops import rms_norm
    from ramforge.profiling import KERNELS, PROFILE

    x, w = np.ones((1, 8), np.float32), np.ones(8, np.float32)
    rms_norm(x, x, w, 1e-6)                                     # loaded or compiled before counting
    PROFILE.enabled = True
    try:
        assert "__call__" in vars(Dispatcher)
        c0, s0 = KERNELS.calls, KERNELS.seconds
        for _ in range(3):
            rms_norm(x, x, w, 1e-6)
        assert KERNELS.calls - c0 == 3 and KERNELS.seconds >= s0
    finally:
        PROFILE.enabled = False
    assert "__call__" not in vars(Dispatcher)
    c0 = KERNELS.calls
    rms_norm(x, x, w, 1e-6)
    assert KERNELS.calls == c0


def test_errors_are_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + valid_model().build()[4:])
    for args in (["inspect", str(bad)], ["inspect", str(tmp_path / "missing.gguf")],
                 ["plan", "--ram", "12Q"], ["inspect", str(tmp_path)]):
        r = ramforge(*args)
        assert r.returncode == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("error:") and r.stderr.count("\n") == 1, r.stderr
    r = ramforge("inspect", str(bad), "--debug")
    assert r.returncode == 1 and "Traceback" in r.stderr and "magic" in r.stderr
    r = ramforge("plan", "--ram")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def _gemma_record(name):
    from tools.oracle_report import records

    rec = next(r for r in records() if r["model"]["source"] != "synthetic")
    return next(p for p in rec["prompts"] if p["name"] == name)


def test_run_greedy_json_matches_oracle():
    pr = _gemma_record("whitespace")      # no near-tie in its greedy continuation
    r = ramforge("run", "--prompt", pr["text"], "-n", "32", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["prompt_tokens"] == pr["tokens"] and d["completion_tokens"] == pr["gen_tokens"]
    assert d["text"] == pr["gen_text"] and d["n_completion"] == 32 and d["finish_reason"] == "length"
    assert d["timings"]["decode_tok_s"] > 0 and d["timings"]["prompt_tokens"] == len(pr["tokens"])


def test_run_streams_text_and_prints_stats():
    pr = _gemma_record("whitespace")      # no near-tie in its greedy continuation
    r = ramforge("run", "default", "-p", pr["text"], "-n", "32", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == pr["gen_text"] + "\n"
    assert "prefill" in r.stderr and "decode 32 tokens" in r.stderr


def test_run_sampling_is_seeded():
    args = ("run", "-p", "Once upon a time", "-n", "12", "--temp", "0.9", "--seed", "7", "--json")
    a, b = ramforge(*args), ramforge(*args)
    assert a.returncode == 0 and json.loads(a.stdout)["completion_tokens"] == json.loads(b.stdout)["completion_tokens"]
    bad = ramforge("run", "-p", "x", "--top-p", "1.5")
    assert bad.returncode == 1 and "top_p" in bad.stderr and "Traceback" not in bad.stderr
    long = ramforge("run", "-p", "word " * 40, "--ctx", "16")
    assert long.returncode == 1 and "16" in long.stderr and "context" in long.stderr


def test_tokenize_detokenize_logits():
    pr = _gemma_record("russian")
    r = ramforge("tokenize", "default", pr["text"], "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ids"] == pr["tokens"]
    r = ramforge("detokenize", "default", *map(str, pr["tokens"][1:]))
    assert r.returncode == 0 and r.stdout == pr["text"] + "\n"
    r = ramforge("logits", "default", pr["text"], "--top", "3", "--json")
    assert r.returncode == 0
    top = json.loads(r.stdout)["top"]
    assert top[0]["id"] == pr["logits"]["top_ids"][len(pr["tokens"]) - 1][0] and len(top) == 3
    assert ramforge("detokenize", "default", "999999999").returncode == 2
