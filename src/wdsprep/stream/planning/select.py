"""Selections over a split's sample table: `select="label == 3 and iso >= 800"`, parsed, never run.

An expression is parsed with `ast` and only these forms are accepted: comparisons (`==`, `!=`, `<`,
`<=`, `>`, `>=`, `in`, `not in`, chained as in Python: `1 <= label < 4`) between a field name
(`label`, or a dotted path `meta.iso` as it was indexed) and a literal (a number, a string, `True`,
`False`, `None`, or a tuple/list of them after `in`), joined by `and`, `or` and `not`, with
parentheses. Anything else (a call, arithmetic, a subscript, two fields compared, a bare name) is one
`ConfigError` line naming what is not allowed, and so is an expression nested deeper than
`codec.MAX_DEPTH` levels (`not not ... x == 1`: the parser and the checks below recurse once a
level). Evaluation is on whole numpy columns: one boolean array per expression, nothing per sample
in Python.
"""
from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Mapping

import numpy as np

from ...checks import refuse
from ...errors import ConfigError
from ...shards.codec import MAX_DEPTH, NESTED

_COMPARE: dict[type, Callable] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_FLIPPED: dict[type, type] = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE,
                              ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}
_LITERALS = (int, float, str, bool, type(None))


class Expression:
    """A parsed selection: `fields` it reads, `text` (canonical: what a state's digest records),
    and `evaluate(columns)` -> a boolean array."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise refuse(text, "select", "must be a non-empty expression string")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as error:
            raise ConfigError(f"select {text!r}: not an expression ({error.msg})") from None
        except (RecursionError, MemoryError):  # the parser's own limits, met before ours
            tree = None
        if tree is None or _deeper_than(tree.body, MAX_DEPTH):
            raise ConfigError(f"select {text!r:.80}: {NESTED}") from None
        self.source = text
        self._tree = tree.body
        self.fields: set[str] = set()
        self._check(self._tree)
        self.text = ast.unparse(self._tree)

    def _refuse(self, node: ast.AST, why: str):
        raise ConfigError(f"select {self.source!r}: {why} ({ast.unparse(node)!r}); a selection is comparisons "
                          "of an indexed field with literals, joined by and/or/not")

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check(value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check(node.operand)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                if isinstance(op, (ast.In, ast.NotIn)):
                    self._field(left) if _is_field(left) else self._refuse(left, "'in' needs a field on its left")
                    self._literal(right, many=True)
                elif type(op) in _COMPARE:
                    if _is_field(left) == _is_field(right):
                        self._refuse(node, "each comparison needs one field and one literal")
                    self._field(left if _is_field(left) else right)
                    self._literal(right if _is_field(left) else left)
                else:
                    self._refuse(node, f"{type(op).__name__} is not a comparison allowed here")
        else:
            self._refuse(node, "not a comparison")

    def _field(self, node: ast.AST) -> None:
        self.fields.add(_field_name(node))

    def _literal(self, node: ast.AST, many: bool = False) -> Any:
        if many and isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [self._literal(element) for element in node.elts]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
            return -node.operand.value
        if isinstance(node, ast.Constant) and isinstance(node.value, _LITERALS):
            return node.value
        self._refuse(node, "not a literal")

    def evaluate(self, columns: Mapping[str, np.ndarray], count: int) -> np.ndarray:
        """The samples the expression keeps, over `columns` (field -> one value per sample)."""
        missing = sorted(self.fields - set(columns))
        if missing:
            indexed = ", ".join(sorted(columns)) or "none"
            raise ConfigError(f"select {self.source!r}: field {missing[0]!r} is not indexed in this split "
                              f"(indexed fields: {indexed})")
        return np.asarray(self._evaluate(self._tree, columns), dtype=bool) & np.ones(count, dtype=bool)

    def _evaluate(self, node: ast.AST, columns) -> np.ndarray:
        if isinstance(node, ast.BoolOp):
            values = [self._evaluate(value, columns) for value in node.values]
            combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            result = values[0]
            for value in values[1:]:
                result = combine(result, value)
            return result
        if isinstance(node, ast.UnaryOp):
            return np.logical_not(self._evaluate(node.operand, columns))
        operands = [node.left, *node.comparators]
        result = True
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if _is_field(left):
                column, literal, kind = columns[_field_name(left)], self._literal(right, many=True), type(op)
            else:
                column, literal, kind = columns[_field_name(right)], self._literal(left), _FLIPPED[type(op)]
            result = np.logical_and(result, _compare(column, kind, literal, self.source))
        return result


def _deeper_than(node: ast.AST, limit: int) -> bool:
    """Whether the expression tree under `node` is more than `limit` nodes deep (walked iteratively)."""
    stack = [(node, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return False


def _is_field(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and _is_field(node.value))


def _field_name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else f"{_field_name(node.value)}.{node.attr}"


def _compare(column: np.ndarray, kind: type, literal: Any, source: str) -> np.ndarray:
    if kind in (ast.In, ast.NotIn):
        values = literal if isinstance(literal, list) else [literal]
        hit = np.zeros(len(column), dtype=bool)
        for value in values:
            hit |= _compare(column, ast.Eq, value, source)
        return hit if kind is ast.In else ~hit
    textual = column.dtype.kind in "USO"
    if isinstance(literal, str) != textual and literal is not None:
        if kind in (ast.Eq, ast.NotEq):  # a number never equals a string: nothing (or everything) kept
            return np.full(len(column), kind is ast.NotEq)
        raise ConfigError(f"select {source!r}: cannot order {column.dtype} values against {literal!r}")
    if literal is None:
        if kind not in (ast.Eq, ast.NotEq):
            raise ConfigError(f"select {source!r}: None can only be compared with == or !=")
        absent = np.array([value is None for value in column]) if column.dtype.kind == "O" else np.zeros(len(column), bool)
        return absent if kind is ast.Eq else ~absent
    return np.asarray(_COMPARE[kind](column, literal), dtype=bool)
