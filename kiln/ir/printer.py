r"""The text form of a graph: deterministic, one node per line, read back exactly by ``kiln.ir.parser``.

Example::

    graph(%0: f32[2,3], %1: i64[2]@cuda:0) {
      %2: f32[2,3] = add(%0, %0)  # "model.py":12 in forward
      %3: f32[] = reduce_sum(%2) {axes=(0, 1), keepdim=False}
      %4: f32[3] = constant() {name="c0"}
      return (%3, %2)
    }

Grammar (``*`` repeats, ``?`` is optional, quoted text is literal; spaces and tabs between tokens
are free, but each statement is one line; blank lines are ignored)::

    graph      := "graph" "(" defs? ")" "{" NEWLINE  node*  "return" "(" uses? ")" NEWLINE  "}"
    node       := outputs "=" OP "(" uses? ")" attrs? location? NEWLINE
    outputs    := defs | "(" ")"                     -- "()" only for a node without outputs
    defs       := VALUE ":" type ("," VALUE ":" type)*
    uses       := VALUE ("," VALUE)*
    type       := DTYPE "[" (dim ("," dim)*)? "]" ("@" DEVICE)?     -- f32[2,3]  bool[]  f16[4]@cuda:0  f32[B,128]
    dim        := INT | SYMBOL                      -- a non-negative size, or a symbolic one
    attrs      := "{" NAME "=" attr ("," NAME "=" attr)* "}"        -- in the node's own order
    attr       := INT | FLOAT | STRING | DTYPE | "None" | "True" | "False" | SYMBOL | tuple
    tuple      := "(" ")" | "(" attr "," ")" | "(" attr ("," attr)+ ")"
    location   := "#" STRING ":" INT ("in" (FUNCTION | STRING))?   -- file, line, function
    VALUE      := "%" digits                        -- the Value's id
    INT        := "-"? digits
    FLOAT      := Python's repr of a float: 1.0  -0.0  1e-05  inf  -inf  nan
    DTYPE      := a dtype's short name: bool u8 i8 i16 i32 i64 f16 f32 f64
    DEVICE     := "cuda" (":" digits)? | "cpu"      -- the CPU is the default and never printed
    STRING     := '"' characters '"'  with \\ \" \n \r \t \xNN \uNNNN \UNNNNNNNN escapes
                  (every character that is not printable is escaped)
    OP, NAME   := [A-Za-z_][A-Za-z0-9_.]*
    SYMBOL     := [A-Za-z_][A-Za-z0-9_]*  other than a DTYPE, None, True, False, inf, nan
                  -- a symbolic dimension (``kiln.ir.types.Sym``): one size wherever the name appears
                  in the graph, bound when the graph runs; in attributes (a reshape's or expand's
                  ``shape``, a slice's ``stops``) it stands for that size, and there it must be a
                  symbol that a type on an earlier line or earlier on the line names
    FUNCTION   := [A-Za-z_<][A-Za-z0-9_.<>]*        -- other function names are printed as a STRING

A kernel node (``kiln.ir.graph.KERNEL``), and a loop node (``LOOP``) alike, prints its attributes other than ``bodies`` on its line,
which ends with ``{``; each body follows, nested and indented, then ``}`` closes the node and
carries its location::

    kernel     := outputs "=" "kernel" "(" uses? ")" attrs? "{" NEWLINE  body+  "}" location? NEWLINE
    body       := "body" "(" defs? ")" "{" NEWLINE  node*  "return" "(" uses? ")" NEWLINE  "}" NEWLINE

    %7: f32[4,8], %8: f32[4,1] = kernel(%0, %1) {name="k0", kind="reduction"} {
      body(%0: f32[4,8], %1: f32[8]) {
        %2: f32[4,1] = reduce_max(%0) {axes=(1,), keepdim=True}  # "m.py":3 in f
        ...
        return (%5, %2)
      }
    }  # "m.py":3 in f

Each body is its own scope: its values are its own (fusion keeps the ids the values had in the
unfused graph, so a body reads like the code it replaced), and a body cannot use the values of
the graph around it. A body's constants print as constant nodes like any other; in the table of
constants that the text form goes with (``parse_graph``'s argument, a graph file's tensors) they
are qualified by the kernel's name and the body's index: ``k0/0/c1`` is constant ``c1`` of the
first body of kernel ``k0`` (``kiln.ir.graph.qualified_constants``).

A value's type is printed where it is defined (a graph input or a node output); uses print the
id alone. Constant nodes are ``constant() {name="..."}``; their arrays are not part of the text
(``parse_graph`` takes them as an argument).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .dtypes import DType
from .graph import NESTING_OPS, Graph, Node, SourceLocation, Value
from .types import CPU, Sym, TensorType

_FUNCTION = re.compile(r"[A-Za-z_<][A-Za-z0-9_.<>]*\Z")  # plain names and <lambda>, <module>...
_SIMPLE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def print_graph(graph: Graph, *, locations: bool = True) -> str:
    """The text form of ``graph`` (ends with a newline); ``locations=False`` leaves out source locations.

    >>> from kiln.ir.graph import GraphBuilder
    >>> from kiln.ir.dtypes import float32
    >>> b = GraphBuilder()
    >>> x = b.input(TensorType((2, 3), float32))
    >>> s = b.node("reduce_sum", [x], {"axes": (1,), "keepdim": False})
    >>> print(print_graph(b.build([s])), end="")
    graph(%0: f32[2,3]) {
      %1: f32[2] = reduce_sum(%0) {axes=(1,), keepdim=False}
      return (%1)
    }
    """
    lines: list[str] = []
    _print_block(lines, "graph", graph, "", locations, ({}, {}, {}))
    return "\n".join(lines) + "\n"


def _print_block(lines: list[str], keyword: str, graph: Graph, indent: str, locations: bool, seen: tuple) -> None:
    lines.append(f"{indent}{keyword}({', '.join(map(format_definition, graph.inputs))}) {{")
    inner = indent + "  "
    for node in graph.nodes:
        if node.op in NESTING_OPS or len(node.outputs) != 1:
            lines.append(inner + format_node(node, locations=locations))
        else:
            lines.append(inner + _format_plain_node(node, locations, seen))
        if node.op in NESTING_OPS:
            for body in node.attrs.get("bodies", ()):
                _print_block(lines, "body", body, inner + "  ", locations, seen)
            closing = inner + "}"
            if locations and node.loc is not None:
                closing += "  # " + format_location(node.loc)
            lines.append(closing)
    lines.append(f"{inner}return ({', '.join(format_use(v) for v in graph.outputs)})")
    lines.append(indent + "}")


def _format_plain_node(node: Node, locations: bool, seen: tuple) -> str:
    """``format_node``'s line of a node with one output and no bodies, each distinct output type and
    attribute set formatted once per graph (``seen``: id(type) -> text, repr(attrs) -> text, and
    id(location) -> text: a trace's locations are few objects, ``jit.locations.user_location``'s). An
    unrolled loop of 61k nodes has a few dozen of each; printing it for the compile cache's key took
    0.16 s. ``repr`` tells apart every attribute value (1, 1.0 and True too), so equal keys print alike."""
    types, attr_sets, places = seen
    out = node.outputs[0]
    type_text = types.get(id(out.type))
    if type_text is None:  # (keyed by id: the graph keeps its types alive while it prints)
        type_text = types[id(out.type)] = format_type(out.type)
    attrs = node.attrs
    attrs_text = ""
    if attrs:
        key = repr(attrs)
        attrs_text = attr_sets.get(key)
        if attrs_text is None:
            attrs_text = attr_sets[key] = " {" + ", ".join([f"{k}={format_attr(v)}" for k, v in attrs.items()]) + "}"
    text = f"%{out.id}: {type_text} = {node.op}({', '.join([f'%{v.id}' for v in node.inputs])}){attrs_text}"
    loc = node.loc
    if locations and loc is not None:
        place = places.get(id(loc))
        if place is None or place[0] is not loc:  # (the object kept: its id stays its own)
            place = places[id(loc)] = (loc, "  # " + format_location(loc))
        text += place[1]
    return text


def format_type(type: TensorType) -> str:
    """``f32[2,3]``, with ``@cuda:0`` appended for a value that is not on the CPU."""
    text = f"{type.dtype.short}[{','.join(map(str, type.shape))}]"
    return text if type.device is CPU else f"{text}@{type.device}"


def format_use(value: Value) -> str:
    return f"%{value.id}"


def format_definition(value: Value) -> str:
    return f"%{value.id}: {format_type(value.type)}"


def format_node(node: Node, *, locations: bool = True) -> str:
    """One node as a line of the text form (without indentation or newline). For a kernel node,
    the line that opens its bodies (ending with ``{``; its location goes on the closing line)."""
    outputs = ", ".join(map(format_definition, node.outputs)) if node.outputs else "()"
    text = f"{outputs} = {node.op}({', '.join([f'%{v.id}' for v in node.inputs])})"
    kernel = node.op in NESTING_OPS
    if node.attrs:
        attrs = [f"{key}={format_attr(value)}" for key, value in node.attrs.items() if not (kernel and key == "bodies")]
        if attrs:
            text += " {" + ", ".join(attrs) + "}"
    if kernel:
        return text + " {"
    if locations and node.loc is not None:
        text += "  # " + format_location(node.loc)
    return text


def format_location(loc: SourceLocation) -> str:
    """``"file.py":12 in forward`` (the function quoted when it is not a plain name)."""
    text = f"{format_string(loc.filename)}:{int(loc.line)}"
    if loc.function:
        function = loc.function if _FUNCTION.match(loc.function) else format_string(loc.function)
        text += f" in {function}"
    return text


def format_string(text: str) -> str:
    """A double-quoted string literal that the parser reads back to exactly ``text``."""
    return '"' + "".join(_escape(c) for c in text) + '"'


def _escape(c: str) -> str:
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c]
    if c.isprintable():
        return c
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def format_attr(value: Any) -> str:
    """An attribute value as the parser reads it back (floats by ``repr``: exact, incl. inf/nan/-0.0)."""
    cls = value.__class__
    # the common cases first, each printed as Python's repr prints it (a graph of 100k nodes prints
    # several times faster): a tuple of plain ints (a shape, axes, a slice's starts), an int
    if cls is tuple and all([v.__class__ is int for v in value]):
        return repr(value)
    if cls is int:
        return repr(value)
    if value is None or isinstance(value, bool | np.bool_):
        return repr(None if value is None else bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return repr(float(value))
    if isinstance(value, str):
        return format_string(value)
    if isinstance(value, DType):
        return value.short
    if isinstance(value, Sym):
        return str(value)  # a name, or a product such as 3*T
    if isinstance(value, tuple):
        if len(value) == 1:
            return f"({format_attr(value[0])},)"
        return f"({', '.join(map(format_attr, value))})"
    raise TypeError(
        f"cannot print attribute value {value!r} of type {type(value).__name__}: expected an int, float, bool, "
        "str, None, a kiln dtype, a Sym or a tuple of these"
    )
