"""Compiling a fitted NVTabular workflow into one TorchScript module: a kernel per graph node, each
built for the static types of its input columns, and the reasons of the nodes that get none.

Operators are matched by the ``transform`` they run (as the fast path matches them). A node gets
no TorchScript form when its operator has no kernel (a custom operator, ``LogOp``), when its
function does not translate (see ``expressions``), when it reads strings, or when its parents
hold different rows (a Filter's output beside what it filtered: NVTabular would align them by
position and fill the gaps with nulls, which no tensor holds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import nvtabular as nvt
import torch
from merlin.dag import ColumnSelector, Node
from merlin.dag.operator import Operator as BaseOperator
from merlin.dag.ops.concat_columns import ConcatColumns
from merlin.dag.ops.rename import Rename as DagRename
from merlin.dag.ops.selection import SelectionOp
from merlin.dag.ops.subset_columns import SubsetColumns
from merlin.dag.ops.subtraction import SubtractionOp
from merlin.dag.ops.udf import UDF
from merlin.schema import Schema
from nvtabular import ops as nvt_ops

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.compiler import describe_operator, nodes_in_run_order
from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.fastpath.passthrough import RenameColumns
from merlin_torch_serving.fastpath.wire_io import output_layout
from merlin_torch_serving.scripted_workflow import (
    callables,
    categorify,
    continuous,
    groupby,
    lists,
)
from merlin_torch_serving.scripted_workflow.columns import ColumnType, Types, torch_dtype
from merlin_torch_serving.scripted_workflow.graph import WorkflowScript
from merlin_torch_serving.scripted_workflow.head import Head
from merlin_torch_serving.scripted_workflow.passthrough import Identity, Select

Builder = Callable[[Node, ColumnSelector, Types], tuple]


def _identity(node, selection, types):
    return Identity(), dict(types)


def _select(names: list[str], types: Types, targets: list[str] | None = None):
    missing = [name for name in names if name not in types]
    if missing:
        raise NotCompiled(f"columns {missing!r} do not reach the node")
    targets = list(targets or names)
    return Select(names, targets), {
        target: types[name] for name, target in zip(names, targets, strict=True)
    }


def _rename(node, selection, types):
    renames = RenameColumns(node.op, selection).renames
    return _select([old for old, _ in renames], types, [new for _, new in renames])


_BUILDERS: dict[Callable, Builder] = {
    BaseOperator.transform: _identity,
    nvt_ops.AddMetadata.transform: _identity,
    nvt_ops.ValueCount.transform: _identity,
    SelectionOp.transform: lambda node, selection, types: _select(
        (selection or node.op.selector).names, types
    ),
    ConcatColumns.transform: lambda node, selection, types: _select(selection.names, types),
    SubsetColumns.transform: lambda node, selection, types: _select(selection.names, types),
    SubtractionOp.transform: lambda node, selection, types: _select(
        (node.op.selector or selection).names, types
    ),
    DagRename.transform: _rename,
    nvt_ops.Rename.transform: _rename,
    nvt_ops.Categorify.transform: lambda node, s, t: categorify.build(node.op, s, t),
    nvt_ops.Groupby.transform: lambda node, s, t: groupby.build(node.op, s, t),
    nvt_ops.ListSlice.transform: lambda node, s, t: lists.build(node.op, s, t),
    nvt_ops.FillMissing.transform: lambda node, s, t: continuous.build_fill_missing(node.op, s, t),
    nvt_ops.LogOp.transform: lambda node, s, t: continuous.build_log(node.op, s, t),
    nvt_ops.Normalize.transform: lambda node, s, t: continuous.build_normalize(node.op, s, t),
    nvt_ops.NormalizeMinMax.transform: lambda node, s, t: continuous.build_normalize_minmax(
        node.op, s, t
    ),
    UDF.transform: callables.build_udf,
    nvt_ops.Filter.transform: callables.build_filter,
}
_PASSING_ON = {
    builder
    for transform, builder in _BUILDERS.items()
    if transform
    in (
        BaseOperator.transform,
        nvt_ops.AddMetadata.transform,
        nvt_ops.ValueCount.transform,
        SelectionOp.transform,
        ConcatColumns.transform,
        SubsetColumns.transform,
        SubtractionOp.transform,
        DagRename.transform,
        nvt_ops.Rename.transform,
    )
}
#: operators whose output rows are not their input rows
_ROW_CHANGING = (nvt_ops.Groupby, nvt_ops.Filter)


@dataclass(frozen=True)
class ScriptedNode:
    """One workflow node: where its inputs come from, and its kernel or why it has none."""

    label: str
    parents: tuple[int, ...]
    request_columns: tuple[str, ...]  # root columns no parent returns: read from the request
    kernel: torch.nn.Module | None
    output_types: Types
    reason: str | None = None
    follows_uncompiled: bool = False  # it has none because a parent has none


@dataclass(frozen=True)
class Compiled:
    """The workflow's nodes, compiled; ``module`` is None unless every node has a kernel."""

    nodes: list[ScriptedNode]
    module: WorkflowScript | None

    @property
    def reduces_over_rows(self) -> list[str]:
        """The operators whose function reads a whole column (``col - col.min()``): the answer to a
        row depends on the request's other rows."""
        return [
            node.label for node in self.nodes if getattr(node.kernel, "reduces_over_rows", False)
        ]

    @property
    def uncompiled(self) -> list[tuple[str, str]]:
        """(operator, why it has no TorchScript form) for every node that has none of its own
        (not merely because a node before it has none)."""
        return [
            (node.label, node.reason)
            for node in self.nodes
            if node.reason is not None and not node.follows_uncompiled
        ]


