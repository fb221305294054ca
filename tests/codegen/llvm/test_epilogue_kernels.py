"""Conv kernels (``kiln.codegen.llvm.conv_epilogue``, fused by ``kiln.passes.epilogues``): a direct convolution with
its bias, activation and max pooling computed in one kernel, against eager and against the same
program compiled without them (the same formulas in kernels of their own: the same bits), over
several calls; what fusion leaves apart (a reader outside a sample's block of channels, a result
read elsewhere); a kernel the code generator declines, on the interpreter; the disk cache; the
verifier's rules for the kind."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln.codegen.llvm.backend import LLVMBackend
from kiln.compiler import program_cache
from kiln.ir.dtypes import float32
from kiln.ir.graph import KERNEL, Graph, Node, Value
from kiln.ir.types import TensorType
from kiln.ir.verifier import VerificationError, verify

TOLERANCE = {np.float32: (2e-5, 2e-5), np.float64: (1e-12, 1e-12)}


def _gelu_pool(x, w, b):
    return F.max_pool2d(F.gelu(F.conv2d(x, w, b), approximate="tanh"), 2)


# (input shape, filter shape, padding, epilogue): LeNet's two layers (rows of 28 and 10), an odd
# channel count (blocks of 1), a pooled size that leaves a row over, a 1x1 output
CASES = [
    ((3, 1, 28, 28), (6, 1, 5, 5), 2, lambda x, w, b: F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=2)), 2)),
    ((2, 6, 14, 14), (16, 6, 5, 5), 0, lambda x, w, b: F.max_pool2d(F.relu(F.conv2d(x, w, b)), 2)),
    ((2, 3, 9, 11), (5, 3, 3, 3), 0, lambda x, w, b: F.relu(F.conv2d(x, w, b)) * 2 - F.conv2d(x, w, b).sigmoid()),
    ((2, 3, 9, 11), (4, 3, 3, 3), 0, _gelu_pool),
    ((2, 2, 3, 3), (3, 2, 3, 3), 0, lambda x, w, b: F.conv2d(x, w, b).tanh()),
]


def _graph(compiled) -> Graph:
    return compiled.state.specializations[0].graph


def _kernel_kinds(compiled) -> list[str]:
    return [n.attrs["kind"] for n in _graph(compiled).nodes if n.op == KERNEL]


def _without_epilogues(fn, *args):
    """``fn`` compiled (traced on ``args``) while the backend takes no conv kernels, and past the
    disk cache (whose key does not know this choice)."""
    original, cache = LLVMBackend.takes_epilogue, program_cache.disk_cache()
    LLVMBackend.takes_epilogue = lambda self, node: False
    enabled, cache.enabled = cache.enabled, False
    try:
        compiled = kiln.compile(fn)
        compiled(*args)
        return compiled
    finally:
        LLVMBackend.takes_epilogue, cache.enabled = original, enabled


def _inputs(x_shape, w_shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [kiln.from_numpy(rng.standard_normal(s).astype(dtype)) for s in (x_shape, w_shape, w_shape[:1])]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape, w_shape, padding, fn", CASES)
def test_the_epilogue_runs_in_the_convolutions_kernel(x_shape, w_shape, padding, fn, dtype):
    plain = _without_epilogues(fn, *_inputs(x_shape, w_shape, dtype, seed=9))
    compiled = kiln.compile(fn)
    compiled(*_inputs(x_shape, w_shape, dtype, seed=9))  # traces (the result of this call is eager's)
    rtol, atol = TOLERANCE[dtype]
    for call in range(3):  # new values each call
        args = _inputs(x_shape, w_shape, dtype, seed=call)
        out, expected = compiled(*args).numpy(), fn(*args).numpy()
        np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol * max(1.0, np.abs(expected).max()))
        np.testing.assert_array_equal(out, plain(*args).numpy())
    assert _kernel_kinds(compiled).count("conv") == 1 and "conv" not in [n.op for n in _graph(compiled).nodes]
    assert "conv" not in _kernel_kinds(plain)
    assert not compiled.state.specializations[0].report.declined


def test_a_training_step_keeps_the_masks_and_indices_its_backward_reads():
    """Forward: conv + bias + ReLU + max pooling in one kernel, which also writes the ReLU mask and
    the pooling's argmax for the backward; losses and gradients over several steps against eager."""
    nn = kiln.nn

    def run(compiled: bool):
        kiln.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(2, 5, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(5 * 5 * 5, 3)).double()  # fmt: skip
        optimizer = kiln.optim.SGD(model.parameters(), lr=0.1)
        x, y = kiln.randn(4, 2, 10, 10, dtype=kiln.float64), kiln.randint(0, 3, (4,))

        def step():
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            grads = [p.grad.clone() for p in model.parameters()]
            optimizer.step()
            return loss, grads

        fn = kiln.compile(step) if compiled else step
        results = [fn() for _ in range(4)]
        return results, fn

    (compiled, fn), (eager, _) = run(True), run(False)
    for (loss, grads), (loss_e, grads_e) in zip(compiled, eager, strict=True):
        np.testing.assert_allclose(float(loss), float(loss_e), rtol=1e-12, atol=1e-14)
        for g, e in zip(grads, grads_e, strict=True):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10, atol=1e-12)
    conv_kernels = [n for n in _graph(fn).nodes if n.op == KERNEL and n.attrs["kind"] == "conv"]
    assert len(conv_kernels) == 1 and len(conv_kernels[0].outputs) >= 2  # pooled values and what backward reads


