"""The LSTM recurrence of one direction as one native function: the time loop, the per-step product
through the BLAS numpy loaded, and the gate math fused into one pass over each step's (B, 4H) block.

``forward_ir`` and ``backward_ir`` generate the functions of ``recurrence_numpy.lstm_forward`` and
``lstm_backward`` (same arrays, same formulas up to float rounding: the sigmoid here is mathlib's,
not ``0.5 tanh(z / 2) + 0.5``) for one dtype and hidden size; the number of steps and the batch are
arguments, so one compile serves every sequence. Each has the signature
``void f(i64 *params, ptr gemm)``: ``params`` holds the sizes, the arrays' addresses and their
strides in elements (``FORWARD``/``BACKWARD`` name the slots), ``gemm`` is ``cblas_sgemm``
(``cblas_dgemm``) of this process, given at each call: no address is baked into code that the disk
cache keeps for other processes. The BLAS's integers are ``index_bits`` wide (64 for an ILP64
OpenBLAS such as numpy 2's).

Per step, forward: ``step = h @ W_hh^T`` (one gemm, into a contiguous scratch row block), then for
each element the four gates' pre-activations ``step + A[t]``, their activations (written back into
``A[t]``), ``c``, ``tanh(c)`` and ``h``. Backward, from the last step: one pass gives ``dz[t]`` and
carries ``dc`` (and copies ``dH[t-1]`` into ``dh``), then ``dh = dz[t] @ W_hh + dh`` (one gemm with
beta 1; beta 0 at step 0, where no ``dH`` adds).
"""

from __future__ import annotations

from llvmlite import ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ..core import Scalar
from ..mathlib import call as math_call
from .core import LLVMCore, register_type
from .loops import I64, for_range, i64

#: The i64 slots of ``params``: sizes, then per array its address and its step (t) and row (b)
#: strides in elements; the inner (G, H) or (H,) block of a row is contiguous.
FORWARD = ("steps", "batch", "a", "a_t", "a_b", "h0", "h0_t", "h0_b", "c0", "c0_t", "c0_b", "hs", "hs_t", "hs_b",
           "cs", "cs_t", "cs_b", "tanh_c", "tanh_c_t", "tanh_c_b", "w_hh", "step")  # fmt: skip
BACKWARD = ("steps", "batch", "a", "a_t", "a_b", "c_prev", "c_prev_t", "c_prev_b", "tanh_c", "tanh_c_t",
            "tanh_c_b", "d_h", "d_h_t", "d_h_b", "d_c", "d_c_t", "d_c_b", "e_a", "e_a_t", "e_a_b", "dz", "dz_t",
            "dz_b", "w_hh", "dh", "dc")  # fmt: skip

# cblas's enums
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
_I32 = ir.IntType(32)
_POINTER = ir.PointerType()


def symbol(direction: str, dtype: DType, hidden: int, index_bits: int) -> str:
    """The function's name (``direction``: ``lstm_forward``, ``gru_backward_tangents``...)."""
    return f"kiln_{direction}_{dtype.name}_h{hidden}_i{index_bits}"


class _Callee:
    """An indirect call's target for llvmlite's ``call``, which asks its callee for a function type
    (an opaque pointer has none)."""

    def __init__(self, value: ir.Value, function_type: ir.FunctionType) -> None:
        self.value, self.function_type, self.type = value, function_type, value.type

    def get_reference(self) -> str:
        return self.value.get_reference()


class Emitter:
    """One function being emitted: its builder, core, parameter slots and the gemm call."""

    def __init__(self, direction: str, slots: tuple[str, ...], dtype: DType, hidden: int, index_bits: int) -> None:
        self.module = ir.Module(name=f"kiln_{direction}")
        self.fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [_POINTER, _POINTER]),
                              symbol(direction, dtype, hidden, index_bits))  # fmt: skip
        self.fn.attributes.add("nounwind")
        self.builder = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.core = LLVMCore(self.builder)
        self.dtype, self.hidden = dtype, hidden
        self.float = register_type(dtype)
        self.index = ir.IntType(index_bits)
        params, self.gemm = self.fn.args
        b = self.builder
        self.values = {name: b.load(b.gep(params, [i64(k)], inbounds=True, source_etype=I64), typ=I64, name=name)
                       for k, name in enumerate(slots)}  # fmt: skip
        self.gemm_type = ir.FunctionType(ir.VoidType(), [_I32, _I32, _I32, self.index, self.index, self.index,
                                                         self.float, _POINTER, self.index, _POINTER, self.index,
                                                         self.float, _POINTER, self.index])  # fmt: skip

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

    def blas_index(self, value: ir.Value | int) -> ir.Value:
        """An i64 size or stride as the BLAS's integer."""
        if isinstance(value, int):
            return ir.Constant(self.index, value)
        return value if self.index.width == 64 else self.builder.trunc(value, self.index)

    def call_gemm(self, trans_b: int, m: ir.Value, n: int, k: int, a: ir.Value, lda: ir.Value,
                  b: ir.Value, ldb: int, beta: float | ir.Value, c: ir.Value, ldc: int) -> None:  # fmt: skip
        """``C = A @ op(B) + beta C``, row-major, all on the BLAS given at call time."""
        index = self.blas_index
        beta_value = ir.Constant(self.float, beta) if isinstance(beta, float) else beta
        args = [ir.Constant(_I32, ROW_MAJOR), ir.Constant(_I32, NO_TRANS), ir.Constant(_I32, trans_b), index(m),
                index(n), index(k), ir.Constant(self.float, 1.0), a, index(lda), b, index(ldb), beta_value, c,
                index(ldc)]  # fmt: skip
        self.builder.call(_Callee(self.gemm, self.gemm_type), args)

    def finish(self) -> str:
        self.builder.ret_void()
        return str(self.module)


