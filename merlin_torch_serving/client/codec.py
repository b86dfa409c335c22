"""A served model's requests and answers as tritonclient carries them, worked out once per model
from what its configuration says (``ModelSchemas``): which columns a request needs and which of
them can be taken as they come, how each travels, what the answer's tensors are called and the
tritonclient objects that ask for them. Requests go from the caller's columns straight to wire
arrays, answers from wire arrays straight to a DataFrame or to a dict of columns, with no table
or frame in between where none is needed.

The checks are ``frames.checked_columns``' (the same errors, naming the column, as in-process):
a column of numbers that already has the input's dtype and one value per row skips them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType
from typing import Literal

import numpy as np
import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving.client import chunks, column_names
from merlin_torch_serving.client.model_schemas import ModelSchemas
from merlin_torch_serving.data import frames, tables, wire

#: ``"frame"``: a DataFrame, one row per output row; ``"columns"``: a dict of columns (see
#: ``ModelCodec.columns``)
OutputFormat = Literal["frame", "columns"]

#: Triton's name of a numpy dtype, looked up once per dtype
_triton_dtype = functools.lru_cache(maxsize=None)(wire.triton_dtype)


class ModelCodec:
    """One served model's requests and answers over one tritonclient module (``tritonclient.grpc``
    or ``tritonclient.http``; their asyncio clients take the same tensors)."""

    def __init__(self, schemas: ModelSchemas, module: ModuleType):
        self.schemas = schemas
        self._module = module
        #: scalar columns of numbers: an array of their dtype with one value per row is ready
        self._ready_dtypes = {
            column.name: wire.column_numpy_dtype(column)
            for column in schemas.input_schema
            if (column.shape.dims is None or len(column.shape.dims) <= 1)
            and wire.is_carried_by_tensors(column)
        }
        #: per output column: whether it is ragged, and (name in the table, name on the wire)
        self._outputs = [
            (
                column.name,
                wire.is_ragged(column),
                [
                    (spec.name, schemas.response_names[column.name] + spec.name[len(column.name) :])
                    for spec in wire.column_specs(column)
                ],
            )
            for column in schemas.output_schema
        ]
        #: the answer frames' column labels, per mapping of the caller's column names
        self._labels: dict[tuple, pd.Index] = {}
        #: tritonclient's requested outputs: read-only once built, so every call shares them
        self.requested_outputs = [
            module.InferRequestedOutput(sent) for _, _, pairs in self._outputs for _, sent in pairs
        ]

    # ---- requests -----------------------------------------------------------------------------

    def request_columns(
        self, data: pd.DataFrame | Mapping[str, object], mapping: Mapping[str, str] | None
    ) -> chunks.Columns:
        """The request's input columns, checked and converted to the input schema (``mapping``:
        the caller's column names -> the inputs')."""
        columns = column_names.columns_of(data, mapping)
        ready = {}
        for name, dtype in self._ready_dtypes.items():
            values = columns.get(name)
            if type(values) is np.ndarray and values.dtype == dtype and values.ndim == 1:
                ready[name] = values
        return frames.checked_columns(columns, self.schemas.input_schema, ready)

    def requests(self, columns: chunks.Columns, max_rows: int | None) -> list[chunks.Columns]:
        """The request in parts of whole sessions that each fit the row limits (``max_rows``, the
        client's, and the model's own)."""
        limits = [limit for limit in (max_rows, self.schemas.max_request_rows) if limit is not None]
        return chunks.split_columns(
            columns, self.schemas.request_groups, min(limits) if limits else None
        )

    def inputs(self, columns: chunks.Columns) -> list:
        """tritonclient's input tensors for one request part."""
        arrays = wire.columns_to_wire(columns)
        if self.schemas.request_dim:
            arrays = {name: array[np.newaxis] for name, array in arrays.items()}
        return infer_inputs(self._module, arrays)

    # ---- answers ------------------------------------------------------------------------------

    def answer_columns(self, result) -> chunks.Columns:
        """The output columns of one answer (tritonclient's ``InferResult``), text as ``str``."""
        columns: chunks.Columns = {}
        for name, ragged, pairs in self._outputs:
            arrays = [self._array(result, sent) for _, sent in pairs]
            columns[name] = (arrays[0], arrays[1]) if ragged else arrays[0]
        return columns

    def joined(self, answers: list[chunks.Columns]) -> chunks.Columns:
        """The answers to a request's parts, one after the other."""
        if len(answers) == 1:
            return answers[0]
        return wire.table_columns(
            tables.concat([TensorTable(answer, _unsafe=True) for answer in answers])
        )

    def frame(self, columns: chunks.Columns, mapping: Mapping[str, str] | None) -> pd.DataFrame:
        """The answer as a DataFrame in output-schema order, one row per output row; a list
        column holds a numpy array per row; a column named like a mapped input (the session id)
        under the caller's name."""
        key = tuple(mapping.items()) if mapping else ()
        labels = self._labels.get(key)
        if labels is None:  # an Index is immutable: frames of the same columns share one
            names = column_names.answer_names(mapping)
            labels = self._labels[key] = pd.Index([names.get(name, name) for name in columns])
        return frames.columns_to_frame(columns, labels=labels)

    def columns(self, columns: chunks.Columns, mapping: Mapping[str, str] | None) -> dict:
        """The answer as a dict of columns in output-schema order, one entry per output row: a
        numpy array for a column of one value per row, a 2-D array (rows x length) for a
        fixed-length list, a list of numpy arrays for a ragged list."""
        names = column_names.answer_names(mapping)
        return {
            names.get(name, name): _rows(column) if isinstance(column, tuple) else _owned(column)
            for name, column in columns.items()
        }

    def _array(self, result, sent: str) -> np.ndarray:
        array = result.as_numpy(sent)
        if self.schemas.request_dim:
            array = array[0]
        return wire.bytes_to_text(array) if array.dtype == object else array


def _rows(column: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """A ragged column's rows, one array each."""
    values, offsets = column
    return np.split(_owned(values), offsets[1:-1]) if len(offsets) > 1 else []


def _owned(array: np.ndarray) -> np.ndarray:
    """``array``, copied when it is tritonclient's read-only view of the answer's bytes: the
    caller owns the arrays it gets (a DataFrame copies them into its own blocks anyway)."""
    return array if array.flags.writeable else array.copy()


def infer_inputs(module: ModuleType, arrays: Mapping[str, np.ndarray]) -> list:
    """tritonclient's input tensors, holding ``arrays`` as they are."""
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), _triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs
