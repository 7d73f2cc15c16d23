"""What the server's modules share: limits, the config, the error mapping and request helpers.

Errors map to HTTP statuses by exception type (`error_status`: ramforge.errors.HTTP_STATUS, the one
table), never by message; bodies are Ollama's `{"error": "..."}`, or OpenAI's
`{"error": {"message": ..., "type": ...}}` under /v1. Request fields of the sampler parameters come
from ramforge.sampling.params' table (`sampler_fields`) and are built by its one builder (`request_sampling`).
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field, StrictBool

from .. import cancel
from ..generation.chat import ChatTemplateError
from ..errors import InvalidArgument, RamforgeError, RequestTooLarge, http_status
from ..sampling.params import PARAMS, sampler_params, stop_strings
from ..store.resolve import default_model_path

log = logging.getLogger("ramforge.server")

MAX_CTX = 1 << 20            # num_ctx / token counts accepted in a request
MAX_PREDICT = 1 << 20        # num_predict / max_tokens
MAX_TOP_K = 1 << 20
MAX_STOP = 16                # stop strings per request
MAX_STOP_LEN = 1024          # characters per stop string
MAX_NAME = 300               # characters in a model field (store names are at most 128 + ':' + 128)
MAX_MESSAGES = 4096          # chat messages per request
MAX_JSON_DEPTH = 512         # arrays and objects nested in a request body (Python's parser recurses per level)
FOREVER = math.inf
OPEN_PATHS = frozenset({"/health"})   # reachable without the API key


@dataclass
class ServerConfig:
    """What `ramforge serve` was started with."""

    model: str | None = None          # the startup model: a path, a store name or "default"
    ram: str | int | None = None      # the budget of the one resident model
    n_ctx: int | None = None          # --ctx: context when a request gives no num_ctx (None: 4096 or the model's);
    #                                   above the model's trained context it is clamped to it (a warning, as Ollama)
    n_threads: int | None = None
    io: str = "direct"
    api_key: str | None = None        # required as `Authorization: Bearer KEY` when set
    origins: tuple[str, ...] = ()     # browser origins allowed beside Ollama's defaults (--origins, $OLLAMA_ORIGINS)
    max_body: int = 1 << 20           # request body limit in bytes (413 above it)
    keep_alive: float = 300.0         # seconds a model stays loaded after a request (inf: forever, 0: unload)
    max_queue: int = 16               # requests waiting for the model before 503
    preload: bool = False             # load the startup model before serving
    speculative: dict | None = None   # speculative.make_drafter's keywords (--lookup, --draft ...); None: off
    slot_save_path: str | None = None  # where POST /slots/0?action=save|restore files live (None: refused)
    cache_ram: str | int | None = None  # the prompt cache's own budget (session.PromptCache); None: none
    cluster: dict | None = None       # cluster.Pipeline's keywords (--ray, --stages, --stage-ram); None: one process
    parallel: int = 1                 # --parallel N: requests share passes in N slots (ramforge.generation.batcher)
    context_shift: bool = False       # --context-shift: llama-server's, when generation fills the context
    type_k: str = "f16"               # KV cache types (--kv-type*, $RAMFORGE_KV_TYPE, $OLLAMA_KV_CACHE_TYPE)
    type_v: str = "f16"
    kv_spill: bool | str | None = None  # the KV cache to storage (--kv-spill; memory.kv_spill): None when needed
    max_ctx: int | None = None        # --max-ctx: the most a request's num_ctx gets (None: the model's trained context);
    #                                   an n_ctx above it is refused when the server starts
    alias: str | None = None          # --alias: the startup model's name on every API (llama-server's)
    chat_template: str | None = None  # --chat-template: template text (a file's, or a named one) over the GGUF's
    lenient_names: bool = True        # /v1 and llama-server's routes: an unknown model name means the loaded
                                      # (or startup) model, as llama-server; False (--strict-names): 404, as Ollama
    pooling: str | None = None        # --pooling (llama-server's): none/mean/cls/last/rank over the files' own
                                      # {arch}.pooling_type for the embedding endpoints; None: the file's
    spm_infill: bool = False          # --spm-infill (llama-server's): fill-in-the-middle prompts put the suffix
                                      # first (/infill, `suffix` on /api/generate and /v1/completions)


@dataclass(frozen=True)
class Runner:
    """Load-time knobs a request may set (Ollama's options num_thread, use_mmap, num_batch): None takes
    the server's. A model loaded with other knobs is reloaded, as Ollama reloads its runner."""

    n_threads: int | None = None
    io: str | None = None
    n_ubatch: int | None = None

    def resolved(self, cfg: "ServerConfig") -> tuple:
        return (self.n_threads or cfg.n_threads, self.io or cfg.io, self.n_ubatch or 512)


# ------------------------------------------------------------------------------------ errors

error_status = http_status          # by the exception's type: ramforge.errors.HTTP_STATUS


_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 413: "invalid_request_error", 503: "server_busy", 507: "insufficient_storage"}


