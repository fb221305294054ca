"""The GRU recurrence of one direction as one native function, as ``recurrence.py`` builds the LSTM's.

``gru_forward_ir``/``gru_backward_ir`` generate the functions of ``recurrence_numpy.gru_forward`` and
``gru_backward`` for one dtype and hidden size (``void f(i64 *params)``, the slots named
by ``GRU_FORWARD``/``GRU_BACKWARD``). Per step, forward: ``step = h @ W_hh^T`` (``small_gemm``'s kernel), then per
element ``r``, ``z`` (sigmoids), ``hn = step_n + b_hn``, ``n = tanh(A_n + r hn)`` and
``h' = n + z (h - n)`` (``W_hh^T`` comes row-major, (H, 3H)), with ``A = gx + bias`` read as the
LSTM's kernel reads it (``gx`` where it lies; ``A`` itself and a zero bias). Backward, from the last step: one pass gives ``dz_hh[t]`` (the gradient of
``h W_hh^T``'s blocks), ``dz[t]`` (that of ``A``'s: the n block before r scales it) and
``dh = dh z + dH[t-1]``, then ``dh += dz_hh[t] @ W_hh`` .
"""

from __future__ import annotations

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ..core import Scalar
from .loops import for_range, i64
from .recurrence import Emitter, check_sizes, sigmoid, tanh

GRU_FORWARD = ("steps", "batch", "gx", "gx_t", "gx_b", "bias", "a", "a_t", "a_b", "h0", "h0_t", "h0_b", "hs", "hs_t", "hs_b", "hn", "hn_t", "hn_b",
               "w_hh_t", "b_hn", "step")  # fmt: skip
GRU_BACKWARD = ("steps", "batch", "a", "a_t", "a_b", "h_prev", "h_prev_t", "h_prev_b", "hn", "hn_t", "hn_b", "d_h",
                "d_h_t", "d_h_b", "e_a", "e_a_t", "e_a_b", "g_hn", "g_hn_t", "g_hn_b", "dz", "dz_t", "dz_b",
                "dz_hh", "dz_hh_t", "dz_hh_b", "w_hh", "dh")  # fmt: skip


def gru_forward_ir(dtype: DType, hidden: int) -> str:
    """LLVM IR of the GRU's forward recurrence (``GRU_FORWARD``'s slots; ``b_hn``: H elements)."""
    check_sizes(dtype, hidden)
    k = Emitter("gru_forward", GRU_FORWARD, dtype, hidden)
    bld, core, width = k.builder, k.core, 3 * hidden
    step, b_hn, bias = k.pointer("step"), k.pointer("b_hn"), k.pointer("bias")
    with for_range(bld, 0, k["steps"], name="t", vectorize=False) as t:
        first = bld.icmp_signed("==", t, i64(0))
        h_prev = bld.select(first, k.pointer("h0"), k.row("hs", bld.sub(t, i64(1)), i64(0)))
        h_stride = bld.select(first, k["h0_b"], k["hs_b"])
        k.product(k["batch"], width, hidden, h_prev, h_stride, k.pointer("w_hh_t"), step, width, accumulate=False)
        with for_range(bld, 0, k["batch"], name="b", vectorize=False) as b:
            a_row, hs_row, hn_row = k.row("a", t, b), k.row("hs", t, b), k.row("hn", t, b)
            gx_row = k.row("gx", t, b)
            step_row = k.element(step, k.mul(b, width))
            h_row = k.element(h_prev, k.mul(b, h_stride))
            with for_range(bld, 0, hidden, name="j", parallel=True) as j:
                at = [k.add(j, g * hidden) for g in range(3)]
                pre = [core.add(k.load(gx_row, where), k.load(bias, where)) for where in at]  # A's, as numpy adds it
                r = sigmoid(k, core.add(pre[0], k.load(step_row, at[0])))
                z = sigmoid(k, core.add(pre[1], k.load(step_row, at[1])))
                hn = core.add(k.load(step_row, at[2]), k.load(b_hn, j))
                n = tanh(k, core.add(pre[2], core.mul(r, hn)))
                for value, where in zip((r, z, n), at, strict=True):
                    k.store(value, a_row, where)
                k.store(hn, hn_row, j)
                k.store(core.add(n, core.mul(z, core.sub(k.load(h_row, j), n))), hs_row, j)
    return k.finish()


