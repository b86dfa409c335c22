"""The functions of ``Filter`` and ``LambdaOp`` as TorchScript: their source read back, checked
against a small language of column arithmetic, and written out as a scripted method.

A function compiles when its body is one expression made of its argument's columns
(``df["a"]``, ``df.a``, the column itself), numbers (literals, or names of the module, closures
and ``numpy``'s constants), arithmetic, comparisons and ``& | ~``, ``.astype``, the numpy functions
that do not round (``abs``, ``floor``, ``ceil``, ``trunc``), calls of other such functions of
one ``return``, and what ``dates`` adds (datetimes, whole-column reductions, functions of a column
whose few values are known). Each step's dtype is what pandas gives it: asked of pandas itself,
at export, on a stand-in of the column's dtype (numpy 1.x picks the dtype of ``column - 2.5`` by
the scalar's value). Anything else (other calls, transcendental functions, whose numpy and torch
implementations round differently) leaves the operator to the python step, with the reason.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.scripted_workflow.columns import ColumnType, torch_dtype
from merlin_torch_serving.scripted_workflow.sources import function_ast, name_of

SERIES, SCALAR, FRAME, PYTHON = "series", "scalar", "frame", "python"
#: one value of a whole column, a 0-dim tensor (``col.min()``; see ``dates``)
REDUCED = "reduced"
_TENSORS = (SERIES, REDUCED)

_BINARY = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.BitAnd: ("&", operator.and_),
    ast.BitOr: ("|", operator.or_),
    ast.BitXor: ("^", operator.xor),
}
_COMPARE = {
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
}
#: numpy functions whose result torch computes bit for bit: none of them rounds (torch's float64
#: sqrt, for one, is not correctly rounded here: sqrt(51) came out one ulp off numpy's)
_EXACT_UFUNCS = {
    np.absolute: "torch.abs",
    np.floor: "torch.floor",
    np.ceil: "torch.ceil",
    np.trunc: "torch.trunc",
    np.negative: "torch.neg",
}


@dataclass(frozen=True)
class Value:
    """What an expression evaluates to: a column (``SERIES``, with its TorchScript source and
    type), a number (``SCALAR``), the DataFrame a filter receives (``FRAME``) or any other python
    object (``PYTHON``: a module, a function)."""

    kind: str
    source: str = ""
    column_type: ColumnType | None = None
    python: Any = None

    @property
    def column(self) -> ColumnType:
        if self.column_type is None:
            raise NotCompiled(f"{self.python!r} is not a column")
        return self.column_type

    @property
    def dtype(self) -> np.dtype:
        return self.column.dtype


def series(source: str, column: ColumnType) -> Value:
    return Value(SERIES, source, column_type=column)


def scalar(number) -> Value:
    return Value(SCALAR, literal(number), python=number)


def literal(number) -> str:
    """A TorchScript literal of a python or numpy number."""
    if isinstance(number, (bool, np.bool_)):
        return "True" if number else "False"
    if isinstance(number, (int, np.integer)):
        return str(int(number))
    value = float(number)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '-float("inf")'
    return repr(value)


def column_text(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def stand_in(column: ColumnType):
    """A two-row pandas Series of the column's dtype, to ask pandas for a result's dtype."""
    if column.dtype.kind == "M":
        return pd.Series(np.array(["2001-01-01", "2001-01-02"], dtype=column.dtype))
    if column.dtype.kind == "m":
        return pd.Series(np.array([1, 2], dtype="m8[s]").astype(column.dtype))
    return pd.Series(np.ones(2, dtype=column.dtype))


def cast(value: Value, dtype: np.dtype) -> str:
    """``value``'s source in ``dtype`` (a number is left to torch, which keeps a tensor's dtype)."""
    if value.kind not in _TENSORS or value.dtype == dtype:
        return value.source
    return f"{value.source}.to({_torch_name(dtype)})"


def _torch_name(dtype: np.dtype) -> str:
    return str(torch_dtype(dtype, "an intermediate result"))


class Evaluator:
    """Evaluates one function's body over ``Value``s; ``extensions`` handle calls and attributes
    this module does not (see ``dates``)."""

    def __init__(self, extensions: list[Callable] | None = None):
        self.extensions = list(extensions or [])
        self._depth = 0
        #: set when the function reduces a whole column (its rows depend on the request's others)
        self.reduces_over_rows = False

    def call(self, function, arguments: list[Value]) -> Value:
        """The value of ``function(*arguments)``, from its source."""
        if self._depth > 8:
            raise NotCompiled("functions call each other more than 8 deep")
        parameters, body = function_ast(function)
        if len(parameters) != len(arguments):
            raise NotCompiled(
                f"{name_of(function)} takes {len(parameters)} arguments, got {len(arguments)}"
            )
        names = dict(zip(parameters, arguments, strict=True))
        self._depth += 1
        try:
            return self.evaluate(body, _Scope(function, names))
        finally:
            self._depth -= 1

    def evaluate(self, node: ast.AST, scope: _Scope) -> Value:
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise NotCompiled(f"`{ast.unparse(node)}` ({type(node).__name__}) is not supported")
        return method(node, scope)

    # ---- leaves ---------------------------------------------------------------------------

    def _Constant(self, node: ast.Constant, scope: _Scope) -> Value:
        if isinstance(node.value, (bool, int, float)):
            return scalar(node.value)
        return Value(PYTHON, python=node.value)

    def _Name(self, node: ast.Name, scope: _Scope) -> Value:
        return scope.lookup(node.id)

    def _Attribute(self, node: ast.Attribute, scope: _Scope) -> Value:
        owner = self.evaluate(node.value, scope)
        for extension in self.extensions:
            handled = extension(self, "attribute", owner, node.attr, [], {})
            if handled is not None:
                return handled
        if owner.kind == FRAME:
            return owner.python[node.attr] if node.attr in owner.python else _missing(node.attr)
        if owner.kind == PYTHON:
            return python_value(getattr(owner.python, node.attr))
        raise NotCompiled(f"`.{node.attr}` of a {owner.kind}")

    def _Subscript(self, node: ast.Subscript, scope: _Scope) -> Value:
        owner = self.evaluate(node.value, scope)
        key = self.evaluate(node.slice, scope)
        if owner.kind == FRAME and key.kind == PYTHON and isinstance(key.python, str):
            return owner.python[key.python] if key.python in owner.python else _missing(key.python)
        raise NotCompiled(f"`{ast.unparse(node)}`: only columns of the DataFrame can be indexed")

    # ---- operators -------------------------------------------------------------------------

    def _BinOp(self, node: ast.BinOp, scope: _Scope) -> Value:
        if type(node.op) not in _BINARY:
            raise NotCompiled(f"the operator of `{ast.unparse(node)}`")
        symbol, function = _BINARY[type(node.op)]
        return binary(
            symbol, function, self.evaluate(node.left, scope), self.evaluate(node.right, scope)
        )

    def _Compare(self, node: ast.Compare, scope: _Scope) -> Value:
        if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
            raise NotCompiled(f"the comparison `{ast.unparse(node)}`")
        symbol, function = _COMPARE[type(node.ops[0])]
        left = self.evaluate(node.left, scope)
        right = self.evaluate(node.comparators[0], scope)
        return binary(symbol, function, left, right)

    def _UnaryOp(self, node: ast.UnaryOp, scope: _Scope) -> Value:
        operand = self.evaluate(node.operand, scope)
        function: Callable[[Any], Any]
        if isinstance(node.op, ast.USub):
            function, symbol = operator.neg, "-"
        elif isinstance(node.op, ast.UAdd):
            return operand
        elif isinstance(node.op, ast.Invert):
            function, symbol = operator.invert, "~"
        else:
            raise NotCompiled(f"`{ast.unparse(node)}`")
        if operand.kind == SCALAR:
            return scalar(function(operand.python))
        dtype = _pandas_dtype(lambda s: function(s), operand)
        return _tensor_like(operand, f"({symbol}{cast(operand, dtype)})", dtype)

    def _Call(self, node: ast.Call, scope: _Scope) -> Value:
        target = self.evaluate(node.func, scope)
        arguments = [self.evaluate(argument, scope) for argument in node.args]
        keywords: dict[str, Value] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise NotCompiled(f"`{ast.unparse(node)}`: ** arguments")
            keywords[keyword.arg] = self.evaluate(keyword.value, scope)
        for extension in self.extensions:
            handled = extension(self, "call", target, "", arguments, keywords)
            if handled is not None:
                return handled
        if target.kind != PYTHON:
            raise NotCompiled(f"`{ast.unparse(node)}` calls a {target.kind}")
        function = target.python
        if isinstance(function, _Method):
            return function.call(arguments, keywords)
        if function in _EXACT_UFUNCS and len(arguments) == 1 and not keywords:
            (argument,) = arguments
            if argument.kind == SCALAR:
                return scalar(function(argument.python))
            dtype = _pandas_dtype(function, argument)
            source = f"{_EXACT_UFUNCS[function]}({cast(argument, dtype)})"
            return _tensor_like(argument, source, dtype)
        if inspect.isfunction(function) and not keywords:
            return self.call(function, arguments)
        raise NotCompiled(
            f"`{ast.unparse(node)}`: {name_of(function)} has no exact TorchScript counterpart"
        )


def binary(symbol: str, function: Callable, left: Value, right: Value) -> Value:
    """``left <symbol> right`` with pandas' result dtype (numbers are folded)."""
    if left.kind == SCALAR and right.kind == SCALAR:
        return scalar(function(left.python, right.python))
    for side in (left, right):
        if side.kind not in (SERIES, SCALAR, REDUCED):
            raise NotCompiled(f"`{symbol}` of a {side.kind}")
    if symbol in ("//", "%") and any(
        side.kind == SERIES and side.dtype.kind in "iub" for side in (left, right)
    ):
        # pandas turns integer division by zero into floats, only for requests that divide by 0
        divisor = right
        if divisor.kind == SERIES or divisor.python == 0:
            raise NotCompiled(f"integer `{symbol}` by a column or by zero")
    result = _pandas_dtype(
        lambda a, b: function(a, b),
        left,
        right,
    )
    if symbol in _comparison_symbols():
        common = _common_dtype(left, right)
        source = f"({cast(left, common)} {symbol} {cast(right, common)})"
    else:
        source = f"({cast(left, result)} {symbol} {cast(right, result)})"
    shaped = next(side for side in (left, right) if side.kind in _TENSORS)
    rows = left if left.kind == SERIES else right if right.kind == SERIES else shaped
    return _tensor_like(rows, source, result)


