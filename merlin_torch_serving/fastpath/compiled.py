"""A compiled workflow: its nodes, run in order on a request the way NVTabular's executor runs them.

The executor's rules for feeding a node are kept exactly (parents that return no rows are dropped,
missing inputs come from the request, later parents win on shared columns); only the data differs.
Where NVTabular breaks (a node whose inputs were all filtered away), the node returns no rows and
no operator ever sees an empty frame.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from merlin.schema import Schema

from merlin_torch_serving.data.wire import VALUES_SUFFIX
from merlin_torch_serving.fastpath.batch import Batch, Column
from merlin_torch_serving.fastpath.errors import Delegate, FastPathError, library_errors
from merlin_torch_serving.fastpath.kernel import Kernel
from merlin_torch_serving.fastpath.wire_io import (
    empty_wire_arrays,
    output_layout,
    request_batch,
    wire_arrays,
)
from merlin_torch_serving.graph import metrics

logger = logging.getLogger("merlin_torch_serving")
_NO_ROWS = Batch({}, 0)


@dataclass(frozen=True)
class CompiledNode:
    """One workflow node: where its inputs come from and the kernel that computes its output."""

    label: str
    description: str  # the label, with a Filter's function for messages that name it
    parents: tuple[int, ...]  # earlier nodes, in the node's parents-then-dependencies order
    input_columns: tuple[str, ...]
    root_columns: tuple[
        str, ...
    ]  # input and dependency columns; from the request if no parent has them
    kernel: Kernel
    fallback: Kernel | None  # NVTabular's own execution, for calls the kernel delegates


class CompiledWorkflow:
    """Transforms request arrays like ``workflow.transform`` would, without building DataFrames."""

    def __init__(
        self,
        nodes: list[CompiledNode],
        input_schema: Schema,
        output_schema: Schema,
        fallbacks: list[tuple[str, str]],
    ):
        self._nodes = list(nodes)
        self._input_schema = input_schema
        self._output_schema = output_schema
        self._output_names = list(dict.fromkeys(output_schema.column_names))
        self._output_layout = output_layout(output_schema)
        self.fallbacks = list(fallbacks)

    @property
    def input_schema(self) -> Schema:
        return self._input_schema

    @property
    def output_schema(self) -> Schema:
        return self._output_schema

    def transform(self, columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The workflow's output for one request, in the wire format of its output schema.

        An empty request gives empty outputs (NVTabular itself fails on empty frames in Categorify).
        A request the fast path cannot run is a ``WorkflowError`` (``InputError`` for a request
        that does not fit the input schema); what NVTabular raises for a step it runs stays as is.
        """
        request = request_batch(columns, self._input_schema)
        if request.num_rows == 0:
            return empty_wire_arrays(self._output_layout)
        with library_errors():
            outputs = self._outputs(request)
            if outputs[-1].num_rows == 0:  # e.g. a Filter kept none of the request's rows
                return empty_wire_arrays(self._output_layout)
            return wire_arrays(outputs[-1].select(self._output_names), self._output_layout)

    def emptying_node(self, columns: Mapping[str, np.ndarray]) -> str | None:
        """The first node that returns no rows for this request although its inputs had some
        (which filter drops it), or None when rows reach the output."""
        request = request_batch(columns, self._input_schema)
        with library_errors():
            outputs = self._outputs(request)
        for node, output in zip(self._nodes, outputs, strict=True):
            fed = any(outputs[parent].num_rows > 0 for parent in node.parents) or not node.parents
            if output.num_rows == 0 and fed:
                return node.description
        return None

    def node_outputs(self, columns: Mapping[str, np.ndarray], nodes: set[int]) -> dict[int, Batch]:
        """What the given nodes (positions in run order, every parent of one among them) return
        for one request, the other nodes not run: the part of a workflow that runs before its
        TorchScript form (``scripted_workflow``)."""
        given = [name for name in self._input_schema.column_names if _holds(columns, name)]
        request = request_batch(columns, self._input_schema.select_by_name(given))
        outputs: list[Batch] = []
        with library_errors():
            for position, node in enumerate(self._nodes):
                ran = position in nodes and request.num_rows > 0
                outputs.append(self._run(node, outputs, request) if ran else _NO_ROWS)
        return {position: outputs[position] for position in nodes}

    def _outputs(self, request: Batch) -> list[Batch]:
        outputs: list[Batch] = []
        for node in self._nodes:
            outputs.append(self._run(node, outputs, request))
        return outputs

    def _run(self, node: CompiledNode, outputs: list[Batch], request: Batch) -> Batch:
        upstream = [outputs[parent] for parent in node.parents if outputs[parent].num_rows > 0]
        present = {name for name in node.input_columns if any(name in batch for batch in upstream)}
        from_request = [name for name in node.root_columns if name not in present]
        if from_request:
            absent = [name for name in from_request if name not in request]
            if absent and len(upstream) < len(node.parents):
                # NVTabular drops the parents that returned no rows and then fails to find their
                # columns; the rows were filtered away, so this step has none either
                return _NO_ROWS
            if absent:
                raise FastPathError(
                    f"step {node.label!r} needs column(s) {absent!r}, which no upstream step"
                    " produced for this request (NVTabular drops upstream results with no rows)"
                    " and the request does not hold; NVTabular's own transform fails on this"
                    " request too"
                )
            upstream.append(request.select(from_request))
        if not upstream:
            raise FastPathError(f"step {node.label!r} has no input for this request")
        batch = _merge(node.label, upstream)
        if node.kernel is node.fallback:  # no compiled kernel: NVTabular on every request
            metrics.count(metrics.FASTPATH_FALLBACKS, operator=node.label)
        try:
            return node.kernel(batch)
        except Delegate as delegated:
            if node.fallback is None:
                raise
            logger.debug(
                "fast path: %s runs through NVTabular for this request: %s",
                node.label,
                delegated.reason,
            )
            metrics.count(metrics.FASTPATH_FALLBACKS, operator=node.label)
            return node.fallback(batch)


