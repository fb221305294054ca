"""The hazard watch (a ``sys.setprofile`` hook, ``hazards.Watch``) is paused while kiln's own work runs
in a traced call -- an op, the backward engine, a Function marked ``kiln_only`` -- and on again for
the user's code, which it must still see: a hook or custom Function's backward that kiln's engine
calls, the user's line after an op (even one that raised)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import kiln
from kiln.frontend import eager_kernels
from kiln.ir.primitives import P

from .helpers import compiled_calls, events

counter = 0


def _breaks(f) -> list[str]:
    return [e.detail for e in events(f, "break")]


def _calls(g, f, make) -> None:
    """Three calls of ``g`` and of ``f``, each on its own copy of ``make()``: equal results and gradients."""
    for _ in range(3):
        x, xe = make(), make()
        out, expected = g(x), f(xe)
        np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-6)
        if x.requires_grad:
            np.testing.assert_allclose(x.grad.numpy(), xe.grad.numpy(), rtol=1e-6)


def test_an_op_runs_unwatched_and_the_users_code_after_it_is_watched(monkeypatch):
    profiles = []

    def add(xp, a, b):  # kiln's kernel for add, as a routed compiled kernel is called
        profiles.append(sys.getprofile())
        return P["add"].eager(xp, a, b)

    monkeypatch.setitem(eager_kernels.ROUTES, P["add"], add)

    def f(x):
        global counter
        y = x + 1
        counter += 1  # after the op: seen
        return y

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2))
    assert profiles[0] is None  # the traced call's op (the eager calls run no watch either)
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]


def test_the_watch_is_on_again_after_an_op_that_raised():
    def f(x):
        global counter
        try:
            x + kiln.ones(3)  # a shape error, raised inside the op
        except RuntimeError:
            counter += 1
        return x * 2

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2))
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]


class _Triple(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        global counter
        counter += 1  # the user's code that the backward engine calls: seen
        return grad * 3


def test_a_custom_functions_backward_that_the_engine_runs_is_watched():
    def f(x):
        loss = _Triple.apply(x).sum()
        loss.backward()
        return loss.detach()

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2, requires_grad=True))
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]
    assert "_Triple" not in _breaks(g)[0] and "backward" in _breaks(g)[0]  # the user's function and line


def test_a_hook_on_a_node_that_the_engine_runs_is_watched():
    def hook(grad_inputs, grad_outputs):
        global counter
        counter += 1

    def f(x):
        y = x * 2
        y.grad_fn.register_hook(hook)
        loss = y.sum()
        loss.backward()
        return loss.detach()

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2, requires_grad=True))
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]


@pytest.mark.parametrize("kiln_only", [True, False])
def test_a_function_marked_kiln_only_runs_unwatched(kiln_only):
    profiles = []

    class Double(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            profiles.append(sys.getprofile())
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            profiles.append(sys.getprofile())
            return grad * 2

    Double.kiln_only = kiln_only

    def f(x):
        loss = Double.apply(x).sum()
        loss.backward()
        return loss.detach()

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2, requires_grad=True))
    assert sum(compiled_calls(g)) == 2  # (the list is not reached from the function: no hazard)
    traced = profiles[:2]  # the forward's and the backward's in the traced call
    if kiln_only:  # as kiln's own Functions (its one-step cell scan) are
        assert traced == [None, None]
    else:
        assert all(callable(p) for p in traced), traced


@pytest.mark.parametrize("kind", ["Linear", "a subclass", "with a forward hook", "a forward set on it"])
def test_a_kiln_only_modules_forward_runs_unwatched_unless_the_user_may_run(kind, monkeypatch):
    profiles = []
    linear = kiln.nn.functional.linear

    def recording_linear(*args):  # what Linear.forward calls, seen from inside it
        profiles.append(sys.getprofile())
        return linear(*args)

    monkeypatch.setattr(kiln.nn.functional, "linear", recording_linear)

    class Sub(kiln.nn.Linear):
        pass

    kiln.manual_seed(0)
    layer = (Sub if kind == "a subclass" else kiln.nn.Linear)(3, 2)
    if kind == "with a forward hook":
        layer.register_forward_hook(lambda module, args, out: None)
    if kind == "a forward set on it":
        layer.forward = lambda x: kiln.nn.Linear.forward(layer, x)

    def f(x):
        return layer(x)

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2, 3))
    assert sum(compiled_calls(g)) == 2
    assert (profiles[0] is None) == (kind == "Linear"), profiles[0]


@pytest.mark.parametrize("kind", ["Linear", "a subclass"])
def test_a_kiln_only_module_is_noted_with_the_watch_paused_and_its_training_flag_still_guards(kind, monkeypatch):
    """The trace notes each module call (its ``training`` flag is a guard); for a ``kiln_only`` module
    that runs with the watch paused too (each event the watch sees costs: a Python loop over LSTM
    cells and a head made 45k of its 112k events in benchmarks' lstm_cells trace)."""
    from kiln.frontend.jit.trace import Trace  # noqa: PLC0415

    profiles = []
    note = Trace.on_module_call
    monkeypatch.setattr(Trace, "on_module_call", lambda self, m: (profiles.append(sys.getprofile()), note(self, m)))

    class Sub(kiln.nn.Linear):
        pass

    kiln.manual_seed(0)
    layer = (Sub if kind == "a subclass" else kiln.nn.Linear)(3, 2)
    g = kiln.compile(lambda x: layer(x))
    _calls(g, lambda x: layer(x), lambda: kiln.ones(2, 3))
    assert (profiles[0] is None) == (kind == "Linear"), profiles[0]
    layer.eval()  # the guard: a new specialization, equal to eager
    _calls(g, lambda x: layer(x), lambda: kiln.ones(2, 3))
    assert len(g.state.specializations) == 2


def test_a_forward_hook_on_a_kiln_only_module_is_watched():
    def hook(module, args, out):
        global counter
        counter += 1

    layer = kiln.nn.Linear(3, 2)
    layer.register_forward_hook(hook)

    def f(x):
        return layer(x)

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2, 3))
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]


