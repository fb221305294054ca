"""The LSTM recurrence of one direction as one native function: the time loop, the per-step product
(``small_gemm``'s register-tiled kernel, inline) and the gate math fused into one pass over each
step's (B, 4H) block.

``forward_ir`` and ``backward_ir`` generate the functions of ``recurrence_numpy.lstm_forward`` and
``lstm_backward`` (same arrays, same formulas up to float rounding: the sigmoid here is mathlib's,
not ``0.5 tanh(z / 2) + 0.5``, and the products sum in their own order) for one dtype and hidden
size; the number of steps and the batch are arguments, so one compile serves every sequence. Each
has the signature ``void f(i64 *params)``: ``params`` holds the sizes, the arrays' addresses and
their strides in elements (``FORWARD``/``BACKWARD`` name the slots).

Per step, forward: ``step = h @ W_hh^T`` (into a contiguous scratch row block; ``W_hh^T`` comes
row-major, (H, 4H)), then for each element the four gates' pre-activations ``step + (gx[t] + bias)``,
their activations (written into ``A[t]``), ``c``, ``tanh(c)`` and ``h``. ``gx`` is the input
projection where it lies (``rnn_scan``'s, which the kernel would otherwise copy into ``A`` with the
bias added first: a strided pass over (T, B, 4H)), or ``A`` itself and a zero bias. Backward, from the last
step: one pass gives ``dz[t]`` and carries ``dc`` (and copies ``dH[t-1]`` into ``dh``, zeros at
step 0), then ``dh += dz[t] @ W_hh``.

The products were calls of numpy's OpenBLAS ``cblas_?gemm``, one per step. Kiln's own kernel, the
recurrence alone (H=128, B=16, T=35, float32, one thread, medians of 300 calls, each tree in its own
process, alternating, twice, on the shared 2-core AMD EPYC): forward 0.90/0.89 -> 0.45/0.41 ms,
backward 0.82/0.83 -> 0.34/0.32 ms. OpenBLAS runs its AVX2 kernels there (``OPENBLAS_CORETYPE=Haswell``
in the environment) and pays its per-call work 35 times; LLVM targets the host's AVX-512.
"""

from __future__ import annotations

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ...ir.primitives.linalg import padded_row_length
from ..core import Scalar
from ..mathlib import call as math_call
from .core import LLVMCore, register_type
from .loops import I64, for_range, i64
from .small_gemm import emit_product

#: The forward's rows of ``rnn_scan``'s packed output besides the states (written where ``packed`` is 1):
#: the states before each step, and the final states in the last step's row, zeros in the others.
PACKED = ("prev_h", "prev_c", "final_h", "final_c")
#: The i64 slots of ``params``: sizes, then per array its address and its step (t) and row (b)
#: strides in elements; the inner (G, H) or (H,) block of a row is contiguous.
FORWARD = ("steps", "batch", "gx", "gx_t", "gx_b", "bias", "a", "a_t", "a_b", "h0", "h0_t", "h0_b", "c0", "c0_t", "c0_b", "hs", "hs_t", "hs_b",
           "cs", "cs_t", "cs_b", "tanh_c", "tanh_c_t", "tanh_c_b", "w_hh_t", "step", "packed",
           *(f"{name}{suffix}" for name in PACKED for suffix in ("", "_t", "_b")))  # fmt: skip
BACKWARD = ("steps", "batch", "a", "a_t", "a_b", "c_prev", "c_prev_t", "c_prev_b", "tanh_c", "tanh_c_t",
            "tanh_c_b", "d_h", "d_h_t", "d_h_b", "d_c", "d_c_t", "d_c_b", "e_a", "e_a_t", "e_a_b", "dz", "dz_t",
            "dz_b", "w_hh", "dh", "dc")  # fmt: skip

_POINTER = ir.PointerType()


def symbol(direction: str, dtype: DType, hidden: int) -> str:
    """The function's name (``direction``: ``lstm_forward``, ``gru_backward_tangents``...)."""
    return f"kiln_{direction}_{dtype.name}_h{hidden}"


