"""Bit-exact dequantization of ggml blocks to float32: the validating entry point.

`dequantize` checks its arguments and runs the registry's kernel for the type (kernels.decode,
bit-exact against gguf-py's `gguf.quants.dequantize`).
"""
from __future__ import annotations

import numpy as np

from ramforge.errors import RamforgeError
from ramforge.gguf.constants import GGML_BLOCK

from .registry import kernels_for


class DequantError(RamforgeError, ValueError):
    """Arguments to `dequantize` do not describe a whole, in-bounds run of blocks."""


def dequantize(ggml_type, raw: np.ndarray, n_elements: int | None = None, first_block: int = 0,
               n_blocks: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Decode blocks [first_block, first_block + n_blocks) of a packed tensor to float32.

    raw: uint8 array holding whole blocks (any shape; flattened). n_elements, when given, is the
    element count `raw` must hold exactly. out: optional float32 C-contiguous destination of
    n_blocks * block_elems elements. Returns float32[n_blocks * block_elems].
    Raises UnsupportedType for a type without kernels, DequantError for bad sizes or ranges.
    """
    k = kernels_for(ggml_type)
    t = k.ggml_type
    be, bb = GGML_BLOCK[t]
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
        got = raw.dtype if isinstance(raw, np.ndarray) else type(raw).__name__
        raise DequantError(f"{t.name} raw data must be a uint8 numpy array, got {got}")
    raw = np.ascontiguousarray(raw).reshape(-1)
    total, rem = divmod(raw.size, bb)
    if rem:
        raise DequantError(f"{t.name} raw data of {raw.size:,} B is not a whole number of blocks of {bb} B "
                           f"({total:,} blocks + {rem} B)")
    if n_elements is not None:
        if n_elements < 0 or n_elements % be:
            raise DequantError(f"{t.name} n_elements = {n_elements:,} is not a whole number of blocks "
                               f"of {be} elements")
        if n_elements // be != total:
            raise DequantError(f"{t.name} n_elements = {n_elements:,} needs {n_elements // be * bb:,} B "
                               f"but raw data has {raw.size:,} B")
    first_block = int(first_block)
    n_blocks = total - first_block if n_blocks is None else int(n_blocks)
    if first_block < 0 or n_blocks < 0 or first_block + n_blocks > total:
        raise DequantError(f"{t.name} block span [{first_block:,}, {first_block + n_blocks:,}) is out of "
                           f"range for {total:,} blocks")
    n_out = n_blocks * be
    if out is None:
        out = np.empty(n_out, dtype=np.float32)
    elif (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.ndim != 1
          or not out.flags.c_contiguous or not out.flags.writeable or out.size != n_out):
        desc = (f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__)
        raise DequantError(f"{t.name} out must be a writable contiguous float32[{n_out:,}], got {desc}")
    if n_blocks:
        k.dequant(out, raw, first_block, n_blocks)
    return out