def gru_backward_ir(dtype: DType, hidden: int, with_tangents: bool, with_g_hn: bool) -> str:
    """LLVM IR of the GRU's backward recurrence (``GRU_BACKWARD``'s slots; ``e_a`` read only
    ``with_tangents``, ``g_hn`` only ``with_g_hn``). ``dh`` (B, H, contiguous) holds the last step's
    ``dH`` on entry and the initial state's gradient on exit."""
    check_sizes(dtype, hidden)
    name = "gru_backward" + ("_tangents" if with_tangents else "") + ("_g_hn" if with_g_hn else "")
    k = Emitter(name, GRU_BACKWARD, dtype, hidden)
    bld, core, width = k.builder, k.core, 3 * hidden
    one, zero = k.constant(1.0), k.constant(0.0)
    dh = k.pointer("dh")
    with for_range(bld, 0, k["steps"], name="s", vectorize=False) as s:
        t = bld.sub(bld.sub(k["steps"], i64(1)), s)
        later = Scalar(bld.icmp_signed(">", t, i64(0)), dt.bool_)
        earlier = bld.select(later.value, bld.sub(t, i64(1)), i64(0))  # step t - 1, read only where t > 0
        with for_range(bld, 0, k["batch"], name="b", vectorize=False) as b:
            a_row, dz_row, dz_hh_row = k.row("a", t, b), k.row("dz", t, b), k.row("dz_hh", t, b)
            h_row, hn_row, next_dh = k.row("h_prev", t, b), k.row("hn", t, b), k.row("d_h", earlier, b)
            tangents = k.row("e_a", t, b) if with_tangents else None
            g_hn = k.row("g_hn", t, b) if with_g_hn else None
            state = k.mul(b, hidden)
            with for_range(bld, 0, hidden, name="j", parallel=True) as j:
                at = [k.add(j, g * hidden) for g in range(3)]
                r, z, n = (k.load(a_row, where) for where in at)
                d_h = k.load(dh, k.add(state, j))
                extra = (lambda g: k.load(tangents, at[g])) if tangents is not None else (lambda g: zero)  # noqa: E731
                dz_n = core.mul(d_h, core.mul(core.sub(one, z), core.sub(one, core.mul(n, n))))
                dz_z = core.mul(d_h, core.mul(core.mul(core.sub(k.load(h_row, j), n), z), core.sub(one, z)))
                if tangents is not None:
                    dz_n, dz_z = core.add(dz_n, extra(2)), core.add(dz_z, extra(1))
                dz_r = core.mul(dz_n, core.mul(core.mul(k.load(hn_row, j), r), core.sub(one, r)))
                dz_hn = core.mul(dz_n, r)
                if tangents is not None:
                    dz_r = core.add(dz_r, extra(0))
                if g_hn is not None:
                    dz_hn = core.add(dz_hn, k.load(g_hn, j))
                for value, where in zip((dz_r, dz_z, dz_hn), at, strict=True):
                    k.store(value, dz_hh_row, where)
                for value, where in zip((dz_r, dz_z, dz_n), at, strict=True):
                    k.store(value, dz_row, where)
                carried = core.add(core.mul(d_h, z), core.select(later, k.load(next_dh, j), zero))
                k.store(carried, dh, k.add(state, j))
        k.product(k["batch"], hidden, width, k.row("dz_hh", t, i64(0)), k["dz_hh_b"], k.pointer("w_hh"), dh, hidden,
                  accumulate=True)  # fmt: skip
    return k.finish()
