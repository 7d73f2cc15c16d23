"""Created models (Ollama's `create`): a Modelfile subset, the config a manifest keeps, and `create` /
`copy` over the store.

A created model is a manifest like a pulled one (a name -> a GGUF blob) whose `config` holds what
its Modelfile said: TEMPLATE (a Jinja chat template, used instead of the file's
tokenizer.chat_template), SYSTEM (the system message when a request brings none, as Ollama) and
PARAMETERs (request option defaults, under what the request sets). FROM names a GGUF file (its
bytes copied into the store's blobs, hashed on the way; a shard of a split GGUF brings its set, one
blob per shard, checked by the reader), a blob already in the store
(`sha256:<hex>`, uploaded by /api/blobs), or another store model (its blob shared, its config
under the new one's). Other Modelfile commands (ADAPTER, LICENSE, MESSAGE, REQUIRES) are refused by
name; so are Ollama's Go templates (ramforge renders Jinja).
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import ModelfileError
from ..gguf.reader import GGUFFile, split_path, split_prefix
from .blobs import Manifest, Shard, Store, _fsync_dir
from .names import (CHUNK, GGUF_MAGIC, _HEX64, BlobMissing, CorruptManifest, NotGGUF, NotInStore, is_valid_name,
                    normalize_name)

MAX_MODELFILE = 1 << 20         # bytes of a Modelfile, or of a TEMPLATE / SYSTEM text
MAX_PARAMETERS = 64
COMMANDS = ("FROM", "PARAMETER", "TEMPLATE", "SYSTEM")
REFUSED = ("ADAPTER", "LICENSE", "MESSAGE", "REQUIRES")
_SHARD = re.compile(r".+-\d{5,}-of-\d{5,}\.gguf")     # gguf-split's names (gguf.reader.split_prefix)
_GO_TEMPLATE = re.compile(r"\{\{-?\s*(\.|(if|range|with|else|end|block|define|template)\b[^}]*\.|end\b)")

# Ollama's PARAMETER names ramforge honours (server.ollama.Options), with their value types; `stop` repeats.
PARAMETERS: dict[str, type] = {
    "num_ctx": int, "num_predict": int, "num_keep": int, "seed": int, "temperature": float, "top_k": int,
    "top_p": float, "min_p": float, "typical_p": float, "repeat_penalty": float, "repeat_last_n": int,
    "presence_penalty": float, "frequency_penalty": float, "mirostat": int, "mirostat_tau": float,
    "mirostat_eta": float, "stop": str,
}


@dataclass(frozen=True)
class ModelConfig:
    """What a created model adds to its GGUF: a chat template, a system message, option defaults."""

    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.template or self.system or self.parameters)

    def over(self, base: "ModelConfig") -> "ModelConfig":
        """This config on top of base's (FROM another created model)."""
        return ModelConfig(self.template or base.template, self.system or base.system,
                           {**base.parameters, **self.parameters})

    def to_json(self) -> dict | None:
        return asdict(self) if self else None

    @classmethod
    def from_json(cls, data) -> "ModelConfig":
        if not isinstance(data, dict):
            return cls()
        return checked(data.get("template"), data.get("system"), data.get("parameters") or {})


@dataclass(frozen=True)
class Modelfile:
    source: str                 # FROM: a path, sha256:<hex>, or a store name
    config: ModelConfig


def checked(template, system, parameters) -> ModelConfig:
    """A ModelConfig from the JSON form's fields; ModelfileError for a value ramforge does not take."""
    for what, text in (("template", template), ("system", system)):
        if text is not None and (not isinstance(text, str) or len(text.encode("utf-8", "surrogatepass")) > MAX_MODELFILE):
            raise ModelfileError(f"{what} must be a string of at most {MAX_MODELFILE:,} bytes")
    if template and _GO_TEMPLATE.search(template):
        raise ModelfileError("TEMPLATE is a Go template (Ollama's {{ .Prompt }} syntax); ramforge renders Jinja chat "
                             "templates as in tokenizer.chat_template ({{ messages }}, {% for %}): give one, or leave "
                             "TEMPLATE out to use the GGUF's own")
    if template:
        import jinja2.sandbox

        try:
            jinja2.sandbox.ImmutableSandboxedEnvironment().parse(template)
        except jinja2.TemplateSyntaxError as e:
            raise ModelfileError(f"TEMPLATE is not a valid Jinja template: {e.message} (line {e.lineno})") from None
    if not isinstance(parameters, dict) or len(parameters) > MAX_PARAMETERS:
        raise ModelfileError(f"parameters must be an object of at most {MAX_PARAMETERS} names")
    out = {}
    for name, value in parameters.items():
        out[name] = _parameter(name, value)
    return ModelConfig(template or None, system or None, out)


