"""LLVM IR builders for the kernels' intrinsics: pointers, splats, lane shuffles, integer dots, fma,
horizontal sums and the exact f16 -> f32 widening. Plain Python over llvmlite (no numba objects):
the @intrinsic codegens of scalars.py, codegen.py, unpack.py, fmatmul.py and ops.py call these.

The target checks (`has_vnni`, `native_half`) read the compile target's features, which numba's
cache keys on; RAMFORGE_NO_VNNI is part of the kernel cache directory's name (ramforge/paths.py).
"""
from __future__ import annotations

from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils

from .. import flags

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()


def ptr(context, builder, arrty, arr, off, vt):
    """A `vt *` to element `off` of numba array `arr` (of numba type arrty)."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [off]), vt.as_pointer())


def splat(builder, val, vt):
    """Scalar `val` (truncated or sign-extended to vt's element) in every lane of vector type vt."""
    if isinstance(val.type, ir.IntType) and val.type.width > vt.element.width:
        val = builder.trunc(val, vt.element)
    elif isinstance(val.type, ir.IntType) and val.type.width < vt.element.width:
        val = builder.sext(val, vt.element)
    undef = ir.Constant(vt, ir.Undefined)
    v0 = builder.insert_element(undef, val, ir.Constant(I32, 0))
    return builder.shuffle_vector(v0, undef, ir.Constant(ir.VectorType(I32, vt.count), [0] * vt.count))


def dtypes_are(arrays, dtypes) -> bool:
    """Typing guard: each argument is a C-contiguous array of the given dtype (the IR reads raw memory)."""
    return all(isinstance(a, types.Array) and a.dtype == d and a.layout == "C" for a, d in zip(arrays, dtypes))


def pick(builder, v, idx):
    """The lanes idx of vector v, as a vector of len(idx)."""
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, len(idx)), idx))


def pair_lanes(builder, v):
    """<2n x i32> -> <n x i32>, lane l = v[2l] + v[2l+1] (madd_epi16's pairing)."""
    n = v.type.count
    return builder.add(pick(builder, v, list(range(0, n, 2))), pick(builder, v, list(range(1, n, 2))))


def quad_lanes(builder, p):
    """<32 x i32> products -> <8 x i32>, lane l = p[4l] + ... + p[4l+3]: the lanes of llama.cpp's
    x86 dots (maddubs + madd, or dpbusd), built as pair sums first (LLVM makes them pmaddwd)."""
    return pair_lanes(builder, pair_lanes(builder, p))


def reduce_add(builder, v):
    """The sum of the lanes of an integer vector (exact: any order)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type.element, [v.type]),
                                        f"llvm.vector.reduce.add.v{v.type.count}i{v.type.element.width}")
    return builder.call(fn, [v])


def _features(context) -> set[str]:
    return set((getattr(context.codegen(), "_tm_features", "") or "").split(","))


def has_vnni(context) -> bool:
    """Whether the compile target has 256-bit VNNI (AVX512-VNNI with VL, or AVX-VNNI): vpdpbusd.
    RAMFORGE_NO_VNNI=1 compiles the generic IR instead (a code switch: part of the cache key)."""
    if flags.NO_VNNI.get():
        return False
    f = _features(context)
    return llvm.get_process_triple().startswith("x86_64") and (
        {"+avx512vnni", "+avx512vl"} <= f or "+avxvnni" in f)


def has_avx2(context) -> bool:
    """Whether the compile target is x86 with AVX2 (its 256-bit byte intrinsics, e.g. vpavgb)."""
    return llvm.get_process_triple().startswith("x86_64") and "+avx2" in _features(context)


def avx2_only(context) -> bool:
    """Whether the integer dots take AVX2's pmaddubsw + pmaddwd: x86 with AVX2 and without VNNI."""
    return has_avx2(context) and not has_vnni(context)


def has_avx512_vnni(context) -> bool:
    """Whether the compile target has 512-bit byte and VNNI ops (AVX512BW + AVX512-VNNI): vpmaddubsw
    and vpdpwssd on 64 bytes. RAMFORGE_NO_VNNI=1 turns this off too."""
    return has_vnni(context) and {"+avx512bw", "+avx512vnni"} <= _features(context)


def target_has_512() -> bool:
    """Whether numba's CPU target (the host, unless NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise)
    has 512-bit byte vectors (AVX512BW): 32 vector registers of 16 lanes, for load-time layout choices."""
    from numba.core.registry import cpu_target  # noqa: PLC0415 (the target context, made on first use)

    return "+avx512bw" in _features(cpu_target.target_context)


def target_native_half() -> bool:
    """native_half (below) of numba's CPU target, for a choice made in Python before a kernel is called."""
    from numba.core.registry import cpu_target  # noqa: PLC0415 (the target context, made on first use)

    return native_half(cpu_target.target_context)


def native_half(context) -> bool:
    """Whether the compile target widens half natively (x86 F16C, AArch64): elsewhere `fpext half`
    becomes a libcall (__extendhfsf2) that numba's JIT does not resolve. Numba keys its cache on
    the target CPU and features, so the choice is consistent per cache entry."""
    triple = llvm.get_process_triple()
    if triple.startswith(("x86_64", "i386", "i686")):
        return "+f16c" in _features(context)
    return triple.startswith(("aarch64", "arm64"))


def _avx2_pieces(builder, name, ret, args):
    """The AVX2 intrinsic `name` (256-bit operands, result `ret` per piece) over operands of any
    multiple of 256 bits: each 256-bit piece on its own, the results concatenated in order."""
    per = 256 // args[0].type.element.width
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [ir.VectorType(a.type.element, per)
                                                                             for a in args]), name)
    outs = [builder.call(fn, [pick(builder, a, list(range(k * per, k * per + per))) if a.type.count > per else a
                              for a in args]) for k in range(args[0].type.count // per)]
    while len(outs) > 1:
        n = outs[0].type.count
        outs = [builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))
                for x, y in zip(outs[0::2], outs[1::2])]
    return outs[0]


def maddubs(builder, u, s):
    """<32k x i8> u (unsigned) . s (signed) -> <16k x i16>, lane l = u[2l]*s[2l] + u[2l+1]*s[2l+1]:
    pmaddubsw, which saturates: exact only where 2 * max|u| * max|s| <= 32767 (callers see to it)."""
    return _avx2_pieces(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(I16, 16), [u, s])


def maddwd(builder, a, b=None):
    """<16k x i16> a . b (ones where b is None) -> <8k x i32>, lane l = a[2l]*b[2l] + a[2l+1]*b[2l+1]: pmaddwd
    (exact but for the pair (-32768)^2 + (-32768)^2, which no caller makes)."""
    if b is None:
        b = ir.Constant(a.type, [1] * a.type.count)
    return _avx2_pieces(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(I32, 8), [a, b])


def quad_dot_avx2(builder, acc, u, s):
    """acc <k x i32> + per lane the 4 products of u (u8) and s (s8) (<4k x i8>), as vpdpbusd computes it,
    on AVX2: pmaddubsw then pmaddwd by ones. Exact where 2 * max|u| * max|s| <= 32767 (maddubs)."""
    return builder.add(acc, maddwd(builder, maddubs(builder, u, s)))


def sign_split(builder, w, a):
    """(|w| as u8, a * sign(w)) for signed bytes w, a: pmaddubsw's operands of the signed products w*a
    (llama.cpp's AVX2 trick; |w| <= 128 and |a| <= 127 keep its pairs from saturating)."""
    zero = ir.Constant(w.type, [0] * w.type.count)
    neg = builder.icmp_signed("<", w, zero)
    return builder.select(neg, builder.sub(zero, w), w), builder.select(neg, builder.sub(zero, a), a)


