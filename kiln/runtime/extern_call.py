"""The executor's step for an extern node: a primitive's eager kernel (``ExternCall``).

An extern node (matmul, gather, the views feeding them...) runs its primitive's eager kernel, with
``out=`` into the arena where the memory plan placed its result. A non-view result that numpy gave
in another layout than C order, or that shares memory with an argument, is copied: the kernels were
compiled for C order, and the memory plan and the in-place write-back count on only view nodes
aliasing. A view of arrays met at two runs in a row is kept (``ExternCall._view``).
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Mapping
from functools import partial
from operator import is_, methodcaller
from typing import Any, cast

import numpy as np

from ..ir.graph import Node, Value
from ..ir.primitives import ELEMENTWISE, PRIMITIVES, Kind
from . import threads
from .direct_views import direct_view
from .frames import PointerTables


class ExternCall:
    """A primitive's eager kernel; its result copied into C order unless it is a view."""

    __slots__ = ("node", "position", "dead", "eager", "eager_into", "args", "attrs", "out", "dtype", "into",
                 "normalize", "product", "last", "keep_views", "direct", "arg", "parks", "xp")  # fmt: skip

    def __init__(self, node: Node, position: int, dead: tuple, slots: Mapping[Value, int], planned: bool) -> None:
        self.node, self.position, self.dead = node, position, dead
        prim = PRIMITIVES[node.op]
        self.eager, self.eager_into = prim.eager, prim.eager_into
        self.args = tuple(slots[v] for v in node.inputs)
        self.arg = self.args[0] if len(self.args) == 1 else -1  # a view of one array: see ``runner``
        self.attrs = dict(node.attrs)
        self.out = slots[node.output]
        self.dtype = node.output.type.dtype.np
        self.into = self.out if (prim.eager_into is not None and planned) else -1  # out= into the arena
        self.normalize = not prim.is_view  # a view's layout is derived from its input's
        # Whether the native pool's spinning workers are sent to sleep first (``threads.park``): before a
        # kernel that may run on other threads (BLAS's, LAPACK's, a collective's), not before numpy's
        # one-thread kernels; a matmul parks them only where numpy's BLAS runs it (``xp``: kiln's
        # product kernel, asked first, runs on those workers); a recurrence never: its native kernels
        # run on those workers too (``recurrence_call``), its numpy one on one BLAS thread.
        self.parks = self.normalize and prim.kind not in _ONE_THREAD and prim.kind not in _OWN_THREADS
        self.xp: Any = np
        # A BLAS product: a small one runs on one BLAS thread (``threads.run_blas_product``), chosen
        # once where its operands' shapes are static, at each run where they are symbolic (``product``);
        # one the BLAS runs on one thread by itself is called as it is (``threads.blas_splits``).
        shapes = [v.type.shape for v in node.inputs[:2]]
        static = all(isinstance(d, int) for shape in shapes for d in shape)
        self.product = prim.kind is Kind.MATMUL and not static
        self.last: tuple | None = None  # a view's last arguments (weakly) and the view kept of them: see ``_view``
        self.keep_views = True  # False: the arguments are new arrays at every run (``CompiledProgram._keep_views``)
        self.direct = direct_view(node)
        if prim.kind is Kind.MATMUL and static and threads.blas_splits(*cast(list[tuple[int, ...]], shapes)):
            macs = threads.matmul_macs(*cast(list[tuple[int, ...]], shapes))
            self.eager = partial(threads.run_blas_product, prim.eager, macs)
            if prim.eager_into is not None:
                self.eager_into = partial(threads.run_blas_product, prim.eager_into, macs)
            if macs >= threads.BLAS_MIN_PARALLEL_MACS:  # (smaller ones run on one BLAS thread)
                self.xp = _PARKING_NUMPY
        elif prim.kind is Kind.MATMUL and not static:
            self.xp = _PARKING_NUMPY

    def run(self, env: list, tables: PointerTables) -> None:
        if self.parks:
            threads.park()
        args = [env[slot] for slot in self.args]
        if not self.normalize and self.into < 0:
            env[self.out] = self._view(args) if self.keep_views else self._eager_view(args)
            for slot in self.dead:
                env[slot] = None
            return
        eager_into, eager = self.eager_into, self.eager
        if self.product and threads.blas_splits(args[0].shape, args[1].shape):  # symbolic shapes: this run's
            macs = threads.matmul_macs(args[0].shape, args[1].shape)
            kernel = eager_into if self.into >= 0 else eager
            eager_into = eager = partial(threads.run_blas_product, kernel, macs)  # type: ignore[arg-type]  # set when into >= 0
        if self.into >= 0:
            eager_into(self.xp, *args, out=env[self.into], **self.attrs)  # type: ignore[misc]  # set when into >= 0
        else:
            result = eager(self.xp, *args, **self.attrs)
            if result.__class__ is not np.ndarray:
                result = np.asarray(result, dtype=self.dtype)
            elif self.normalize and (not result.flags.c_contiguous or _aliases_an_argument(result, self.args, env)):
                # numpy keeps its input's layout (order="K") where the kernels were compiled for C
                # order (``infer_layouts``); and the memory plan and the in-place write-back see a
                # non-view node's result as memory of its own
                result = result.copy(order="C")
            env[self.out] = result
        for slot in self.dead:
            env[slot] = None

    def runner(self) -> Callable[[list, PointerTables], None]:
        """What the call loop calls: ``run``, or a case of it chosen once: a product into the arena
        of static shapes (an LSTM cell's trip makes three), a view of one array (a loop's trip makes a
        dozen, a training step a hundred)."""
        if self.into >= 0 and self.normalize and not self.product:
            return self._run_into
        if self.normalize or self.into >= 0 or self.arg < 0:
            return self.run
        if self.keep_views:
            return self._run_kept_view
        return self._run_direct_view if self.direct is not None else self.run

    def _run_into(self, env: list, tables: PointerTables) -> None:
        """``run`` for an eager kernel that writes into the arena (``out=``), of static shapes."""
        if self.parks:
            threads.park()
        self.eager_into(self.xp, *[env[slot] for slot in self.args], out=env[self.into], **self.attrs)  # type: ignore[misc]
        for slot in self.dead:
            env[slot] = None

    def _run_direct_view(self, env: list, tables: PointerTables) -> None:
        """``run`` for a view of new arrays at every run (``keep_views`` False) that is one numpy call."""
        env[self.out] = self.direct(env[self.arg])  # type: ignore[misc]  # runner checked
        for slot in self.dead:
            env[slot] = None

    def _run_kept_view(self, env: list, tables: PointerTables) -> None:
        """``run`` for a view of one array, kept between runs: ``_view``'s hit without a list."""
        last, array = self.last, env[self.arg]
        if last is not None and last[1] is not None and last[0][0]() is array:
            env[self.out] = last[1]
        else:
            env[self.out] = self._view([array])
        for slot in self.dead:
            env[slot] = None

    def _view(self, args: list) -> Any:
        """The view primitive's result on ``args``: the last run's view when they are the same arrays.

        An array's memory, shape and strides are fixed for its life, so a view of the same arrays
        with the same attributes is the same window onto memory (a weight's transpose, every call).
        A view is kept only of arrays met at two runs in a row and held weakly until then: a view
        holds its base, and arrays new at every run (a batch, a backward's saved values) must not
        live on until the next. Only a result that is a view of ``args[0]`` is kept (never a copy)."""
        last = self.last
        if last is not None and all(map(is_, map(_dereference, last[0]), args)):
            if last[1] is not None:
                return last[1]
            result = self._eager_view(args)
            if result.__class__ is np.ndarray and _owner(result) is _owner(args[0]):  # a view, not a copy
                self.last = (last[0], result)
            return result
        result = self._eager_view(args)
        try:
            self.last = (tuple(weakref.ref(a) for a in args), None)  # met once: held weakly
        except TypeError:  # an array without weak references: a new view each run
            self.last = None
        return result

    def _eager_view(self, args: list) -> Any:
        if self.direct is not None:
            return self.direct(args[0])
        result = self.eager(np, *args, **self.attrs)
        return result if result.__class__ is np.ndarray else np.asarray(result, dtype=self.dtype)

    def describe(self) -> str:
        node = self.node
        return f"{node.op}({', '.join(str(v.type) for v in node.inputs)}) -> {node.output.type}"


