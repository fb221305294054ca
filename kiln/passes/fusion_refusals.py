"""Why fusion left two pieces of work apart (as Inductor's ``WhyNoFuse``): recorded cheaply, worded when shown.

Every place of fusion that declines a merge makes a ``Refusal``: its kind (a key of ``WORDING``), a
value each side makes and a few details, all taken as they are (no text is built while fusing: a
chain of ten thousand nodes fuses in near-linear time, refusals included). The sides are named only
once the fused graph exists, by the kernel that holds each value (``k3``, with its kind) or the
extern node that makes it (``matmul %12``), so a refusal reads as the fused graph the user sees:

    reduction k1 + elementwise k2: an output of shape [1,8,1,1] is neither the full value [8,4,16,16] nor a row value [8]

``fuse(graph, ..., refusals=[])`` appends the refusals of the final fusion (merges that a later,
larger merge made after all are not among them); ``summarize`` words the first few of each kind,
with a count of the rest, for ``kiln.explain`` and ``dump_dir``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple

from ..ir.graph import KERNEL, Graph, Value


class Refusal(NamedTuple):
    """A merge fusion declined: ``kind`` (a key of ``WORDING``), a value of each side (``second`` None:
    a refusal about one side alone) and the details its wording reads."""

    kind: str
    first: Value
    second: Value | None
    detail: tuple = ()


def _shape(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _rows(signature) -> str:
    domain, axes = signature
    return f"{_shape(domain)} reduced over axes {tuple(axes)}"


def _outputs(a: str, b: str, detail: tuple) -> str:
    (shapes,) = detail
    return f"outputs of shapes {', '.join(map(_shape, shapes))}: an elementwise kernel has one domain"


def _row_outputs(a: str, b: str, detail: tuple) -> str:
    signature, shapes = detail
    domain, axes = signature
    outer = domain[: len(domain) - len(axes)]
    rows = {outer + (1,) * j for j in range(len(axes) + 1)}
    odd = next((s for s in shapes if s != domain and s not in rows), domain)
    return (
        f"an output of shape {_shape(odd)} is neither the full value {_shape(domain)} nor a row value {_shape(outer)}"
    )


def _remap(a: str, b: str, detail: tuple) -> str:
    value, domain = detail
    return (f"%{value.id} of shape {_shape(value.type.shape)} reaches no element of the domain {_shape(domain)} "
            "by index remapping")  # fmt: skip


def _why_axes(axes: tuple, shape: tuple) -> str:
    if len(shape) - 1 in axes:
        return "not trailing ones, and its input's shape is not static"
    return "and keeps the last one (a kernel's row of it would read a column)"


#: Each kind's wording: ``word(first side, second side, detail)`` -> the reason after "a + b: ".
WORDING: dict[str, Callable[[str, str, tuple], str]] = {
    "size": lambda a, b, d: f"{d[0]} nodes together, more than one kernel takes ({d[1]})",
    "no domain": lambda a, b, d: f"{(a, b)[d[0]]} has no single domain (its outputs have several shapes)",
    "outputs": _outputs,
    "reductions": lambda a, b, d: f"different rows: {_rows(d[0])} and {_rows(d[1])}",
    "row outputs": _row_outputs,
    "remap": _remap,
    "row read": lambda a, b, d: f"%{d[0].id}, computed from a reduction, would be read at another row's index",
    "cycle": lambda a, b, d: f"a path leaves {a} and comes back through {d[0] if d else 'another node'}",
    "far": lambda a, b, d: (
        f"too far apart to search for a path that leaves {a} and comes back (more than {d[0]} kernels or nodes "
        "on each side: fusion_groups.MAX_ORDER_SEARCH)"
    ),
    "conv reader": lambda a, b, d: "a conv kernel takes elementwise kernels only",
    "conv result": lambda a, b, d: (
        "the convolution's result is also read elsewhere (a conv kernel keeps it on the stack)"
    ),
    "conv backend": lambda a, b, d: "the backend compiles no conv kernel of the two (takes_epilogue)",
    "horizontal": lambda a, b, d: f"the same body, but {b} depends on {a}",
    "axes": lambda a, b, d: f"{a} stays out of kernels: it reduces axes {d[0]} of {_shape(d[1])}, {_why_axes(*d)}",
    "check": lambda a, b, d: (
        f"{a} and {d[0] - 1} other node(s) a check's condition is computed from stay out of "
        "kernels: a kernel would feed a check and read what the check guards"
    ),
}


class SideNames:
    """Names for the values of a fused graph, long and short: the kernel that makes each
    (``("elementwise k3", "k3")``), the node that makes it (``matmul %12`` both), the kernels that
    compute it without making it (``sub %9 (in k3, k5)``: recomputation dropped its maker's kernel),
    else ``%id``; ``made``: the ids of the values some node of the graph makes. Kernel bodies are
    walked only for the ids of ``wanted`` that no node makes (a long chain's bodies are large)."""

    def __init__(self, graph: Graph, wanted: Collection[int] = ()) -> None:
        self.names: dict[int, tuple[str, str]] = {}
        for node in graph.nodes:
            if node.op == KERNEL:
                kernel = str(node.attrs["name"])
                for v in node.outputs:
                    self.names[v.id] = (f"{node.attrs['kind']} {kernel}", kernel)
            else:
                for v in node.outputs:
                    self.names[v.id] = (f"{node.op} %{v.id}",) * 2
        self.made = set(self.names)
        missing = set(wanted) - self.made
        if missing:
            self._inside(graph, missing)

    def _inside(self, graph: Graph, missing: set[int]) -> None:
        inside: dict[int, tuple[str, list[str]]] = {}  # value -> (op, the kernels computing it)
        for node in graph.nodes:
            if node.op != KERNEL:
                continue
            for body in node.attrs["bodies"]:
                for inner in body.nodes:
                    for v in inner.outputs:
                        if v.id in missing:
                            inside.setdefault(v.id, (inner.op, []))[1].append(str(node.attrs["name"]))
        for key, (op, kernels) in inside.items():
            listed = ", ".join(kernels[:3]) + (", ..." if len(kernels) > 3 else "")
            self.names[key] = (f"{op} %{key} (in {listed})",) * 2

    def __call__(self, v: Value) -> tuple[str, str]:
        return self.names.get(v.id, (f"%{v.id}",) * 2)


def word(refusal: Refusal, name: SideNames) -> str:
    """The refusal in words: ``a + b: why`` (``why`` alone for a refusal of one side)."""
    a, short_a = name(refusal.first)
    b, short_b = name(refusal.second) if refusal.second is not None else ("", "")
    detail = tuple(name(d)[0] if isinstance(d, Value) and refusal.kind == "cycle" else d for d in refusal.detail)
    why = WORDING[refusal.kind](short_a, short_b, detail)
    return f"{a} + {b}: {why}" if b else why


def summarize(refusals: Sequence[Refusal], graph: Graph, per_kind: int = 3) -> list[str]:
    """The refusals in words, the first ``per_kind`` of each kind (in the order kinds first occur),
    then a count of that kind's others; ``graph``: the fused graph, which names the sides. A refusal
    whose sides ended in one kernel all the same (the conv epilogue's merge), or of which a side is
    no unit of the graph any more (every value it made is computed again by its readers), is left out."""
    wanted = {v.id for r in refusals for v in (r.first, r.second, *r.detail) if isinstance(v, Value)}
    name = SideNames(graph, wanted)
    shown: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for refusal in refusals:
        if refusal.first.id not in name.made:
            continue
        if refusal.second is not None and (
            refusal.second.id not in name.made or name(refusal.first) == name(refusal.second)
        ):
            continue
        counts[refusal.kind] = counts.get(refusal.kind, 0) + 1
        if counts[refusal.kind] <= per_kind:  # only these are worded
            shown.setdefault(refusal.kind, []).append(word(refusal, name))
    lines = []
    for kind in counts:
        lines += shown.get(kind, [])
        if counts[kind] > per_kind:
            lines.append(f"... and {counts[kind] - per_kind} more of this kind ({kind})")
    return lines