@pytest.mark.parametrize("kind", ["SGD", "a subclass", "with a closure"])
def test_a_kiln_optimizers_step_runs_unwatched_unless_the_user_may_run(kind, monkeypatch):
    profiles = []
    update = kiln.optim.SGD._update_group

    def recording_update(self, group, scalars):  # what SGD.step calls, seen from inside it
        profiles.append(sys.getprofile())
        update(self, group, scalars)

    monkeypatch.setattr(kiln.optim.SGD, "_update_group", recording_update)

    class Sub(kiln.optim.SGD):
        pass

    w = kiln.ones(3, requires_grad=True)
    opt = (Sub if kind == "a subclass" else kiln.optim.SGD)([w], lr=0.1)
    we = kiln.ones(3, requires_grad=True)
    opt_e = kiln.optim.SGD([we], lr=0.1)

    def step(x, w, opt):
        opt.zero_grad()
        loss = (w * x).sum()
        loss.backward()
        opt.step((lambda: loss) if kind == "with a closure" else None)
        return loss.detach()

    g = kiln.compile(lambda x: step(x, w, opt))
    for _ in range(3):
        x = kiln.arange(3.0)
        np.testing.assert_allclose(g(x).numpy(), step(x, we, opt_e).numpy(), rtol=1e-6)
        np.testing.assert_allclose(w.detach().numpy(), we.detach().numpy(), rtol=1e-6)
    assert sum(compiled_calls(g)) == 2
    assert (profiles[0] is None) == (kind == "SGD"), profiles[0]


def test_a_users_optimizer_subclass_is_watched():
    class Counting(kiln.optim.SGD):
        def _update_group(self, group, scalars):
            global counter
            counter += 1  # the user's code inside a kiln optimizer's step: seen
            super()._update_group(group, scalars)

    w = kiln.ones(3, requires_grad=True)
    opt = Counting([w], lr=0.1)

    def f(x):
        opt.zero_grad()
        loss = (w * x).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    g = kiln.compile(f)
    for _ in range(3):
        g(kiln.arange(3.0))
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]


def test_an_optimizers_closure_is_watched():
    w = kiln.ones(3, requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1)

    def f(x):
        def closure():
            global counter
            counter += 1
            opt.zero_grad()
            loss = (w * x).sum()
            loss.backward()
            return loss

        return opt.step(closure).detach()

    g = kiln.compile(f)
    for _ in range(3):
        g(kiln.arange(3.0))
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]


def _ones(*shape):
    return lambda: kiln.ones(*shape)


_KILN_ONLY_MODULES = {  # kiln's modules whose forward runs unwatched: (the module, an input it takes)
    "Conv2d": (lambda: kiln.nn.Conv2d(2, 3, 3, padding=1), _ones(1, 2, 5, 5)),
    "ConvTranspose2d": (lambda: kiln.nn.ConvTranspose2d(2, 3, 3), _ones(1, 2, 4, 4)),
    "BatchNorm2d": (lambda: kiln.nn.BatchNorm2d(2), lambda: kiln.arange(96.0).reshape(3, 2, 4, 4)),
    "LayerNorm": (lambda: kiln.nn.LayerNorm(4), lambda: kiln.arange(8.0).reshape(2, 4)),
    "MaxPool2d": (lambda: kiln.nn.MaxPool2d(2), lambda: kiln.arange(32.0).reshape(1, 2, 4, 4)),
    "Embedding": (lambda: kiln.nn.Embedding(5, 3), lambda: kiln.tensor([0, 2, 4])),
    "Dropout": (lambda: kiln.nn.Dropout(0.0), _ones(2, 4)),
    "GELU": (lambda: kiln.nn.GELU(), _ones(2, 4)),
}


