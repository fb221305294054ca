"""One LSTM step on ``rnn_scan``'s packed layout as one native function each way: an ``nn.LSTMCell``'s
step in a compiled loop's trip (``rnn_scan`` and ``rnn_scan_backward`` over one time step).

``recurrence.py``'s functions run the recurrence on the numpy kernels' arrays; around them, one step
on the packed layout (``recurrence_numpy._lstm_scan_step``/``_lstm_backward_step``) took a dozen
numpy calls more -- the bias added, the previous and final states copied into their blocks, the
state cotangents summed, the gate tangents scaled -- each a microsecond or two where the step's own
arithmetic (hidden 51, batch 16, float32) takes about 3 us. These functions do all of it in their
one pass over each row:

- ``step_forward_ir`` (``STEP_FORWARD``'s slots): ``out``'s row (the packed layout of
  ``recurrence_layout.ScanLayout``) from ``gx``, ``bias``, ``h0``, ``c0`` and ``W_hh^T`` (H, 4H,
  row-major), with the pre-activations ``h0 W_hh^T + (gx + bias)`` (the numpy path's rounding);
- ``step_backward_ir`` (``STEP_BACKWARD``'s slots): ``out``'s row (``dz`` and the initial states'
  gradients) from the packed forward row, its cotangent ``g`` and ``W_hh`` (4H, H, row-major).

Rows have run-time strides (in elements); every block of a row is contiguous.
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.primitives.recurrence_layout import ScanLayout
from .loops import for_range, i64
from .recurrence import Emitter, check_sizes, sigmoid, tanh

#: The i64 slots of ``params``: the batch, then per array its address and (for those with rows) its
#: row stride in elements.
STEP_FORWARD = ("batch", "gx", "gx_b", "bias", "h0", "h0_b", "c0", "c0_b", "w_hh_t", "step", "out", "out_b")
STEP_BACKWARD = ("batch", "packed", "packed_b", "g", "g_b", "w_hh", "out", "out_b")


def step_forward_ir(dtype: DType, hidden: int) -> str:
    """LLVM IR of one forward step into the packed row (``STEP_FORWARD``'s slots)."""
    check_sizes(dtype, hidden)
    k = Emitter("lstm_step_forward", STEP_FORWARD, dtype, hidden)
    bld, core, width = k.builder, k.core, 4 * hidden
    layout = ScanLayout("LSTM", hidden)
    step = k.pointer("step")
    k.product(k["batch"], width, hidden, k.pointer("h0"), k["h0_b"], k.pointer("w_hh_t"), step, width, accumulate=False)
    bias = k.pointer("bias")
    with for_range(bld, 0, k["batch"], name="b", vectorize=False) as b:
        gx_row, out_row = k.row("gx", None, b), k.row("out", None, b)
        h0_row, c0_row = k.row("h0", None, b), k.row("c0", None, b)
        step_row = k.element(step, k.mul(b, width))
        with for_range(bld, 0, hidden, name="j", parallel=True) as j:
            gates = []
            for n in range(4):
                at = k.add(j, n * hidden)
                z = core.add(k.load(step_row, at), core.add(k.load(gx_row, at), k.load(bias, at)))
                gates.append(tanh(k, z) if n == 2 else sigmoid(k, z))
                k.store(gates[-1], out_row, k.add(at, layout.gate_span[0]))
            i, f, g, o = gates
            h_prev, c_prev = k.load(h0_row, j), k.load(c0_row, j)
            c = core.add(core.mul(f, c_prev), core.mul(i, g))
            tanh_c = tanh(k, c)
            h = core.mul(o, tanh_c)
            assert layout.extra is not None  # an LSTM's tanh(c)
            blocks = ((layout.out(0), h), (layout.final(0), h), (layout.out(1), c), (layout.final(1), c),
                      (layout.prev(0), h_prev), (layout.prev(1), c_prev), (layout.extra, tanh_c))  # fmt: skip
            for (start, _), value in blocks:
                k.store(value, out_row, k.add(j, start))
    return k.finish()


def step_backward_ir(dtype: DType, hidden: int) -> str:
    """LLVM IR of one backward step into the packed gradient row (``STEP_BACKWARD``'s slots)."""
    check_sizes(dtype, hidden)
    k = Emitter("lstm_step_backward", STEP_BACKWARD, dtype, hidden)
    bld, core = k.builder, k.core
    layout = ScanLayout("LSTM", hidden)
    assert layout.extra is not None  # an LSTM's tanh(c)
    gate, extra, dz_start = layout.gate_span[0], layout.extra[0], layout.dz[0]
    one = k.constant(1.0)
    with for_range(bld, 0, k["batch"], name="b", vectorize=False) as b:
        saved, cot, out_row = k.row("packed", None, b), k.row("g", None, b), k.row("out", None, b)
        with for_range(bld, 0, hidden, name="j", parallel=True) as j:
            part = lambda row, span: k.load(row, k.add(j, span[0]))  # noqa: E731 - one block's element j
            i, f, g, o = (k.load(saved, k.add(j, gate + n * hidden)) for n in range(4))
            tanh_c, c_prev = part(saved, layout.extra), part(saved, layout.prev(1))
            from_tanh = core.sub(one, core.mul(tanh_c, tanh_c))
            d_h = core.add(part(cot, layout.out(0)), part(cot, layout.final(0)))
            d_c = core.add(part(cot, layout.out(1)), part(cot, layout.final(1)))
            d_c = core.add(d_c, core.mul(k.load(cot, k.add(j, extra)), from_tanh))
            slope = lambda y: core.mul(core.sub(one, y), y)  # noqa: E731 - sigmoid' from sigmoid
            # the gate activations' own cotangents, through each activation (tanh' for g)
            through = (slope(i), slope(f), core.sub(one, core.mul(g, g)), slope(o))
            tangents = [core.mul(k.load(cot, k.add(j, gate + n * hidden)), through[n]) for n in range(4)]
            dz = [None, None, None, core.mul(d_h, core.mul(tanh_c, slope(o)))]
            d_c = core.add(d_c, core.mul(d_h, core.mul(from_tanh, o)))
            dz[0] = core.mul(d_c, core.mul(g, slope(i)))
            dz[1] = core.mul(d_c, core.mul(c_prev, slope(f)))
            dz[2] = core.mul(d_c, core.mul(core.sub(one, core.mul(g, g)), i))
            for n, value in enumerate(dz):
                assert value is not None
                k.store(core.add(value, tangents[n]), out_row, k.add(j, dz_start + n * hidden))
            k.store(core.add(core.mul(d_c, f), part(cot, layout.prev(1))), out_row, k.add(j, layout.initial(1)[0]))
            # the initial h's gradient: its own cotangent, plus dz @ W_hh (the product below adds it)
            k.store(part(cot, layout.prev(0)), out_row, k.add(j, layout.initial(0)[0]))
    out = k.pointer("out")
    k.product(k["batch"], hidden, 4 * hidden, k.element(out, i64(dz_start)), k["out_b"], k.pointer("w_hh"),
              k.element(out, i64(layout.initial(0)[0])), k["out_b"], accumulate=True)  # fmt: skip
    return k.finish()
