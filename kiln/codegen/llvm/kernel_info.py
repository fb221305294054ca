"""What a compiled kernel's caller needs: its symbol, parallel units and bytes moved (``KernelInfo``).

Apart from the code generator (``kernels.py``) so that loading a cached program, which needs only
this record, does not import the generator (its IR builders and math library).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...ir.types import Sym, SymbolicShapeError

#: Primitives the LLVM backend compiles as functions of their own, outside fused kernels
#: (``kernels_window``, ``kernels_tiles``, ``kernels_index``, ``kernels_conv``, ``kernels_reduce``): a
#: stored program's code may name these nodes.
WINDOW_OPS = frozenset({"unfold", "fold", "tile_transform", "untile_transform"})
INDEX_OPS = frozenset({"take", "index_put"})
CONV_OPS = frozenset({"conv", "conv_weight"})
#: Sums that keep the last axis (fusion takes those over trailing axes into kernels).
REDUCE_OPS = frozenset({"reduce_sum"})
NATIVE_OPS = WINDOW_OPS | INDEX_OPS | CONV_OPS | REDUCE_OPS
#: Native ops whose pointer table ends with a status word: nonzero after a call when an index was
#: out of range (the executor then runs the node's eager kernel, which raises what eager raises).
STATUS_OPS = INDEX_OPS


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
        size = self._size(sizes)
        return -(-size * self.rows_per_size // self.rows_per_unit)

    def work(self, sizes: Mapping[Sym, int] | None = None) -> int:
        """Bytes read and written for the symbols bound to ``sizes``."""
        if not self.symbols:
            return self.fixed_work_bytes
        return self.fixed_work_bytes + self._size(sizes) * self.bytes_per_size

    def _size(self, sizes: Mapping[Sym, int] | None) -> int:
        (sym,) = self.symbols
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
