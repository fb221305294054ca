"""The eager dispatch path's shortcuts keep every semantic: leaf edges made when read, grad-mode
flags read from thread-local state only once used, unrolled device checks, operator fast paths."""

from __future__ import annotations

import ast
import gc
import importlib
import inspect
import pathlib
import threading
import types
import weakref

import numpy as np
import pytest

import kiln
from kiln.frontend.autograd import grad_mode
from kiln.frontend.autograd.graph import AccumulateGrad
from kiln.frontend.tensor import make_tensor


def leaf(*values):
    return kiln.tensor(list(values), dtype=kiln.float64, requires_grad=True)


# ----------------------------------------------------------------------------- leaf edges
def test_a_graph_dropped_unused_makes_no_accumulator():
    x = leaf(1.0, 2.0)
    for _ in range(3):
        x * 2.0  # noqa: B018 - the op's graph is dropped at once
    assert x._grad_acc is None  # the accumulator is made when backward reads the edges
    y = x * 3.0
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_the_nodes_of_one_leaf_share_its_accumulator():
    x = leaf(1.0, 2.0)
    y, z = x * 2.0, x + 1.0
    (acc_y, nr_y), (acc_z, nr_z) = y.grad_fn.next_edges[0], z.grad_fn.next_edges[0]
    assert isinstance(acc_y, AccumulateGrad) and acc_y is acc_z and acc_y.variable is x
    assert nr_y == nr_z == 0
    assert y.grad_fn.next_edges[1] is None  # the scalar operand requires no grad
    (y + z).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_the_graph_keeps_a_leaf_alive_for_its_hooks(torch):
    def run(lib, x):
        seen = []
        x.register_hook(lambda g: seen.append(g.tolist()))
        y = (x * 3.0).sum()
        del x  # only the graph holds the leaf now
        y.backward()
        return seen

    assert run(kiln, leaf(1.0, 2.0)) == run(torch, torch.tensor([1.0, 2.0], requires_grad=True)) == [[3.0, 3.0]]


def test_a_leaf_dies_with_its_graph():
    x = leaf(1.0, 2.0)
    alive = weakref.ref(x)
    y = x * 2.0
    del x
    gc.collect()
    assert alive() is not None  # y's graph holds it
    del y
    assert alive() is None  # no reference cycle: freed without the garbage collector


def test_leaf_edges_of_ops_with_more_inputs():
    x, w = leaf(1.0, -2.0), leaf(0.5, 0.5)
    out = kiln.where(x > 0, x, w)
    assert [e[0].variable for e in out.grad_fn.next_edges[1:]] == [x, w]
    out.sum().backward()
    assert x.grad.tolist() == [1.0, 0.0] and w.grad.tolist() == [0.0, 1.0]


# ----------------------------------------------------------------------------- grad-mode flags
def test_inference_mode_in_another_thread_leaves_this_threads_tensors_normal():
    entered, release = threading.Event(), threading.Event()
    made = []

    def infer():
        with kiln.inference_mode():
            made.append(kiln.ones(2))
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=infer)
    worker.start()
    try:
        assert entered.wait(10)
        x = kiln.ones(2)
        w = kiln.tensor([1.0, 2.0], requires_grad=True)  # float32, as x: mul saves x itself
        (w * x).sum().backward()  # x is a normal tensor: it can be saved for backward
        assert w.grad.tolist() == [1.0, 1.0]
    finally:
        release.set()
        worker.join()
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        kiln.tensor([1.0, 2.0], requires_grad=True) * made[0]


def test_grad_mode_off_in_one_thread_leaves_the_others_recording():
    """Ops read grad mode from one module set of the threads with it off while that set is empty;
    each thread still records exactly as its own mode says, and the set follows every switch."""
    start = len(grad_mode.threads_without_grad)
    entered, release, seen = threading.Event(), threading.Event(), {}
    x = leaf(1.0, 2.0)

    def without_grad():
        with kiln.no_grad():
            seen["off"] = [(x * 2.0).requires_grad, x.reshape(2, 1).requires_grad]
            entered.set()
            release.wait(10)
            seen["still off"] = (x + 1.0).requires_grad

    worker = threading.Thread(target=without_grad)
    worker.start()
    try:
        assert entered.wait(10)
        assert len(grad_mode.threads_without_grad) == start + 1
        assert (x * 2.0).requires_grad and x.reshape(2, 1).requires_grad  # this thread's mode is on
        with kiln.no_grad():
            assert len(grad_mode.threads_without_grad) == start + 2
            assert not (x * 2.0).requires_grad
            with kiln.enable_grad():
                assert len(grad_mode.threads_without_grad) == start + 1 and (x * 2.0).requires_grad
    finally:
        release.set()
        worker.join()
    assert seen == {"off": [False, False], "still off": False}
    assert threading.get_ident() not in grad_mode.threads_without_grad
    assert len(grad_mode.threads_without_grad) == start
    kiln.set_grad_enabled(False)
    try:
        assert len(grad_mode.threads_without_grad) == start + 1 and not (x * 2.0).requires_grad
        kiln.set_grad_enabled(False)  # the same mode again: counted once
        assert len(grad_mode.threads_without_grad) == start + 1
    finally:
        kiln.set_grad_enabled(True)
    assert len(grad_mode.threads_without_grad) == start and (x * 2.0).requires_grad


def test_grad_mode_is_switched_only_through_set_mode():
    """A write of ``state.grad_enabled`` that bypassed ``grad_mode.set_mode`` would leave a thread with
    grad mode off out of ``threads_without_grad``, and ops there would record graphs: none in kiln."""
    root = pathlib.Path(kiln.__file__).parent
    writes = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and target.attr == "grad_enabled"
    ]
    lines, first = inspect.getsourcelines(grad_mode.set_mode)
    assert writes == [f"frontend/autograd/grad_mode.py:{first + 3}"], writes  # set_mode's own
    assert "state.grad_enabled = enabled" in lines[3]