def _parameter(name, value):
    kind = PARAMETERS.get(name)
    if kind is None:
        raise ModelfileError(f"PARAMETER {name!r} is not one ramforge takes; known: {', '.join(PARAMETERS)}")
    if kind is str:                                             # stop: one string or several
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v for v in values):
            raise ModelfileError(f"PARAMETER {name} {value!r}: expected non-empty strings")
        return list(values)
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if not math.isfinite(number) or (kind is int and number != int(number)):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise ModelfileError(f"PARAMETER {name} {value!r}: expected {'an integer' if kind is int else 'a number'}") from None
    return int(number) if kind is int else number


# ------------------------------------------------------------------------------- the Modelfile

def parse_modelfile(text: str) -> Modelfile:
    """FROM, PARAMETER, TEMPLATE, SYSTEM (Ollama's syntax: case-insensitive commands, `#` comments,
    \"\"\"triple-quoted\"\"\" or "quoted" values over several lines); anything else by name."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MODELFILE:
        raise ModelfileError(f"the Modelfile is over {MAX_MODELFILE:,} bytes")
    source, template, system, params = None, None, None, {}
    pos, line_no = 0, 1
    while pos < len(text):
        m = re.compile(r"[ \t]*(?:#[^\n]*)?\n|[ \t]*(\w+)[ \t]*").match(text, pos)
        if m is None or (m.group(1) is None and not m.group(0).endswith("\n")):
            break
        if m.group(1) is None:
            pos, line_no = m.end(), line_no + 1
            continue
        cmd, at = m.group(1).upper(), line_no
        value, pos = _value(text, m.end(), at)
        line_no += text.count("\n", m.start(), pos)
        if cmd in REFUSED:
            raise ModelfileError(f"Modelfile line {at}: {cmd} is not supported by ramforge (it takes {', '.join(COMMANDS)})")
        if cmd not in COMMANDS:
            raise ModelfileError(f"Modelfile line {at}: unknown command {m.group(1)!r} (ramforge takes {', '.join(COMMANDS)})")
        if cmd == "FROM":
            source = value.strip()
        elif cmd == "TEMPLATE":
            template = value
        elif cmd == "SYSTEM":
            system = value
        else:
            name, _, val = value.strip().partition(" ")
            val = val.strip()
            if len(val) >= 2 and val[0] == val[-1] == '"':      # PARAMETER stop "<|end|>": the quotes go
                val = val[1:-1].replace('\\"', '"')
            if not name or not val:
                raise ModelfileError(f"Modelfile line {at}: PARAMETER needs a name and a value")
            params[name] = [*params.get(name, []), val] if name == "stop" else val
    if not source:
        raise ModelfileError("the Modelfile has no FROM line (FROM ./model.gguf, or FROM a model's name)")
    return Modelfile(source, checked(template, system, params))


def _value(text: str, pos: int, line: int) -> tuple[str, int]:
    """A command's argument from pos: \"\"\"...\"\"\", "...", or the rest of the line; (value, end)."""
    for quote in ('"""', '"'):
        if text.startswith(quote, pos):
            end = text.find(quote, pos + len(quote))
            if end < 0:
                raise ModelfileError(f"Modelfile line {line}: unterminated {quote}")
            value = text[pos + len(quote):end]
            return (value.replace('\\"', '"') if quote == '"' else value), end + len(quote)
    end = text.find("\n", pos)
    end = len(text) if end < 0 else end
    return text[pos:end].rstrip(), end


# ------------------------------------------------------------------------------ store commands