def compile_nodes(
    workflow: nvt.Workflow, non_null_inputs: list[str], head: Head | None = None
) -> Compiled:
    """Every node's kernel (or reason), and the whole workflow's module when all have one. With a
    ``head`` (``split``), the columns its nodes send are inputs of the module, as the request's are,
    and those nodes take them from there."""
    input_types = request_types(workflow.input_schema)
    if head is not None:
        input_types.update(head.types)
    nodes = nodes_in_run_order(workflow.output_node)
    index = {id(node): position for position, node in enumerate(nodes)}
    compiled: list[ScriptedNode] = []
    domains: list[int | None] = []  # which rows a node holds: -1 the request's, else a node's
    may_be_empty: list[bool] = []
    for position, node in enumerate(nodes):
        if head is not None and position in head.external:
            compiled.append(_sent_by_head(node, position, head))
            domains.append(-1)
            may_be_empty.append(False)
            continue
        parents = tuple(index[id(parent)] for parent in node.parents_with_dependencies)
        types: Types = {}
        for parent in parents:
            types.update(compiled[parent].output_types)
        root_columns = dict.fromkeys(node.input_schema.column_names + node.dependency_columns.names)
        from_request = tuple(name for name in root_columns if name not in types)
        types.update({name: input_types[name] for name in from_request if name in input_types})
        reason = None
        blocked = [compiled[parent].label for parent in parents if compiled[parent].kernel is None]
        absent = [name for name in from_request if name not in input_types]
        if blocked:
            reason = f"it reads what {blocked[0]} returns, which has no TorchScript form"
        elif absent:
            reason = f"no upstream node returns {absent!r} and the request does not hold them"
        parent_domains = {domains[parent] for parent in parents} | ({-1} if from_request else set())
        if reason is None and (None in parent_domains or len(parent_domains) > 1):
            reason = (
                "its inputs hold different rows (a Filter's or Groupby's output beside other"
                " columns), which NVTabular aligns by position and fills with nulls"
            )
        empty_parents = any(may_be_empty[parent] for parent in parents)
        if reason is None and empty_parents and all(name in input_types for name in root_columns):
            reason = "a Filter may leave it without rows, and NVTabular then reads the request"
        kernel, output_types = None, {}
        if reason is None:
            try:
                kernel, output_types = _kernel_for(node, types)
            except NotCompiled as not_compiled:
                reason = not_compiled.reason
        op_is_row_changing = isinstance(node.op, _ROW_CHANGING)
        domain = next(iter(parent_domains), -1) if reason is None else None
        domains.append(position if op_is_row_changing and reason is None else domain)
        may_be_empty.append(isinstance(node.op, nvt_ops.Filter) or empty_parents)
        compiled.append(
            ScriptedNode(
                label=describe_operator(node.op),
                parents=parents,
                request_columns=from_request,
                kernel=kernel,
                output_types=output_types,
                reason=reason,
                follows_uncompiled=bool(blocked),
            )
        )
    if any(node.reason for node in compiled):
        return Compiled(compiled, None)
    try:
        module = _module(workflow, compiled, input_types, non_null_inputs, head)
    except NotCompiled as not_compiled:
        last = compiled[-1]
        compiled[-1] = ScriptedNode(
            last.label, last.parents, last.request_columns, None, {}, not_compiled.reason
        )
        return Compiled(compiled, None)
    return Compiled(compiled, module)