def error_body(path: str, status: int, message: str) -> dict:
    """Ollama's error body, or OpenAI's under /v1."""
    if path.startswith("/v1/") or path == "/v1":
        kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return {"error": message}


def error_response(request: Request, status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message), status_code=status, headers=headers)


def validation_message(errors: list[dict]) -> str:
    """Pydantic errors as one line: `options.num_predict: Input should be ...; ...`."""
    parts = []
    for e in errors[:6]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        msg = e.get("msg", "invalid")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = f" (and {len(errors) - 6} more)" if len(errors) > 6 else ""
    return "invalid request: " + "; ".join(parts) + more


# ------------------------------------------------------------------------------------ request bodies

_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)


def json_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep arrays and objects nest in a JSON text (brackets in strings not counted), or 0 when it
    has no more than `limit` brackets (so cannot nest deeper): linear, in C (a count, a regex, numpy)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return 0
    import numpy as np

    a = np.frombuffer(_JSON_STRING.sub(b'""', body), np.uint8)
    step = ((a == 0x5B) | (a == 0x7B)).astype(np.int32) - ((a == 0x5D) | (a == 0x7D)).astype(np.int32)
    return int(np.cumsum(step).max(initial=0))


def body_error(exc: BaseException | None) -> str | None:
    """The reason a request body's JSON could not be read, from the error FastAPI's generic "There was an
    error parsing the body" wraps (None: not one of these)."""
    import sys

    if isinstance(exc, RecursionError):
        return f"the request body nests arrays and objects too deep (at most {MAX_JSON_DEPTH} levels are read)"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return (f"a number in the request body is too large: more than {sys.get_int_max_str_digits():,} digits "
                "(Python's limit for reading an integer)")
    return None


# ------------------------------------------------------------------------------------ helpers

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value) -> float | None:
    """Ollama's keep_alive: seconds as a number or numeric string, or a Go duration ('5m', '1h30m',
    '-1s'); negative: forever (inf); 0: unload after the request; None: the server's default."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidArgument(f"keep_alive must be a duration like '5m' or a number of seconds, not {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        s = str(value).strip()
        if s == "":
            return None
        try:
            seconds = float(s)
        except ValueError:
            sign, body = (-1.0, s[1:]) if s[:1] == "-" else (1.0, s.lstrip("+"))
            pos, seconds = 0, 0.0
            for m in _DURATION.finditer(body):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNIT_S[m.group(2)]
                pos = m.end()
            if pos != len(body) or not body:
                raise InvalidArgument(f"keep_alive {value!r} is not a duration: use e.g. '5m', '1h', '30s', "
                                    f"0 (unload now) or -1 (keep loaded)") from None
            seconds *= sign
    if not math.isfinite(seconds):
        raise InvalidArgument(f"keep_alive {value!r} is not a finite duration: use -1 to keep the model loaded")
    return FOREVER if seconds < 0 else seconds


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def iso(ts: float) -> str:
    if not math.isfinite(ts) or ts > 253402300799:
        return "9999-12-31T23:59:59Z"
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


# llama_ftype (general.file_type) -> Ollama's quantization_level names
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}


def human_count(n: int) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _plain(v, verbose: bool):
    """A metadata value as JSON (numpy made plain); long arrays are null unless verbose (as Ollama)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        if len(v) > 64 and not verbose:
            return None
        return [_plain(x, verbose) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_info(path: str, verbose: bool = False) -> dict:
    """Details (Ollama's shape), metadata and parameter count of a GGUF, reading only its header."""
    from ..gguf.reader import GGUFFile

    with GGUFFile(path) as f:
        md = f.metadata
        n_params = sum(int(t.n_elements) for t in f.tensors.values())
        arch = md.get("general.architecture") or ""
        ftype = md.get("general.file_type")
        info = {"general.parameter_count": n_params}
        info.update({k: _plain(v, verbose) for k, v in md.items()
                     if k != "tokenizer.chat_template" and not k.startswith("tokenizer.chat_template.")})
        return {
            "details": {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
                        "parameter_size": human_count(n_params),
                        "quantization_level": FILE_TYPES.get(int(ftype), str(ftype)) if ftype is not None else ""},
            "model_info": info,
            "template": _template_text(md, path),
            "license": _plain(md.get("general.license"), verbose),
        }


def _template_text(md: dict, path: str) -> str | None:
    """The chat template Model.render_chat uses: the GGUF's; for the embedded default model (whose
    GGUF has none) the gemma-3 template ramforge ships; else llama.cpp's ChatML fallback."""
    from ..generation import api
    from ..generation.chat import ChatTemplate

    override = None
    shipped = getattr(api, "_DEFAULT_MODEL_TEMPLATE", None)
    if "tokenizer.chat_template" not in md and shipped is not None:
        try:
            if Path(path).resolve() == default_model_path().resolve():
                override = Path(shipped).read_text()
        except (OSError, RamforgeError):
            pass
    try:
        return ChatTemplate.from_metadata(md, override).text
    except ChatTemplateError:
        return md.get("tokenizer.chat_template")


@lru_cache(maxsize=64)
def _details(path: str, size: int, mtime_ns: int) -> dict:
    return read_info(path)["details"]


def details_of(path: str) -> dict | None:
    try:
        st = Path(path).stat()
        return _details(str(path), st.st_size, st.st_mtime_ns)
    except (OSError, RamforgeError):
        return None


def stop_list(stop) -> list[str]:
    """A request's stop strings, within the server's limits (InvalidArgument: 400)."""
    return stop_strings(stop, MAX_STOP, MAX_STOP_LEN)


def sampler_fields(bounds: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """pydantic fields for a request model, one per sampler parameter of ramforge.sampling.params' table:
    optional (None takes the front end's default), typed as the table says, and bounded by the
    table's range, or by `bounds` (lo, hi) where an API documents its own or caps what one request
    may ask; unbounded where llama-server clamps or defaults instead (`Param.server`). Use: `pydantic.create_model(name, __base__=Strict, **sampler_fields(bounds))`."""
    out = {}
    for p in PARAMS:
        if p.kind is dict:          # logit_bias: {"id": bias} or [[id, bias], ...]; false bans a token
            out[p.name] = (dict[str, StrictBool | float] | list[tuple[int, StrictBool | float]] | None, None)
            continue
        if p.kind is tuple:         # dry_sequence_breakers
            out[p.name] = (list[str] | None, Field(None, max_length=MAX_STOP))
            continue
        lo, hi = bounds.get(p.name, (p.lo, p.hi) if not p.server else (-math.inf, math.inf))
        limits = {"gt" if p.open_low and lo == p.lo else "ge": lo} if math.isfinite(lo) else {}
        if math.isfinite(hi):
            limits["le"] = hi
        out[p.name] = (p.kind | None, Field(None, **limits))
    return out


def request_sampling(request, defaults: Mapping[str, Any], seed: int | None) -> dict:
    """The sampler parameters of a request made with `sampler_fields`, with the front end's defaults
    and its seed (mapped onto the table's meaning), built and validated by the one builder; as
    keywords for Model.stream."""
    values = {p.name: p.for_server(getattr(request, p.name)) for p in PARAMS}   # llama-server's clamps
    return sampler_params({**values, "seed": seed}, defaults).as_dict()


# ------------------------------------------------------------------------------- context sizes

@lru_cache(maxsize=64)
def _trained(path: str, size: int, mtime_ns: int) -> int:
    from ..gguf.reader import GGUFFile

    with GGUFFile(path) as f:
        md = f.metadata
        v = md.get(f"{md.get('general.architecture') or ''}.context_length")
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


@lru_cache(maxsize=64)
def _sampling_defaults(path: str, size: int, mtime_ns: int) -> dict:
    from ..gguf.reader import GGUFFile
    from ..sampling.gguf_defaults import gguf_sampling_defaults

    with GGUFFile(path) as f:
        return gguf_sampling_defaults(f.metadata)


def model_sampling_defaults(path: str) -> dict:
    """A GGUF's `general.sampling.*` as sampler defaults (ramforge.sampling.gguf_defaults), which
    llama-server applies beneath every request's values; read once per file version."""
    st = Path(path).stat()
    return dict(_sampling_defaults(str(path), st.st_size, st.st_mtime_ns))


def trained_context(path: str) -> int:
    """A GGUF's trained context (`{arch}.context_length`), 0 where it has none; read once per file."""
    st = Path(path).stat()
    return _trained(str(path), st.st_size, st.st_mtime_ns)


def clamp_num_ctx(num_ctx: int | None, path: str, max_ctx: int | None) -> int | None:
    """A request's num_ctx (or the server's --ctx) as Ollama sizes it (llm/server.go): above the model's
    trained context it is that context, with a warning; and here also at most the server's --max-ctx.
    None stays None (the server's --ctx, or the engine's default)."""
    if num_ctx is None:
        return None
    trained = trained_context(path)
    limit = min(x for x in (trained, max_ctx, MAX_CTX) if x)
    if num_ctx > limit:
        log.warning("requested context size too large for model: num_ctx=%d, n_ctx_train=%d, --max-ctx=%s; "
                    "using %d", num_ctx, trained, max_ctx, limit)
        return limit
    return num_ctx


# ------------------------------------------------------------------------------ chat truncation

def check_messages(n: int) -> None:
    """RequestTooLarge (400) for a chat of more than MAX_MESSAGES messages."""
    if n > MAX_MESSAGES:
        raise RequestTooLarge(f"{n:,} messages, over the server's limit of {MAX_MESSAGES:,} per request; "
                              "drop the oldest ones")


def _tool_block_start(msgs: list[dict], i: int) -> int:
    """i, or the assistant turn whose tool calls the run of tool results at i answers (kept together)."""
    if i <= 0 or i >= len(msgs) or msgs[i].get("role") != "tool":
        return i
    start = i
    while start > 0 and msgs[start - 1].get("role") == "tool":
        start -= 1
    a = start - 1
    return a if a >= 0 and msgs[a].get("role") == "assistant" and msgs[a].get("tool_calls") else i


def fit_messages(msgs: list[dict], n_ctx: int, count) -> list[dict]:
    """Ollama's chat truncation (server/prompt.go chatPrompt): drop the oldest messages until
    count(messages) <= n_ctx, keeping every dropped system message, always the last message, and a
    tool result with the assistant turn that called it. count: messages -> prompt tokens. A cut the
    chat template refuses (a Jinja template that wants user/assistant turns alternating) is passed
    over; the whole conversation's refusal is the caller's error.

    The first cut that fits is found by binary search (a later cut keeps fewer messages, so fewer
    tokens), so a chat of n messages is rendered about log2(n) times, not up to n times (plus the
    refused cuts passed over); at most MAX_MESSAGES messages."""
    check_messages(len(msgs))
    last = len(msgs) - 1

    def kept(i: int) -> tuple[int, list]:
        start = _tool_block_start(msgs, i)
        return start, [m for m in msgs[:start] if m.get("role") == "system"] + msgs[start:]

    def first_taken(i: int, hi: int) -> tuple[int, list | None]:
        """(k, kept if it fits else None) for the first cut k in i..hi the template takes; (hi + 1, None)
        if it takes none of them."""
        for k in range(i, hi + 1):
            cancel.check()                 # each cut is a render and a tokenization under the model lock
            start, ks = kept(k)
            if k == last:
                return k, ks
            try:
                return k, ks if count(ks) <= n_ctx else None
            except ChatTemplateError:
                if start == 0:
                    raise
        return hi + 1, None

    lo, hi, best = 0, last, None
    while lo <= hi:
        mid = (lo + hi) // 2
        k, ks = first_taken(mid, hi)
        if ks is not None:                 # fits at k: the first fit is k or before mid
            best, hi = ks, mid - 1
        elif k > hi:                       # every cut in mid..hi refused: the first fit is before mid
            hi = mid - 1
        else:                              # k does not fit, nor does anything before it
            lo = k + 1
    return best if best is not None else kept(last)[1]


def loading_response() -> JSONResponse:
    """llama-server's answer to /health while the model loads (here: while its kernels warm)."""
    return JSONResponse({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
                        status_code=503)