def config_of(store: Store, name: str) -> ModelConfig:
    """The created-model config of a store name (empty for a pulled model, or no store name)."""
    m = store.find(name) if is_valid_name(name) else None
    return ModelConfig.from_json(m.config) if m is not None else ModelConfig()


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def import_file(store: Store, path: str | os.PathLike, progress=None) -> tuple[str, int]:
    """Copy a GGUF file into the store's blobs, hashed on the way; (hex digest, size)."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise NotGGUF(f"{path} is not a GGUF file; FROM takes a .gguf file")
    store._ensure()
    fd, tmp = tempfile.mkstemp(prefix=".create.", suffix=".tmp", dir=store.blobs)
    h, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
            total = os.fstat(src.fileno()).st_size
            while chunk := src.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
                if progress:
                    progress("copying", size, total)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, store.blob_path(h.hexdigest()))
        _fsync_dir(store.blobs)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return h.hexdigest(), size


def check_source(store: Store, source: str, allow_path=lambda p: True) -> tuple[str, str | Path]:
    """What FROM names, checked without copying anything: ("blob", hex), ("model", name) or ("file", path);
    BlobMissing / NotInStore (404), PathNotAllowed or ModelfileError (400) otherwise."""
    if source.lower().startswith("sha256:"):
        digest = source.strip().lower().removeprefix("sha256:")
        if not _HEX64.fullmatch(digest):
            raise ModelfileError(f"FROM {source!r}: a digest is sha256: and 64 hex digits")
        if not store.blob_path(digest).is_file():
            raise BlobMissing(f"blob sha256:{digest} is not in the store; upload it first (POST /api/blobs/sha256:{digest}, "
                              f"as `ollama create` does)")
        return "blob", digest
    if is_valid_name(source) and store.find(source) is not None:
        return "model", source
    path = Path(source).expanduser()
    if not path.is_file():
        if is_valid_name(source):
            raise NotInStore(source, store.root)
        raise ModelfileError(f"FROM {source!r} is neither a file, a blob digest nor a model in the store")
    allow_path(path)                                            # PathNotAllowed where a server may not read it
    return "file", path


def _import_split(store: Store, path: Path, allow_path, progress) -> tuple[str, int, tuple[Shard, ...]]:
    """FROM a shard of a split GGUF: its set, found and checked by the reader (gguf-split's names, counts,
    architecture), each shard copied into the blobs; (hex, size of shard 1, the other shards)."""
    prefix, _, count = split_prefix(str(path))
    for k in range(1, count + 1):                       # every shard's path allowed before a byte is read
        allow_path(Path(split_path(prefix, k, count)))
    with GGUFFile(path) as f:
        paths = f.paths
    got = []
    for k, p in enumerate(paths, 1):
        hx, size = import_file(store, p, progress and (lambda ph, d, t, k=k: progress(f"{ph} {k}/{len(paths)}", d, t)))
        got.append(Shard("", size, store.blob_path(hx).stat().st_mtime_ns, hx))
    return got[0].sha256, got[0].size, tuple(got[1:])


def create(store: Store, name: str, source: str, config: ModelConfig, *, allow_path=lambda p: True,
           progress=None) -> Manifest:
    """Create store model `name` FROM source (a GGUF path allow_path accepts: a shard brings its split set;
    `sha256:<hex>` of a blob in the store, or a store name) with config; the new manifest."""
    canon = normalize_name(name)
    store.manifest_path(canon)                                  # validated before any I/O
    base = ModelConfig()
    kind, what = check_source(store, source, allow_path)
    shards: tuple[Shard, ...] = ()
    if kind == "blob":
        blob = store.blob_path(what)
        with open(blob, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise NotGGUF(f"blob {source} is not a GGUF file; upload the model's .gguf")
        digest, size, origin, verified = what, blob.stat().st_size, f"blob:sha256:{what}", True
    elif kind == "model":                                       # its files shared (a split set, the HF cache's)
        m = store.get(what)
        new = replace(m, name=canon, pulled_at=_now(), config=config.over(ModelConfig.from_json(m.config)).to_json())
        return _replace_manifest(store, new)
    elif _SHARD.fullmatch(what.name):
        digest, size, shards = _import_split(store, what, allow_path, progress)
        origin, verified = f"file:{os.path.realpath(what)}", False
    else:
        digest, size = import_file(store, what, progress)
        origin, verified = f"file:{os.path.realpath(what)}", False
    m = Manifest(name=canon, digest=f"sha256:{digest}", size=size, source=origin, pulled_at=_now(),
                 verified=verified, mtime_ns=store.blob_path(digest).stat().st_mtime_ns, shards=shards,
                 config=config.over(base).to_json())
    if shards:
        store._check_split(m)
    return _replace_manifest(store, m)


def _replace_manifest(store: Store, m: Manifest) -> Manifest:
    """Write m, then collect the blobs of the manifest it replaces that nothing keeps now."""
    try:
        old = store.find(m.name)
    except CorruptManifest:
        old = None
    store._write_manifest(m)
    store._collect_all(old, m)
    return m


def copy(store: Store, source: str, destination: str) -> Manifest:
    """A second name for a store model (its blob and config shared); NotInStore for an unknown source."""
    m = store.get(source)
    return _replace_manifest(store, replace(m, name=normalize_name(destination), pulled_at=_now()))


