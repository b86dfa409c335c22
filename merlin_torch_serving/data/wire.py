"""The wire format: how schema columns travel as Triton tensors, written down once.

It is Merlin Systems' format, so clients written for Merlin keep working:

- a scalar column ``c`` is one tensor ``c`` with dims ``[-1]`` (one value per row);
- a fixed-length list column is one tensor ``c`` with dims ``[-1, L, ...]``;
- a ragged list column is two tensors: ``c__values`` (all rows' values, concatenated; dims
  ``[-1, ...]``) and ``c__offsets`` (int32, ``rows + 1`` entries, starting at 0, where row ``i``
  holds ``values[offsets[i]:offsets[i + 1]]``).

A Triton ensemble cannot have an output named like one of its inputs (the scheduler would take
the input for the output), so such an output travels as ``<name>__out`` (e.g. a session id that
goes in and comes back); see ``response_name``.

The batch dimension is part of ``dims`` and ``max_batch_size`` is 0 everywhere: a request's first
dimension counts interaction rows, and a step may return fewer rows (sessions) than it received, so
Triton must not batch requests on that dimension.

The batched form (an export with ``ModelOptions(batching=True)``) puts one more dimension of 1 in
front of every tensor above, requests and answers alike (``c__values`` is ``[1, n]``,
``c__offsets`` ``[1, rows + 1]``): each request is one item of a batch Triton forms across requests
(``max_batch_size`` > 0, ``allow_ragged_batch`` on the python steps), and the step merges the
items itself (``export.merging``). The ensemble says so in its config (dims ``[1, ...]`` and the
``merlin_torch_serving.request_dim`` parameter), which ``Client`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from merlin.dtypes.base import ElementType
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable
from numpy.typing import DTypeLike
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from merlin_torch_serving.exceptions import InputError

VALUES_SUFFIX = "__values"
OFFSETS_SUFFIX = "__offsets"
OFFSETS_DTYPE = np.dtype(np.int32)
RESPONSE_SUFFIX = "__out"
#: Triton's protocol calls text tensors BYTES; model configs call the same type STRING
_PROTOCOL_TEXT, _CONFIG_TEXT = "BYTES", "STRING"
#: numpy has no bfloat16 of its own (tritonclient maps it to ml_dtypes'), and nothing here makes one
_UNSUPPORTED = ("BF16",)


@dataclass(frozen=True)
class TensorSpec:
    """One Triton tensor: its name, numpy dtype and dims (``-1`` for a variable dimension)."""

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]

    @property
    def triton_dtype(self) -> str:
        """The dtype as Triton's protocol names it (``INT64``, ``FP32``, ``BYTES``, ...)."""
        return triton_dtype(self.dtype)

    @property
    def config_dtype(self) -> str:
        """The dtype as a model config names it (``TYPE_INT64``, ``TYPE_STRING``, ...)."""
        name = self.triton_dtype
        return "TYPE_" + (_CONFIG_TEXT if name == _PROTOCOL_TEXT else name)


def triton_dtype(dtype: np.dtype) -> str:
    """Triton's name (``INT64``, ``BYTES``, ...) of a numpy dtype; text of any kind is BYTES."""
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return _PROTOCOL_TEXT
    name = np_to_triton_dtype(dtype)
    if name is None or name in _UNSUPPORTED:
        raise TypeError(f"dtype {dtype} has no Triton equivalent")
    return name


def numpy_dtype(triton: str) -> np.dtype:
    """The numpy dtype for a Triton dtype name (``INT64``, ``TYPE_INT64``, ``TYPE_STRING``)."""
    name = triton.removeprefix("TYPE_")
    name = _PROTOCOL_TEXT if name == _CONFIG_TEXT else name
    found = None if name in _UNSUPPORTED else triton_to_np_dtype(name)
    if found is None:
        raise TypeError(f"Triton dtype {triton!r} has no numpy equivalent")
    return np.dtype(found)


def tensor_numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (``torch.float32`` -> ``float32``), by torch's own
    conversion (merlin-core's map lacks torch's unsigned types above 8 bits); ``TypeError`` for a
    dtype numpy has not, such as bfloat16."""
    import torch  # only callers that hold tensors pay for it

    return torch.empty(0, dtype=dtype).numpy().dtype


def column_numpy_dtype(column: ColumnSchema) -> np.dtype:
    """The numpy dtype a column's values travel as (strings travel as object arrays of bytes)."""
    element_type = column.dtype.element_type
    if element_type is ElementType.String:
        return np.dtype(np.object_)
    if element_type is ElementType.Unknown:
        raise TypeError(f"column {column.name!r} has no dtype in its schema")
    return np.dtype(column.dtype.to_numpy)


def is_carried_by_tensors(column: ColumnSchema) -> bool:
    """Whether the column is numbers or booleans (TorchScript tensors hold it), not text."""
    return column_numpy_dtype(column).kind in "biuf"


def is_ragged(column: ColumnSchema) -> bool:
    return bool(column.shape.dims is not None and column.shape.is_ragged)


def _dims(column: ColumnSchema) -> tuple[int, ...]:
    """Dims of the column as one dense tensor; -1 where a dimension is not fixed."""
    shape = column.shape
    if shape.dims is None or len(shape.dims) == 0:
        return (-1,)
    return tuple(
        -1 if i == 0 or not dim.is_fixed else int(dim.max) for i, dim in enumerate(shape.dims)
    )


def column_specs(column: ColumnSchema) -> list[TensorSpec]:
    """The tensor(s) one column travels as."""
    dtype = column_numpy_dtype(column)
    dims = _dims(column)
    if is_ragged(column):
        # the ragged dimension (dims[1]) is folded into the values' first dimension
        return [
            TensorSpec(column.name + VALUES_SUFFIX, dtype, (-1, *dims[2:])),
            TensorSpec(column.name + OFFSETS_SUFFIX, OFFSETS_DTYPE, (-1,)),
        ]
    return [TensorSpec(column.name, dtype, dims)]


