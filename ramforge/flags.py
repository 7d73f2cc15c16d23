"""The runtime's environment switches and its shared defaults, one table each. A leaf: imports only
ramforge.errors.

Every `RAMFORGE_*` variable is read here and nowhere else (tests/test_flags.py checks the source):
a module asks its `Flag` (`flags.THREADS.get()`), which parses the value by its type with one rule
for booleans (FALSE: 0, false, no, off or empty; TRUE: 1, true, yes, on; anything else refused
with InvalidArgument naming the variable). A flag with `affects_kernels` changes the machine code a
kernel generates, so the kernel cache's directory hashes its value (paths.kernel_cache_key).
docs/USAGE.md's table of variables is `markdown_table()` (`python -m ramforge.flags` prints it).

FOREIGN lists the variables of other programs ramforge reads where they are used (Ollama's, numba's,
libgomp's): documented in the same table, not parsed here.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InvalidArgument

# ---- defaults: one home per fact -------------------------------------------------------------------
DEFAULT_CTX = 4096          # the context when none is given (llama-cli's), capped by the model's own
N_UBATCH = 512              # llama.cpp's default n_ubatch: the physical batch whose arithmetic evals reproduce
DIRECT_ALIGN = 4096         # O_DIRECT offset, length and buffer alignment (weights' read spans, the KV spill)
KV_PAD = 256                # llama.cpp pads n_ctx and n_ctx_seq to 256 cells; the KV cache is charged in
                            # chunks of as many positions

# ---- environment switches -----------------------------------------------------------------------
FALSE = ("", "0", "false", "no", "off")
TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Flag:
    """One environment switch: its variable, value type, value when unset, and what it does."""

    name: str
    type: type                      # bool, int or str
    default: object
    doc: str
    affects_kernels: bool = False   # changes the code kernels compile to: part of the kernel cache key

    def raw(self, env: Mapping[str, str] | None = None) -> str:
        """The variable's text, stripped ("" when unset)."""
        return (os.environ if env is None else env).get(self.name, "").strip()

    def get(self, env: Mapping[str, str] | None = None):
        """The parsed value (the default when unset or empty); env: a mapping instead of os.environ."""
        return parse(self, self.raw(env))


def parse(flag: Flag, text: str):
    """text (stripped) as flag's type; "" is the default."""
    if flag.type is bool:
        low = text.lower()
        if low in FALSE:
            return False if text else flag.default
        if low in TRUE:
            return True
        raise InvalidArgument(f"{flag.name}={text!r}: expected one of {', '.join(TRUE)} (on) or "
                              f"{', '.join(repr(v) for v in FALSE)} (off)")
    if not text:
        return flag.default
    if flag.type is int:
        try:
            return int(text)
        except ValueError:
            raise InvalidArgument(f"{flag.name}={text!r} is not an integer") from None
    return text


HOME = Flag("RAMFORGE_HOME", str, None, "the model store's and the kernel cache's root (default: "
            "`$XDG_CACHE_HOME/ramforge`, else `~/.cache/ramforge`)")
THREADS = Flag("RAMFORGE_THREADS", int, None, "default kernel threads (else the physical cores, at most "
               "$NUMBA_NUM_THREADS)")
KV_TYPE = Flag("RAMFORGE_KV_TYPE", str, None, "default KV cache type, `q8_0` or `q8_0,f16` for K,V (else f16; "
               "`serve` also reads Ollama's `OLLAMA_KV_CACHE_TYPE`)")
API_KEY = Flag("RAMFORGE_API_KEY", str, None, "`serve --api-key` (and what `ps`/`stop` send)")
HOST = Flag("RAMFORGE_HOST", str, None, "`serve --host` (and where `ps`/`stop` look)")
PORT = Flag("RAMFORGE_PORT", str, None, "`serve --port` (and where `ps`/`stop` look); a port number from 0 to 65535")
RAM = Flag("RAMFORGE_RAM", str, None, "`serve --ram`")
CREATE_DIRS = Flag("RAMFORGE_CREATE_DIRS", str, None, "`serve`: the directories (`:`-separated) an `/api/create` "
                   "FROM path may lie in (none when unset: upload the file as a blob)")