def _tensor_like(shape: Value, source: str, dtype: np.dtype) -> Value:
    """A result of ``dtype`` shaped like ``shape``: a column, or one value of a column."""
    return Value(shape.kind, source, column_type=shape.column.with_dtype(dtype))


def _comparison_symbols() -> set[str]:
    return {symbol for symbol, _ in _COMPARE.values()}


def _common_dtype(left: Value, right: Value) -> np.dtype:
    """The dtype numpy compares two operands in (a number's value counts, numpy 1.x)."""
    operands = [side.dtype if side.kind in _TENSORS else side.python for side in (left, right)]
    return np.result_type(*operands)


def _pandas_dtype(function: Callable, *operands: Value) -> np.dtype:
    """The dtype pandas gives ``function`` of the operands (columns stood in for)."""
    arguments = [
        stand_in(operand.column)
        if operand.kind == SERIES
        else stand_in(operand.column).min()
        if operand.kind == REDUCED
        else operand.python
        for operand in operands
    ]
    try:
        with np.errstate(all="ignore"):
            result = function(*arguments)
    except Exception as error:
        raise NotCompiled(f"pandas refuses it ({error})") from None
    if isinstance(result, pd.Series):
        return np.dtype(result.dtype)  # type: ignore[arg-type]  # a numpy dtype for these columns
    if isinstance(result, (pd.Timestamp, pd.Timedelta)):  # one value of a datetime column
        return np.dtype("datetime64[ns]" if isinstance(result, pd.Timestamp) else "m8[ns]")
    if all(operand.kind != SERIES for operand in operands) and hasattr(result, "dtype"):
        return np.dtype(result.dtype)  # one value of a column, and numbers
    raise NotCompiled(f"it gives a {type(result).__name__}, not a column")


