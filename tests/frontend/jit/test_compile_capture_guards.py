"""Guards on many captured tensors: the checks run in C loops over all of them at once
(``Specialization._captures_match``, the identity containers of ``guards.Guards``), and every
way one captured tensor's state can change must still miss, name what changed, and give eager's
result. Each function captures more than one tensor (the fast paths loop over lists); each case
calls it several times before and after the change. float32 elementwise, rtol 1e-6 / atol 1e-7.
"""

from __future__ import annotations

import gc

import pytest

import kiln

from .helpers import assert_tree_close, events

RTOL, ATOL = 1e-6, 1e-7
COUNT = 12


def _weights(n: int = COUNT) -> list:
    kiln.manual_seed(0)
    return [kiln.randn(3, 3) for _ in range(n)]


def _combine(x, ws):
    out = x * 1.0
    for w in ws:
        out = out + w
    return out


def _calls(f, g, x, times: int = 3) -> None:
    for _ in range(times):
        assert_tree_close(f(x), g(x), rtol=RTOL, atol=ATOL)


def _last_reason(f) -> str:
    return events(f, "compiled")[-1].detail


def _changes(ws: list) -> dict:
    """Each way a captured tensor's (shape, strides, dtype, requires_grad, .grad is set) changes
    without its version counter moving, and the word the miss says."""
    return {
        "shape": (lambda: setattr(ws[5], "data", kiln.ones(1, 3)), "shape"),
        "strides": (lambda: setattr(ws[5], "data", ws[5].detach().T), "strides"),
        "dtype": (lambda: setattr(ws[5], "data", ws[5].detach().double()), "dtype"),
        "requires_grad": (lambda: ws[5].requires_grad_(), "requires_grad"),
    }


# (whether .grad is set is guarded only where the call reads it: tests/frontend/jit/test_first_calls.py)
@pytest.mark.parametrize("change", ["shape", "strides", "dtype", "requires_grad"])
def test_each_change_of_one_captured_tensor_misses(change):
    ws = _weights()

    def g(x):
        return _combine(x, ws)

    f = kiln.compile(g)
    x = kiln.ones(3, 3)
    _calls(f, g, x)
    mutate, word = _changes(ws)[change]
    mutate()
    _calls(f, g, x)
    assert len(f.state.specializations) == 2
    assert word in _last_reason(f)


def _reads_grads(ws: list):
    for w in ws:
        w.requires_grad_()
        w.grad = kiln.ones(3, 3)

    def g(x):
        with kiln.no_grad():
            return _combine(x, [w + w.grad if w.grad is not None else w for w in ws])

    return g


def test_grad_cleared_on_a_captured_tensor_misses():
    ws = _weights()
    g = _reads_grads(ws)
    f = kiln.compile(g)
    x = kiln.ones(3, 3)
    _calls(f, g, x)
    old = ws[7].grad  # kept alive: the miss is the cleared .grad, not a freed tensor
    ws[7].grad = None
    _calls(f, g, x)
    assert len(f.state.specializations) == 2
    assert ".grad is set True -> False" in _last_reason(f)
    del old


def test_a_freed_captured_tensor_misses():
    # The graph read ws[7].grad; a new .grad tensor replaces it and the old one is freed.
    ws = _weights()
    g = _reads_grads(ws)
    f = kiln.compile(g)
    x = kiln.ones(3, 3)
    _calls(f, g, x)
    ws[7].grad = kiln.full((3, 3), 2.0)
    gc.collect()
    _calls(f, g, x)
    assert len(f.state.specializations) == 2
    assert "was freed" in _last_reason(f)


def test_an_argument_sharing_memory_with_a_captured_tensor_misses():
    ws = _weights()

    def g(x):
        for w in ws:
            w.add_(x)  # in place: whether x is one of them decides what each step reads
        return ws[0] * 1.0

    f = kiln.compile(g)
    eager = [w.clone() for w in ws]

    def reference(x):
        for w in eager:
            w.add_(x)
        return eager[0] * 1.0

    x = kiln.full((3, 3), 0.5)
    for _ in range(3):
        assert_tree_close(f(x), reference(x), rtol=RTOL, atol=ATOL)
    for _ in range(3):  # an argument that is captured tensor 3's memory (a view of it)
        assert_tree_close(f(ws[3][:]), reference(eager[3][:]), rtol=RTOL, atol=ATOL)
        for w, e in zip(ws, eager, strict=True):
            assert_tree_close(w, e, rtol=RTOL, atol=ATOL)
    spec = f.state.specializations[0]
    miss = spec.state_miss(f._globals, f._closure_values(), [ws[3][:]])
    assert miss is not None and "shares memory with captured tensor" in miss