@pytest.mark.parametrize(
    "fn, merged",
    [
        (lambda x, w, b: F.conv2d(x, w).transpose(2, 3) + b, True),  # within its sample and channel
        (lambda x, w, b: F.conv2d(x, w).transpose(0, 1) + b, False),  # another sample's and channel's
        (lambda x, w, b: F.conv2d(x, w).reshape(4, 7, 4, 7).transpose(1, 2) + b, False),  # rows of other channels
        (lambda x, w, b: F.conv2d(x, w).flip(3) + b, False),  # flip is an extern node, the kernel's reader
        (lambda x, w, b: (F.conv2d(x, w).relu(), F.conv2d(x, w)), False),  # the result is an output
        (lambda x, w, b: F.conv2d(x, w, stride=2).relu(), False),  # the convolution is not compiled
    ],
)
def test_what_fusion_leaves_apart_is_still_right(fn, merged):
    compiled = kiln.compile(fn)
    for call in range(3):
        x, w, b = _inputs((4, 3, 9, 9), (4, 3, 3, 3), np.float64, seed=call)  # as many samples as channels
        args = (x, w, b.reshape(4, 1, 1))
        out, expected = compiled(*args), fn(*args)
        for a, e in zip(out if isinstance(out, tuple) else (out,), expected if isinstance(expected, tuple) else (expected,),
                        strict=True):  # fmt: skip
            np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-12, atol=1e-12)
    assert ("conv" in _kernel_kinds(compiled)) == merged, _kernel_kinds(compiled)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w: F.conv2d(x, w) * F.conv2d(x, w)[:, :1],  # channel 0's block, for every channel
        lambda x, w: F.conv2d(x, w) * F.conv2d(x, w)[:1],  # sample 0's block, for every sample
    ],
)
def test_a_broadcast_of_one_block_is_not_read_from_another_units_slab(fn):
    """Reading one channel's (or sample's) block for all of them names no channel (sample)
    variable; with two blocks of channels, a unit's slab does not hold it (read there, it was
    the stack's garbage: nan)."""
    compiled = kiln.compile(fn)
    for call in range(3):
        x, w, _ = _inputs((3, 3, 9, 9), (8, 3, 3, 3), np.float64, seed=call)
        np.testing.assert_allclose(compiled(x, w).numpy(), fn(x, w).numpy(), rtol=1e-12, atol=1e-12)
    assert "conv" not in _kernel_kinds(compiled)


def test_a_declined_conv_kernel_runs_on_the_interpreter_and_says_why():
    """Fusion proposes the kernel before the layouts are known; a convolution of transposed rows is
    then declined by the code generator: the whole kernel runs its body on the interpreter."""
    fn = lambda x, w, b: F.conv2d(x.transpose(2, 3), w, b).relu()  # noqa: E731
    compiled = kiln.compile(fn)
    for call in range(3):
        args = _inputs((2, 3, 8, 8), (4, 3, 3, 3), np.float64, seed=call)
        np.testing.assert_allclose(compiled(*args).numpy(), fn(*args).numpy(), rtol=1e-12, atol=1e-12)
    report = "\n".join(compiled.state.specializations[0].report.describe())
    assert "rows are not contiguous" in report, report


def test_results_do_not_depend_on_the_thread_count():
    args = _inputs((8, 3, 20, 20), (8, 3, 5, 5), np.float32)
    compiled = kiln.compile(CASES[0][3])
    compiled(*args)
    before = kiln.get_num_threads()
    try:
        results = []
        for n in (1, 2, 1, 2):
            kiln.set_num_threads(n)
            results.append(compiled(*args).numpy())
    finally:
        kiln.set_num_threads(before)
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)


def test_a_conv_kernel_loads_from_the_disk_cache():
    fn = CASES[1][3]
    args = _inputs((2, 6, 14, 14), (16, 6, 5, 5), np.float32)
    first, second = kiln.compile(fn), kiln.compile(fn)
    a = [first(*args).numpy() for _ in range(2)][-1]
    b = [second(*args).numpy() for _ in range(2)][-1]
    assert second.state.specializations[0].report.cache == "hit"
    assert "conv" in _kernel_kinds(second)
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- the verifier
def _conv_kernel(first_op: str = "conv", channels: int = 4) -> Graph:
    """A graph of one conv kernel: conv(x, w), its first ``channels`` channels, exp; with
    ``first_op="exp"``, a body that starts with another op."""
    x, w = Value(0, TensorType((2, 3, 6, 6), float32)), Value(1, TensorType((4, 3, 3, 3), float32))
    bx, bw = Value(0, x.type), Value(1, w.type)
    if first_op == "conv":
        first = Node(
            "conv", (bx, bw), {"stride": (1, 1), "dilation": (1, 1)}, (Value(2, TensorType((2, 4, 4, 4), float32)),)
        )
    else:
        first = Node("exp", (bx,), {}, (Value(2, bx.type),))
    nodes, last = [first], first.outputs[0]
    if channels != 4:
        sliced = Value(3, TensorType((2, channels, 4, 4), float32))
        slice_attrs = {"starts": (0, 0, 0, 0), "stops": (2, channels, 4, 4), "steps": (1, 1, 1, 1)}
        nodes.append(Node("slice", (last,), slice_attrs, (sliced,)))
        last = sliced
    out = Value(4, last.type)
    nodes.append(Node("exp", (last,), {}, (out,)))
    body = Graph((bx, bw), tuple(nodes), (out,), {})
    result = Value(2, out.type)
    kernel = Node(KERNEL, (x, w), {"name": "k0", "kind": "conv", "bodies": (body,)}, (result,))
    return Graph((x, w), (kernel,), (result,), {})


def test_the_verifier_checks_a_conv_kernels_body():
    verify(_conv_kernel())
    with pytest.raises(VerificationError, match="starts with a conv node"):
        verify(_conv_kernel(first_op="exp"))
    with pytest.raises(VerificationError, match="sample and channel dims"):
        verify(_conv_kernel(channels=2))