class Emitter:
    """One function being emitted: its builder, core, parameter slots and the step products."""

    def __init__(self, direction: str, slots: tuple[str, ...], dtype: DType, hidden: int) -> None:
        self.module = ir.Module(name=f"kiln_{direction}")
        self.fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [_POINTER]), symbol(direction, dtype, hidden))
        self.fn.attributes.add("nounwind")
        self.builder = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.core = LLVMCore(self.builder)
        self.dtype, self.hidden = dtype, hidden
        self.float = register_type(dtype)
        (params,) = self.fn.args
        b = self.builder
        self.values = {name: b.load(b.gep(params, [i64(k)], inbounds=True, source_etype=I64), typ=I64, name=name)
                       for k, name in enumerate(slots)}  # fmt: skip

    def __getitem__(self, name: str) -> ir.Value:
        return self.values[name]

    def pointer(self, name: str) -> ir.Value:
        return self.builder.inttoptr(self[name], _POINTER)

    def mul(self, a: ir.Value, b: ir.Value | int) -> ir.Value:
        return self.builder.mul(a, i64(b) if isinstance(b, int) else b, flags=("nsw",))

    def add(self, *terms: ir.Value | int) -> ir.Value:
        total = terms[0] if not isinstance(terms[0], int) else i64(terms[0])
        for term in terms[1:]:
            total = self.builder.add(total, i64(term) if isinstance(term, int) else term, flags=("nsw",))
        return total

    def row(self, array: str, t: ir.Value | None, b: ir.Value) -> ir.Value:
        """The address of row ``b`` of step ``t`` (None: an array without steps, such as ``h0``)."""
        offset = self.mul(b, self[f"{array}_b"])
        if t is not None:
            offset = self.add(offset, self.mul(t, self[f"{array}_t"]))
        return self.element(self.pointer(array), offset)

    def element(self, base: ir.Value, offset: ir.Value | int) -> ir.Value:
        offset = i64(offset) if isinstance(offset, int) else offset
        return self.builder.gep(base, [offset], inbounds=True, source_etype=self.float)

    def load(self, base: ir.Value, offset: ir.Value | int) -> Scalar:
        return Scalar(self.builder.load(self.element(base, offset), typ=self.float), self.dtype)

    def store(self, value: Scalar, base: ir.Value, offset: ir.Value | int) -> None:
        self.builder.store(value.value, self.element(base, offset))

    def constant(self, value: float) -> Scalar:
        return self.core.constant(value, self.dtype)

    def product(self, m: ir.Value, n: int, k: int, a: ir.Value, lda: ir.Value, b: ir.Value, c: ir.Value,
                ldc: ir.Value | int, accumulate: bool) -> None:  # fmt: skip
        """``C = A @ B`` (``accumulate``: ``C += A @ B``), ``B`` (k, n) with rows ``padded_row_length(n)``
        apart (``linalg.padded_rows`` lays a weight out so): ``small_gemm``'s kernel inline, with its half
        tile (the batch is ``m``: 4, 12... rows)."""
        ldc = i64(ldc) if isinstance(ldc, int) else ldc
        ldb = i64(padded_row_length(n, self.dtype.itemsize))
        emit_product(self.builder, self.dtype, m, n, k, a, lda, b, c, ldc, accumulate, ldb=ldb, half_tile=True)

    def finish(self) -> str:
        """The module's IR: the function, and its blocks of rows (``rows_symbol``)."""
        self.builder.ret_void()
        _emit_rows(self.module, self.fn, len(self.values))
        return str(self.module)


def rows_symbol(function: str) -> str:
    """The name of ``function``'s blocks of rows: ``void f(ptr table, i64 begin, i64 end)``."""
    return f"{function}_rows"


