"""The check every request meets where it enters a step: in-process (``Ensemble.run``) and in a
served python step, before any operator sees it.

Operators trust their inputs. A request that breaks the wire format (offsets that do not start at
0, go backwards, or end before or past the values; columns of different row counts) would
otherwise fail deep inside an operator with an error naming no column, or, where nothing reads
the offsets whole, be answered from the wrong rows without any error. Each failure here is an
``InputError`` naming the tensor and saying what was expected and what came.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from merlin.schema import Schema, Tags

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import InputError
from merlin_torch_serving.graph.plan import OpCall, Ref

_SPLIT_HINT = (
    "send fewer rows per request (Client(max_rows_per_request=...) splits a request by whole "
    "sessions), or export with ModelOptions(max_request_rows=...) to allow more"
)


@dataclass(frozen=True)
class EntryCheck:
    """What a step's entry accepts: ``schema``'s tensors, nothing else.

    ``row_groups`` lists the columns that must hold the same number of rows (columns produced by
    one operator, or all request columns); ``non_null`` the columns that must not hold NaN or
    None (keys that group rows into sessions, and columns tagged as ids); ``max_rows`` the most
    rows a request may hold, counting each value of a ragged list as a row (None: no limit).
    """

    schema: Schema
    row_groups: tuple[tuple[str, ...], ...]
    non_null: frozenset[str] = frozenset()
    max_rows: int | None = None
    _specs: dict[str, tuple[wire.TensorSpec, ...]] = field(init=False, repr=False, compare=False)
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # read from the schema once: merlin's schema objects are slow to ask per request
        specs = {column.name: tuple(wire.column_specs(column)) for column in self.schema}
        object.__setattr__(self, "_specs", specs)
        object.__setattr__(
            self, "_names", frozenset(spec.name for column in specs.values() for spec in column)
        )

    @classmethod
    def for_entry(
        cls,
        schema: Schema,
        entries: Mapping[str, Ref],
        calls: Sequence[OpCall],
        max_rows: int | None = None,
    ) -> EntryCheck:
        """The check of an entry whose columns ``entries`` (name -> ref) feed ``calls``."""
        groups: dict[int, list[str]] = {}
        for name, ref in entries.items():
            groups.setdefault(ref.producer, []).append(name)
        name_of = {ref: name for name, ref in entries.items()}
        non_null = {column.name for column in schema if Tags.ID in column.tags}
        for call in calls:
            for name in call.op.non_null_inputs():
                routed = call.inputs.get(name)
                if routed in name_of:
                    non_null.add(name_of[routed])
        return cls(
            schema, tuple(tuple(names) for names in groups.values()), frozenset(non_null), max_rows
        )

    def check(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Raise ``InputError`` for the first tensor of ``arrays`` that does not fit.

        ``arrays`` are in the wire format.
        """
        extra = sorted(set(arrays) - self._names)
        if extra:
            raise InputError(
                extra[0],
                f"no such input (the inputs are {', '.join(map(repr, sorted(self._names)))})",
                "a tensor of that name",
            )
        rows = {name: self._rows_of(name, specs, arrays) for name, specs in self._specs.items()}
        for group in self.row_groups:
            counts = {name: rows[name] for name in group if name in rows}
            if len(set(counts.values())) > 1:
                usual = max(set(counts.values()), key=list(counts.values()).count)
                odd = next(name for name, count in counts.items() if count != usual)
                like = ", ".join(repr(name) for name, count in counts.items() if count == usual)
                raise InputError(
                    odd,
                    f"{usual} rows, like {like}",
                    f"{counts[odd]} rows",
                    "every column needs one entry per row",
                )

    # ---- one column -------------------------------------------------------------------------

    def _rows_of(
        self, column: str, specs: tuple[wire.TensorSpec, ...], arrays: Mapping[str, np.ndarray]
    ) -> int:
        """The column's row count, once its tensors are checked."""
        tensors = []
        for spec in specs:
            if spec.name not in arrays:
                raise InputError(
                    spec.name, f"{_describe(spec)} for column {column!r}", "no such tensor"
                )
            tensors.append(_checked_tensor(spec, arrays[spec.name]))
        values = tensors[0]
        if self.max_rows is not None and len(values) > self.max_rows:
            raise InputError(
                specs[0].name,
                f"at most {self.max_rows} rows per request",
                f"{len(values)}",
                _SPLIT_HINT,
            )
        if column in self.non_null:
            _check_no_nulls(specs[0].name, values)
        if len(tensors) == 1:
            return len(values)
        offsets = tensors[1]
        _check_offsets(specs[1].name, offsets, len(values), specs[0].name)
        return len(offsets) - 1


def _checked_tensor(spec: wire.TensorSpec, array) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise InputError(
            spec.name, _describe(spec), f"a {type(array).__name__}", "send a numpy array"
        )
    object_wanted = spec.dtype == np.dtype(object)
    dtype_fits = array.dtype.kind in "OUS" if object_wanted else array.dtype == spec.dtype
    if spec.name.endswith(wire.OFFSETS_SUFFIX):
        dtype_fits = array.dtype.kind in "iu"  # in-process requests may carry int64 offsets
    if not dtype_fits:
        raise InputError(
            spec.name, _describe(spec), f"{array.dtype} values", f"convert them to {spec.dtype}"
        )
    fixed = spec.dims[1:]
    if array.ndim != len(spec.dims) or any(
        want != -1 and want != got for want, got in zip(fixed, array.shape[1:], strict=True)
    ):
        raise InputError(spec.name, _describe(spec), f"shape {list(array.shape)}")
    return array


def _check_offsets(name: str, offsets: np.ndarray, values: int, values_name: str) -> None:
    """Check the offsets of a ragged list.

    They need at least one entry, start at 0, never decrease, and end at the number of values.
    """
    expected = f"offsets from 0 up to len({values_name!r}) = {values}, never decreasing"
    if len(offsets) == 0:
        raise InputError(
            name,
            expected,
            "no offsets",
            "a request of n rows has n + 1 offsets; send [0] for no rows",
        )
    if offsets[0] != 0:
        raise InputError(name, expected, f"a first offset of {int(offsets[0])}")
    if offsets[-1] != values:
        raise InputError(
            name,
            expected,
            f"a last offset of {int(offsets[-1])}",
            "each row's values must be in the values tensor",
        )
    steps = np.diff(offsets.astype(np.int64, copy=False))
    if len(steps) and steps.min() < 0:
        row = int(np.argmax(steps < 0))
        raise InputError(
            name,
            expected,
            f"offsets going back from {int(offsets[row])} to {int(offsets[row + 1])} at row {row}",
        )


def _check_no_nulls(name: str, values: np.ndarray) -> None:
    if values.dtype.kind == "f":
        missing = np.isnan(values)
    elif values.dtype == np.dtype(object):
        missing = np.fromiter((value is None for value in values.ravel()), bool, values.size)
    else:
        return
    if missing.any():
        row = int(np.argmax(missing.ravel()))
        raise InputError(
            name,
            "no missing values (it is an id, or the key that groups rows into sessions)",
            f"a missing (null) value at row {row}",
            "fill or drop those rows first",
        )


def _describe(spec: wire.TensorSpec) -> str:
    return (
        f"{spec.dtype if spec.dtype != np.dtype(object) else 'string'} tensor of dims"
        f" {list(spec.dims)}"
    )