def sigmoid(k: Emitter, x: Scalar) -> Scalar:
    """mathlib's sigmoid of ``x`` (inlined: the pass over a step's block vectorizes)."""
    return math_call(k.core, "sigmoid", x)


def tanh(k: Emitter, x: Scalar) -> Scalar:
    """mathlib's tanh of ``x``."""
    return math_call(k.core, "tanh", x)


def check_sizes(dtype: DType, hidden: int, index_bits: int) -> None:
    """``ValueError`` for what no recurrence kernel is generated for."""
    if dtype not in (dt.float32, dt.float64) or hidden < 1 or index_bits not in (32, 64):
        raise ValueError(f"a native recurrence kernel takes float32/float64, hidden >= 1 and 32/64-bit BLAS "
                         f"integers, got {dtype.name}, hidden {hidden}, {index_bits} bits")  # fmt: skip


def forward_ir(dtype: DType, hidden: int, index_bits: int) -> str:
    """LLVM IR of the forward recurrence (``FORWARD``'s slots)."""
    check_sizes(dtype, hidden, index_bits)
    k = Emitter("lstm_forward", FORWARD, dtype, hidden, index_bits)
    bld, width = k.builder, 4 * hidden
    step = k.pointer("step")
    with for_range(bld, 0, k["steps"], name="t", vectorize=False) as t:
        first = bld.icmp_signed("==", t, i64(0))
        previous = bld.sub(t, i64(1))
        h_prev = bld.select(first, k.pointer("h0"), k.row("hs", previous, i64(0)))
        h_stride = bld.select(first, k["h0_b"], k["hs_b"])
        c_prev = bld.select(first, k.pointer("c0"), k.row("cs", previous, i64(0)))
        c_stride = bld.select(first, k["c0_b"], k["cs_b"])
        k.call_gemm(TRANS, k["batch"], width, hidden, h_prev, h_stride, k.pointer("w_hh"), hidden, 0.0, step, width)
        with for_range(bld, 0, k["batch"], name="b", vectorize=False) as b:
            a_row = k.row("a", t, b)
            step_row = k.element(step, k.mul(b, width))
            c_row = k.element(c_prev, k.mul(b, c_stride))
            out = {name: k.row(name, t, b) for name in ("hs", "cs", "tanh_c")}
            with for_range(bld, 0, hidden, name="j", parallel=True) as j:
                gates = []
                for g in range(4):
                    at = k.add(j, g * hidden)
                    z = k.core.add(k.load(step_row, at), k.load(a_row, at))
                    gates.append(tanh(k, z) if g == 2 else sigmoid(k, z))
                    k.store(gates[-1], a_row, at)
                i, f, g_, o = gates
                c = k.core.add(k.core.mul(f, k.load(c_row, j)), k.core.mul(i, g_))
                k.store(c, out["cs"], j)
                tanh_c = tanh(k, c)
                k.store(tanh_c, out["tanh_c"], j)
                k.store(k.core.mul(o, tanh_c), out["hs"], j)
    return k.finish()


def backward_ir(dtype: DType, hidden: int, index_bits: int, with_tangents: bool) -> str:
    """LLVM IR of the backward recurrence (``BACKWARD``'s slots; ``e_a`` is read only when
    ``with_tangents``). ``dh`` and ``dc`` (B, H, contiguous) hold the last step's ``dH``/``dC`` on
    entry and the initial states' gradients on exit."""
    check_sizes(dtype, hidden, index_bits)
    k = Emitter("lstm_backward_tangents" if with_tangents else "lstm_backward", BACKWARD, dtype, hidden, index_bits)
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
        beta = bld.select(later, ir.Constant(k.float, 1.0), ir.Constant(k.float, 0.0))
        k.call_gemm(NO_TRANS, k["batch"], hidden, width, k.row("dz", t, i64(0)), k["dz_b"], k.pointer("w_hh"),
                    hidden, beta, dh, hidden)  # fmt: skip
    return k.finish()