MAX_BLOB = Flag("RAMFORGE_MAX_BLOB", str, None, "`serve`: the largest `/api/blobs` upload, a size (default: the "
                "store's free disk less a margin)")
DEBUG = Flag("RAMFORGE_DEBUG", bool, False, "tracebacks on errors (as `--debug`)")
PORTABLE = Flag("RAMFORGE_PORTABLE", bool, False, "plain-loop kernels instead of the vector IR",
                affects_kernels=True)
NO_VNNI = Flag("RAMFORGE_NO_VNNI", bool, False, "the generic integer-dot IR instead of `vpdpbusd`",
               affects_kernels=True)
NO_REPACK = Flag("RAMFORGE_NO_REPACK", bool, False, "keep every matrix in file order (for A/B runs)")
NO_REPACK_EXPERTS = Flag("RAMFORGE_NO_REPACK_EXPERTS", bool, False, "keep experts read into the expert cache "
                         "in file order (for A/B runs)")
REPACK_STREAMED = Flag("RAMFORGE_REPACK_STREAMED", bool, False, "also repack streamed layers (for A/B runs; "
                       "out of core it costs more than it gains)")

FLAGS: tuple[Flag, ...] = (HOME, THREADS, KV_TYPE, API_KEY, HOST, PORT, RAM, CREATE_DIRS, MAX_BLOB, DEBUG, PORTABLE,
                           NO_VNNI, NO_REPACK, NO_REPACK_EXPERTS, REPACK_STREAMED)

FOREIGN: tuple[Flag, ...] = (
    Flag("OLLAMA_ORIGINS", str, None, "`serve --origins` (read by server.browser)"),
    Flag("OLLAMA_KV_CACHE_TYPE", str, None, "`serve`'s KV cache type where `RAMFORGE_KV_TYPE` is unset"),
    Flag("OLLAMA_HOST", str, None, "`serve`'s address when neither flags nor `RAMFORGE_HOST/PORT` set it, read as "
         "Ollama does: `HOST`, `HOST:PORT`, `:PORT` (every address), `http(s)://HOST[:PORT]`"),
    Flag("OLLAMA_KEEP_ALIVE", str, None, "`serve --keep-alive`"),
    Flag("OLLAMA_CONTEXT_LENGTH", int, None, "`serve --ctx`"),
    Flag("OLLAMA_NUM_PARALLEL", int, None, "`serve --parallel`"),
    Flag("OLLAMA_MODELS", str, None, "`serve`'s model store root when `RAMFORGE_HOME` is unset (ramforge's store "
         "layout, not Ollama's)"),
    Flag("HF_ENDPOINT", str, None, "Hugging Face sources: a mirror (`HF_TOKEN`, `HF_HOME`, `HF_HUB_CACHE` as "
         "huggingface_hub reads them; [Getting models](#getting-models))"),
    Flag("NUMBA_CACHE_DIR", str, None, "where compiled kernels are cached (default: the ramforge cache dir)"),
    Flag("GOMP_SPINCOUNT", int, 10000, "libgomp's barrier spin; ramforge sets 10000 unless it or "
         "`OMP_WAIT_POLICY` is set"),
)


def kernel_switches(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(name, value in a canonical text) of every flag that changes kernel code, which the kernel cache
    key hashes: a boolean "1" on, "" off (so `0`, `off` and unset share a cache); others as parsed."""
    out = []
    for f in FLAGS:
        if f.affects_kernels:
            v = f.get(env)
            out.append((f.name, ("1" if v else "") if f.type is bool else "" if v is None else str(v)))
    return out


def markdown_table() -> str:
    """docs/USAGE.md's table of environment variables."""
    rows = ["| variable | type | default | effect |", "|---|---|---|---|"]
    for f in FLAGS + FOREIGN:
        default = "unset" if f.default is None else "off" if f.default is False else f"`{f.default}`"
        doc = f.doc + (" (part of the kernel cache key)" if f.affects_kernels else "")
        rows.append(f"| `{f.name}` | {f.type.__name__} | {default} | {doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
