"""Linear algebra through the public API: matmul and its 1-D rules, mm/bmm/dot/outer, einsum and
norm against PyTorch (values, dtypes, gradients), float64 gradient checks, and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.frontend import dispatch
from kiln.ir.types import CPU
from tests.conftest import assert_close, to_torch, tol


def rand(shape, dtype=kiln.float64, seed=0):
    rng = np.random.default_rng(seed)
    return kiln.from_numpy(rng.uniform(-2.0, 2.0, size=shape).astype(dtype.np))


def grads_match_torch(torch, fn, *inputs):
    """fn's values and gradients (for a random upstream gradient) agree with PyTorch's, in float64."""
    ks = [x.detach().clone().requires_grad_() for x in inputs]
    ts = [to_torch(torch, x).requires_grad_() for x in inputs]
    out_k, out_t = fn(kiln, *ks), fn(torch, *ts)
    assert_close(out_k, out_t, rtol=1e-10, atol=1e-12)
    seed = rand(tuple(out_k.shape), seed=9)
    out_k.backward(seed)
    out_t.backward(to_torch(torch, seed))
    for k, t in zip(ks, ts, strict=True):
        assert_close(k.grad, t.grad, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- matmul
MATMUL_SHAPES = [
    ((2, 3), (3, 4)), ((3,), (3, 4)), ((2, 3), (3,)), ((3,), (3,)), ((5, 2, 3), (3, 4)), ((3,), (5, 3, 4)),
    ((5, 2, 3), (3,)), ((2, 1, 2, 3), (4, 3, 2)), ((1, 2, 3), (4, 3, 5)), ((0, 3), (3, 2)), ((2, 0), (0, 2)),
    ((0,), (0,)),
]  # fmt: skip


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_values_and_gradients_match_pytorch(sa, sb, torch):
    a, b = rand(sa, seed=1), rand(sb, seed=2)
    grads_match_torch(torch, lambda m, x, y: m.matmul(x, y), a, b)
    a32, b32 = a.float(), b.float()
    assert_close(a32 @ b32, to_torch(torch, a32) @ to_torch(torch, b32), **tol(kiln.float32))


@pytest.mark.parametrize(("sa", "sb"), [((2, 3), (3, 4)), ((3,), (3, 2)), ((2, 1, 2, 3), (4, 3, 2)), ((4, 3), (3,))])
def test_matmul_gradcheck_float64(sa, sb):
    a, b = rand(sa, seed=3).requires_grad_(), rand(sb, seed=4).requires_grad_()
    assert kiln.autograd.gradcheck(kiln.matmul, (a, b))


def test_matmul_second_order_matches_pytorch(torch):
    a, b = rand((2, 3), seed=1), rand((3, 2), seed=2)
    ak, bk = a.clone().requires_grad_(), b.clone().requires_grad_()
    at, bt = to_torch(torch, a).requires_grad_(), to_torch(torch, b).requires_grad_()
    (gk,) = kiln.autograd.grad((ak @ bk).sum(), (ak,), create_graph=True)
    (gt,) = torch.autograd.grad((at @ bt).sum(), (at,), create_graph=True)
    (gk * gk).sum().backward()
    (gt * gt).sum().backward()
    assert_close(bk.grad, bt.grad, rtol=1e-12, atol=1e-12)


def test_matmul_non_contiguous_inputs(torch):
    a = rand((3, 2), seed=5).transpose(0, 1)  # a (2, 3) view with swapped strides
    b = rand((4, 3), seed=6).transpose(0, 1)
    assert not a.is_contiguous() and not b.is_contiguous()
    grads_match_torch(torch, lambda m, x, y: m.matmul(x, y), a, b)


@pytest.mark.parametrize("k, n", [(6, 9), (9, 6)])  # the stack copied into C order first / the product's rows
def test_a_transposed_stack_times_a_matrix_is_one_product_in_c_order(k, n):
    # An RNN's batch_first output: (batch, time, k) in time-major memory, times one matrix.
    from kiln.ir.primitives.linalg import _matmul_eager, _matmul_into  # noqa: PLC0415

    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 4, k)).transpose(1, 0, 2)
    b = rng.standard_normal((k, n))
    expected = np.einsum("btk,kn->btn", a, b)
    out = _matmul_eager(np, a, b)
    assert out.flags.c_contiguous
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    into = np.full((4, 5, n), np.nan)
    assert _matmul_into(np, a, b, out=into) is into
    np.testing.assert_allclose(into, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(64, 1024), (256, 256), (3, 512), (130, 70), (1024, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_transposed_matrix_in_c_order(shape, dtype):
    # rows 1 KiB apart (a Linear(1024, 64)'s weight) take the padded copy; the others the blocked one
    from kiln.ir.primitives.linalg import c_order  # noqa: PLC0415

    w = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    out = c_order(w.T)
    assert out.flags.c_contiguous and out.shape == w.T.shape
    np.testing.assert_array_equal(out, w.T)


@pytest.mark.parametrize(
    "a_shape, b_shape, blocks",
    [
        ((6, 50176), (50176, 25), 8),  # LeNet-5's conv1 weight gradient
        ((1, 25, 50176), (1, 50176, 6), 8),  # a conv's group dim in front
        ((3, 300007), (300007, 2), 2),  # blocks of unequal length
        ((16, 6400), (6400, 150), 1),  # an output of 2400 elements: one product
        ((6, 1000), (1000, 25), 1),  # few multiply-adds: one product
    ],
)
def test_a_tiny_output_with_a_long_inner_dim_is_a_sum_of_blocked_products(a_shape, b_shape, blocks):
    from kiln.ir.primitives.linalg import _inner_blocks, _matmul_eager, _matmul_into  # noqa: PLC0415

    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape, dtype=np.float32)
    b = (
        rng.standard_normal(b_shape[::-1], dtype=np.float32).T
        if len(b_shape) == 2
        else (rng.standard_normal(b_shape, dtype=np.float32))
    )  # a transposed view, as a weight gradient's
    assert _inner_blocks(a, b) == blocks
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    tolerance = {"rtol": 1e-4, "atol": 1e-5 * np.sqrt(a_shape[-1])}
    out = _matmul_eager(np, a, b)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == expected.shape
    np.testing.assert_allclose(out, expected, **tolerance)
    into = np.full(expected.shape, np.nan, np.float32)
    assert _matmul_into(np, a, b, out=into) is into
    np.testing.assert_allclose(into, expected, **tolerance)
    assert _inner_blocks(a.astype(np.int64), b.astype(np.int64)) == 1  # numpy's own loops: no BLAS to help


def test_a_blocked_product_into_memory_it_reads_is_still_right():
    from kiln.ir.primitives.linalg import _inner_blocks, _matmul_into  # noqa: PLC0415

    rng = np.random.default_rng(1)
    memory = rng.standard_normal(6 * 50176 + 50176 * 25, dtype=np.float32)
    a, b = memory[: 6 * 50176].reshape(6, 50176), memory[6 * 50176 :].reshape(50176, 25)
    assert _inner_blocks(a, b) > 1
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = memory[-150:].reshape(6, 25)  # b's last rows: the last block reads them after the first wrote out
    _matmul_into(np, a, b, out=out)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5 * np.sqrt(50176))


@pytest.mark.parametrize("dtype", [kiln.int32, kiln.int64])
def test_integer_matmul(dtype, torch):
    a = kiln.tensor([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    b = kiln.tensor([[1, 0], [0, 1], [2, -1]], dtype=dtype)
    out = a @ b
    assert out.dtype is dtype and out.tolist() == [[7, -1], [16, -1]]
    assert_close(kiln.matmul(a[0], b), torch.matmul(to_torch(torch, a)[0], to_torch(torch, b)), rtol=0, atol=0)


def test_matmul_operators_and_methods():
    a, b = rand((2, 3)), rand((3, 4))
    expected = a.numpy() @ b.numpy()
    for out in (a @ b, a.matmul(b), b.__rmatmul__(a), kiln.mm(a, b), a.mm(b)):
        assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_float32_matmul_hands_the_callers_arrays_to_numpy(monkeypatch):
    # The eager path of a large float32 product is one np.matmul on the tensors' own arrays:
    # no contiguous copy, no cast, no reshape in between (numpy then calls BLAS).
    a, b = rand((1024, 1024), kiln.float32, seed=1), rand((1024, 1024), kiln.float32, seed=2)
    seen = []

    class Recorder:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def matmul(x, y):
            seen.append((x, y))
            return np.matmul(x, y)

    monkeypatch.setitem(dispatch._NAMESPACES, CPU, Recorder())
    out = a @ b
    assert len(seen) == 1 and seen[0][0] is a._data and seen[0][1] is b._data
    np.testing.assert_allclose(out.numpy()[:4, :4], (a.numpy() @ b.numpy())[:4, :4], rtol=1e-5, atol=1e-4)


def test_matmul_errors_name_both_shapes():
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)"):
        kiln.zeros(2, 3) @ kiln.zeros(4, 5)
    with pytest.raises(RuntimeError, match=r"batch dims of shapes \[7, 2, 3\] and \[4, 3, 5\] do not broadcast"):
        kiln.zeros(7, 2, 3) @ kiln.zeros(4, 3, 5)
    with pytest.raises(RuntimeError, match=r"shapes \[2, 3\] and \[4\] cannot be multiplied"):
        kiln.zeros(2, 3) @ kiln.zeros(4)
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(1x3 and 4x5\)"):
        kiln.zeros(3) @ kiln.zeros(4, 5)
    with pytest.raises(RuntimeError, match=r"shapes \[3\] and \[4\] cannot be multiplied"):
        kiln.zeros(3) @ kiln.zeros(4)
    with pytest.raises(RuntimeError, match="at least 1D, but they are 0D and 1D"):
        kiln.matmul(kiln.tensor(1.0), kiln.zeros(4))
    with pytest.raises(RuntimeError, match="same dtype, but got: float32 != float64"):
        kiln.zeros(2, 3) @ kiln.zeros(3, 4, dtype=kiln.float64)
    with pytest.raises(TypeError, match="must be a Tensor"):
        kiln.matmul(kiln.zeros(2, 2), [[1.0, 0.0], [0.0, 1.0]])


# ----------------------------------------------------------------------------- mm, bmm, dot, outer
def test_bmm_dot_outer_match_pytorch(torch):
    grads_match_torch(torch, lambda m, x, y: m.bmm(x, y), rand((4, 2, 3), seed=1), rand((4, 3, 5), seed=2))
    grads_match_torch(torch, lambda m, x, y: m.dot(x, y), rand((5,), seed=1), rand((5,), seed=2))
    grads_match_torch(torch, lambda m, x, y: m.outer(x, y), rand((3,), seed=1), rand((4,), seed=2))
    i, f = kiln.tensor([1, 2]), kiln.tensor([0.5, 1.5, 2.0])
    assert_close(kiln.outer(i, f), torch.outer(to_torch(torch, i), to_torch(torch, f)), rtol=0, atol=0)  # promotes
    assert kiln.dot(kiln.tensor([1, 2, 3]), kiln.tensor([4, 5, 6])).item() == 32


def test_bmm_dot_outer_gradcheck():
    a, b = rand((2, 2, 3), seed=1).requires_grad_(), rand((2, 3, 2), seed=2).requires_grad_()
    assert kiln.autograd.gradcheck(kiln.bmm, (a, b))
    u, v = rand((4,), seed=3).requires_grad_(), rand((4,), seed=4).requires_grad_()
    assert kiln.autograd.gradcheck(kiln.dot, (u, v))
    assert kiln.autograd.gradcheck(kiln.outer, (u, v))


def test_mm_bmm_dot_outer_errors():
    with pytest.raises(RuntimeError, match=r"self must be a matrix.*\[2, 3, 1\]"):
        kiln.mm(kiln.zeros(2, 3, 1), kiln.zeros(3, 4))
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x4\)"):
        kiln.mm(kiln.zeros(2, 3), kiln.zeros(4, 4))
    with pytest.raises(RuntimeError, match=r"batch1 must be a 3D tensor"):
        kiln.bmm(kiln.zeros(2, 3), kiln.zeros(3, 4))
    with pytest.raises(
        RuntimeError, match=r"Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[3, 3\]"
    ):
        kiln.bmm(kiln.zeros(2, 2, 3), kiln.zeros(3, 3, 4))
    with pytest.raises(RuntimeError, match="1D tensors expected, but got 2D and 1D tensors"):
        kiln.dot(kiln.zeros(2, 2), kiln.zeros(2))
    with pytest.raises(RuntimeError, match=r"expected tensor \[3\] and src \[2\]"):
        kiln.dot(kiln.zeros(3), kiln.zeros(2))
    with pytest.raises(RuntimeError, match="Expected 1-D argument vec2, but got 2-D"):
        kiln.outer(kiln.zeros(3), kiln.zeros(2, 2))


# ----------------------------------------------------------------------------- einsum
EINSUMS = [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("ij,jk", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
    ("ij->ji", [(2, 3)]), ("ij->", [(2, 3)]), ("ij->j", [(2, 3)]), ("ba", [(2, 3)]), ("i,i->", [(4,)] * 2),
    ("i,i", [(4,)] * 2), ("i,j->ij", [(2,), (3,)]), ("i,j", [(2,), (3,)]), ("Ba,ab", [(2, 3), (3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 2, 5)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,ik,il->jkl", [(2, 3), (2, 2), (2, 4)]), ("...ij,...jk->...ik", [(5, 1, 2, 3), (4, 3, 2)]),
    ("i...->...", [(2, 3, 4)]), ("...ij->...ji", [(2, 3, 4)]), ("...", [(2, 3)]), ("ij,jk->ik", [(2, 1), (3, 4)]),
    ("bi,bi->b", [(3, 4), (1, 4)]), ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]), ("i,i,i->i", [(3,)] * 3),
    (" ij , jk -> ik ", [(2, 3), (3, 4)]), ("ij,kl->ijkl", [(2, 3), (0, 2)]), ("ij,jk->ik", [(2, 0), (0, 3)]),
]  # fmt: skip


@pytest.mark.parametrize(("equation", "shapes"), EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_matches_pytorch(equation, shapes, torch):
    operands = [rand(s, seed=i) for i, s in enumerate(shapes)]
    grads_match_torch(torch, lambda m, *xs: m.einsum(equation, *xs), *operands)


@pytest.mark.parametrize(("equation", "shapes"), [e for e in EINSUMS if 0 not in sum(e[1], ())][::3])
def test_einsum_gradcheck(equation, shapes):
    operands = [rand(s, seed=i).requires_grad_() for i, s in enumerate(shapes)]
    assert kiln.autograd.gradcheck(lambda *xs: kiln.einsum(equation, *xs), operands)


def test_einsum_takes_a_list_of_operands_and_integers(torch):
    a, b = kiln.tensor([[1, 2], [3, 4]]), kiln.tensor([[5], [6]])
    assert kiln.einsum("ij,jk->ik", [a, b]).tolist() == [[17], [39]]
    assert kiln.einsum("ij->i", a).dtype is kiln.int64


@pytest.mark.parametrize(
    ("equation", "shapes", "error", "match"),
    [
        ("ii->i", [(2, 2)], NotImplementedError, "subscript 'i' repeats within operand 0.*diagonals are not supported"),
        ("ij,jk->ik", [(2, 3)], ValueError, "names 2 operand\\(s\\) but 1 were given"),
        ("ij->ik", [(2, 3)], ValueError, "output subscript 'k' .* does not appear in any input"),
        ("ij->ii", [(2, 3)], ValueError, "output subscript 'i' appears more than once"),
        ("ijk", [(2, 3)], ValueError, "number of subscripts in the equation \\(3\\) does not match .* \\(2\\)"),
        ("i1", [(2, 3)], ValueError, "invalid subscript '1'"),
        ("ij,jk", [(2, 3), (4, 5)], RuntimeError, "subscript 'j' has size 4 in operand 1 \\(shape \\[4, 5\\]\\) but size 3"),
        ("......", [(2, 3)], ValueError, "more than one ellipsis"),
    ],
)  # fmt: skip
def test_einsum_errors(equation, shapes, error, match):
    with pytest.raises(error, match=match):
        kiln.einsum(equation, *[kiln.zeros(*s) for s in shapes])


def test_einsum_rejects_mixed_dtypes():
    with pytest.raises(RuntimeError, match="one dtype, got float32, float64"):
        kiln.einsum("i,i", kiln.zeros(2), kiln.zeros(2, dtype=kiln.float64))


# ----------------------------------------------------------------------------- norm
NORMS = [
    ("default", {}), ("fro_dim_tuple", {"p": "fro", "dim": (0, 1)}), ("p2_dim", {"p": 2, "dim": 1}),
    ("p1", {"p": 1}), ("inf", {"p": math.inf, "dim": 0}), ("neg_inf", {"p": -math.inf, "dim": 1, "keepdim": True}),
    ("p3", {"p": 3, "dim": -1}), ("p_half", {"p": 0.5}), ("p_neg", {"p": -1.5, "dim": 1}), ("p0", {"p": 0, "dim": 1}),
    ("keepdim", {"dim": 1, "keepdim": True}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "kwargs"), NORMS, ids=[n[0] for n in NORMS])
def test_norm_matches_pytorch(name, kwargs, torch):
    for x in (
        rand((3, 4), seed=2),
        rand((4, 3), seed=3).transpose(0, 1),
        kiln.tensor([[0.0, 1.0, -2.0], [0.0, 0.0, 0.0]], dtype=kiln.float64),
    ):
        if name == "p0":
            assert_close(kiln.norm(x, **kwargs), torch.norm(to_torch(torch, x), **kwargs), rtol=0, atol=0)
        else:
            grads_match_torch(torch, lambda m, t: m.norm(t, **kwargs), x)
    x32 = rand((3, 4), kiln.float32)
    assert_close(x32.norm(**kwargs), torch.norm(to_torch(torch, x32), **kwargs), **tol(kiln.float32))


@pytest.mark.parametrize(
    ("name", "kwargs"), [n for n in NORMS if n[0] != "p0"], ids=[n[0] for n in NORMS if n[0] != "p0"]
)
def test_norm_gradcheck(name, kwargs):
    x = kiln.tensor([[0.7, -1.3, 2.1, 0.4], [1.1, 0.5, -0.2, -1.7], [0.9, 1.6, -0.6, 0.3]], dtype=kiln.float64)
    assert kiln.autograd.gradcheck(lambda t: kiln.norm(t, **kwargs), (x.requires_grad_(),))


def test_norm_gradient_at_zero_is_zero():
    for p in (2, "fro", 3, 0.5, 1):
        x = kiln.zeros(3, dtype=kiln.float64, requires_grad=True)
        kiln.norm(x, p=p).backward()
        assert x.grad.tolist() == [0.0, 0.0, 0.0], p


def test_norm_edge_cases():
    assert kiln.tensor([3.0, 4.0]).norm().item() == 5.0
    assert kiln.zeros(0, 3).norm(dim=0).tolist() == [0.0, 0.0, 0.0]
    assert kiln.tensor([0.0, 2.0]).norm(p=-1).item() == 0.0  # a zero element: 1/|0| = inf, norm 0
    assert kiln.tensor([1e20, 1e20]).norm().item() == math.inf  # float32 squares overflow, as in PyTorch
    with pytest.raises(RuntimeError, match="Expected a floating point tensor as input. Got int64"):
        kiln.tensor([1, 2]).norm()
    with pytest.raises(ValueError, match="p must be 'fro' or a number"):
        kiln.ones(2, 2).norm(p="nuc")
    with pytest.raises(IndexError, match="Dimension out of range"):
        kiln.ones(2, 2).norm(dim=2)


def test_compiled_products_with_no_columns_or_rows():
    """A stack times a matrix with an empty dim, compiled into the arena (out=) and eagerly."""
    a, b = kiln.randn(4, 3, 5), kiln.randn(5, 0)
    f = kiln.compile(lambda x, y: (x @ y + 1, (x @ kiln.randn(5, 2)).sum()))
    for _ in range(3):
        out, _ = f(a, b)
        assert tuple(out.shape) == (4, 3, 0)


@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((16, 204), (204, 51)), ((1, 16, 204), (204, 51)), ((1, 16), (16, 51))]
)
def test_a_small_c_ordered_product_is_one_blas_call_of_its_rows(monkeypatch, a_shape, b_shape):
    """A product of at most SMALL_PRODUCT multiply-adds of C-ordered rows (an LSTMCell step's) is one
    np.matmul of the rows as they lie, into ``out`` where given: no swap (16x204 @ 204x51 would be
    swapped, at the cost of a copy), no block count, no row order to find."""
    from kiln.ir.primitives import linalg  # noqa: PLC0415

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape, dtype=np.float32), rng.standard_normal(b_shape, dtype=np.float32)
    want = np.matmul(a.astype(np.float64), b)

    def chosen(*args):
        raise AssertionError("a small product of C-ordered rows has nothing to choose")

    for name in ("_swapped", "_inner_blocks", "_rows_in_order"):
        monkeypatch.setattr(linalg, name, chosen)
    got = linalg._matmul_eager(np, a, b)
    assert got.flags.c_contiguous and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out = np.full(want.shape, np.nan, np.float32)
    assert linalg._matmul_into(np, a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
