"""Optional coverage-guided fuzzing with atheris (libFuzzer for Python); not run in CI.

    pip install atheris
    python robustness/fuzz_atheris.py reader    [libFuzzer flags, e.g. -max_total_time=600 CORPUS_DIR]
    python robustness/fuzz_atheris.py tokenizer [-max_total_time=600]

reader: each input is a whole GGUF file.  It is written to a temporary file (on /dev/shm when there
is one) and opened with GGUFFile, then every tensor is read.  A RamforgeError is a clean refusal;
any other exception is a crash that libFuzzer reports and saves as crash-<sha1>.  With no corpus
directory given, one is seeded (under /tmp) from tools/ggufbuild.py: valid_model() and a few dozen
random small files from robustness/gguf_cases.py's generator, so mutation starts from valid files.
-rss_limit_mb and -timeout bound memory and time per input (defaults here: 512 MB, 5 s).

tokenizer: each input is raw bytes, tokenized (bytes and surrogateescape text, with and without
special-token parsing) by the llama-spm and qwen2 vocabularies of llama.cpp's test set, then
decoded and stream-decoded.  Only RamforgeError may escape encode; decode of encode's ids must
not raise at all.

Reproduce a crash with: python robustness/fuzz_atheris.py reader crash-<sha1>
"""
from __future__ import annotations

import atexit
import os
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["ramforge"]):
    from ramforge.errors import RamforgeError
    from ramforge.gguf.reader import GGUFFile
    from ramforge.tokenizer import load_tokenizer


def _tmp_path() -> str:
    d = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    fd, p = tempfile.mkstemp(prefix="ramforge-atheris-", suffix=".gguf", dir=d)
    os.close(fd)
    atexit.register(lambda: os.path.exists(p) and os.unlink(p))
    return p


def reader_target():
    path = _tmp_path()

    def one(data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)
        try:
            with GGUFFile(path) as g:
                _ = g.metadata
                for t in g.tensors.values():
                    g.read_tensor(t)
        except RamforgeError:
            pass

    return one


def seed_corpus() -> str:
    from tools.ggufbuild import valid_model
    from robustness.gguf_cases import random_builder
    d = tempfile.mkdtemp(prefix="ramforge-atheris-corpus-")
    Path(d, "valid_model.gguf").write_bytes(valid_model().build())
    rng = random.Random(0)
    for i in range(40):
        Path(d, f"random{i}.gguf").write_bytes(random_builder(rng).build())
    print(f"seed corpus (new inputs are added here): {d}", file=sys.stderr)
    return d


def tokenizer_target():
    from ramforge.gguf.reader import GGUFFile
    from tools._fixtures import vocab_path

    toks = []
    for name in ("llama-spm", "qwen2"):
        with GGUFFile(vocab_path(name)) as g:
            toks.append(load_tokenizer(dict(g.metadata)))

    def one(data: bytes) -> None:
        text = data.decode("utf-8", "surrogateescape")
        for tok in toks:
            for inp in (data, text):
                for parse_special in (False, True):
                    try:
                        ids = tok.encode(inp, add_special=True, parse_special=parse_special)
                    except RamforgeError:
                        continue
                    tok.decode(ids)
                    s = tok.stream()
                    "".join(s.feed(i) for i in ids) + s.flush()

    return one


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("reader", "tokenizer"):
        sys.exit(__doc__)
    target = sys.argv.pop(1)
    args = list(sys.argv)
    if not any(a.startswith("-rss_limit_mb") for a in args):
        args.append("-rss_limit_mb=512")
    if not any(a.startswith("-timeout") for a in args):
        args.append("-timeout=5")
    if target == "reader":
        one = reader_target()
        if not any(not a.startswith("-") for a in args[1:]):
            args.append(seed_corpus())
    else:
        one = tokenizer_target()
    atheris.Setup(args, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