#: Kinds of primitives whose eager kernels are numpy's one-thread loops: they leave the native pool's
#: workers spinning for the kernels after them (a GPT step's concatenations, copies and gathers between
#: its products and kernels woke the workers from sleep again each time).
_ONE_THREAD = frozenset({*ELEMENTWISE, Kind.REDUCE, Kind.SCAN, Kind.MOVEMENT, Kind.INDEX, Kind.CREATION,
                         Kind.RANDOM, Kind.CHECK})  # fmt: skip


#: Kinds whose eager kernels ask kiln's own kernels first, which run on the native pool's workers: the
#: executor leaves them spinning (a recurrence parked them, and the product after it woke them from sleep:
#: four times an LSTM LM's step).
_OWN_THREADS = frozenset({Kind.MATMUL, Kind.RECURRENCE})


class _ParkingNumpy:
    """numpy for a matmul's eager kernel, whose ``matmul`` (a BLAS call that may use every core) first
    sends the native pool's spinning workers to sleep; kiln's product kernel, which the eager kernel asks
    first (``linalg.install_product``), runs on those workers and finds them awake."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def matmul(*args: Any, **kwargs: Any) -> Any:
        threads.park()
        return np.matmul(*args, **kwargs)


_PARKING_NUMPY = _ParkingNumpy()
_dereference = getattr(operator, "call", None) or methodcaller("__call__")  # a weak reference -> its object, in C


def _owner(array: Any) -> Any:
    """The object at the end of ``array``'s chain of bases: what holds its memory (an array, or the
    foreign object an array over other memory keeps)."""
    base = array.base
    while base is not None:
        array, base = base, getattr(base, "base", None)
    return array


def _aliases_an_argument(result: np.ndarray, args: tuple[int, ...], env: list) -> bool:
    """Whether an extern's result is one of its arguments or may share memory with one (bounds only:
    cheap; a result that owns its memory shares none)."""
    owns = result.base is None
    for slot in args:
        array = env[slot]
        if array is result or (not owns and np.may_share_memory(result, array)):
            return True
    return False
