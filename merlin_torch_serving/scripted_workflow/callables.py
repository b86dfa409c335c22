"""Scripted ``LambdaOp``/``UDF`` and ``Filter``: the user's function translated by ``expressions``
into one TorchScript method, kept only where it equals NVTabular on the fast path's probe data.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import numpy as np
import torch
from merlin.dag import ColumnSelector, Node

from merlin_torch_serving.fastpath.batch import Batch, same_values
from merlin_torch_serving.fastpath.callables import probe_batches
from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.fastpath.fallback import NVTabularStep
from merlin_torch_serving.scripted_workflow import dates
from merlin_torch_serving.scripted_workflow.columns import ColumnType
from merlin_torch_serving.scripted_workflow.expressions import (
    FRAME,
    SERIES,
    Evaluator,
    Value,
    column_text,
    columns_attributes,
    series,
)
from merlin_torch_serving.scripted_workflow.ragged import integer_cast, take  # noqa: F401

_SIGNATURE = (
    "def forward(self, values: Dict[str, Tensor], offsets: Dict[str, Tensor], rows: int)"
    " -> Tuple[Dict[str, Tensor], Dict[str, Tensor], int]:"
)


def scripted_method(source: str) -> torch.jit.ScriptModule:
    """A module whose ``forward`` is ``source``: a class per module, since TorchScript keeps the
    methods a ScriptModule defines on its class. Names in ``source`` resolve in this module."""

    class Expression(torch.jit.ScriptModule):
        def __init__(self):
            super().__init__()
            self.define(source)

    return Expression()


def _evaluator() -> Evaluator:
    return Evaluator([columns_attributes, dates.extension])


def build_udf(node: Node, selection: ColumnSelector, types: dict[str, ColumnType]):
    """Each selected column through the function; returns only those columns."""
    if node.op.dependencies:
        raise NotCompiled("the operator has dependencies")
    lines, output = [_SIGNATURE, "    output: Dict[str, Tensor] = {}"], {}
    for name in selection.names:
        column = types[name]
        if column.is_list:
            raise NotCompiled(f"a function of the list column {name!r}")
        result = _evaluator().call(node.op.f, [series(f"values[{column_text(name)}]", column)])
        if result.kind != SERIES:
            raise NotCompiled(f"the function gives a {result.kind} for {name!r}, not a column")
        lines.append(f"    output[{column_text(name)}] = {dates.as_rows(result)}")
        output[name] = result.column
    lines.append("    return output, {}, rows")
    module = scripted_method("\n".join(lines) + "\n")
    _check_on_probe(module, node, selection, types)
    return module, output


def build_filter(node: Node, selection: ColumnSelector, types: dict[str, ColumnType]):
    """The rows where the function is True, every column kept."""
    frame = {
        name: series(f"values[{column_text(name)}]", column)
        for name, column in types.items()
        if not column.is_list
    }
    result = _evaluator().call(node.op.f, [Value(FRAME, python=frame)])
    if result.kind != SERIES or result.dtype != np.dtype(np.bool_):
        raise NotCompiled("the filter does not give one boolean per row")
    source = "\n".join(
        [
            _SIGNATURE,
            f"    keep = {dates.as_rows(result)}",
            "    return take((values, offsets, rows), torch.nonzero(keep).flatten())",
        ]
    )
    module = scripted_method(source + "\n")
    _check_on_probe(module, node, selection, types)
    return module, dict(types)


def _check_on_probe(module, node: Node, selection: ColumnSelector, types) -> None:
    """NotCompiled unless the module and NVTabular agree exactly on every probe batch."""
    nvtabular = NVTabularStep(node, selection)
    for variant, probe in probe_batches(node.input_schema).items():
        try:
            expected = nvtabular(probe)
        except Exception as error:
            raise NotCompiled(
                f"NVTabular fails on probe data ({variant}: {type(error).__name__}: {error})"
            ) from None
        try:
            values, _, rows = module(*as_tensors(probe, types))
        except Exception as error:
            raise NotCompiled(
                f"its TorchScript fails on probe data ({variant}: {error})".splitlines()[0]
            ) from None
        if rows != expected.num_rows or set(values) != set(expected.columns):
            raise NotCompiled(
                f"its TorchScript gives {sorted(values)} x {rows} rows, NVTabular"
                f" {sorted(expected.columns)} x {expected.num_rows} ({variant})"
            )
        if expected.num_rows == 0:
            continue
        for name, column in expected.columns.items():
            if column.is_list:
                continue  # passed through unchanged, as every list column here
            ours = values[name].numpy()
            if ours.dtype != column.values.dtype and column.values.dtype.kind in "mM":
                ours = ours.view(column.values.dtype)
            if not same_values(ours, column.values):
                raise NotCompiled(
                    f"its TorchScript gives other values or dtypes for {name!r} than NVTabular"
                    f" ({variant})"
                )


def as_tensors(batch: Batch, types: dict[str, ColumnType]):
    """A fast-path batch as the (values, offsets, rows) a kernel takes, in the static types."""
    values, offsets = {}, {}
    for name, column in batch.columns.items():
        dtype = types[name].dtype if name in types else column.values.dtype
        array = column.values.astype(dtype) if dtype.kind not in "mM" else column.values
        if array.dtype.kind in "mM":
            array = array.astype(dtype).view(np.int64)
        values[name] = torch.from_numpy(np.ascontiguousarray(array))
        if column.is_list:
            offsets[name] = torch.from_numpy(column.list_offsets().astype(np.int64))
    return values, offsets, batch.num_rows
