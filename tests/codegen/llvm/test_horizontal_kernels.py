"""Horizontal kernels split by element ranges: members of very different sizes against the interpreter."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest

from kiln.codegen.llvm import engine
from kiln.codegen.llvm.kernels import KernelModule
from kiln.codegen.llvm.loops import CHUNK
from kiln.ir.interpreter import interpret
from tests.codegen.llvm.test_kernels import _adam_like, compile_kernel, kernel, run
from tests.conftest import assert_close

rng = np.random.default_rng(1)


def _member_arrays(shape, transposed=False):
    p = rng.normal(size=shape).astype(np.float32)
    if transposed:  # the same shape, column-major: its dims do not collapse to one loop
        p = np.asfortranarray(p)
    return [p, rng.normal(size=shape).astype(np.float32), np.array(rng.uniform(0.1, 1.0), np.float32)]


def _units(shape, transposed=False) -> int:
    """Units of one member counted by hand: pieces of CHUNK along a long row, else blocks of rows."""
    n = int(np.prod(shape))
    if n == 0:
        return 0
    if not transposed or len(shape) == 1:
        return -(-n // CHUNK)
    rows, inner = shape  # the loops stay in the domain's order: a row is a row of the array
    if inner > CHUNK:
        return rows * -(-inner // CHUNK)
    return -(-rows // max(1, CHUNK // inner))


MEMBERS = [
    ((1,), False),
    ((CHUNK - 1,), False),
    ((0,), False),
    ((CHUNK + 1,), False),
    ((3 * CHUNK + 5,), False),
    ((70, 300), True),  # short rows, several per unit
    ((5, CHUNK + 3), True),  # long rows, several units per row
    ((4, 0), False),
    ((3, 1, 4), False),
]


def _expected(bodies, arrays):
    return [e for m, body in enumerate(bodies) for e in interpret(body, arrays[3 * m : 3 * m + 3])]


def _case(members):
    bodies = [_adam_like(shape) for shape, _ in members]
    arrays = [a for shape, transposed in members for a in _member_arrays(shape, transposed)]
    return bodies, arrays


def test_units_are_chunks_of_each_member():
    bodies, arrays = _case(MEMBERS)
    info, _, _ = compile_kernel(kernel("horizontal", *bodies), arrays)
    assert info.extent == sum(_units(shape, transposed) for shape, transposed in MEMBERS)
    assert info.work_bytes == sum(a.nbytes for a in arrays) + sum(2 * arrays[3 * m].nbytes for m in range(len(bodies)))


@pytest.mark.parametrize("seed", range(4))
def test_members_of_very_different_sizes_over_split_unit_ranges(seed):
    members = list(MEMBERS)
    np.random.default_rng(seed).shuffle(members)
    bodies, arrays = _case(members)
    node = kernel("horizontal", *bodies)
    info, _, _ = compile_kernel(node, arrays)
    expected = _expected(bodies, arrays)
    cuts = sorted({0, info.extent, 1, info.extent - 1, *np.random.default_rng(seed).integers(0, info.extent, 3)})
    for cut in cuts:  # two calls, [0, cut) then [cut, extent), as two threads would make them
        actual = run(node, arrays, ranges=[(0, int(cut)), (int(cut), info.extent)])
        for a, e in zip(actual, expected, strict=True):
            assert_close(a, np.asarray(e), rtol=1e-6, atol=1e-7)


def test_units_called_one_by_one_in_reverse_order():
    bodies, arrays = _case(MEMBERS)
    node = kernel("horizontal", *bodies)
    info, _, _ = compile_kernel(node, arrays)
    actual = run(node, arrays, ranges=[(u, u + 1) for u in reversed(range(info.extent))])
    for a, e in zip(actual, _expected(bodies, arrays), strict=True):
        assert_close(a, np.asarray(e), rtol=1e-6, atol=1e-7)


def test_in_place_members_write_over_their_inputs():
    members = [((CHUNK + 1,), False), ((5,), False), ((3 * CHUNK + 5,), False), ((70, 300), True)]
    bodies, arrays = _case(members)
    expected = _expected(bodies, [a.copy() for a in arrays])
    # Each member's first output goes into its parameter's buffer, as the executor may arrange.
    outputs = []
    for m in range(len(bodies)):
        p = arrays[3 * m]
        outputs += [p if p.flags.c_contiguous else np.empty(p.shape, np.float32), np.empty(p.shape, np.float32)]
    node = kernel("horizontal", *bodies)
    info, _, _ = compile_kernel(node, arrays)
    actual = run(node, arrays, ranges=[(0, info.extent // 2), (info.extent // 2, info.extent)], outputs=outputs)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, np.asarray(e), rtol=1e-6, atol=1e-7)


def test_only_empty_members_have_no_units():
    bodies, arrays = _case([((0,), False), ((2, 0), False)])
    info, _, _ = compile_kernel(kernel("horizontal", *bodies), arrays)
    assert info.extent == 0


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="looks for x86-64 vector registers")
def test_contiguous_members_of_different_sizes_keep_a_vectorized_unit_stride_loop():
    shapes = [(10,), (3 * CHUNK + 5,), (300, 5)]
    layouts = []
    for shape in shapes:
        strides = tuple(int(np.prod(shape[k + 1 :])) for k in range(len(shape)))
        layouts += [strides, strides, ()]
    module = KernelModule()
    module.add(kernel("horizontal", *(_adam_like(s) for s in shapes)), layouts)
    if "avx" not in engine.host_signature():
        pytest.skip("the host has no AVX")
    assembly = engine.assembly(module.ir())
    packed = [line for line in assembly.splitlines() if "ps\t" in line and ("%ymm" in line or "%zmm" in line)]
    assert packed, "no packed single-precision instruction on ymm/zmm registers"


def _parallel_groups_per_function(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """Per function of LLVM IR text: the access groups its loads and stores are in, and the groups
    its loops declare parallel (through ``llvm.loop`` -> ``llvm.loop.parallel_accesses``)."""
    nodes = dict(re.findall(r"^(![0-9]+) = (?:distinct )?!\{(.*)\}$", text, re.M))
    out = {}
    for name, body in re.findall(r'^define [^@]*@"?([\w.]+)"?\(.*?\n(.*?)^\}', text, re.M | re.S):
        used = set(re.findall(r"!llvm\.access\.group (![0-9]+)", body))
        declared = set()
        for loop in re.findall(r"!llvm\.loop (![0-9]+)", body):
            for op in re.findall(r"![0-9]+", nodes[loop]):
                if "llvm.loop.parallel_accesses" in nodes.get(op, ""):
                    declared |= set(re.findall(r"![0-9]+", nodes[op]))
        out[name] = (used, declared)
    return out


def test_every_kernel_of_a_module_declares_its_own_access_group_parallel():
    # The groups are distinct nodes with no operands; llvmlite once took them for equal, and every
    # kernel after a module's first declared the first kernel's group parallel instead of its own,
    # so LLVM vectorized those loops behind runtime overlap checks that in-place buffers fail.
    module = KernelModule()
    for shapes in ([(10,), (CHUNK + 1,)], [(7,), (3, 5)], [(CHUNK,)]):
        layouts = [x for s in shapes for x in (tuple(int(np.prod(s[k + 1 :])) for k in range(len(s))),) * 2 + ((),)]
        module.add(kernel("horizontal", *(_adam_like(s) for s in shapes)), layouts)
    functions = _parallel_groups_per_function(module.ir())
    assert len(functions) == 3
    for name, (used, declared) in functions.items():
        assert used, name
        assert used <= declared, f"{name}: groups {used} used, {declared} declared parallel"


# An identity the generator would leave for LLVM to fold: ``add i64 0, x``, ``mul i64 x, 1``,
# ``mul i64 0, c``, or arithmetic on two constants.
_IDENTITY = re.compile(r"= (add( nsw)? i64 0, |mul( nsw)? i64 (0, |%\S+, 1$)|(add|mul)( nsw)? i64 -?\d+, -?\d+$)", re.M)


def test_members_alike_read_their_tables_as_constants_with_no_identity_arithmetic():
    """Members of one shape: every table column is one constant, so the unit's ranges and pointer
    slots are constants too (``loops.add``/``mul`` fold them) -- and the results stay the interpreter's."""
    bodies, arrays = _case([((3, 1, 4), False)] * 3)
    node = kernel("horizontal", *bodies)
    module = KernelModule()
    module.add(node, [tuple(s // a.itemsize for s in a.strides) for a in arrays])
    text = module.ir()
    assert _IDENTITY.findall(text) == []
    assert "add i64 0, 1" not in text  # the pointer slots of the first member: immediates
    for a, e in zip(run(node, arrays), _expected(bodies, arrays), strict=True):
        assert_close(a, np.asarray(e), rtol=1e-6, atol=1e-7)