def dot_lanes(context, builder, w, a, unsigned=False):
    """<32 x i8> weights . <32 x i8> activations -> <8 x i32>, lane l = sum of products 4l..4l+3:
    one vpdpbusd where the target has VNNI, of w itself when the weights are `unsigned` (0..127),
    else of |w| (u8) and a signed as w (exact: |a| <= 127, as llama.cpp's quantizers make it); the
    same operands through pmaddubsw and pmaddwd on AVX2 alone; elsewhere the products as quad_lanes."""
    if not has_vnni(context):
        if has_avx2(context):
            return quad_dot_avx2(builder, ir.Constant(ir.VectorType(I32, 8), [0] * 8),
                                 *((w, a) if unsigned else sign_split(builder, w, a)))
        wt = ir.VectorType(I32, 32)
        return quad_lanes(builder, builder.mul(builder.sext(w, wt), builder.sext(a, wt)))
    v32, l8 = ir.VectorType(I8, 32), ir.VectorType(I32, 8)
    zero = ir.Constant(v32, [0] * 32)
    if unsigned:
        aw, sa = w, a
    else:
        neg = builder.icmp_signed("<", w, zero)
        aw = builder.select(neg, builder.sub(zero, w), w)           # |w|, -128 -> 0x80 = 128 as u8
        sa = builder.select(neg, builder.sub(zero, a), a)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(l8, [l8, v32, v32]),
                                        "llvm.x86.avx512.vpdpbusd.256")
    return builder.call(fn, [ir.Constant(l8, [0] * 8), aw, sa])


def scale16(builder, s0, s1=None):
    """<16 x i16> sub-block scales for dot_lanes_scaled: scalar s0 in every lane, or s0 in lanes 0-7
    and s1 in 8-15 (two 16-element sub-blocks of a 32-element chunk: its lanes 0-3 / 4-7)."""
    v16 = ir.VectorType(I16, 16)
    a = splat(builder, s0, v16)
    if s1 is None:
        return a
    return builder.shuffle_vector(a, splat(builder, s1, v16), ir.Constant(ir.VectorType(I32, 16),
                                                                          list(range(8)) + list(range(24, 32))))


def dot_lanes_scaled(context, builder, acc, w, a, unsigned, sc16, sc32):
    """acc + dot_lanes(w, a) * scale, lane by lane (exact integers): on x86 with AVX2 as llama.cpp's
    K-quant dots, pmaddubsw (pairs of |w| u8 * a i8 as i16: |w| <= 128, |a| <= 127, no saturation)
    then the pairs times the i16 scales sc16 summed into i32 lanes (vpdpwssd into acc with VNNI,
    else pmaddwd and an add); elsewhere dot_lanes times sc32 (<8 x i32>)."""
    if not has_avx2(context):
        return builder.add(acc, builder.mul(dot_lanes(context, builder, w, a, unsigned), sc32))
    v32, v16, l8 = ir.VectorType(I8, 32), ir.VectorType(I16, 16), ir.VectorType(I32, 8)
    if unsigned:
        aw, sa = w, a
    else:
        zero = ir.Constant(v32, [0] * 32)
        neg = builder.icmp_signed("<", w, zero)
        aw = builder.select(neg, builder.sub(zero, w), w)
        sa = builder.select(neg, builder.sub(zero, a), a)
    ub = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v32, v32]), "llvm.x86.avx2.pmadd.ub.sw")
    p16 = builder.call(ub, [aw, sa])
    if has_vnni(context):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(l8, [l8, v16, v16]),
                                            "llvm.x86.avx512.vpdpwssd.256")
        return builder.call(fn, [acc, p16, sc16])
    wd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(l8, [v16, v16]), "llvm.x86.avx2.pmadd.wd")
    return builder.add(acc, builder.call(wd, [p16, sc16]))


def dot64_scaled(builder, acc, w, a, sc):
    """<16 x i32> acc + per lane l the products 4l..4l+3 of <64 x i8> weights w (unsigned, <= 127) and
    activations a, times the <32 x i16> scales sc (one per pair of products): vpmaddubsw then vpdpwssd,
    on 512 bits (has_avx512_vnni)."""
    v64, v32, l16 = ir.VectorType(I8, 64), ir.VectorType(I16, 32), ir.VectorType(I32, 16)
    ub = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v64, v64]),
                                        "llvm.x86.avx512.pmaddubs.w.512")
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(l16, [l16, v32, v32]),
                                        "llvm.x86.avx512.vpdpwssd.512")
    return builder.call(fn, [acc, builder.call(ub, [w, a]), sc])


