"""Window nodes compiled: ``unfold`` (im2col) and ``fold`` (col2im), with the kernels' calling convention.

Convolution is unfold + matmul (+ fold in its backward: ``kiln/nn/_conv.py``). Their eager
kernels are numpy copies on one thread (a 6-d strided copy, and one strided add per kernel
offset); here each is one function ``void @sym(ptr args, i64 begin, i64 end)`` over parallel
units, specialized on the node's static shapes, attributes and its input's strides, as a fused
kernel is (``kernels.py``): the executor runs it on the thread pool and reads its ``KernelInfo``.

- ``unfold``: a unit is a block of output planes (all dims but the last two output positions, in
  the output's memory order, ``batch_inner`` or not); a plane is rows of ``o_last`` elements copied
  from the input at stride ``stride[-1]``, so a unit-stride convolution's rows are contiguous loads
  and stores, and the division of a flat index into the output's dims runs once per plane.
- ``fold``: a unit is a block of ``(n, c)`` planes of the output with one ``c`` (a block of samples
  when the windows are ``batch_inner``, so each kernel offset's windows are read in order), which
  it zeroes and then sums every window element of those planes into: threads own disjoint planes,
  so there are no races, and the result does not depend on how units are split (each element's
  sum runs in the same order).

A ``fold`` over a symbolic batch (the output's leading dim; every other size static: a
convolution's input gradient, a pool's, over a dynamic batch) reads the batch from the argument
table, after the pointers: a unit is then one ``(n, c)`` plane, ``C * N`` of them (``symbolic_info``),
and windows with the batch inner (C order) are addressed at strides that follow the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from llvmlite import ir

from ...ir.graph import Node
from ...ir.primitives.tiles import one_tile_a_plane
from ...ir.types import Sym, is_static
from ..core import Unsupported
from .body import element_pointer, operand_pointers
from .emitter import memory_type
from .kernel_info import WINDOW_OPS, float_static
from .loops import CHUNK, dot, for_range, i64, minimum, row_major_indices, static_shape
from .symbolic import symbol_size
from .tiles import tile, untile
from .vectors import transfer_row

# A unit of an unfold: whole rows of about ``CHUNK`` output elements (at least one row).
#: Output elements of a fold unit's block of planes (at least one plane): 64 KB of float32, in L2.
FOLD_BLOCK = 16384


def compilable(node: Node) -> str | None:
    """Why the window node ``node`` is not compiled (None: it is)."""
    if node.op not in WINDOW_OPS:
        return f"{node.op} is not a window op"
    if _fold_batch(node) is not None or _unfold_batch(node) is not None:
        return None if node.output.type.dtype.name in ("float32", "float64") else float_static(node)
    why = float_static(node)
    if why is not None:
        return why
    return eager_by_choice(node)


def eager_by_choice(node: Node) -> str | None:
    """Why the window node runs on its eager kernel because that is faster, not for want of a
    compiled one (None: it does not)."""
    if node.op in ("tile_transform", "untile_transform"):
        plane = node.inputs[0].type.shape[-2:] if node.op == "tile_transform" else node.attrs["size"]
        if one_tile_a_plane(plane, len(node.attrs["matrix"][0])):
            return f"{node.op} of one tile a plane (a filter's) is one matmul: its eager kernel, in BLAS"
    return None


def emit(builder: ir.IRBuilder, params: Sequence[ir.Value], node: Node,
         layouts: Sequence[tuple[int, ...]]) -> int | tuple[int, int]:  # fmt: skip
    """Emit ``node``'s function body at ``builder``, the entry block of ``(args, begin, end)`` =
    ``params``; return its extent (over a symbolic batch: units per sample, 1)."""
    why = compilable(node)
    if why is not None:
        raise Unsupported(why)
    args, begin, end = params
    pointers = operand_pointers(builder, args, 2)
    strides = tuple(layouts[0])
    extent: int | tuple[int, int]
    if _fold_batch(node) is not None:
        _fold_over_batch(builder, pointers, begin, end, node, strides, symbol_size(builder, args, 2))
        extent = static_shape(node.output)[1], 1
    elif node.op == "unfold":
        samples = symbol_size(builder, args, 2) if _unfold_batch(node) is not None else None
        extent = _unfold(builder, pointers, begin, end, node, strides, samples)
    else:
        extent = {"fold": _fold, "tile_transform": tile, "untile_transform": untile}[node.op](
            builder, pointers, begin, end, node, strides
        )
    builder.ret_void()
    return extent


def _fold_batch(node: Node) -> Sym | None:
    """The symbolic batch of a ``fold`` node: its output's leading dim, the windows' batch dim (first,
    or after the channel and kernel dims when ``batch_inner``), every other size static; else None."""
    if node.op != "fold" or not node.output.type.shape or not isinstance(node.output.type.shape[0], Sym):
        return None
    windows, sym = node.inputs[0].type.shape, node.output.type.shape[0]
    at = 1 + len(node.attrs["kernel_size"]) if node.attrs.get("batch_inner", False) else 0
    rest = (*windows[:at], *windows[at + 1 :], *node.output.type.shape[1:])
    return sym if windows[at] == sym and is_static(rest) else None


def _unfold_batch(node: Node) -> Sym | None:
    """The symbolic batch of an ``unfold`` node: its input's leading dim, its windows' batch dim (first,
    or after the channel and kernel dims when ``batch_inner``), every other size static; else None."""
    if node.op != "unfold" or not node.inputs[0].type.shape or not isinstance(node.inputs[0].type.shape[0], Sym):
        return None
    windows, sym = node.output.type.shape, node.inputs[0].type.shape[0]
    at = 1 + len(node.attrs["kernel_size"]) if node.attrs.get("batch_inner", False) else 0
    rest = (*windows[:at], *windows[at + 1 :], *node.inputs[0].type.shape[1:])
    return sym if windows[at] == sym and is_static(rest) else None


def symbolic_info(node: Node, extent: int | tuple[int, int]) -> tuple:
    """``(symbols, fixed_extent, rows_per_size, rows_per_unit, fixed_bytes, bytes_per_size)`` of a
    ``fold`` or ``unfold`` over a symbolic batch (``KernelInfo``): a fold's unit is a plane, ``C`` of
    them a sample; an unfold's a block of window planes."""
    sym = _fold_batch(node) or _unfold_batch(node)
    assert sym is not None and isinstance(extent, tuple), f"{node.op} over symbolic sizes other than a batch"
    per_sample = sum(math.prod([d for d in v.type.shape if isinstance(d, int)]) * v.type.dtype.itemsize
                     for v in (*node.inputs, *node.outputs))  # fmt: skip
    return (sym,), 0, extent[0], extent[1], 0, per_sample