def _emit_rows(module: ir.Module, fn: ir.Function, slots: int) -> None:
    """``rows_symbol(fn)``: ``fn`` on each params of ``[begin, end)`` in ``table`` (rows of ``slots``
    i64s: one block of the batch's rows each, ``recurrence_call``'s), with the compiled kernels' ABI,
    so that ``runtime.threads`` runs blocks on the native pool, whose spinning workers take one in
    microseconds where the Python pool's took tens."""
    rows = ir.Function(module, ir.FunctionType(ir.VoidType(), [_POINTER, I64, I64]), rows_symbol(fn.name))
    rows.attributes.add("nounwind")
    builder = ir.IRBuilder(rows.append_basic_block("entry"))
    table, begin, end = rows.args
    with for_range(builder, begin, end, name="block", vectorize=False) as block:
        at = builder.mul(block, i64(slots), flags=("nsw",))
        builder.call(fn, [builder.gep(table, [at], inbounds=True, source_etype=I64)])
    builder.ret_void()


def sigmoid(k: Emitter, x: Scalar) -> Scalar:
    """mathlib's sigmoid of ``x`` (inlined: the pass over a step's block vectorizes)."""
    return math_call(k.core, "sigmoid", x)


def tanh(k: Emitter, x: Scalar) -> Scalar:
    """mathlib's tanh of ``x``."""
    return math_call(k.core, "tanh", x)


def check_sizes(dtype: DType, hidden: int) -> None:
    """``ValueError`` for what no recurrence kernel is generated for."""
    if dtype not in (dt.float32, dt.float64) or hidden < 1:
        raise ValueError(f"a native recurrence kernel takes float32/float64 and hidden >= 1, got {dtype.name}, "
                         f"hidden {hidden}")  # fmt: skip


def forward_ir(dtype: DType, hidden: int) -> str:
    """LLVM IR of the forward recurrence (``FORWARD``'s slots)."""
    check_sizes(dtype, hidden)
    k = Emitter("lstm_forward", FORWARD, dtype, hidden)
    bld, width = k.builder, 4 * hidden
    step, bias = k.pointer("step"), k.pointer("bias")
    with for_range(bld, 0, k["steps"], name="t", vectorize=False) as t:
        first = bld.icmp_signed("==", t, i64(0))
        previous = bld.sub(t, i64(1))
        h_prev = bld.select(first, k.pointer("h0"), k.row("hs", previous, i64(0)))
        h_stride = bld.select(first, k["h0_b"], k["hs_b"])
        c_prev = bld.select(first, k.pointer("c0"), k.row("cs", previous, i64(0)))
        c_stride = bld.select(first, k["c0_b"], k["cs_b"])
        k.product(k["batch"], width, hidden, h_prev, h_stride, k.pointer("w_hh_t"), step, width, accumulate=False)
        with for_range(bld, 0, k["batch"], name="b", vectorize=False) as b:
            a_row, gx_row = k.row("a", t, b), k.row("gx", t, b)
            step_row = k.element(step, k.mul(b, width))
            c_row = k.element(c_prev, k.mul(b, c_stride))
            out = {name: k.row(name, t, b) for name in ("hs", "cs", "tanh_c")}
            with for_range(bld, 0, hidden, name="j", parallel=True) as j:
                gates = []
                for g in range(4):
                    at = k.add(j, g * hidden)
                    # (gx + bias) first: the rounding of the pre-activations the numpy kernel adds up
                    z = k.core.add(k.load(step_row, at), k.core.add(k.load(gx_row, at), k.load(bias, at)))
                    gates.append(tanh(k, z) if g == 2 else sigmoid(k, z))
                    k.store(gates[-1], a_row, at)
                i, f, g_, o = gates
                c = k.core.add(k.core.mul(f, k.load(c_row, j)), k.core.mul(i, g_))
                k.store(c, out["cs"], j)
                tanh_c = tanh(k, c)
                k.store(tanh_c, out["tanh_c"], j)
                k.store(k.core.mul(o, tanh_c), out["hs"], j)
            with bld.if_then(bld.icmp_signed("!=", k["packed"], i64(0))):
                _packed_rows(k, t, b, (k.element(h_prev, k.mul(b, h_stride)), c_row), (out["hs"], out["cs"]))
    return k.finish()


def _packed_rows(k: Emitter, t: ir.Value, b: ir.Value, before: tuple, after: tuple) -> None:
    """Row ``b`` of step ``t`` of ``PACKED``'s arrays: the states ``before`` the step, and the states
    ``after`` it where ``t`` is the last step (zeros before): one pass over rows still in cache, where
    numpy's passes over the packed output read it all back (7.9 MB a layer at T=350)."""
    bld = k.builder
    last = bld.icmp_signed("==", t, bld.sub(k["steps"], i64(1)))
    rows = [k.row(name, t, b) for name in PACKED]
    zero = k.constant(0.0).value
    with for_range(bld, 0, k.hidden, name="p", parallel=True) as j:
        for s in range(2):
            k.store(k.load(before[s], j), rows[s], j)
            final = bld.select(last, k.load(after[s], j).value, zero)
            k.store(Scalar(final, k.dtype), rows[2 + s], j)


def backward_ir(dtype: DType, hidden: int, with_tangents: bool) -> str:
    """LLVM IR of the backward recurrence (``BACKWARD``'s slots; ``e_a`` is read only when
    ``with_tangents``). ``dh`` and ``dc`` (B, H, contiguous) hold the last step's ``dH``/``dC`` on
    entry and the initial states' gradients on exit."""
    check_sizes(dtype, hidden)
    k = Emitter("lstm_backward_tangents" if with_tangents else "lstm_backward", BACKWARD, dtype, hidden)
    bld, core, width = k.builder, k.core, 4 * hidden
    one = k.constant(1.0)
    dh, dc = k.pointer("dh"), k.pointer("dc")
    with for_range(bld, 0, k["steps"], name="s", vectorize=False) as s:
        t = bld.sub(bld.sub(k["steps"], i64(1)), s)
        later = bld.icmp_signed(">", t, i64(0))
        earlier = bld.select(later, bld.sub(t, i64(1)), i64(0))  # step t - 1, read only where t > 0
        with for_range(bld, 0, k["batch"], name="b", vectorize=False) as b:
            a_row, dz_row = k.row("a", t, b), k.row("dz", t, b)
            rows = {name: k.row(name, t, b) for name in ("c_prev", "tanh_c")}
            next_dh, next_dc = k.row("d_h", earlier, b), k.row("d_c", earlier, b)
            tangents = k.row("e_a", t, b) if with_tangents else None
            state = k.mul(b, hidden)
            with for_range(bld, 0, hidden, name="j", parallel=True) as j:
                i, f, g, o = (k.load(a_row, k.add(j, n * hidden)) for n in range(4))
                tanh_c, c_prev = k.load(rows["tanh_c"], j), k.load(rows["c_prev"], j)
                at = k.add(state, j)
                d_h, d_c = k.load(dh, at), k.load(dc, at)
                slope = lambda y: core.mul(core.sub(one, y), y)  # noqa: E731 - sigmoid' from sigmoid
                dz = [None, None, None, core.mul(d_h, core.mul(tanh_c, slope(o)))]
                d_c = core.add(d_c, core.mul(d_h, core.mul(core.sub(one, core.mul(tanh_c, tanh_c)), o)))
                dz[0] = core.mul(d_c, core.mul(g, slope(i)))
                dz[1] = core.mul(d_c, core.mul(c_prev, slope(f)))
                dz[2] = core.mul(d_c, core.mul(core.sub(one, core.mul(g, g)), i))
                for n in range(4):
                    value = dz[n]
                    assert value is not None
                    if tangents is not None:
                        value = core.add(value, k.load(tangents, k.add(j, n * hidden)))
                    k.store(value, dz_row, k.add(j, n * hidden))
                d_c = core.mul(d_c, f)
                # where t > 0 the next step (t - 1) adds its dC, and dh starts from its dH (the gemm adds)
                zero = k.constant(0.0)
                k.store(core.add(d_c, core.select(Scalar(later, dt.bool_), k.load(next_dc, j), zero)), dc, at)
                k.store(core.select(Scalar(later, dt.bool_), k.load(next_dh, j), zero), dh, at)
        # dh holds dH[t - 1] where t > 0 and zeros at t = 0: the product adds to it
        k.product(k["batch"], hidden, width, k.row("dz", t, i64(0)), k["dz_b"], k.pointer("w_hh"), dh, hidden,
                  accumulate=True)  # fmt: skip
    return k.finish()