def python_value(value) -> Value:
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return scalar(value.item() if isinstance(value, np.generic) else value)
    return Value(PYTHON, python=value)


def _missing(name: str) -> Value:
    raise NotCompiled(f"the function reads column {name!r}, which the operator does not receive")


@dataclass(frozen=True)
class _Method:
    """A bound method of a column (``col.astype``), called with evaluated arguments."""

    name: str
    owner: Value
    apply: Callable

    def call(self, arguments: list[Value], keywords: dict[str, Value]) -> Value:
        return self.apply(self.owner, arguments, keywords)


def method(name: str, owner: Value, apply: Callable) -> Value:
    return Value(PYTHON, python=_Method(name, owner, apply))


def columns_attributes(evaluator: Evaluator, what, owner, name, arguments, keywords):
    """``col.astype(dtype)``: pandas' cast; float to integer refused at run time for NaN and inf."""
    if what != "attribute" or owner.kind != SERIES or name != "astype":
        return None
    return method(name, owner, _astype)


def _astype(owner: Value, arguments: list[Value], keywords: dict[str, Value]) -> Value:
    if len(arguments) != 1 or keywords or arguments[0].kind not in (PYTHON, SCALAR):
        raise NotCompiled("astype takes one dtype here")
    try:
        dtype = np.dtype(arguments[0].python)
    except (TypeError, ValueError):
        raise NotCompiled(f"astype({arguments[0].python!r})") from None
    if dtype.kind not in "iufb" or owner.dtype.kind not in "iufb":
        raise NotCompiled(f"astype from {owner.dtype} to {dtype}")
    if owner.dtype.kind == "f" and dtype.kind in "iu":
        source = f"integer_cast({owner.source}, {_torch_name(dtype)})"
        return series(source, owner.column.with_dtype(dtype))
    return series(cast(owner, dtype), owner.column.with_dtype(dtype))


class _Scope:
    """Names a function body sees: its parameters, then its closure, module and builtins."""

    def __init__(self, function, parameters: dict[str, Value]):
        self.function = function
        self.parameters = parameters

    def lookup(self, name: str) -> Value:
        if name in self.parameters:
            return self.parameters[name]
        code = self.function.__code__
        if name in code.co_freevars and self.function.__closure__:
            cell = self.function.__closure__[code.co_freevars.index(name)]
            return python_value(cell.cell_contents)
        if name in self.function.__globals__:
            return python_value(self.function.__globals__[name])
        if hasattr(builtins, name):
            return python_value(getattr(builtins, name))
        raise NotCompiled(f"the name {name!r} is not defined where the function is")
