"""DecodeItemIds: turn Categorify-encoded item ids back into the raw ids users know.

Columns it is not asked to decode pass through unchanged, so it can sit at the end of a chain.
Integer raw ids are also a TorchScript lookup, compiled into the libtorch model before it.
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.data.vocabulary import CategoryVocabulary
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.ops.base import ServingOperator

VOCABULARY_FILE = "vocabulary.npz"


class DecodeIds(torch.nn.Module):
    """The ``decoded`` inputs looked up in ``raw_ids`` (-1 for ids outside it, which also marks the
    ids that are not items), the ``passed`` ones unchanged, as ``CategoryVocabulary.decode`` does.
    """

    decoded: list[str]
    passed: list[str]
    raw_ids: torch.Tensor

    def __init__(self, raw_ids: torch.Tensor, decoded: list[str], passed: list[str]):
        super().__init__()
        self.decoded = decoded
        self.passed = passed
        self.register_buffer("raw_ids", raw_ids)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outputs: dict[str, torch.Tensor] = {}
        for name in self.passed:
            outputs[name] = inputs[name]
        size = self.raw_ids.shape[0]
        for name in self.decoded:
            ids = inputs[name]
            inside = (ids >= 0) & (ids < size)
            found = self.raw_ids[torch.clamp(ids, 0, size - 1)]
            outputs[name] = torch.where(inside, found, torch.full_like(found, -1))
        return outputs


class DecodeItemIds(ServingOperator):
    """Map encoded ids in ``columns`` to raw values through a Categorify vocabulary.

    Parameters
    ----------
    vocabulary
        A fitted ``nvtabular.Workflow`` (its vocabulary of ``source_column`` is used) or a
        ``CategoryVocabulary``.
    source_column
        The raw column the ids were encoded from (default ``"item_id"``).
    columns
        The columns to decode (default ``("item_ids",)``, TopK's output); others pass through.
        Reserved or unknown ids decode to -1 (integers), NaN (floats) or None (strings).
    """

    def __init__(
        self, vocabulary, source_column: str = "item_id", columns: Sequence[str] = ("item_ids",)
    ):
        super().__init__()
        if not isinstance(vocabulary, CategoryVocabulary):
            vocabulary = CategoryVocabulary.from_workflow(vocabulary, source_column)
        self.vocabulary = vocabulary
        self.columns = list(columns)

    @property
    def label(self) -> str:
        return f"DecodeItemIds({self.vocabulary.column!r})"

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        for name in self.columns:
            column = input_schema.get(name)
            if column is None:
                raise SchemaError(
                    self.label,
                    name,
                    "an int column of encoded ids",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
            if column.dtype.element_type.value != "int":
                raise SchemaError(
                    self.label, name, "an int column of encoded ids", describe_column(column)
                )

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        raw_dtype = self.vocabulary.raw_values.dtype
        raw_dtype = "str" if raw_dtype.kind == "O" else raw_dtype
        columns = []
        for column in input_schema:
            if column.name in self.columns:
                # the encoded ids' domain does not describe raw ids (with_properties would keep it)
                properties = {k: v for k, v in column.properties.items() if k != "domain"}
                column = dataclasses.replace(column.with_dtype(raw_dtype), properties=properties)
            columns.append(column)
        return Schema(columns)

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        columns = {}
        for name, column in transformable.items():
            if name in self.columns:
                decoded = self.vocabulary.decode(column.values)
                columns[name] = (decoded, column.offsets) if column.offsets is not None else decoded
            else:
                columns[name] = column
        return TensorTable(columns, _unsafe=True)

    def config(self) -> dict[str, Any]:
        return {"source_column": self.vocabulary.column, "columns": self.columns}

    def exportable(self, input_schema: Schema) -> DecodeIds | None:
        return self.torchscript(input_schema)

    def torchscript(self, input_schema: Schema) -> DecodeIds | None:
        """A lookup when raw ids are integers and every column is scalar or fixed-length."""
        raw_values = self.vocabulary.raw_values
        if (
            raw_values.dtype.kind not in "iu"
            or len(raw_values) == 0
            or any(wire.is_ragged(c) for c in input_schema)
        ):
            return None
        raw_ids = torch.from_numpy(
            np.where(self.vocabulary.is_item, raw_values, -1).astype(raw_values.dtype)
        )
        names = input_schema.column_names
        return DecodeIds(
            raw_ids,
            [n for n in names if n in self.columns],
            [n for n in names if n not in self.columns],
        )

    def save_artifacts(self, artifact_path=None) -> None:
        raw_values = self.vocabulary.raw_values
        if raw_values.dtype == np.dtype(object):
            # object arrays need pickle; strings are stored as fixed-width text, so loading needs
            # none
            raw_values = np.array(
                ["" if value is None else str(value) for value in raw_values], dtype=str
            )
        np.savez(
            os.path.join(artifact_path, VOCABULARY_FILE),
            raw_values=raw_values,
            is_item=self.vocabulary.is_item,
        )

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        with np.load(os.path.join(artifact_path, VOCABULARY_FILE), allow_pickle=False) as saved:
            raw_values, is_item = saved["raw_values"], saved["is_item"]
        if raw_values.dtype.kind == "U":
            raw_values = np.where(is_item, raw_values.astype(object), np.array(None, dtype=object))
        return {
            "vocabulary": CategoryVocabulary(config["source_column"], raw_values, is_item),
            **config,
        }
