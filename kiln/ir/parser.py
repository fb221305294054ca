"""Reads the text form written by ``kiln.ir.printer`` back into a ``Graph`` (grammar: see that module).

A small hand-written tokenizer and recursive-descent parser: nothing in the text is ever
evaluated. Errors are ``ParseError`` naming the line and column and what was expected.

>>> g = parse_graph('''
... graph(%0: f32[2]) {
...   %1: f32[2] = exp(%0)  # "model.py":3 in forward
...   return (%1)
... }''')
>>> g.nodes[0].op, g.nodes[0].loc.line, g.outputs[0].type.shape
('exp', 3, (2,))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import BY_NAME
from .graph import CONSTANT, NESTING_OPS, QUALIFIER, Graph, Node, SourceLocation, Value, body_constants
from .types import RESERVED_NAMES, Dim, Sym, TensorType, device, parse_dim, sym_product

__all__ = ["ParseError", "parse_graph"]


class ParseError(ValueError):
    """A syntax or naming error in the text form, at ``line`` and ``column`` (both 1-based)."""

    def __init__(self, message: str, line: int, column: int, source: str = "") -> None:
        text = f"line {line}, column {column}: {message}"
        if source:
            text += f"\n    {source}\n    {' ' * (column - 1)}^"
        super().__init__(text)
        self.line = line
        self.column = column


@dataclass(frozen=True)
class _Token:
    kind: str  # "value", "int", "float", "name", "string", "punct" or "end"
    text: str
    column: int  # 1-based
    value: Any = None

    def describe(self) -> str:
        return "end of line" if self.kind == "end" else repr(self.text)


_TOKEN = re.compile(
    r"""(?P<space>[ \t]+)
      | (?P<value>%\d+)
      | (?P<float>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)|-inf(?![\w<>.]))
      | (?P<int>-?\d+)
      | (?P<name>[A-Za-z_<][\w.<>]*)
      | (?P<symsum>\((?:[\w*]|\([\w*+\-]+\)(?://\d+)?)+[+\-](?:[\w*+\-]|\([\w*+\-]+\)(?://\d+)?)*\)(?://\d+)?
                  |\([\w*+\-]+\)//\d+)
      | (?P<punct>[(){}\[\],:=@\#*])
      | (?P<string>")""",
    re.VERBOSE,
)
_OP = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_NAMED_ATTRS: dict[str, Any] = {"None": None, "True": True, "False": False, "inf": float("inf"), "nan": float("nan")}


def parse_graph(text: str, constants: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Parse the printer's text form. ``constants`` supplies the arrays of ``constant`` nodes.

    With ``constants`` given, every constant node's name must be in it (else a ``ParseError``)
    and the graph's constant table is ``dict(constants)`` (less the kernels' body constants, which
    it carries under qualified names, ``kiln.ir.graph.qualified_constants``, and which go to the bodies); without, the table is empty (fine for
    reading and printing; ``verify`` will reject the graph). The graph is not verified here.
    """
    return _GraphParser(text, constants).parse()


def _own_constants(table: Mapping[str, np.ndarray] | None, nodes: list[Node]) -> dict[str, np.ndarray]:
    """The entries of a flat constant table that are not qualified names of the kernels' bodies."""
    if table is None:
        return {}
    kernels = {node.attrs.get("name") for node in nodes if node.op in NESTING_OPS}
    return {key: value for key, value in table.items() if key.partition(QUALIFIER)[0] not in kernels}


def _tokenize(line: str, lineno: int) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(line):
        match = _TOKEN.match(line, pos)
        if match is None:
            raise ParseError(f"unexpected character {line[pos]!r}", lineno, pos + 1, line)
        kind = match.lastgroup
        assert kind is not None
        if kind == "string":
            value, end = _read_string(line, pos, lineno)
            tokens.append(_Token("string", line[pos:end], pos + 1, value))
            pos = end
            continue
        text = match.group()
        if kind == "value":
            tokens.append(_Token(kind, text, pos + 1, int(text[1:])))
        elif kind == "int":
            tokens.append(_Token(kind, text, pos + 1, int(text)))
        elif kind == "float":
            tokens.append(_Token(kind, text, pos + 1, float(text)))
        elif kind != "space":
            tokens.append(_Token(kind, text, pos + 1))
        pos = match.end()
    tokens.append(_Token("end", "", len(line) + 1))
    return tokens


def _read_string(line: str, start: int, lineno: int) -> tuple[str, int]:
    """The string literal opening at ``line[start]``: its value and the index after its closing quote."""
    chars: list[str] = []
    pos = start + 1
    while pos < len(line):
        c = line[pos]
        if c == '"':
            return "".join(chars), pos + 1
        if c != "\\":
            chars.append(c)
            pos += 1
            continue
        escape = line[pos + 1 : pos + 2]
        if escape in _ESCAPES:
            chars.append(_ESCAPES[escape])
            pos += 2
        elif escape in _HEX_ESCAPES:
            digits = line[pos + 2 : pos + 2 + _HEX_ESCAPES[escape]]
            if len(digits) != _HEX_ESCAPES[escape] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ParseError(f"expected {_HEX_ESCAPES[escape]} hex digits after \\{escape}", lineno, pos + 1, line)
            code = int(digits, 16)
            if code > 0x10FFFF:
                raise ParseError(f"\\{escape}{digits} is not a Unicode code point", lineno, pos + 1, line)
            chars.append(chr(code))
            pos += 2 + len(digits)
        else:
            raise ParseError(
                'expected an escape \\\\ \\" \\n \\r \\t \\xNN \\uNNNN or \\UNNNNNNNN', lineno, pos + 1, line
            )
    raise ParseError("expected '\"' to close the string before the end of the line", lineno, len(line) + 1, line)


class _GraphParser:
    def __init__(self, text: str, constants: Mapping[str, np.ndarray] | None) -> None:
        self.lines = text.splitlines()
        self.constants = constants
        self.values: dict[int, Value] = {}
        self.defined_on: dict[int, int] = {}
        self.symbols: set[Sym] = set()  # the symbolic dimensions the types read so far name
        self.lineno = 0
        self.source = ""
        self.tokens: list[_Token] = []
        self.pos = 0

    # -- the line structure --------------------------------------------------------------------

    def parse(self) -> Graph:
        if not self._next_line():
            raise ParseError("expected 'graph(...) {', got an empty text", max(self.lineno, 1), 1)
        graph = self._parse_block("graph", self.constants)
        if self._next_line():
            raise ParseError(f"expected the end of the text after '}}', got {self._peek().describe()}", self.lineno, 1)
        return graph

    def _parse_block(self, keyword: str, constants: Mapping[str, np.ndarray] | None) -> Graph:
        """A graph or a kernel's body, from its header line (the current one) to its closing '}'."""
        outer_constants, self.constants = self.constants, constants
        inputs = self._parse_header(keyword)
        nodes: list[Node] = []
        while True:
            if not self._next_line():
                raise ParseError("expected a node or 'return (...)' before the end of the text", self.lineno + 1, 1)
            first = self._peek()
            if first.kind == "name" and first.text == "return":
                outputs = self._parse_return()
                break
            nodes.append(self._parse_node())
        if not self._next_line():
            raise ParseError("expected '}' after the return line", self.lineno + 1, 1)
        self._expect("punct", "}", "after the return line")
        self._expect_end("after '}'")
        self.constants = outer_constants
        return Graph(tuple(inputs), tuple(nodes), tuple(outputs), _own_constants(constants, nodes))

    def _next_line(self) -> bool:
        """Move to the next non-blank line; False at the end of the text."""
        while self.lineno < len(self.lines):
            self.source = self.lines[self.lineno]
            self.lineno += 1
            if self.source.strip():
                self.tokens = _tokenize(self.source, self.lineno)
                self.pos = 0
                return True
        return False

    def _parse_header(self, keyword: str) -> list[Value]:
        where = "at the start of the graph" if keyword == "graph" else "to start a body of the kernel (or '}')"
        self._expect("name", keyword, where)
        self._expect("punct", "(", f"after '{keyword}'")
        definitions = [] if self._accept(")") else self._parse_definitions(")", f"the {keyword}'s inputs")
        self._expect("punct", "{", f"after the {keyword}'s inputs")
        self._expect_end(f"after '{keyword}(...) {{'")
        for value, column in definitions:
            self._define(value, column)
        return [value for value, _ in definitions]

    def _parse_return(self) -> list[Value]:
        self._advance()
        self._expect("punct", "(", "after 'return'")
        outputs = [] if self._accept(")") else self._parse_uses("the graph's outputs")
        self._expect_end("after 'return (...)'")
        return outputs

    def _parse_node(self) -> Node:
        if self._accept("("):
            self._expect("punct", ")", "for a node without outputs: '() = op(...)'")
            definitions: list[tuple[Value, int]] = []
        else:
            definitions = self._parse_definitions("=", "the node's outputs")
        self._expect("punct", "=", "after the node's outputs")
        op = self._expect("name", None, "an op name")
        if not _OP.match(op.text):
            self._fail(op, "an op name ([A-Za-z_][A-Za-z0-9_.]*)")
        self._expect("punct", "(", f"after the op name {op.text!r}")
        inputs = [] if self._accept(")") else self._parse_uses(f"the inputs of {op.text}")
        if op.text in NESTING_OPS:
            attrs, loc = self._parse_kernel()
        else:
            attrs = self._parse_attrs() if self._accept("{") else {}
            loc = self._parse_location() if self._accept("#") else None
            self._expect_end(f"after the node {op.text}")
        for value, column in definitions:  # defined only now: a node cannot read its own output
            self._define(value, column)
        if op.text == CONSTANT and self.constants is not None:
            name = attrs.get("name")
            if not isinstance(name, str) or name not in self.constants:
                raise ParseError(
                    f"constant {name!r} is not among the constants given", self.lineno, op.column, self.source
                )
        return Node(op.text, tuple(inputs), attrs, tuple(value for value, _ in definitions), loc)

    def _parse_kernel(self) -> tuple[dict[str, Any], SourceLocation | None]:
        """The rest of a kernel node: its attributes, '{', its bodies, '}' and its location."""
        attrs: dict[str, Any] = {}
        self._expect("punct", "{", "(attributes, or the '{' that opens the kernel's bodies)")
        if self._peek().kind != "end":
            attrs = self._parse_attrs()
            self._expect("punct", "{", "to open the kernel's bodies at the end of its line")
        self._expect_end("after the '{' that opens the kernel's bodies")
        if "bodies" in attrs:
            self._fail(self.tokens[0], "a kernel whose bodies follow its line, not a 'bodies' attribute")
        name = attrs.get("name")
        scope = (self.values, self.defined_on)
        bodies: list[Graph] = []
        while True:
            if not self._next_line():
                raise ParseError("expected 'body(...) {' or '}' to close the kernel", self.lineno + 1, 1)
            if self._accept("}"):
                break
            table = None
            if self.constants is not None:
                table = body_constants(self.constants, name, len(bodies)) if isinstance(name, str) else {}
            self.values, self.defined_on = {}, {}  # a body is its own scope
            bodies.append(self._parse_block("body", table))
            self.values, self.defined_on = scope
        loc = self._parse_location() if self._accept("#") else None
        self._expect_end("after the '}' that closes the kernel")
        attrs["bodies"] = tuple(bodies)
        return attrs, loc

    # -- values and types ---------------------------------------------------------------------

    def _parse_definitions(self, closer: str, what: str) -> list[tuple[Value, int]]:
        """``%id: type, ...`` with each value's column, up to ``closer`` (consumed unless it is '=')."""
        definitions: list[tuple[Value, int]] = []
        while True:
            token = self._expect("value", None, f"a value '%N: type' in {what}")
            if any(value.id == token.value for value, _ in definitions):
                self._fail(token, f"a value not defined twice in {what}", found=f"{token.text} again")
            self._expect("punct", ":", f"after {token.text} (a definition needs its type)")
            definitions.append((Value(token.value, self._parse_type()), token.column))
            if closer == "=" and self._peek().text == "=":
                return definitions
            if self._accept(closer):
                return definitions
            self._expect("punct", ",", f"',' or '{closer}' in {what}")

    def _define(self, value: Value, column: int) -> None:
        if value.id in self.values:
            first = self.defined_on[value.id]
            raise ParseError(f"%{value.id} is defined twice (first on line {first})", self.lineno, column, self.source)
        self.values[value.id] = value
        self.defined_on[value.id] = self.lineno

    def _parse_uses(self, what: str) -> list[Value]:
        """``%id, ...`` up to and including ')'."""
        values: list[Value] = []
        while True:
            token = self._expect("value", None, f"a value '%N' in {what}")
            if token.value not in self.values:
                self._fail(token, f"a value defined on an earlier line in {what}", found=f"undefined {token.text}")
            values.append(self.values[token.value])
            if self._accept(")"):
                return values
            self._expect("punct", ",", f"',' or ')' in {what}")

    def _parse_type(self) -> TensorType:
        token = self._expect("name", None, "a dtype such as f32")
        if token.text not in BY_NAME:
            self._fail(token, "a dtype (bool, u8, i8, i16, i32, i64, f16, f32 or f64)")
        self._expect("punct", "[", f"'[' and the shape after the dtype {token.text}")
        shape: list[Dim] = []
        if not self._accept("]"):
            while True:
                shape.append(self._parse_dim())
                if self._accept("]"):
                    break
                self._expect("punct", ",", "',' or ']' in the shape")
        if not self._accept("@"):
            return TensorType(tuple(shape), BY_NAME[token.text])
        where = self._expect("name", None, "a device such as cuda:0 after '@'")
        spec = where.text
        if self._accept(":"):
            spec += ":" + self._expect("int", None, "a device index after ':'").text
        try:
            dev = device(spec)
        except ValueError:
            self._fail(where, "a device such as cpu or cuda:0", found=repr(spec))
        return TensorType(tuple(shape), BY_NAME[token.text], dev)

    # -- attributes and locations -------------------------------------------------------------

    def _parse_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        while True:
            key = self._expect("name", None, "an attribute name")
            if key.text in attrs:
                self._fail(key, "each attribute once", found=f"{key.text!r} again")
            self._expect("punct", "=", f"'=' after the attribute name {key.text!r}")
            attrs[key.text] = self._parse_attr_value()
            if self._accept("}"):
                return attrs
            self._expect("punct", ",", "',' or '}' in the attributes")

    def _parse_attr_value(self) -> Any:
        token = self._advance()
        if token.kind == "int" and token.value >= 0 and self._peek().text == "*":
            return self._product(token.value)
        if token.kind in ("int", "float", "string"):
            return token.value
        if token.kind == "name":
            if token.text in _NAMED_ATTRS:
                return _NAMED_ATTRS[token.text]
            if token.text in BY_NAME:
                return BY_NAME[token.text]
            if _SYMBOL.match(token.text) and Sym(token.text) in self.symbols:
                return self._product(Sym(token.text))
        if token.kind == "symsum":
            return self._product(self._sum(token))
        if token.text == "(":
            return self._parse_tuple()
        self._fail(token, 'an attribute value (int, float, "string", dtype, None, True, False, a tuple, or a symbol '
                          "that a type before it names)")  # fmt: skip

    def _product(self, first: Dim) -> Dim:
        """``first`` times the factors after it (``3*T`` in an attribute), each a size or a known symbol."""
        factors = [first]
        while self._accept("*"):
            token = self._advance()
            if token.kind == "int" and token.value >= 0:
                factors.append(token.value)
            elif token.kind == "symsum":
                factors.append(self._sum(token))
            elif token.kind == "name" and _SYMBOL.match(token.text) and Sym(token.text) in self.symbols:
                factors.append(Sym(token.text))
            else:
                self._fail(token, "a size or a symbol that a type before it names after '*'")
        return factors[0] if len(factors) == 1 else sym_product(1, factors)

    def _parse_dim(self) -> Dim:
        """A dimension: a size, a symbol, or a product of them (``3*T``, ``B*T``)."""
        factors: list[Dim] = []
        while True:
            dim = self._advance()
            if dim.kind == "int" and dim.value >= 0:
                factors.append(dim.value)
            elif dim.kind == "symsum":
                factors.append(self._sum(dim, define=True))
            else:
                factors.append(self._symbol(dim, "a dimension (a non-negative integer or a symbol such as B)"))
                self.symbols.add(factors[-1])  # type: ignore[arg-type]
            if not self._accept("*"):
                return factors[0] if len(factors) == 1 else sym_product(1, factors)

    def _sum(self, token: _Token, define: bool = False) -> Dim:
        """The symbolic sum a ``symsum`` token spells (``(H-2)//2``); its symbols are defined by it in a
        type (``define``), else they must be symbols a type before it names."""
        try:
            dim = parse_dim(token.text)
        except (ValueError, TypeError) as error:
            return self._fail(token, f"a symbolic sum such as (H-2)//2 ({error})")
        names = set(re.findall(r"[A-Za-z_]\w*", token.text))
        if define:
            self.symbols.update(Sym(n) for n in names)
        elif not all(Sym(n) in self.symbols for n in names):
            self._fail(token, "a symbolic sum of symbols that a type before it names")
        return dim

    def _symbol(self, token: _Token, expected: str) -> Sym:
        """The symbolic dimension named by ``token``, or a ParseError saying ``expected``."""
        if token.kind != "name" or token.text in RESERVED_NAMES:
            self._fail(token, expected)
        try:
            return Sym(token.text)
        except ValueError:
            return self._fail(token, f"{expected}; a symbol is [A-Za-z_][A-Za-z0-9_]*")

    def _parse_tuple(self) -> tuple:
        if self._accept(")"):
            return ()
        items = [self._parse_attr_value()]
        if not self._accept(","):
            self._fail(self._peek(), "',' after the element (a one-element tuple is written (x,))")
        while not self._accept(")"):
            items.append(self._parse_attr_value())
            if self._accept(")"):
                break
            self._expect("punct", ",", "',' or ')' in the tuple")
        return tuple(items)

    def _parse_location(self) -> SourceLocation:
        filename = self._expect("string", None, "a quoted file name after '#' (\"file.py\":12 in fn)")
        self._expect("punct", ":", "':' and a line number after the file name")
        line = self._expect("int", None, "a line number")
        function = ""
        if self._peek().kind == "name" and self._peek().text == "in":
            self._advance()
            token = self._advance()
            if token.kind not in ("name", "string"):
                self._fail(token, "a function name after 'in'")
            function = token.value if token.kind == "string" else token.text
        return SourceLocation(filename.value, line.value, function)

    # -- tokens -------------------------------------------------------------------------------

    def _peek(self) -> _Token:
        return self.tokens[self.pos]

    def _advance(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "end":
            self.pos += 1
        return token

    def _accept(self, punct: str) -> bool:
        token = self.tokens[self.pos]
        if token.kind == "punct" and token.text == punct:
            self.pos += 1
            return True
        return False

    def _expect(self, kind: str, text: str | None, expected: str) -> _Token:
        token = self._peek()
        if token.kind != kind or (text is not None and token.text != text):
            what = f"'{text}' {expected}" if text is not None else expected
            self._fail(token, what)
        return self._advance()

    def _expect_end(self, where: str) -> None:
        token = self._peek()
        if token.kind != "end":
            self._fail(token, f"the end of the line {where}")

    def _fail(self, token: _Token, expected: str, *, found: str | None = None) -> Any:
        got = found if found is not None else token.describe()
        raise ParseError(f"expected {expected}, got {got}", self.lineno, token.column, self.source)