def request_types(schema: Schema) -> Types:
    """The static types of the request columns: the input schema's dtypes, lists as arrays."""
    types = {}
    for column in schema:
        try:
            dtype = wire.column_numpy_dtype(column)
        except TypeError:
            dtype = np.dtype(object)
        types[column.name] = ColumnType(dtype, bool(column.is_list))
    return types


def _kernel_for(node: Node, types: Types):
    if node.op is None:
        return Identity(), dict(types)
    builder = _BUILDERS.get(type(node.op).transform)
    if builder is None:
        raise NotCompiled(f"{type(node.op).__name__} has no TorchScript form")
    selection = node.input_columns.resolve(node.input_schema)
    if builder not in _PASSING_ON:
        for name in selection.names:
            if name in types:
                torch_dtype(types[name].dtype, f"column {name!r}")
        varying = [name for name in selection.names if name in types and types[name].varying]
        if varying:
            raise NotCompiled(
                f"column {varying[0]!r} is {types[varying[0]].dtype} only in some requests (after"
                " ListSlice's float padding of integers)"
            )
    return builder(node, selection, types)


def _sent_by_head(node: Node, position: int, head: Head) -> ScriptedNode:
    """A node of the head, whose columns the module receives: it reads them from its inputs."""
    sent = {name: column for name, (source, column) in head.columns.items() if source == position}
    return ScriptedNode(
        label=describe_operator(node.op),
        parents=(),
        request_columns=tuple(sent),
        kernel=Select(list(sent), list(sent.values())),
        output_types={column: head.types[name] for name, column in sent.items()},
    )


def _module(
    workflow,
    nodes: list[ScriptedNode],
    input_types: Types,
    non_null: list[str],
    head: Head | None,
):
    inputs: dict[str, list[str]] = {"scalar": [], "ragged": [], "fixed": []}
    request_dtypes = {}
    sent = [] if head is None else [head.schema[name] for name in head.columns]
    for column in [*workflow.input_schema, *sent]:
        dtype = input_types[column.name].dtype
        if head is not None and dtype.kind in "OUS":
            continue  # a string the head reads (the module could not take it)
        request_dtypes[column.name] = torch_dtype(dtype, f"request column {column.name!r}")
        kind = "ragged" if wire.is_ragged(column) else "fixed" if column.is_list else "scalar"
        inputs[kind].append(column.name)
    final = nodes[-1].output_types
    ragged, widths, dtypes = [], {}, {}
    for output in output_layout(workflow.output_schema):
        if output.name not in final:
            raise NotCompiled(f"output column {output.name!r} is not what the workflow returns")
        produced = final[output.name]
        if produced.is_list != (output.ragged or output.width is not None):
            raise NotCompiled(f"output column {output.name!r} is {produced.describe()}")
        dtype = output.dtype or produced.dtype
        dtypes[output.name] = torch_dtype(dtype, f"output column {output.name!r}")
        if output.ragged:
            ragged.append(output.name)
        elif output.width is not None:
            widths[output.name] = output.width
    floats = {name for name, column in input_types.items() if column.is_float}
    return WorkflowScript(
        [node.kernel for node in nodes if node.kernel is not None],
        inputs,
        request_dtypes,
        [name for name in non_null if name in floats],
        [list(node.parents) for node in nodes],
        [list(node.request_columns) for node in nodes],
        [output.name for output in output_layout(workflow.output_schema)],
        ragged,
        widths,
        dtypes,
    )