def target_cpu_name() -> str:
    """The CPU numba compiles for (NUMBA_CPU_NAME, else the host's, as LLVM names it: znver5, rocketlake, ...),
    which numba's cache keys on (its codegen's magic tuple)."""
    from numba.core import config  # noqa: PLC0415

    return config.CPU_NAME if config.CPU_NAME not in (None, "host") else llvm.get_host_cpu_name()


def prefetch_locality() -> int:
    """llvm.prefetch's locality for streamed weights: 3 (prefetcht0, into L1) on AMD's cores, 2 (prefetcht1,
    into L2) elsewhere. A 3B Q4_K_M decode token on 2 cores: AMD Zen 5 was fastest with L1; on an Intel
    Xeon (LLVM's `rocketlake`) L1 took 103 ms, no prefetch 94, L2 82 (any distance 4-32 KiB), NTA 154."""
    return 3 if target_cpu_name().startswith(("znver", "bdver", "btver", "amdfam")) else 2


def prefetch(builder, p, nbytes, ahead):
    """Prefetch (read; prefetch_locality's level) the nbytes at i8* p + ahead, a cache line a call: the
    hardware prefetcher alone leaves a core streaming weights waiting on memory."""
    ty = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, ty, "llvm.prefetch.p0")
    level = ir.Constant(I32, prefetch_locality())
    for o in range(0, nbytes, 64):
        builder.call(fn, [builder.gep(p, [ir.Constant(I64, ahead + o)]), ir.Constant(I32, 0), level,
                          ir.Constant(I32, 1)])


def hsum8(builder, v):
    """llama.cpp's hsum_float_8 of <8 x float>: ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))."""
    t = builder.fadd(pick(builder, v, [4, 5, 6, 7]), pick(builder, v, [0, 1, 2, 3]))
    u = builder.fadd(t, pick(builder, t, [2, 3, 2, 3]))
    u0, u1 = (builder.extract_element(u, ir.Constant(I32, i)) for i in (0, 1))
    return builder.fadd(u0, u1)


def fma_fn(builder, ty):
    """llvm.fma of float or <n x float> `ty`: a * b + c with one rounding."""
    name = f"llvm.fma.v{ty.count}f32" if isinstance(ty, ir.VectorType) else "llvm.fma.f32"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]), name)


def half_to_float(context, builder, h, native=None):
    """IEEE binary16 bits (i16, or <n x i16>) -> float (<n x float>) exactly: `fpext half` where the
    target widens half natively (`native` None: ask the target), else integer ops (normal, inf/nan
    with its payload kept as numpy keeps it, subnormal by one exact multiply by 2^-24)."""
    vec = isinstance(h.type, ir.VectorType)
    n = h.type.count if vec else 1
    wrap = (lambda t: ir.VectorType(t, n)) if vec else (lambda t: t)  # noqa: E731
    if native_half(context) if native is None else native:
        return builder.fpext(builder.bitcast(h, wrap(ir.HalfType())), wrap(F32))
    ti, tf = wrap(I32), wrap(F32)
    c = (lambda v: ir.Constant(ti, [v] * n)) if vec else (lambda v: ir.Constant(ti, v))  # noqa: E731
    x = builder.zext(h, ti)
    sign = builder.shl(builder.and_(x, c(0x8000)), c(16))
    e = builder.and_(builder.lshr(x, c(10)), c(31))
    m = builder.and_(x, c(0x3FF))
    m13 = builder.shl(m, c(13))
    bits = builder.or_(builder.shl(builder.add(e, c(112)), c(23)), m13)
    bits = builder.select(builder.icmp_unsigned("==", e, c(31)), builder.or_(c(0x7F800000), m13), bits)
    two_m24 = ir.Constant(tf, [2.0 ** -24] * n) if vec else ir.Constant(tf, 2.0 ** -24)
    sub = builder.fmul(builder.uitofp(m, tf), two_m24)
    bits = builder.select(builder.icmp_unsigned("==", e, c(0)), builder.bitcast(sub, ti), bits)
    return builder.bitcast(builder.or_(bits, sign), tf)
