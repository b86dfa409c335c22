"""Datetimes and whole-column reductions in scripted functions, the part of ``expressions`` that the
end-to-end example's time features need: ``pd.to_datetime(col, unit=...)``, ``.dt.weekday`` and
the other calendar fields of a time of day, ``(col - col.min()).dt.days``.

A datetime column is held as int64 nanoseconds since 1970 (pandas' ``datetime64[ns]``), a
timedelta as int64 nanoseconds. Only datetimes made from integers by ``to_datetime`` arise here,
so none is NaT. A reduction over the column (``col.min()``) makes the function depend on every row
of the request, as it does in NVTabular; the workflow then says so (``reduces_over_rows``), and its
requests are neither split nor merged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.scripted_workflow.expressions import (
    PYTHON,
    REDUCED,
    SERIES,
    Value,
    method,
    series,
)

_NANOSECONDS = {"D": 86_400 * 10**9, "s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_DAY = 86_400 * 10**9
#: calendar fields of a datetime that need no calendar: field -> (divisor, modulus, range)
_TIME_OF_DAY = {
    "hour": (3_600 * 10**9, 24),
    "minute": (60 * 10**9, 60),
    "second": (10**9, 60),
}
_WEEKDAY_NAMES = ("weekday", "dayofweek", "day_of_week")


@dataclass(frozen=True)
class _Accessor:
    """``col.dt``."""

    owner: Value


def extension(evaluator, what, owner, name, arguments, keywords) -> Value | None:
    """Evaluates what the module adds; None for anything else."""
    if what == "call":
        if owner.kind == PYTHON and owner.python is pd.to_datetime:
            return _to_datetime(arguments, keywords)
        return None
    if owner.kind == SERIES and name == "dt":
        return Value(PYTHON, python=_Accessor(owner))
    if owner.kind == SERIES and name in ("min", "max"):
        evaluator.reduces_over_rows = True
        return method(name, owner, _reduction(name))
    if owner.kind == PYTHON and isinstance(owner.python, _Accessor):
        return _field(owner.python.owner, name)
    return None


def as_rows(value: Value) -> str:
    """The TorchScript source of a function's result: one value per row."""
    if value.kind != SERIES:
        raise NotCompiled(f"the function gives a {value.kind}, not one value per row")
    return value.source


def _to_datetime(arguments: list[Value], keywords: dict[str, Value]) -> Value:
    if len(arguments) != 1 or set(keywords) - {"unit"}:
        raise NotCompiled("to_datetime takes one column and unit= here")
    (column,) = arguments
    unit = keywords["unit"].python if "unit" in keywords else "ns"
    if column.kind != SERIES or column.dtype.kind not in "iu" or unit not in _NANOSECONDS:
        raise NotCompiled(f"to_datetime of {column.kind} of unit {unit!r}")
    source = f"to_datetime_ns({column.source}.to(torch.int64), {_NANOSECONDS[unit]})"
    return series(source, column.column.with_dtype(np.dtype("datetime64[ns]")))


def _field(owner: Value, name: str) -> Value:
    kind = owner.dtype.kind
    if kind == "M" and name in _WEEKDAY_NAMES:
        # 1970-01-01 was a Thursday (3)
        source = f"torch.remainder(torch.floor_divide({owner.source}, {_DAY}) + 3, 7)"
        return _ranged(series(source, owner.column.with_dtype(np.int64)), 0, 6)
    if kind == "M" and name in _TIME_OF_DAY:
        unit, count = _TIME_OF_DAY[name]
        since_midnight = f"torch.remainder({owner.source}, {_DAY})"
        source = f"torch.remainder(torch.floor_divide({since_midnight}, {unit}), {count})"
        return _ranged(series(source, owner.column.with_dtype(np.int64)), 0, count - 1)
    if kind == "m" and name == "days":
        source = f"torch.floor_divide({owner.source}, {_DAY})"
        return series(source, owner.column.with_dtype(np.int64))
    raise NotCompiled(f"`.dt.{name}` of {owner.dtype} values")


def _ranged(value: Value, low: int, high: int) -> Value:
    return replace(value, column_type=replace(value.column, value_range=(low, high)))


def _reduction(name: str):
    """``col.min()`` / ``col.max()``: one value of the whole column, NaN skipped as pandas does."""

    def reduce(owner: Value, arguments: list[Value], keywords: dict[str, Value]) -> Value:
        if arguments or keywords:
            raise NotCompiled(f"{name}() with arguments")
        if owner.dtype.kind not in "iufmM":
            raise NotCompiled(f"{name}() of {owner.dtype} values")
        function = "column_min" if name == "min" else "column_max"
        return Value(REDUCED, f"{function}({owner.source})", column_type=owner.column)

    return reduce
