"""Numba kernels, bit-exact with llama.cpp's CPU backend. Layers, each importing only those above it:

  llvmir.py     LLVM IR builders (pointers, splats, lanes, integer dots, fma, exact f16 widening)
  scalars.py    bit-level scalars: u16/u32/f16/f32 reads, f32 -> f16 rounding, fma
  blocks.py     the block layouts and their scale / quant decoders (one copy)
  naming.py     distinct symbol names for factory-made kernels (made_for), stable cache keys for closures
  lowbit_tables.py   MXFP4 / TQ / IQ1 tables (kvalues, E8M0, iq1s grid)   lowbit_ir.py   their packed-row IR
  lowbit.py     MXFP4, TQ1_0, IQ1_S, IQ1_M dequantization and row unpackers
  variants.py   the named arithmetic variants of the integer dots (enums) and QDot
  batch.py      the batch a computation belongs to (llama.cpp picks arithmetic by batch size)
  decode.py     dequantization kernels, per type      unpack.py   row unpackers of the integer dots
  rowdot.py     the IR of a row dot, per variant     codegen.py   packed-row sources, 8 rows at once
  rows.py       the row dots' intrinsics and plain twin
  quantize.py   activation quantization (Q8_0 / Q8_1 / Q8_K)
  registry.py   the one table of executable types and their kernels
  dequant.py    dequantize()       qmatmul.py   qmatmul()      fmatmul.py   float matmul
  matmul.py     matmul(): routing; the float reference    ops.py   RMSNorm, RoPE, attention, GLUs
"""
from .naming import stable_cache_keys as _stable_cache_keys

_stable_cache_keys()        # before any kernel is looked up in numba's disk cache
