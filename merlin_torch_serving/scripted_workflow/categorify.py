"""Scripted NVTabular ``Categorify``: each column's vocabulary sorted once, looked up with
``torch.searchsorted`` (the counterpart of ``fastpath.categorify``, with the same encoding: 0 is
padding, 1 a null value, 2 a value outside the vocabulary, then the vocabulary's own labels).

String vocabularies stay with the python step: Triton's pytorch backend hands a model strings only
as ``List[str]`` arguments of ``forward``, never inside the ``Dict[str, Tensor]`` its steps take.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import numpy as np
import torch
from merlin.dag import ColumnSelector
from nvtabular.ops import Categorify

from merlin_torch_serving.fastpath.categorify import CategorifyKernel
from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.scripted_workflow.columns import ARRAY_CELLS, ColumnType, torch_dtype


class EncodedColumn(torch.nn.Module):
    """One column's vocabulary (values sorted, ``labels`` beside them) and how keys reach it."""

    vocabulary: torch.Tensor
    labels: torch.Tensor
    key_dtype: torch.dtype
    out_dtype: torch.dtype
    float_keys: bool
    integer_vocabulary: bool
    is_list: bool

    def __init__(self, vocabulary, labels, key_dtype, out_dtype, float_keys, is_list):
        super().__init__()
        self.register_buffer("vocabulary", vocabulary)
        self.register_buffer("labels", labels)
        self.key_dtype = key_dtype
        self.out_dtype = out_dtype
        self.float_keys = float_keys
        self.integer_vocabulary = not vocabulary.is_floating_point()
        self.is_list = is_list

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        keys = values
        if self.float_keys:
            nulls = torch.isnan(values)
            unmatchable = nulls
            if self.integer_vocabulary:
                # pandas cannot cast NaN or inf to an integer: encoded as null or out of vocabulary
                unmatchable = ~torch.isfinite(values)
                keys = torch.where(unmatchable, torch.zeros_like(values), values)
            labels = self.lookup(keys.to(self.key_dtype))
            labels = torch.where(unmatchable, torch.full_like(labels, 2), labels)
            if not self.is_list:
                # inside lists NVTabular only merges: a null element is out of vocabulary there
                labels = torch.where(nulls, torch.full_like(labels, 1), labels)  # NULL_LABEL
        else:
            labels = self.lookup(keys.to(self.key_dtype))
        return labels.to(self.out_dtype)

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Each key's label, 2 (the fast path's OOV_LABEL) for keys outside the vocabulary."""
        count = self.vocabulary.shape[0]
        if count == 0:
            return torch.full(keys.shape, 2, dtype=torch.int64)
        positions = torch.clamp(torch.searchsorted(self.vocabulary, keys), max=count - 1)
        found = self.vocabulary.index_select(0, positions) == keys
        labels = self.labels.index_select(0, positions)
        return torch.where(found, labels, torch.full_like(positions, 2))


class CategorifyScript(torch.nn.Module):
    """Encodes the selected columns; returns every input column, those replaced."""

    def __init__(self, columns: dict[str, EncodedColumn]):
        super().__init__()
        self.columns = torch.nn.ModuleDict(columns)

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        encoded = dict(values)
        for name, column in self.columns.items():
            encoded[name] = column(values[name])
        return encoded, offsets, rows


def build(op: Categorify, selection: ColumnSelector, types: dict[str, ColumnType]):
    """The kernel and its output types; NotCompiled for what only the python step can run."""
    vocabularies = CategorifyKernel(op, selection).vocabularies  # the fast path's own checks
    out_dtype = np.dtype(op.output_dtype)
    columns, output = {}, dict(types)
    for name, vocabulary in vocabularies.items():
        column = types[name]
        if vocabulary.dtype.kind not in "iuf" or column.dtype.kind not in "iuf":
            raise NotCompiled(
                f"column {name!r} holds {column.dtype} values against a vocabulary of"
                f" {vocabulary.dtype}; strings and objects are encoded in the python step"
            )
        key_dtype = torch_dtype(vocabulary.dtype, f"the vocabulary of {name!r}")
        columns[name] = EncodedColumn(
            torch.from_numpy(np.ascontiguousarray(vocabulary.values)),
            torch.from_numpy(vocabulary.labels.astype(np.int64)),
            key_dtype,
            torch_dtype(out_dtype, "Categorify's output"),
            column.dtype.kind == "f",
            column.is_list,
        )
        labels = ColumnType(out_dtype, value_range=(0, int(vocabulary.labels.max(initial=2))))
        output[name] = labels.of_lists(ARRAY_CELLS) if column.is_list else labels
    return CategorifyScript(columns), output
