"""The small, safe expression language of pipeline specs: ``${{ ... }}``.

    ${{ steps.pretrain.outputs.checkpoint }}              a reference (in strings and `if:`)
    ${{ steps.eval.outputs.perplexity < params.max_ppl }}  a condition

Grammar (no calls, no attribute access beyond dotted names, no indexing, never ``eval``)::

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)?
    sum     := product (("+" | "-") product)*
    product := unary (("*" | "/") unary)*
    unary   := "-" unary | atom
    atom    := NUMBER | STRING | "true" | "false" | "null" | NAME ("." NAME)* | "(" expr ")"

Names are ``params.NAME`` and ``steps.STEP.outputs.KEY``. Parsing happens when a spec is
validated (syntax errors and unknown references are found before anything runs); evaluation
takes a resolver that returns the value of a reference or raises ExprError.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "TEMPLATE_RE",
    "Expr",
    "ExprError",
    "Ref",
    "parse_expr",
    "render_template",
    "template_refs",
]

Value = str | int | float | bool | None
Resolver = Callable[[tuple[str, ...]], Value]

TEMPLATE_RE = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
MAX_EXPR_CHARS = 1000
MAX_DEPTH = 32


class ExprError(ValueError):
    """An expression that does not parse or cannot be evaluated (the message says why)."""


@dataclass(frozen=True)
class Ref:
    """A dotted name like ``steps.eval.outputs.perplexity``."""

    parts: tuple[str, ...]

    def __str__(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True)
class _Const:
    value: Value


@dataclass(frozen=True)
class _Unary:
    op: str
    operand: Node


@dataclass(frozen=True)
class _Binary:
    op: str
    left: Node
    right: Node


Node = _Const | Ref | _Unary | _Binary

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)
      | (?P<str>'[^']*'|"[^"]*")
      | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
      | (?P<op><=|>=|==|!=|[<>()+\-*/.])
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "true", "false", "null"}


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None or match.end() == pos:
            raise ExprError(f"cannot read {text[pos : pos + 20]!r} at character {pos + 1}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "name" and value in _KEYWORDS:
            kind = "kw"
        tokens.append((kind, value))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, *values: str) -> str | None:
        token = self.peek()
        if token is not None and token[0] in ("op", "kw") and token[1] in values:
            self.i += 1
            return token[1]
        return None

    def parse(self) -> Node:
        if not self.tokens:
            raise ExprError("the expression is empty")
        node = self.or_()
        if self.peek() is not None:
            raise ExprError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.take("or"):
            node = _Binary("or", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.take("and"):
            node = _Binary("and", node, self.not_())
        return node

    def not_(self) -> Node:
        if self.take("not"):
            return _Unary("not", self.nested(self.not_))
        return self.compare()

    def compare(self) -> Node:
        node = self.sum()
        op = self.take("<", "<=", ">", ">=", "==", "!=")
        if op:
            node = _Binary(op, node, self.sum())
            if self.take("<", "<=", ">", ">=", "==", "!="):
                raise ExprError("chained comparisons are not supported (fix: use 'and')")
        return node

    def sum(self) -> Node:
        node = self.product()
        while op := self.take("+", "-"):
            node = _Binary(op, node, self.product())
        return node

    def product(self) -> Node:
        node = self.unary()
        while op := self.take("*", "/"):
            node = _Binary(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.take("-"):
            return _Unary("-", self.nested(self.unary))
        return self.atom()

    def nested(self, rule: Callable[[], Node]) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"the expression nests deeper than {MAX_DEPTH} levels")
        try:
            return rule()
        finally:
            self.depth -= 1

    def atom(self) -> Node:
        token = self.peek()
        if token is None:
            raise ExprError("the expression ends too early")
        kind, value = token
        self.i += 1
        if kind == "num":
            number = float(value)
            return _Const(int(value) if value.isdigit() else number)
        if kind == "str":
            return _Const(value[1:-1])
        if kind == "kw" and value in ("true", "false", "null"):
            return _Const({"true": True, "false": False, "null": None}[value])
        if kind == "name":
            parts = [value]
            while self.take("."):
                nxt = self.peek()
                if nxt is None or nxt[0] not in ("name", "kw", "num"):
                    raise ExprError(f"a name is missing after '{'.'.join(parts)}.'")
                parts.append(nxt[1])
                self.i += 1
            return Ref(tuple(parts))
        if kind == "op" and value == "(":
            node = self.nested(self.or_)
            if not self.take(")"):
                raise ExprError("a ')' is missing")
            return node
        raise ExprError(f"unexpected {value!r}")


@dataclass(frozen=True)
class Expr:
    """A parsed expression: its source text, tree and the references it reads."""

    text: str
    root: Node
    refs: tuple[Ref, ...]

    def evaluate(self, resolve: Resolver) -> Value:
        """The value, reading each reference through ``resolve`` (which may raise ExprError)."""
        return _eval(self.root, resolve)


def parse_expr(text: str) -> Expr:
    """Parse an expression (without the ``${{ }}``); ExprError says what is wrong."""
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"the expression is longer than {MAX_EXPR_CHARS} characters")
    root = _Parser(text).parse()
    refs: list[Ref] = []
    _collect(root, refs)
    return Expr(text.strip(), root, tuple(refs))


def _collect(node: Node, out: list[Ref]) -> None:
    if isinstance(node, Ref):
        out.append(node)
    elif isinstance(node, _Unary):
        _collect(node.operand, out)
    elif isinstance(node, _Binary):
        _collect(node.left, out)
        _collect(node.right, out)


def _number(value: Value, node: Node) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExprError(f"{_show(node)} is {value!r}, not a number")
    return value


def _show(node: Node) -> str:
    return str(node) if isinstance(node, Ref) else "a value"


def _eval(node: Node, resolve: Resolver) -> Value:
    if isinstance(node, _Const):
        return node.value
    if isinstance(node, Ref):
        return resolve(node.parts)
    if isinstance(node, _Unary):
        value = _eval(node.operand, resolve)
        return (not value) if node.op == "not" else -_number(value, node.operand)
    if node.op == "and":
        return bool(_eval(node.left, resolve)) and bool(_eval(node.right, resolve))
    if node.op == "or":
        return bool(_eval(node.left, resolve)) or bool(_eval(node.right, resolve))
    left, right = _eval(node.left, resolve), _eval(node.right, resolve)
    if node.op == "==":
        return left == right
    if node.op == "!=":
        return left != right
    if node.op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    a, b = _number(left, node.left), _number(right, node.right)
    if node.op == "<":
        return a < b
    if node.op == "<=":
        return a <= b
    if node.op == ">":
        return a > b
    if node.op == ">=":
        return a >= b
    if node.op == "+":
        return a + b
    if node.op == "-":
        return a - b
    if node.op == "*":
        return a * b
    if b == 0:
        raise ExprError(f"division by zero ({_show(node.right)} is 0)")
    result = a / b
    return result if math.isfinite(result) else None


def template_refs(text: str) -> list[Expr]:
    """Every ``${{ ... }}`` of a string, parsed (ExprError for the first bad one)."""
    return [parse_expr(m.group(1)) for m in TEMPLATE_RE.finditer(text)]


def render_template(text: str, resolve: Resolver) -> str:
    """Replace every ``${{ ... }}`` with its value (numbers as written, booleans as
    true/false, null as the empty string)."""

    def one(match: re.Match[str]) -> str:
        value = parse_expr(match.group(1)).evaluate(resolve)
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            return repr(value)
        return str(value)

    return TEMPLATE_RE.sub(one, text)