def test_anomaly_mode_records_the_forward_stack_only_while_on():
    x = leaf(1.0, 2.0)
    kiln.autograd.set_detect_anomaly(True)
    try:
        y = x * 2.0
    finally:
        kiln.autograd.set_detect_anomaly(False)
    z = x * 2.0
    assert z.grad_fn.forward_stack is None
    stack = "".join(y.grad_fn.forward_stack)
    assert "test_dispatch.py" in stack and "y = x * 2.0" in stack
    assert "autograd/graph.py" not in stack  # the node's construction is not the forward op


# ----------------------------------------------------------------------------- devices
@pytest.mark.parametrize("arity", [1, 2, 3])
def test_mixing_devices_is_an_error_for_every_arity(arity):
    cpu = kiln.ones(2)
    fake_cuda = make_tensor(np.ones(2, dtype=np.float32), kiln.device("cuda:0"))
    ops = {1: lambda: kiln.cat([cpu, fake_cuda]), 2: lambda: cpu * fake_cuda,
           3: lambda: kiln.where(cpu > 0, cpu, fake_cuda)}  # fmt: skip
    with pytest.raises(RuntimeError, match=r"same device, but found at least two devices, cpu and cuda:0!"):
        ops[arity]()


# ----------------------------------------------------------------------------- operator fast paths
OPERANDS = [
    ("float32", "float32"), ("float16", 2), ("float16", 2.5), ("float64", 3), ("float32", True),
    ("int64", 2), ("int64", 2.5), ("int32", "int64"), ("bool", 2), ("float32", "float64"), ("int64", "float32"),
]  # fmt: skip


def _operand(lib, spec, values):
    if not isinstance(spec, str):
        return spec
    return lib.tensor(values, dtype=getattr(lib, spec))


@pytest.mark.parametrize(("left", "right"), OPERANDS)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv"])
def test_operators_promote_as_pytorch_does(torch, op, left, right):
    if op == "sub" and ("bool" in (left, right) or right is True):
        for lib in (kiln, torch):  # both refuse a bool operand (kiln once computed x - True as x - 1)
            a, b = _operand(lib, left, [1, 2, 3]), _operand(lib, right, [3, 1, 2])
            with pytest.raises(RuntimeError, match="bool"):
                a - b
            with pytest.raises(RuntimeError, match="bool"):
                b - a
        return
    for lib in (kiln, torch):
        a, b = _operand(lib, left, [1, 2, 3]), _operand(lib, right, [3, 1, 2])
        result = getattr(a, f"__{op}__")(b)
        if lib is kiln:
            ours = result
    assert ours.dtype.name == str(result.dtype).removeprefix("torch.")
    np.testing.assert_allclose(ours.numpy().astype(np.float64), result.double().numpy(), rtol=1e-3)


def test_float_division_by_a_number_keeps_the_dtype_and_the_gradient():
    x = leaf(1.0, 4.0)
    y = x / 2
    assert y.dtype is kiln.float64 and y.tolist() == [0.5, 2.0]
    y.sum().backward()
    assert x.grad.tolist() == [0.5, 0.5]
    assert (kiln.tensor([3, 4]) / 2).tolist() == [1.5, 2.0]  # integers divide as floats


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
def test_relu_keeps_the_dtype_as_pytorch_does(torch, dtype):
    values = [-2, 0, 3]
    ours = kiln.relu(kiln.tensor(values, dtype=getattr(kiln, dtype)))
    theirs = torch.relu(torch.tensor(values, dtype=getattr(torch, dtype)))
    assert ours.dtype.name == dtype and ours.tolist() == theirs.tolist() == [0, 0, 3]


def test_a_dispatched_result_is_made_as_make_tensor_makes_one():
    """dispatch.apply inlines make_tensor's body (its call is ~6% of a one-element add): every slot
    of an op's result starts as make_tensor's does, inside inference mode too."""
    from kiln.frontend.tensor import Tensor

    def slots(t):
        return {name: getattr(t, name) for name in Tensor.__slots__ if name not in ("__weakref__", "_data", "_version")}

    x = kiln.tensor([1.0, 2.0])
    for context in (kiln.no_grad, kiln.inference_mode):
        with context():
            made = make_tensor(np.array([2.0, 4.0], dtype=np.float32))
            found = x + x
        assert slots(found) == slots(made)
        assert found._version == made._version == [0] and found._version is not x._version


# ----------------------------------------------------------------------------- the per-op path's code
PER_OP_MODULES = ("kiln.frontend.dispatch", "kiln.frontend.autograd.graph", "kiln.frontend.autograd.node",
                  "kiln.frontend.ops._views", "kiln.frontend.tensor")  # fmt: skip


@pytest.mark.parametrize("name", PER_OP_MODULES)
def test_the_per_op_path_calls_no_method_of_an_imported_object(name):
    """Python 3.11 compiles ``name.method(...)`` on a name an import bound as an attribute load and a
    call of the bound method it makes (meant for modules); on a dict or another object that load does
    not specialize (``ROUTES.get`` in dispatch cost ~30 ns of each op): bind such a method once."""
    module = importlib.import_module(name)
    tree = ast.parse(inspect.getsource(module))
    imported = {a.asname or a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)
                for a in n.names}  # fmt: skip
    calls = [
        f"line {n.lineno}: {n.func.value.id}.{n.func.attr}()"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
        and n.func.value.id in imported and not isinstance(getattr(module, n.func.value.id, None), types.ModuleType | type)
    ]  # fmt: skip
    assert calls == [], f"{name}: {calls}"