def _holds(columns: Mapping[str, np.ndarray], name: str) -> bool:
    return name in columns or name + VALUES_SUFFIX in columns


def _merge(label: str, batches: list[Batch]) -> Batch:
    """Combine a node's inputs like LocalExecutor._merge_upstream_columns: later inputs win."""
    combined: Batch | None = None
    seen: set[str] = set()
    for batch in batches:
        names = set(batch.columns)
        if combined is None or combined.num_rows == 0:
            combined, seen = batch, names
            continue
        parts = []
        old, shared, new = seen - names, seen & names, names - seen
        if old:
            parts.append(combined.select(old))
        if shared:
            parts.append(batch.select(shared))
        if new:
            parts.append(batch.select(new))
            seen |= new
        if parts:
            combined = parts[0] if len(parts) == 1 else _concat(label, parts)
    if combined is None:
        raise ValueError(f"step {label!r} has no input to merge")
    return combined


def _concat(label: str, parts: list[Batch]) -> Batch:
    num_rows = max(part.num_rows for part in parts)
    columns = {}
    for part in parts:
        for name, column in part.columns.items():
            # pandas aligns the frames on row number and fills the shorter ones with nulls
            if part.num_rows < num_rows:
                column = _pad_with_nulls(label, name, column, num_rows)
            columns[name] = column
    return Batch(columns, num_rows)


def _pad_with_nulls(label: str, name: str, column: Column, num_rows: int) -> Column:
    if column.is_list:
        raise FastPathError(
            f"step {label!r} combines inputs with different row counts; NVTabular would fill the"
            f" list column {name!r} with nulls, which the fast path cannot hold. Make the branches"
            " keep the same rows"
        )
    values = column.values
    kind = values.dtype.kind
    # pandas' null is NaN, so integers become float64 and booleans objects
    if kind in "iu":
        values = values.astype(np.float64)
    elif kind == "b":
        values = values.astype(object)
    nulls = np.full(num_rows - len(values), "NaT" if kind in "mM" else np.nan, dtype=values.dtype)
    return Column(np.concatenate([values, nulls]))