@pytest.mark.parametrize("subclassed", [False, True])
@pytest.mark.parametrize("name", list(_KILN_ONLY_MODULES))
def test_kiln_modules_run_unwatched_and_a_subclass_is_watched(name, subclassed, monkeypatch):
    make, make_input = _KILN_ONLY_MODULES[name]
    cls = getattr(kiln.nn, name)
    profiles = []
    forward = cls.forward

    def recording_forward(self, *args):  # the module's forward, seen from inside it
        profiles.append(sys.getprofile())
        return forward(self, *args)

    monkeypatch.setattr(cls, "forward", recording_forward)
    kiln.manual_seed(0)
    module = make()
    if subclassed:  # the same module as an instance of a user's subclass
        module.__class__ = type("Sub", (cls,), {})

    def f(x):
        return module(x)

    g = kiln.compile(f)
    _calls(g, f, make_input)
    assert sum(compiled_calls(g)) == 2
    assert (profiles[0] is None) != subclassed, profiles[0]


@pytest.mark.parametrize("hook", [None, "tensor hook", "post-accumulate hook"])
def test_a_leafs_gradient_is_accumulated_unwatched_and_its_hooks_watched(hook, monkeypatch):
    profiles, in_hook = [], []
    accumulate = kiln.frontend.autograd.accumulate.accumulate_into_grad

    def recording_accumulate(*args, **kwargs):  # what a leaf's AccumulateGrad calls, seen from inside it
        profiles.append(sys.getprofile())
        return accumulate(*args, **kwargs)

    monkeypatch.setattr(kiln.frontend.autograd.accumulate, "accumulate_into_grad", recording_accumulate)
    w = kiln.ones(3, requires_grad=True)
    if hook == "tensor hook":
        w.register_hook(lambda grad: in_hook.append(sys.getprofile()))
    elif hook == "post-accumulate hook":
        w.register_post_accumulate_grad_hook(lambda leaf: in_hook.append(sys.getprofile()))

    def f(x):
        w.grad = None
        (w * x).sum().backward()
        return w.grad

    g = kiln.compile(f)
    for _ in range(3):
        np.testing.assert_allclose(g(kiln.arange(3.0)).numpy(), [0.0, 1.0, 2.0])
    # the sum into .grad runs unwatched but where a hook runs after it in the same node
    assert (profiles[0] is None) == (hook != "post-accumulate hook"), profiles[0]
    assert (len(in_hook) > 0) == (hook is not None) and all(callable(p) for p in in_hook[:1])  # the traced call's


def test_a_leafs_hooks_are_watched():
    w = kiln.ones(3, requires_grad=True)

    def hook(leaf):
        global counter
        counter += 1

    w.register_post_accumulate_grad_hook(hook)

    def f(x):
        w.grad = None
        (w * x).sum().backward()
        return w.grad

    g = kiln.compile(f)
    for _ in range(3):
        g(kiln.arange(3.0))
    assert compiled_calls(g) == [] and "global variable 'counter'" in _breaks(g)[0]


@pytest.mark.parametrize(
    ("module", "function", "make", "shape"),
    [("_batch_norm", "_TrainingBatchNorm", lambda: kiln.nn.BatchNorm2d(2), (3, 2, 4, 4)),
     ("_pooling", "_MaxOfWindows", lambda: kiln.nn.MaxPool2d(2), (1, 2, 4, 4))],
)  # fmt: skip
def test_kilns_own_functions_run_their_backward_unwatched(module, function, make, shape, monkeypatch):
    cls = vars(sys.modules[f"kiln.nn.{module}"])[function]
    profiles = []
    backward = cls.backward

    def recording_backward(ctx, *grads):  # the Function's backward, seen from inside it
        profiles.append(sys.getprofile())
        return backward(ctx, *grads)

    monkeypatch.setattr(cls, "backward", staticmethod(recording_backward))
    layer = make()

    def f(x):
        (layer(x) * layer(x).detach().cos()).sum().backward()
        return x.grad

    def make_input():
        return kiln.arange(float(np.prod(shape))).reshape(*shape).sin().requires_grad_()

    g = kiln.compile(f)
    for _ in range(3):
        x, xe = make_input(), make_input()
        np.testing.assert_allclose(g(x).numpy(), f(xe).numpy(), rtol=1e-5, atol=1e-6)
    assert sum(compiled_calls(g)) >= 1 and profiles[0] is None, profiles[:1]  # (BatchNorm: traced twice)


@pytest.mark.parametrize("where", ["kiln.nn._loss._BinaryCrossEntropy", "kiln.nn._rnn._FusedLayer"])
def test_kilns_other_functions_are_kiln_only(where):
    module, name = where.rsplit(".", 1)
    assert vars(sys.modules[module])[name].__dict__.get("kiln_only") is True


def test_a_users_subclass_of_a_kiln_only_function_is_watched():
    """``kiln_only`` is read from a Function's own class, as a Module's is: the subclass's backward
    is the user's (on the old code it inherited the flag and ran unwatched)."""
    profiles = []

    class Double(kiln.autograd.Function):
        kiln_only = True

        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    class Logged(Double):
        @staticmethod
        def backward(ctx, grad):
            profiles.append(sys.getprofile())
            return grad * 2

    def f(x):
        loss = Logged.apply(x).sum()
        loss.backward()
        return loss.detach()

    g = kiln.compile(f)
    _calls(g, f, lambda: kiln.ones(2, requires_grad=True))
    assert profiles[0] is not None  # the traced call's backward ran under the watch
