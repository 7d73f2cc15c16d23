"""LLVM IR of the packed-row sources of TQ1_0, IQ1_S and IQ1_M (codegen._raw_source): each 32-element
chunk of a row's blocks built in registers, byte for byte as their unpackers (lowbit.py) build it in
memory, so that one-token matmuls dot the packed rows without unpacking them first.

  TQ1_0  digit n of byte q: ((q * 3^n mod 256) * 3) >> 8 (0..2; in byte ops as llama.cpp computes
         it), in element order: chunks 0-4 are
         digit c of bytes 0..31; chunk 5 digits 0, 1 of bytes 32..47; chunk 6 digits 2, 3; chunk 7
         digit 4 of bytes 32..47, then digit i // 4 of qh byte i % 4.
  IQ1_*  four 8-byte rows of grid + 1 (0..2), one per group of 8, from a global table of 2048
         u64 (lowbit_tables.IQ1_U64); the delta8 terms apart (codegen: IQ1_S from the bsums and
         its signed scales, IQ1_M per lane of 4 from the activation's sums).
The float scales come from the row's scratch p["wd"], p["wm"] (blocks._row_scales, per row).
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from ramforge.gguf.constants import GGMLType

from .blocks import LAYOUTS
from .llvmir import I8, I16, I32, I64, has_avx2
from .lowbit_tables import IQ1_U64, POW3
from .rowdot import RowSource

_IQ1_TABLE = "ramforge_iq1_grid1"


def _block_ptr(builder, rp, nbytes):
    def at(b, off, ty):
        q = builder.gep(rp, [builder.add(builder.mul(b, ir.Constant(I64, nbytes)), ir.Constant(I64, off))])
        return builder.load(builder.bitcast(q, ty.as_pointer()), align=1)
    return at


def _scales(builder, p):
    return (lambda b: builder.load(builder.gep(p["wd"], [b])),
            lambda b: builder.load(builder.gep(p["wm"], [b])))           # (w_d, w_m of a RowSource)


def tq1_0_chunks(context, builder, rp):
    """w_vec(b, e, c) of TQ1_0 blocks at rp (i8*): chunk c of block b as <32 x i8> digits 0..2."""
    L = LAYOUTS[GGMLType.TQ1_0]
    at = _block_ptr(builder, rp, L.nbytes)
    x86 = has_avx2(context)

    def digits(v, mults):
        # ((v * mult mod 256) * 3) >> 8 per byte, mults a list of len(v) multipliers, in byte ops as
        # llama.cpp's vec_dot: q' = q -sat 1, (q' + avg(q', 0) + 1) >> 1 (vpavgb twice), >> 6 (equal
        # for every byte and digit: the vector and portable unpackers are compared on random bytes)
        n = v.type.count
        vt, wt = ir.VectorType(I8, n), ir.VectorType(I16, n)
        if len(set(mults)) == 1:                  # v * 3^k as k steps of x + x + x (byte adds)
            q = v
            for _ in range(POW3.index(mults[0])):
                q = builder.add(builder.add(q, q), q)
        else:
            q = builder.mul(v, ir.Constant(vt, [m & 0xFF for m in mults]))
        usub = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]), f"llvm.usub.sat.v{n}i8")
        q = builder.call(usub, [q, ir.Constant(vt, [1] * n)])

        def avg(a, b):                        # (a + b + 1) >> 1 without overflow: vpavgb where x86 has it
            if x86:
                name = "llvm.x86.avx2.pavg.b" if n == 32 else "llvm.x86.sse2.pavg.b"
                return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]),
                                                                   name), [a, b])
            s = builder.add(builder.add(builder.zext(a, wt), builder.zext(b, wt)), ir.Constant(wt, [1] * n))
            return builder.trunc(builder.lshr(s, ir.Constant(wt, [1] * n)), vt)
        r = avg(q, avg(q, ir.Constant(vt, [0] * n)))
        return builder.lshr(r, ir.Constant(vt, [6] * n))

    def join(lo, hi):
        return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))

    def w_vec(b, e, c):
        if c < 5:
            return digits(at(b, L.qs, ir.VectorType(I8, 32)), [POW3[c]] * 32)
        v16 = at(b, L.qs + 32, ir.VectorType(I8, 16))
        if c < 7:
            return join(digits(v16, [POW3[2 * c - 10]] * 16), digits(v16, [POW3[2 * c - 9]] * 16))
        qh = builder.bitcast(at(b, L.qh, I32), ir.VectorType(I8, 4))
        qh16 = builder.shuffle_vector(qh, qh, ir.Constant(ir.VectorType(I32, 16), [i % 4 for i in range(16)]))
        return join(digits(v16, [POW3[4]] * 16), digits(qh16, [POW3[i // 4] for i in range(16)]))
    return w_vec


def _tq1_0_source(context, builder, rp, p):
    return RowSource(*_scales(builder, p), tq1_0_chunks(context, builder, rp))


def _iq1_table(builder):
    mod = builder.module
    g = mod.globals.get(_IQ1_TABLE)
    if g is None:
        ty = ir.ArrayType(I64, len(IQ1_U64))
        g = cgutils.global_constant(mod, _IQ1_TABLE, ir.Constant(ty, [int(v) for v in IQ1_U64]))
    return g


def _iq1_source(m_type):
    """IQ1_S / IQ1_M packed: w_vec gives grid + 1 (unsigned; codegen subtracts the activation's sums
    per lane of 4); IQ1_M adds delta(b, c, ones): its delta8 lanes, +-ones by each group's sign bit.
    (IQ1_S's delta sums come from the bsums and the signed scales in imn, blocks._scales_fn.)"""
    t = GGMLType.IQ1_M if m_type else GGMLType.IQ1_S
    L = LAYOUTS[t]

    def source(context, builder, rp, p):
        at = _block_ptr(builder, rp, L.nbytes)
        table = _iq1_table(builder)

        def k(v):
            return ir.Constant(I64, v)

        def w_vec(b, e, c):                     # chunk c = the 4 groups 4c .. 4c+3
            v = ir.Constant(ir.VectorType(I64, 4), ir.Undefined)
            hw = builder.zext(at(b, L.qh + 2 * c, I16), I64)    # IQ1_S: the qh word; IQ1_M: 2 qh bytes
            for lg in range(4):
                idx = builder.zext(at(b, L.qs + 4 * c + lg, I8), I64)
                shift = 4 * lg if m_type else 3 * lg
                hi = builder.shl(builder.and_(builder.lshr(hw, k(shift)), k(7)), k(8))
                row = builder.load(builder.gep(table, [ir.Constant(I32, 0), builder.or_(idx, hi)]))
                v = builder.insert_element(v, row, ir.Constant(I32, lg))
            return builder.bitcast(v, ir.VectorType(I8, 32))

        def delta(b, c, ones):                  # lanes 2g, 2g+1: group g's sign, bit 4g + 3 of the 2 bytes
            l8 = ir.VectorType(I32, 8)
            hw = builder.zext(at(b, L.qh + 2 * c, I16), I32)
            hv = builder.insert_element(ir.Constant(l8, ir.Undefined), hw, ir.Constant(I32, 0))
            hv = builder.shuffle_vector(hv, hv, ir.Constant(l8, [0] * 8))
            bits = builder.and_(builder.lshr(hv, ir.Constant(l8, [4 * (i // 2) + 3 for i in range(8)])),
                                ir.Constant(l8, [1] * 8))
            neg = builder.icmp_unsigned("!=", bits, ir.Constant(l8, [0] * 8))
            return builder.select(neg, builder.sub(ir.Constant(l8, [0] * 8), ones), ones)
        return RowSource(*_scales(builder, p), w_vec, iq1_delta=delta if m_type else True)
    return source


RAW_SOURCES = {GGMLType.TQ1_0: _tq1_0_source, GGMLType.IQ1_S: _iq1_source(False),
               GGMLType.IQ1_M: _iq1_source(True)}