def _geometry(node: Node):
    attrs = node.attrs
    kernel, stride, dilation = tuple(attrs["kernel_size"]), tuple(attrs["stride"]), tuple(attrs["dilation"])
    return kernel, stride, dilation, bool(attrs.get("batch_inner", False))


def _unfold(builder, pointers, begin, end, node: Node, strides: tuple[int, ...],
            samples: ir.Value | None = None) -> int | tuple[int, int]:  # fmt: skip
    """``unfold``'s loops; over a symbolic batch of ``samples`` (an i64; the input's strides, the
    batch leading, are the same at every batch) its planes are ``samples`` times the others, and its
    units per sample are returned (with 1)."""
    kernel, stride, dilation, batch_inner = _geometry(node)
    d = len(kernel)
    batch_at = 1 + d if batch_inner else 0
    # the output's sizes, the batch's as 1 over a symbolic batch (its planes are then per sample)
    out_shape = static_shape(node.output) if samples is None else _one_batch(node.output.type.shape, batch_at)
    dtype = node.output.type.dtype
    # memory-order dims of the output, and for each its meaning: ("n"|"c", None) or ("k"|"o", i)
    names: list[tuple[str, int | None]] = [("n", None), ("c", None), *(("k", i) for i in range(d))]
    names += [("o", i) for i in range(d)]
    if batch_inner:
        names = [names[1], *names[2 : 2 + d], names[0], *names[2 + d :]]
    # a plane: the last two output dims (the last alone for 1-d windows); units are blocks of planes
    # (the index arithmetic of a plane's start runs once per plane, not per row)
    plane_dims = 2 if len(out_shape) >= 2 and names[-2][0] == "o" else 1
    rows_per_plane = out_shape[-2] if plane_dims == 2 else 1
    inner = out_shape[-1]
    planes = math.prod(out_shape[:-plane_dims])
    per_unit = max(1, CHUNK // max(1, inner * rows_per_plane))
    extent: int | tuple[int, int] = (-(-planes // per_unit) if planes else 0) if samples is None else (planes, per_unit)
    x_n, x_c, x_s = strides[0], strides[1], strides[2:]
    coefficient: dict[tuple[str, int | None], int] = {("n", None): x_n, ("c", None): x_c}
    for i in range(d):
        coefficient["k", i] = dilation[i] * x_s[i]
        coefficient["o", i] = stride[i] * x_s[i]
    row_step = coefficient[names[-2]] if plane_dims == 2 else 0
    first = builder.mul(begin, i64(per_unit), flags=("nsw",))
    every = i64(planes) if samples is None else builder.mul(samples, i64(planes), flags=("nsw",))
    last = minimum(builder, builder.mul(end, i64(per_unit), flags=("nsw",)), every)
    with for_range(builder, first, last, name="plane") as plane:
        if samples is None:
            indices = row_major_indices(builder, plane, out_shape[:-plane_dims])
        else:
            indices = _indices_over_batch(builder, plane, out_shape[:-plane_dims], batch_at, samples)
        base = dot(builder, [(v, coefficient[name]) for v, name in zip(indices, names[:-plane_dims], strict=True)])
        with for_range(builder, 0, rows_per_plane, name="row", vectorize=False) as row:
            src_row = builder.add(base, builder.mul(row, i64(row_step), flags=("nsw",)), flags=("nsw",))
            flat_row = builder.add(builder.mul(plane, i64(rows_per_plane), flags=("nsw",)), row, flags=("nsw",))
            out_base = builder.mul(flat_row, i64(inner), flags=("nsw",))
            source_row, output_row = (pointers[0], src_row), (pointers[1], out_base)
            transfer_row(builder, inner, source_row, output_row, coefficient["o", d - 1], 1, dtype, add=False)
    return extent


def _fold_over_batch(builder, pointers, begin, end, node: Node, strides: tuple[int, ...], samples: ir.Value) -> None:
    """``fold`` over a symbolic batch of ``samples`` (an i64): a unit is the ``(n, c)`` plane
    ``unit = c * samples + n``, zeroed and then summed into from every kernel offset's windows, in
    offset order as ``_fold``. Windows that lead with the batch are read at their strides (the same at
    every batch); windows with the batch inner must be C order (a layout that follows the batch is
    taken by the program only so), their channel's and kernel offsets' strides the batch times a
    static part."""
    kernel, stride, dilation, batch_inner = _geometry(node)
    d = len(kernel)
    windows_shape = node.inputs[0].type.shape
    out_shape = static_shape(node.output)[1:]  # (C, *S); the batch is ``samples``
    c_size, size = out_shape[0], out_shape[1:]
    out_spatial = cast(tuple[int, ...], windows_shape[-d:])
    plane = math.prod(size)
    positions = math.prod(out_spatial)
    # each stride of the windows as (static part, whether times the batch)
    if batch_inner:  # (C, *K, N, *O), C order: the channel's and kernel offsets' strides follow the batch
        _check_c_order(node, strides, 1 + d)
        c_part, k_parts = (math.prod(kernel) * positions, True), [(math.prod(kernel[i + 1 :]) * positions, True)
                                                                   for i in range(d)]  # fmt: skip
        n_part = (positions, False)
    else:  # (N, C, *K, *O): the batch leads, so every stride is the same at every batch
        n_part, c_part, k_parts = (strides[0], False), (strides[1], False), [(s, False) for s in strides[2 : 2 + d]]
    o_strides = strides[2 + d :]

    def times(value, part):
        step, by_batch = part
        scaled = builder.mul(value, i64(step), flags=("nsw",))
        return builder.mul(scaled, samples, flags=("nsw",)) if by_batch else scaled

    size_strides = [math.prod(size[i + 1 :]) for i in range(d)]
    zero = ir.Constant(memory_type(node.output.type.dtype), 0.0)
    with for_range(builder, begin, end, name="unit") as unit:
        c, n = builder.udiv(unit, samples), builder.urem(unit, samples)
        base = builder.mul(builder.add(builder.mul(n, i64(c_size)), c), i64(plane), flags=("nsw",))
        with for_range(builder, 0, plane, name="z", parallel=True) as z:
            builder.store(zero, element_pointer(builder, pointers[1], builder.add(base, z), node.output.type.dtype))
        n_src = builder.add(times(c, c_part), times(n, n_part), flags=("nsw",))
        with for_range(builder, 0, math.prod(kernel), name="k", vectorize=False) as k_flat:
            k = row_major_indices(builder, k_flat, kernel)
            k_src = n_src
            for index, part in zip(k, k_parts, strict=True):
                k_src = builder.add(k_src, times(index, part), flags=("nsw",))
            k_dst = builder.add(base, dot(builder, [(k[i], dilation[i] * size_strides[i]) for i in range(d)]))
            _fold_rows(builder, pointers, node, k_src, k_dst, out_spatial, o_strides, size_strides)


def _check_c_order(node: Node, strides: tuple[int, ...], at: int) -> None:
    """``Unsupported`` unless the windows' element ``strides`` (at the batch the code is generated
    for: where the batch is inner, the first stride says which) are C order; ``at``: the batch dim."""
    shape = list(node.inputs[0].type.shape)
    static_part = math.prod(shape[1:at] + shape[at + 1 :])  # type: ignore[arg-type]  # static but the batch
    shape[at] = strides[0] // static_part if at and static_part else 1
    expected = tuple(math.prod(shape[k + 1 :]) for k in range(len(shape)))  # type: ignore[arg-type]
    if tuple(strides) != expected:
        raise Unsupported("a fold over a symbolic batch whose windows are not in C order runs on its eager kernel")


def _fold_rows(builder, pointers, node: Node, src, dst, out_spatial, o_strides, size_strides) -> None:
    """Add one kernel offset's windows of one plane (at ``src``) into its output plane (at ``dst``):
    one pass per output row of windows, ``out_spatial[-1]`` elements at the stride."""
    _, stride, _, _ = _geometry(node)
    d = len(out_spatial)
    with for_range(builder, 0, math.prod(out_spatial[:-1]), name="r", vectorize=False) as r_flat:
        o = row_major_indices(builder, r_flat, out_spatial[:-1])
        row_src = builder.add(src, dot(builder, list(zip(o, o_strides[:-1]))), flags=("nsw",))
        row = [(o[i], stride[i] * size_strides[i]) for i in range(d - 1)]
        row_dst = builder.add(dst, dot(builder, row), flags=("nsw",))
        transfer_row(builder, out_spatial[-1], (pointers[0], row_src), (pointers[1], row_dst), o_strides[-1],
                     stride[-1], node.output.type.dtype, add=True)  # fmt: skip


def _one_batch(shape, batch_at: int) -> tuple[int, ...]:
    """``shape`` (static but for its batch, at ``batch_at``) with the batch as 1."""
    return cast(tuple[int, ...], tuple(1 if k == batch_at else n for k, n in enumerate(shape)))


def _indices_over_batch(builder: ir.IRBuilder, flat: ir.Value, sizes, batch_at: int, samples: ir.Value) -> list:
    """``row_major_indices`` of ``flat`` over ``sizes`` whose size at ``batch_at`` is ``samples`` (an
    i64 read at run time; ``sizes`` holds 1 there)."""
    out = []
    for k in range(len(sizes)):
        inner = i64(math.prod(sizes[k + 1 :]))
        if batch_at > k:
            inner = builder.mul(inner, samples, flags=("nsw",))
        value = builder.udiv(flat, inner)
        out.append(builder.urem(value, samples if k == batch_at else i64(sizes[k])) if k else value)
    return out


def _fold(builder, pointers, begin, end, node: Node, strides: tuple[int, ...]) -> int:
    kernel, stride, dilation, batch_inner = _geometry(node)
    d = len(kernel)
    out_shape = static_shape(node.output)  # (N, C, *S), C order
    n_size, c_size, size = out_shape[0], out_shape[1], out_shape[2:]
    out_spatial = static_shape(node.inputs[0])[-d:]
    dtype = node.output.type.dtype
    plane = math.prod(size)
    # the windows' strides by meaning (the input is (C, *K, N, *O) when batch_inner)
    if batch_inner:
        c_stride, k_strides, n_stride, o_strides = strides[0], strides[1 : 1 + d], strides[1 + d], strides[2 + d :]
    else:
        n_stride, c_stride, k_strides, o_strides = strides[0], strides[1], strides[2 : 2 + d], strides[2 + d :]
    size_strides = [math.prod(size[i + 1 :]) for i in range(d)]  # the output plane's, C order
    zero = ir.Constant(memory_type(dtype), 0.0)
    # A unit is a block of (n, c) planes of one c: the block's planes are zeroed, then each kernel
    # offset adds its windows into every plane of the block. With batch_inner, one offset's windows
    # for a block of samples are one stretch of memory, read in order; with one plane per unit they
    # were a short stretch per offset (64 bytes in ResNet's last stage), and fold ran at a third of
    # unfold's bandwidth. Each element still sums its windows in offset order, as the eager fold.
    block = max(1, min(n_size, FOLD_BLOCK // max(1, plane))) if batch_inner else 1
    blocks = -(-n_size // block)
    with for_range(builder, begin, end, name="unit") as unit:
        c, first_n = builder.udiv(unit, i64(blocks)), builder.mul(builder.urem(unit, i64(blocks)), i64(block))
        last_n = minimum(builder, builder.add(first_n, i64(block)), i64(n_size))

        def out_base(n):
            return builder.mul(builder.add(builder.mul(n, i64(c_size)), c), i64(plane), flags=("nsw",))

        with for_range(builder, first_n, last_n, name="zn", vectorize=False) as n:
            base = out_base(n)
            with for_range(builder, 0, plane, name="z", parallel=True) as z:
                builder.store(zero, element_pointer(builder, pointers[1], builder.add(base, z), dtype))
        with for_range(builder, 0, math.prod(kernel), name="k", vectorize=False) as k_flat:
            k = row_major_indices(builder, k_flat, kernel)
            k_src = dot(builder, [(c, c_stride), *zip(k, k_strides)])
            k_dst = dot(builder, [(k[i], dilation[i] * size_strides[i]) for i in range(d)])
            with for_range(builder, first_n, last_n, name="n", vectorize=False) as n:
                n_src = builder.add(k_src, builder.mul(n, i64(n_stride), flags=("nsw",)), flags=("nsw",))
                n_dst = builder.add(out_base(n), k_dst, flags=("nsw",))
                # one pass per output row of windows: a row adds out_spatial[-1] elements at stride[-1]
                with for_range(builder, 0, math.prod(out_spatial[:-1]), name="r", vectorize=False) as r_flat:
                    o = row_major_indices(builder, r_flat, out_spatial[:-1])
                    src = builder.add(n_src, dot(builder, list(zip(o, o_strides[:-1]))), flags=("nsw",))
                    row = [(o[i], stride[i] * size_strides[i]) for i in range(d - 1)]
                    dst = builder.add(n_dst, dot(builder, row), flags=("nsw",))
                    windows, plane_row = (pointers[0], src), (pointers[1], dst)
                    transfer_row(
                        builder, out_spatial[-1], windows, plane_row, o_strides[-1], stride[-1], dtype, add=True
                    )
    return c_size * blocks
