"""Compiling a fitted NVTabular workflow: one kernel per graph node, chosen by the node's operator.

An operator is matched by the ``transform`` it actually runs, so a subclass that overrides it is
never mistaken for its parent; operators without a kernel run through NVTabular, logged once each.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import nvtabular as nvt
from merlin.dag import ColumnSelector, Node
from merlin.dag.operator import Operator as BaseOperator
from merlin.dag.ops.concat_columns import ConcatColumns
from merlin.dag.ops.rename import Rename as DagRename
from merlin.dag.ops.selection import SelectionOp
from merlin.dag.ops.stat_operator import StatOperator
from merlin.dag.ops.subset_columns import SubsetColumns
from merlin.dag.ops.subtraction import SubtractionOp
from merlin.dag.ops.udf import UDF
from nvtabular import ops as nvt_ops

from merlin_torch_serving.fastpath.callables import FilterKernel, udf_kernel
from merlin_torch_serving.fastpath.categorify import CategorifyKernel
from merlin_torch_serving.fastpath.compiled import CompiledNode, CompiledWorkflow
from merlin_torch_serving.fastpath.continuous import (
    FillMissingKernel,
    LogKernel,
    NormalizeKernel,
    NormalizeMinMaxKernel,
)
from merlin_torch_serving.fastpath.errors import FastPathError, NotCompiled, library_errors
from merlin_torch_serving.fastpath.fallback import NVTabularStep
from merlin_torch_serving.fastpath.groupby import GroupbyKernel
from merlin_torch_serving.fastpath.kernel import Kernel
from merlin_torch_serving.fastpath.lists import ListSliceKernel
from merlin_torch_serving.fastpath.passthrough import Identity, RenameColumns, Select

logger = logging.getLogger("merlin_torch_serving")

KernelBuilder = Callable[[Node, ColumnSelector], Kernel]

# Keyed by the transform function itself: an operator gets a kernel only if it runs exactly
# this transform (directly or inherited), never because of its class name.
_BUILDERS: dict[Callable, KernelBuilder] = {
    BaseOperator.transform: lambda node, selection: Identity(),
    nvt_ops.AddMetadata.transform: lambda node, selection: Identity(),
    nvt_ops.ValueCount.transform: lambda node, selection: Identity(),
    SelectionOp.transform: lambda node, selection: Select((selection or node.op.selector).names),
    ConcatColumns.transform: lambda node, selection: Select(selection.names),
    SubsetColumns.transform: lambda node, selection: Select(selection.names),
    SubtractionOp.transform: lambda node, selection: Select((node.op.selector or selection).names),
    DagRename.transform: lambda node, selection: RenameColumns(node.op, selection),
    nvt_ops.Rename.transform: lambda node, selection: RenameColumns(node.op, selection),
    nvt_ops.Categorify.transform: lambda node, selection: CategorifyKernel(node.op, selection),
    nvt_ops.Groupby.transform: lambda node, selection: GroupbyKernel(node.op, selection),
    nvt_ops.ListSlice.transform: lambda node, selection: ListSliceKernel(node.op, selection),
    nvt_ops.FillMissing.transform: lambda node, selection: FillMissingKernel(node.op, selection),
    nvt_ops.LogOp.transform: lambda node, selection: LogKernel(node.op, selection),
    nvt_ops.Normalize.transform: lambda node, selection: NormalizeKernel(node.op, selection),
    nvt_ops.NormalizeMinMax.transform: lambda node, selection: NormalizeMinMaxKernel(
        node.op, selection
    ),
    UDF.transform: udf_kernel,
    nvt_ops.Filter.transform: FilterKernel,
}


def compile_workflow(workflow: nvt.Workflow, *, kernels: bool = True) -> CompiledWorkflow:
    """Compile a fitted workflow; reads each Categorify vocabulary once, here.

    ``kernels=False`` runs every operator through NVTabular's own transform, step by step, with the
    same rules for feeding each step (and the same handling of steps left without rows). A workflow
    that cannot be compiled is a ``WorkflowError``.
    """
    if not isinstance(workflow, nvt.Workflow):
        raise TypeError(
            f"compile_workflow takes a fitted nvtabular.Workflow, got {type(workflow).__name__}"
        )
    with library_errors():
        return _compile(workflow, kernels)


def _compile(workflow: nvt.Workflow, kernels: bool) -> CompiledWorkflow:
    if not workflow.output_schema or workflow.output_node.input_schema is None:
        raise FastPathError(
            "the workflow has no schemas yet; fit it (workflow.fit(dataset)) before compiling it"
        )
    nodes = nodes_in_run_order(workflow.output_node)
    unfitted = [
        node.op.label for node in nodes if isinstance(node.op, StatOperator) and not node.op.fitted
    ]
    if unfitted:
        raise FastPathError(
            f"operator(s) {unfitted!r} are not fitted; call workflow.fit(dataset) before compiling"
        )
    index = {id(node): position for position, node in enumerate(nodes)}
    compiled, fallbacks = [], []
    for node in nodes:
        kernel, fallback, reason = _kernel_for(node) if kernels else _nvtabular_step(node)
        if reason is not None:
            fallbacks.append((node.op.label, reason))
            logger.warning(
                "fast path: operator %r runs through NVTabular: %s", node.op.label, reason
            )
        compiled.append(
            CompiledNode(
                label=node.op.label if node.op else "input",
                description=describe_operator(node.op),
                parents=tuple(index[id(parent)] for parent in node.parents_with_dependencies),
                input_columns=tuple(node.input_schema.column_names),
                root_columns=tuple(
                    dict.fromkeys(node.input_schema.column_names + node.dependency_columns.names)
                ),
                kernel=kernel,
                fallback=fallback,
            )
        )
    return CompiledWorkflow(compiled, workflow.input_schema, workflow.output_schema, fallbacks)


def _kernel_for(node: Node) -> tuple[Kernel, Kernel | None, str | None]:
    """The node's kernel, NVTabular's execution of it, and why the two are the same.

    The reason is None when they are not the same.
    """
    if node.op is None:
        return Identity(), None, None
    selection = node.input_columns.resolve(node.input_schema)
    fallback = NVTabularStep(node, selection)
    builder = _BUILDERS.get(type(node.op).transform)
    if builder is None:
        return fallback, fallback, f"{type(node.op).__name__} has no compiled kernel"
    try:
        return builder(node, selection), fallback, None
    except NotCompiled as not_compiled:
        return fallback, fallback, not_compiled.reason


def describe_operator(op) -> str:
    """The operator's label; for a Filter with its function's source, so messages can name it."""
    if op is None:
        return "input"
    if isinstance(op, nvt_ops.Filter):
        try:
            source = " ".join(inspect.getsource(op.f).split())
        except (OSError, TypeError):
            return op.label
        start = source.find("lambda")
        return f"Filter({_lambda_expression(source[start:]) if start >= 0 else op.f.__name__})"
    return op.label


def _lambda_expression(text: str) -> str:
    """The lambda at the start of ``text``, up to the comma or bracket that closes it."""
    depth = 0
    for position, character in enumerate(text):
        if character in "([{":
            depth += 1
        elif character in ")]}":
            if depth == 0:
                return text[:position].strip()
            depth -= 1
        elif character == "," and depth == 0:
            return text[:position].strip()
    return text.strip()


def _nvtabular_step(node: Node) -> tuple[Kernel, Kernel | None, None]:
    if node.op is None:
        return Identity(), None, None
    step = NVTabularStep(node, node.input_columns.resolve(node.input_schema))
    return step, None, None


def nodes_in_run_order(output_node: Node) -> list[Node]:
    """Every node once, each after all of its parents and dependencies; the output node last."""
    ordered: list[Node] = []
    visited: set[int] = set()
    stack = [(output_node, False)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            ordered.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in reversed(node.parents_with_dependencies):
            if id(parent) not in visited:
                stack.append((parent, False))
    return ordered