def schema_specs(schema: Schema) -> list[TensorSpec]:
    """The tensors a whole schema travels as, in schema order."""
    return [spec for column in schema for spec in column_specs(column)]


def to_wire(table: TensorTable) -> dict[str, np.ndarray]:
    """Flatten a table to named numpy arrays in the wire format (offsets as int32)."""
    return columns_to_wire(table_columns(table))


#: a TensorTable column as this package builds one: values, or a ragged list's (values, offsets)
TableColumn = np.ndarray | tuple[np.ndarray, np.ndarray]


def table_columns(table: TensorTable) -> dict[str, TableColumn]:
    """A table's columns by name, a ragged list as ``(values, offsets)``."""
    return {
        name: (column.values, column.offsets) if column.offsets is not None else column.values
        for name, column in table.items()
    }


def columns_to_wire(columns: Mapping[str, TableColumn]) -> dict[str, np.ndarray]:
    """Table columns (arrays, or a ragged list's ``(values, offsets)``) as named numpy arrays in
    the wire format (offsets as int32)."""
    arrays: dict[str, np.ndarray] = {}
    for name, column in columns.items():
        if isinstance(column, tuple):
            arrays[name + VALUES_SUFFIX] = np.asarray(column[0])
            arrays[name + OFFSETS_SUFFIX] = np.asarray(column[1]).astype(OFFSETS_DTYPE, copy=False)
        else:
            arrays[name] = np.asarray(column)
    return arrays


def from_wire(arrays: Mapping[str, np.ndarray], schema: Schema | None = None) -> TensorTable:
    """Group wire arrays into a table; with a schema, take exactly its columns, in its order.

    A column whose tensors are not all there is an ``InputError`` naming the column, the tensors it
    travels as and the ones that came.
    """
    if schema is None:
        return TensorTable(dict(arrays), _unsafe=True)
    columns: dict[str, TableColumn] = {}
    for column in schema:
        try:
            if is_ragged(column):
                columns[column.name] = (
                    arrays[column.name + VALUES_SUFFIX],
                    arrays[column.name + OFFSETS_SUFFIX],
                )
            else:
                columns[column.name] = arrays[column.name]
        except KeyError:
            raise _missing_tensors(column, arrays) from None
    return TensorTable(columns, _unsafe=True)


def _missing_tensors(column: ColumnSchema, arrays: Mapping[str, np.ndarray]) -> InputError:
    if is_ragged(column):
        names = [column.name + VALUES_SUFFIX, column.name + OFFSETS_SUFFIX]
        expected = (
            f"tensors {names[0]!r} (its values) and {names[1]!r} (int32, rows + 1 offsets): a"
            " ragged list column travels as both"
        )
    else:
        names = [column.name]
        expected = f"a tensor {column.name!r}"
    missing = [name for name in names if name not in arrays]
    came = ", ".join(map(repr, sorted(arrays))) or "none"
    return InputError(
        column.name,
        expected,
        f"no {' and no '.join(map(repr, missing))} (the tensors are {came})",
        "send every tensor of the column (see the wire format)",
    )


def lengths(offsets: np.ndarray) -> np.ndarray:
    """Row lengths of a ragged column from its offsets."""
    return np.diff(np.asarray(offsets))


def offsets_from_lengths(row_lengths: np.ndarray, dtype: DTypeLike = OFFSETS_DTYPE) -> np.ndarray:
    """Offsets from row lengths, starting at 0.

    They are int32, as they travel, unless ``dtype`` says otherwise.
    """
    offsets = np.zeros(len(row_lengths) + 1, dtype=dtype)
    np.cumsum(row_lengths, out=offsets[1:])
    return offsets


def segment_positions(
    starts: np.ndarray, row_lengths: np.ndarray, offsets: np.ndarray
) -> np.ndarray:
    """Flat positions of the segments ``[start, start + length)``, concatenated in row order.

    ``offsets`` are the output offsets (from ``row_lengths``); passing them avoids a second cumsum.
    """
    shift = np.repeat(starts - offsets[:-1], row_lengths)
    return shift + np.arange(offsets[-1], dtype=np.int64)


def take_ragged(
    values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, dtype: np.dtype = OFFSETS_DTYPE
) -> tuple[np.ndarray, np.ndarray]:
    """The given rows of a ragged column, in that order.

    Returns their values and new offsets of ``dtype``.
    """
    offsets = np.asarray(offsets)
    starts = offsets[:-1][rows]
    row_lengths = offsets[1:][rows] - starts
    new_offsets = offsets_from_lengths(row_lengths, dtype)
    return np.asarray(values)[segment_positions(starts, row_lengths, new_offsets)], new_offsets


def response_name(column_name: str, request_names) -> str:
    """The name an output column travels under: its own, unless a request column has it."""
    return column_name + RESPONSE_SUFFIX if column_name in set(request_names) else column_name


def bytes_to_text(array: np.ndarray) -> np.ndarray:
    """BYTES tensors arrive as ``bytes`` objects; operators and callers see ``str``."""
    if array.dtype != np.dtype(object):
        return array
    flat = [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.ravel()]
    return np.array(flat, dtype=object).reshape(array.shape)


def text_to_bytes(array: np.ndarray) -> np.ndarray:
    """``str`` values encoded as UTF-8 ``bytes``, as BYTES tensors carry them."""
    if array.dtype != np.dtype(object):
        return array
    flat = [v.encode("utf-8") if isinstance(v, str) else v for v in array.ravel()]
    return np.array(flat, dtype=object).reshape(array.shape)