def test_an_argument_that_a_captured_view_views_misses_at_every_call():
    # The captured tensors' ids and their bases' are kept after the first call (``_ids_of``); an
    # argument that is the base of a captured view must still miss each time, the view read after
    # the argument's in-place change as in eager.
    kiln.manual_seed(0)
    bases = [kiln.randn(4, 3) for _ in range(3)]
    views = [b[1:3] for b in bases]

    def g(x):
        x.add_(1.0)
        return _combine(views[0], views[1:])

    f = kiln.compile(g)
    for _ in range(3):
        assert_tree_close(f(kiln.zeros(4, 3)), g(kiln.zeros(4, 3)), rtol=RTOL, atol=ATOL)
    spec = f.state.specializations[0]
    assert spec._captured_ids is not None, "the ids are not kept: the test tests nothing"
    for k in (1, 2, 1):
        before = [v.numpy().copy() for v in views]
        got = f(bases[k])  # eager: bases[k] (so views[k]) grows by 1, then the views are summed
        expected = sum(before) + 1.0
        assert_tree_close(got, kiln.from_numpy(expected), rtol=RTOL, atol=ATOL)
        miss = spec.state_miss(f._globals, f._closure_values(), [bases[k]])
        assert miss is not None and "shares memory with captured tensor" in miss


@pytest.mark.parametrize("how", ["item replaced", "item appended", "dict value replaced", "dict key added"])
def test_containers_of_captured_tensors_are_guarded(how):
    ws = _weights()
    table = {f"w{i}": w for i, w in enumerate(ws)}

    def g(x):
        return _combine(x, ws) + _combine(x, table.values())

    f = kiln.compile(g)
    x = kiln.ones(3, 3)
    _calls(f, g, x)
    if how == "item replaced":
        ws[4] = kiln.full((3, 3), 9.0)
    elif how == "item appended":
        ws.append(kiln.full((3, 3), 9.0))
    elif how == "dict value replaced":
        table["w4"] = kiln.full((3, 3), 9.0)
    else:
        table["extra"] = kiln.full((3, 3), 9.0)
    _calls(f, g, x)
    assert len(f.state.specializations) == 2
    # the reason names the path to the entry (the containers the call reached are guarded by path)
    expected = {"item replaced": "ws[4] changed: another Tensor object now", "item appended": "ws[12] changed: (absent) -> tensor",
                "dict value replaced": "table['w4'] changed: another Tensor", "dict key added": "table['extra']"}  # fmt: skip
    assert expected[how] in _last_reason(f)


def test_the_same_entries_in_another_order_make_a_new_trace():
    # The trace read the entries in their order (a loop over ``table.values()``, a concatenation of
    # them): the same tensors in another order are another computation, so the guard misses.
    ws = _weights()
    table = {f"w{i}": w for i, w in enumerate(ws)}

    def g(x):
        return kiln.cat([x * 1.0, *table.values()])

    f = kiln.compile(g)
    x = kiln.ones(3, 3)
    _calls(f, g, x)
    items = list(table.items())
    table.clear()
    table.update(reversed(items))
    _calls(f, g, x)
    assert len(f.state.specializations) == 2
    assert "order of its keys" in _last_reason(f), _last_reason(f)
    table["w0"] = kiln.zeros(3, 3)
    _calls(f, g, x)
    assert len(f.state.specializations) == 3


@pytest.mark.parametrize("keep_old", [True, False])
def test_a_new_grad_tensor_is_read_even_when_the_old_one_lives(keep_old):
    # ``p.grad = new`` while something still holds the old .grad: the graph captured the old
    # tensor, which is alive and unchanged; the path ``p.grad`` to it is what changed.
    ws = _weights()
    g = _reads_grads(ws)
    f = kiln.compile(g)
    x = kiln.ones(3, 3)
    _calls(f, g, x)
    old = ws[7].grad
    ws[7].grad = kiln.full((3, 3), 100.0)
    if not keep_old:
        del old
    _calls(f, g, x)
    assert len(f.state.specializations) == 2


def test_an_optimizer_reads_a_replaced_grad():
    params = _weights(4)
    eager = [w.clone() for w in params]
    for p, q in zip(params, eager, strict=True):
        p.requires_grad_(), q.requires_grad_()
        p.grad, q.grad = kiln.ones(3, 3), kiln.ones(3, 3)
    opt, ref = kiln.optim.SGD(params, lr=0.1), kiln.optim.SGD(eager, lr=0.1)
    step = kiln.compile(lambda: opt.step())
    held = []
    for k in range(4):
        step()
        ref.step()
        for p, q in zip(params, eager, strict=True):
            assert_tree_close(p.detach(), q.detach(), rtol=RTOL, atol=ATOL)
        held.append(params[1].grad)  # the old .grad stays alive
        params[1].grad, eager[1].grad = kiln.full((3, 3), float(k)), kiln.full((3, 3), float(k))
