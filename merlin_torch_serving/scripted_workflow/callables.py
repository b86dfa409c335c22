"""Scripted ``LambdaOp``/``UDF`` and ``Filter``: the user's function translated by ``expressions``
into one TorchScript method, kept only where it equals NVTabular on the fast path's probe data.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import typing
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from merlin.dag import ColumnSelector, Node

from merlin_torch_serving.fastpath.batch import Batch, Column, same_values
from merlin_torch_serving.fastpath.callables import probe_batches
from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.fastpath.fallback import NVTabularStep
from merlin_torch_serving.scripted_workflow import dates
from merlin_torch_serving.scripted_workflow.columns import ColumnType, torch_dtype
from merlin_torch_serving.scripted_workflow.expressions import (
    FRAME,
    SERIES,
    Evaluator,
    Value,
    column_text,
    columns_attributes,
    series,
)

# the helpers a function's TorchScript calls, found here by name when it is defined
from merlin_torch_serving.scripted_workflow.ragged import (  # noqa: F401
    column_max,
    column_min,
    integer_cast,
    table_lookup,
    take,
    to_datetime_ns,
)

#: the most values a function of a column is tabulated for
_MAX_TABLE = 4096

_SIGNATURE = (
    "def forward(self, values: Dict[str, Tensor], offsets: Dict[str, Tensor], rows: int)"
    " -> Tuple[Dict[str, Tensor], Dict[str, Tensor], int]:"
)


def scripted_method(
    source: str, reduces_over_rows: bool, tables: dict[str, torch.Tensor] | None = None
) -> torch.nn.Module:
    """A module whose ``forward`` is ``source``, with ``tables`` as buffers: a class per module,
    since TorchScript keeps the methods a ScriptModule defines on its class. Names in ``source``
    resolve in this module. ``reduces_over_rows`` records that the function reads every row."""

    class Expression(torch.jit.ScriptModule):
        def __init__(self):
            super().__init__()
            for name, table in (tables or {}).items():
                self.register_buffer(name, table)
            self.reduces_over_rows = reduces_over_rows
            self.define(source)

    return ExpressionKernel(Expression(), _as_python(source), reduces_over_rows)


class ExpressionKernel(torch.nn.Module):
    """A translated function's kernel: its TorchScript (``scripted``), and the same source as a
    Python function, which torch.export traces (it cannot trace into TorchScript) on the same
    buffers."""

    __jit_ignored_attributes__: typing.ClassVar[list[str]] = ["python"]
    reduces_over_rows: bool

    def __init__(self, scripted: torch.jit.ScriptModule, python, reduces_over_rows: bool):
        super().__init__()
        self.scripted = scripted
        self.python = python
        self.reduces_over_rows = reduces_over_rows

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
            if torch.compiler.is_exporting():
                return self.python(self.scripted, values, offsets, rows)
        return self.scripted(values, offsets, rows)


def _as_python(source: str):
    """``source`` (a TorchScript ``forward``) defined as a Python function of this module."""
    # TorchScript's names of the annotations' types, as Python reads them
    names = {"Dict": dict, "List": list, "Tuple": tuple, "Optional": typing.Optional}
    namespace = {**globals(), **names, "Tensor": torch.Tensor}
    exec(compile(source, "<translated function>", "exec"), namespace)  # source made here
    return namespace["forward"]


def _evaluator() -> Evaluator:
    return Evaluator([columns_attributes, dates.extension])


def build_udf(node: Node, selection: ColumnSelector, types: dict[str, ColumnType]):
    """Each selected column through the function; returns only those columns. A function that does
    not translate, of a column whose few values are known (a weekday), becomes a table of its
    values, computed by calling it as NVTabular does."""
    if node.op.dependencies:
        raise NotCompiled("the operator has dependencies")
    lines, output = [_SIGNATURE, "    output: Dict[str, Tensor] = {}"], {}
    tables: dict[str, torch.Tensor] = {}
    reduces = False
    for name in selection.names:
        column = types[name]
        if column.is_list:
            raise NotCompiled(f"a function of the list column {name!r}")
        argument = series(f"values[{column_text(name)}]", column)
        evaluator = _evaluator()
        try:
            result = evaluator.call(node.op.f, [argument])
        except NotCompiled as untranslated:
            table = f"table_{len(tables)}"
            tables[table], result = _tabulated(node.op.f, argument, table, untranslated)
        reduces = reduces or evaluator.reduces_over_rows
        if result.kind != SERIES:
            raise NotCompiled(f"the function gives a {result.kind} for {name!r}, not a column")
        lines.append(f"    output[{column_text(name)}] = {dates.as_rows(result)}")
        output[name] = result.column
    lines.append("    return output, {}, rows")
    module = scripted_method("\n".join(lines) + "\n", reduces, tables)
    _check_on_probe(module, node, selection, types)
    return module, output


def _tabulated(function, argument: Value, table: str, untranslated: NotCompiled):
    """``function`` of a column of known integers as a lookup in the table of its values."""
    value_range = argument.column.value_range
    if value_range is None or value_range[1] - value_range[0] >= _MAX_TABLE:
        raise untranslated
    low, high = value_range
    domain = np.arange(low, high + 1).astype(argument.dtype)
    try:
        values = _series_values(function, domain)
        # the same values whatever else the column holds: elementwise, so a table reproduces it
        for rows in (domain[::-1], domain[: len(domain) // 2 + 1], domain[-1:], domain[[0, 0]]):
            if not same_values(_series_values(function, rows), values[rows - low]):
                raise NotCompiled("its value for a row depends on the other rows")
        scripted_dtype = torch_dtype(values.dtype, "its values")
    except NotCompiled as reason:
        raise NotCompiled(f"{untranslated.reason}; as a table of its values: {reason}") from None
    source = f"table_lookup(self.{table}, {argument.source}, {int(low)})"
    column = replace(argument.column, dtype=values.dtype, value_range=None)
    return torch.from_numpy(values).to(scripted_dtype), series(source, column)


def _series_values(function, values: np.ndarray) -> np.ndarray:
    """``function`` called on a pandas Series of ``values``, as NVTabular calls it."""
    try:
        result = function(pd.Series(values))
    except Exception as error:
        raise NotCompiled(f"it raises {type(error).__name__}: {error}") from None
    if not isinstance(result, pd.Series) or len(result) != len(values):
        raise NotCompiled("it does not give one value per row")
    return result.to_numpy()


def build_filter(node: Node, selection: ColumnSelector, types: dict[str, ColumnType]):
    """The rows where the function is True, every column kept."""
    frame = {
        name: series(f"values[{column_text(name)}]", column)
        for name, column in types.items()
        if not column.is_list
    }
    evaluator = _evaluator()
    result = evaluator.call(node.op.f, [Value(FRAME, python=frame)])
    if result.kind != SERIES or result.dtype != np.dtype(np.bool_):
        raise NotCompiled("the filter does not give one boolean per row")
    source = "\n".join(
        [
            _SIGNATURE,
            f"    keep = {dates.as_rows(result)}",
            "    return take((values, offsets, rows), torch.nonzero(keep).flatten())",
        ]
    )
    module = scripted_method(source + "\n", evaluator.reduces_over_rows)
    _check_on_probe(module, node, selection, types)
    return module, dict(types)


def _check_on_probe(module, node: Node, selection: ColumnSelector, types) -> None:
    """NotCompiled unless the module and NVTabular agree exactly on every probe batch."""
    nvtabular = NVTabularStep(node, selection)
    for variant, probe in probe_batches(node.input_schema).items():
        probe = _within_types(probe, types)
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


def _within_types(batch: Batch, types: dict[str, ColumnType]) -> Batch:
    """The probe made to hold what the scripted workflow's columns can hold: no NaT in datetimes
    (they come from integers, through ``to_datetime``; pandas types a column with a NaT otherwise)
    and, in a column of known integers (a weekday), only those."""
    columns = {}
    for name, column in batch.columns.items():
        values = column.values
        known = types[name].value_range if name in types else None
        if not column.is_list and values.dtype.kind in "mM":
            column = Column(np.where(np.isnat(values), values.dtype.type(0, "s"), values))
        elif not column.is_list and known is not None and values.dtype.kind in "iu":
            low, high = known
            span = high - low + 1
            column = Column((low + (values.astype(np.int64) - low) % span).astype(values.dtype))
        columns[name] = column
    return Batch(columns, batch.num_rows)


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
