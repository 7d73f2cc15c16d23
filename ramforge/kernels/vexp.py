"""ggml's vector exp (ggml_v_expf, its AVX-512 form) on 16 lanes in LLVM IR, and the two loops that
spend it: SwiGLU's silu (ggml_vec_swiglu_f32) and softmax's exp-and-sum (ggml_vec_soft_max_f32).

Lane for lane the same float steps as the scalar ops._expf (which the tests compare it with, bit for
bit): n = round(x*log2 e) by the 1.5*2^23 trick, b = x - n*ln2 in two fmas, a degree-5 polynomial j,
then scalef(j, n) = j * 2^n rounded once: in double (exact), narrowed to float (the one rounding,
subnormals included); |n| > 192 gives 0 (n <= 0) or inf, NaN stays NaN. No libm call, no branch: the
scalar form's ldexp made every exp a call (~20 ns), a third of a 128-token prefill's attention.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvmir import F32, I32, I64, fma_fn, pick

W = 16                                   # lanes
_V = ir.VectorType(F32, W)
_D = ir.VectorType(ir.DoubleType(), W)
_L = ir.VectorType(I64, W)
_C = tuple(float.fromhex(h) for h in ("0x1.8p23", "0x1.715476p+0", "0x1.62e4p-1", "0x1.7f7d1cp-20", "0x1.0e4020p-7",
                                       "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1"))


def _k(v, ty=_V):
    return ir.Constant(ty, [v] * ty.count)


def exp16(builder, x):
    """<16 x float> exp(x), ggml_v_expf lane by lane."""
    r, l2e, ln2_hi, ln2_lo, c5, c4, c3, c2, c1 = (_k(c) for c in _C)
    fma = fma_fn(builder, _V)

    def f(a, b, c):
        return builder.call(fma, [a, b, c])
    n = builder.fsub(f(x, l2e, r), r)
    nn = builder.fneg(n)
    b = f(nn, ln2_lo, f(nn, ln2_hi, x))
    u = builder.fmul(b, b)
    j = f(f(f(c5, b, c4), u, f(c3, b, c2)), u, f(c1, b, _k(1.0)))
    an = builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V]), "llvm.fabs.v16f32"),
                      [n])
    big = builder.fcmp_ordered(">", an, _k(192.0))
    ok = builder.fcmp_ordered("<=", an, _k(192.0))           # false for NaN (j is NaN then too)
    ni = builder.fptosi(builder.select(ok, n, _k(0.0)), _L)  # integral already; in [-192, 192]
    p2 = builder.bitcast(builder.shl(builder.add(ni, _k(1023, _L)), _k(52, _L)), _D)      # 2^n, exact
    res = builder.fptrunc(builder.fmul(builder.fpext(j, _D), p2), _V)
    alt = builder.select(builder.fcmp_ordered("<=", n, _k(0.0)), _k(0.0), _k(float("inf")))
    return builder.select(big, alt, res)


def reduce16(builder, v):
    """_mm512_reduce_add_ps's order: halves added (8), (4), then ((c0 + c2) + (c1 + c3))."""
    a = builder.fadd(pick(builder, v, list(range(8))), pick(builder, v, list(range(8, 16))))
    c = builder.fadd(pick(builder, a, [0, 1, 2, 3]), pick(builder, a, [4, 5, 6, 7]))
    d = builder.fadd(pick(builder, c, [0, 1]), pick(builder, c, [2, 3]))
    return builder.fadd(builder.extract_element(d, ir.Constant(I32, 0)), builder.extract_element(d, ir.Constant(I32, 1)))


def _at(context, builder, ty, arr, off):
    a = context.make_array(ty)(context, builder, arr)
    return builder.bitcast(builder.gep(a.data, [off]), _V.as_pointer())


@intrinsic
def _swiglu16(typingctx, out, oo, gate, go, up, uo):
    """out[oo:oo+16] = (g / (1 + exp(0 - g))) * u for g = gate[go:go+16], u = up[uo:uo+16] (f32, 1-D)."""
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 for a in (out, gate, up)):
        return None

    def codegen(context, builder, sig, args):
        o_, oo_, g_, go_, u_, uo_ = args
        g = builder.load(_at(context, builder, sig.args[2], g_, go_), align=4)
        u = builder.load(_at(context, builder, sig.args[4], u_, uo_), align=4)
        e = exp16(builder, builder.fsub(_k(0.0), g))
        y = builder.fmul(builder.fdiv(g, builder.fadd(_k(1.0), e)), u)
        builder.store(y, _at(context, builder, sig.args[0], o_, oo_), align=4)
        return context.get_dummy_value()
    return types.void(out, oo, gate, go, up, uo), codegen


@intrinsic
def _exp_sub16(typingctx, s, so, mx):
    """s[so:so+16] = exp(s - mx) in place (f32, 1-D); returns their sum in _mm512_reduce_add_ps's order."""
    if not (isinstance(s, types.Array) and s.dtype == types.float32 and mx == types.float32):
        return None

    def codegen(context, builder, sig, args):
        s_, so_, mx_ = args
        p = _at(context, builder, sig.args[0], s_, so_)
        m = builder.shuffle_vector(builder.insert_element(ir.Constant(_V, ir.Undefined), mx_, ir.Constant(I32, 0)),
                                   ir.Constant(_V, ir.Undefined), ir.Constant(ir.VectorType(I32, W), [0] * W))
        e = exp16(builder, builder.fsub(builder.load(p, align=4), m))
        builder.store(e, p, align=4)
        return reduce16(builder, e)
    return types.float32(s, so, mx), codegen
