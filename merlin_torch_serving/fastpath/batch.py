"""The columns a compiled workflow passes from step to step, in place of a pandas DataFrame.

A list column is flat values plus int64 row offsets; each column also keeps the dtype pandas would
give it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.errors import Delegate

# How pandas holds the rows of a list column: Groupby makes python lists, Categorify and raw
# ragged inputs make numpy arrays. It matters because ListSlice(pad=True) pads only lists.
LIST_CELLS = "list"
ARRAY_CELLS = "array"
#: list offsets inside the fast path (they travel as int32, see ``wire``)
OFFSETS_DTYPE = np.dtype(np.int64)


@dataclass(frozen=True)
class Column:
    """One column: per-row values, or for a list column flat values and int64 row offsets."""

    values: np.ndarray
    offsets: np.ndarray | None = None
    cells: str = LIST_CELLS

    @property
    def is_list(self) -> bool:
        return self.offsets is not None

    @property
    def num_rows(self) -> int:
        return len(self.offsets) - 1 if self.offsets is not None else len(self.values)

    def lengths(self) -> np.ndarray:
        """Values per row: one for every row of a scalar column."""
        if self.offsets is None:
            return np.ones(len(self.values), dtype=np.int64)
        return np.diff(self.offsets)

    def list_offsets(self) -> np.ndarray:
        """The row offsets of a list column (a scalar column has none)."""
        if self.offsets is None:
            raise ValueError("a scalar column has no row offsets")
        return self.offsets

    def take(self, rows: np.ndarray) -> Column:
        """The rows at the given positions, in that order."""
        if self.offsets is None:
            return Column(self.values[rows])
        values, offsets = wire.take_ragged(self.values, self.offsets, rows, OFFSETS_DTYPE)
        return Column(values, offsets, self.cells)


class Batch:
    """Named columns of one row count: what an operator would receive as a DataFrame."""

    __slots__ = ("columns", "num_rows")

    def __init__(self, columns: Mapping[str, Column], num_rows: int):
        self.columns = dict(columns)
        self.num_rows = num_rows

    @classmethod
    def of(cls, columns: Mapping[str, Column]) -> Batch:
        """A batch whose row count comes from its columns.

        Without columns it has 0 rows, like an empty DataFrame.
        """
        num_rows = next(iter(columns.values())).num_rows if columns else 0
        return cls(columns, num_rows)

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def __getitem__(self, name: str) -> Column:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(
                f"column {name!r} is not in this step's input; it has {sorted(self.columns)}"
            ) from None

    def select(self, names: Iterable[str]) -> Batch:
        return Batch({name: self[name] for name in names}, self.num_rows)

    def with_columns(self, updates: Mapping[str, Column]) -> Batch:
        return Batch({**self.columns, **updates}, self.num_rows)

    def take(self, rows: np.ndarray) -> Batch:
        return Batch({name: column.take(rows) for name, column in self.columns.items()}, len(rows))


def null_mask(values: np.ndarray) -> np.ndarray:
    """Where pandas' ``isna`` is true: NaN, NaT and, in object arrays, None and NaN."""
    kind = values.dtype.kind
    if kind in "fc":
        return np.isnan(values)
    if kind in "mM":
        return np.isnat(values)
    if kind == "O":
        try:
            # A value unequal to itself is NaN-like (float NaN, NaT, Decimal NaN).
            # numpy's stubs take no None here, numpy compares each object with it
            is_none = np.equal(values, None)  # type: ignore[call-overload]
            return is_none | np.not_equal(values, values)
        except TypeError as error:
            # pd.NA refuses a truth value; let pandas judge such data.
            raise Delegate(f"object values without a truth value ({error})") from None
    return np.zeros(len(values), dtype=bool)


def as_python_scalars(values: np.ndarray) -> np.ndarray:
    """The values with the dtype pandas infers after they passed through python lists.

    Groupby collects rows into python lists; when pandas turns such lists back into a Series it
    infers int64 for any integers, float64 for any floats, and keeps strings as objects.
    """
    kind = values.dtype.kind
    if kind == "i" or (kind == "u" and values.dtype.itemsize < 8):
        return values.astype(np.int64, copy=False)
    if kind == "f":
        return values.astype(np.float64, copy=False)
    if kind in "bmM":  # booleans, and Timestamps / Timedeltas that pandas reads back as datetime64
        return values
    if kind == "O":
        element_types = set(map(type, values))
        if element_types <= {str, type(None)} or element_types <= {bytes, type(None)}:
            return values
        raise Delegate(f"object values of types {sorted(t.__name__ for t in element_types)}")
    raise Delegate(f"values of dtype {values.dtype}")


def same_values(left: np.ndarray, right: np.ndarray) -> bool:
    """Exact equality of two arrays, dtype included, with NaN == NaN and -0.0 != 0.0."""
    if left.dtype != right.dtype or left.shape != right.shape:
        return False
    if left.dtype.kind == "O":
        return all(_same_object(a, b) for a, b in zip(left.tolist(), right.tolist(), strict=True))
    if left.dtype.kind in "fc":
        if not np.array_equal(left, right, equal_nan=True):
            return False
        numbers = ~np.isnan(left)  # a NaN's sign bit carries no meaning
        return bool(np.array_equal(np.signbit(left.real[numbers]), np.signbit(right.real[numbers])))
    return bool(np.array_equal(left, right))


def _same_object(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if a != a and b != b:  # both NaN-like
        return True
    return type(a) is type(b) and a == b
