"""What a compiled kernel's caller needs: its symbol, parallel units and bytes moved (``KernelInfo``).

Apart from the code generator (``kernels.py``) so that loading a cached program, which needs only
this record, does not import the generator (its IR builders and math library).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from types import ModuleType

from ...ir import dtypes as dt
from ...ir.types import Dim, Sym, SymbolicShapeError, dim_size, is_static

#: Primitives the LLVM backend compiles as functions of their own, outside fused kernels, by family:
#: a stored program's code may name these nodes.
WINDOW_OPS = frozenset({"unfold", "fold", "tile_transform", "untile_transform"})
INDEX_OPS = frozenset({"take", "index_put"})
CONV_OPS = frozenset({"conv", "conv_weight"})
#: Sums that keep the last axis (fusion takes those over trailing axes into kernels).
REDUCE_OPS = frozenset({"reduce_sum"})
PAD_OPS = frozenset({"pad"})


@dataclass(frozen=True)
class NativeFamily:
    """Primitives compiled as functions of their own by one module of this package.

    The module (imported only when code is generated: ``native_code``) defines
    ``compilable(node) -> str | None`` (why the node is not compiled; None: it is) and
    ``emit(builder, args, node, layouts) -> int`` (the function's body; its parallel units), and may
    define ``eager_by_choice(node) -> str | None`` (the eager kernel is faster: nothing to report) and
    ``work_bytes(node) -> int`` (bytes moved, where that is not each input and output once).
    ``status``: the pointer table ends with a status word, nonzero after a call when an index was
    out of range (the executor then runs the node's eager kernel, which raises what eager raises)."""

    ops: frozenset[str]
    module: str
    status: bool = False


NATIVE_FAMILIES = (
    NativeFamily(WINDOW_OPS, "window"),  # and tiles, which it calls
    NativeFamily(INDEX_OPS, "gather_scatter", status=True),
    NativeFamily(CONV_OPS, "conv"),
    NativeFamily(REDUCE_OPS, "leading_sums"),
    NativeFamily(PAD_OPS, "pad"),
)
_FAMILY = {op: family for family in NATIVE_FAMILIES for op in family.ops}
NATIVE_OPS = frozenset(_FAMILY)
STATUS_OPS = frozenset(op for family in NATIVE_FAMILIES if family.status for op in family.ops)


def moved_bytes(node) -> int:
    """Bytes of every input and output of the node ``node``, once each."""
    return sum(v.type.numel * v.type.dtype.itemsize for v in (*node.inputs, *node.outputs))


def float_static(node) -> str | None:
    """Why a native float op's node (a window op, a direct convolution, a sum of rows) runs on its
    eager kernel for its dtype or its shapes (None: float32 or float64, static shapes)."""
    dtype = node.output.type.dtype
    if dtype not in (dt.float32, dt.float64):
        return f"{node.op} of {dtype.name} runs on its eager kernel"
    if not all(is_static(v.type.shape) for v in (*node.inputs, *node.outputs)):
        return f"{node.op} over a symbolic dimension runs on its eager kernel"
    return None


def native_code(op: str) -> ModuleType:
    """The module that compiles the native op ``op`` (``NativeFamily``); importing it loads the code generator."""
    return importlib.import_module(f"{__package__}.{_FAMILY[op].module}")


@dataclass(frozen=True)
class KernelInfo:
    """A compiled kernel's entry point, its number of parallel units, and bytes read + written.

    For a kernel over a symbolic dimension (``symbols`` not empty) both depend on the bound sizes:
    ``units(sizes)`` is ``ceil(size * rows_per_size / rows_per_unit)`` and ``work(sizes)`` is
    ``fixed_work_bytes + size * bytes_per_size``; ``extent`` and ``work_bytes`` raise for it, so
    that a caller that assumes a static kernel fails loudly instead of running no units.
    """

    symbol: str
    fixed_extent: int
    fixed_work_bytes: int
    symbols: tuple[Sym, ...] = ()  # the sizes the kernel reads after the pointers, in slot order
    rows_per_size: int = 0
    rows_per_unit: int = 1
    bytes_per_size: int = 0
    #: ``(dims, itemsize)`` per value of a kernel over several symbols (``symbolic_rows``): its work
    #: is their bytes at the bound sizes (``bytes_per_size`` does not apply)
    work_terms: tuple[tuple[tuple[Dim, ...], int], ...] = ()

    @property
    def extent(self) -> int:
        """The number of parallel units of a static kernel."""
        self._require_static("extent")
        return self.fixed_extent

    @property
    def work_bytes(self) -> int:
        """Bytes read and written by a static kernel."""
        self._require_static("work_bytes")
        return self.fixed_work_bytes

    def units(self, sizes: Mapping[Sym, int] | None = None) -> int:
        """The number of parallel units for the symbols bound to ``sizes``."""
        if not self.symbols:
            return self.fixed_extent
        size = self._size(sizes)  # (a kernel whose units do not depend on it has rows_per_size 0)
        return self.fixed_extent + -(-size * self.rows_per_size // self.rows_per_unit)

    def work(self, sizes: Mapping[Sym, int] | None = None) -> int:
        """Bytes read and written for the symbols bound to ``sizes``."""
        if not self.symbols:
            return self.fixed_work_bytes
        if self.work_terms:
            self._size(sizes)  # says which size is missing
            assert sizes is not None
            return sum(itemsize * prod(dim_size(d, sizes) for d in dims) for dims, itemsize in self.work_terms)
        return self.fixed_work_bytes + self._size(sizes) * self.bytes_per_size

    def _size(self, sizes: Mapping[Sym, int] | None) -> int:
        sym = self.symbols[0]  # the units' size (a kernel over rows of a symbolic length reads a second)
        if sizes is None or sym not in sizes:
            raise KeyError(f"kernel {self.symbol} runs over the symbolic dimension {sym}: give its size")
        return int(sizes[sym])

    def _require_static(self, what: str) -> None:
        if self.symbols:
            names = ", ".join(map(str, self.symbols))
            raise SymbolicShapeError(
                f"kernel {self.symbol} runs over the symbolic dimension {names}: its {what} depends on the size "
                "(KernelInfo.units(sizes) / work(sizes))"
            )
