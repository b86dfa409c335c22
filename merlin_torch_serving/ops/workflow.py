"""TransformWorkflow: run a fitted NVTabular workflow on raw interaction rows.

By default the workflow runs through the compiled fast path (``merlin_torch_serving.fastpath``):
numpy kernels built once per operator instance, equal to ``workflow.transform`` but without a
DataFrame per request. The same path runs in-process and inside the served model, so both give
the same answer. Groupby returns sessions sorted by key; this operator puts them back in the
order they first appear in the request, so answers line up with what the caller sent.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
from merlin.dag import postorder_iter_nodes
from merlin.schema import Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving import frames, wire
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.tables import take_rows

WORKFLOW_DIR = "workflow"

class TransformWorkflow(ServingOperator):
    """Apply ``workflow`` (fitted ``nvtabular.Workflow``) to the request.

    Parameters
    ----------
    workflow
        The fitted workflow; its input schema is what this operator expects.
    keep_request_order
        When the workflow groups rows by one key column that it also outputs (session-based
        workflows group by session id), return groups in first-appearance order of the key in
        the request instead of sorted order.
    fast_path
        Run the workflow through compiled numpy kernels (operators without one run through
        NVTabular, logged once each). ``False`` runs NVTabular's pandas executor on every request.
    """

    def __init__(self, workflow, *, keep_request_order: bool = True, fast_path: bool = True):
        super().__init__()
        self.workflow = workflow
        self.keep_request_order = keep_request_order
        self.fast_path = fast_path
        self.request_key = _groupby_key(workflow) if keep_request_order else None
        self._compiled = None

    def compiled_workflow(self):
        """The workflow compiled for the fast path; built on first use (it reads the vocabularies)."""
        if self._compiled is None:
            from merlin_torch_serving.fastpath import compile_workflow

            self._compiled = compile_workflow(self.workflow)
        return self._compiled

    @property
    def label(self) -> str:
        return "TransformWorkflow"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return self.workflow.input_schema

    def root_columns(self) -> list[str]:
        return self.workflow.input_schema.column_names

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return self.workflow.output_schema

    def request_groups(self) -> list[str] | None:
        """The keys of the workflow's Groupby when they are request columns (the session id): the
        other operators of a fitted workflow transform rows independently."""
        return _groupby_columns(self.workflow)

    def non_null_inputs(self) -> list[str]:
        """The Groupby keys (a null key would drop its rows from the answer) and the raw columns of
        outputs tagged as ids (a null item id is a broken click, not a category of its own)."""
        ids = [c.name for c in self.workflow.output_schema if Tags.ID in c.tags]
        sources = {name for column in ids for name in _input_sources(self.workflow.output_node, column)}
        keys = _groupby_columns(self.workflow) or []
        inputs = self.workflow.input_schema.column_names
        return [name for name in inputs if name in sources or name in keys]

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        if self.fast_path:
            arrays = self.compiled_workflow().transform(wire.to_wire(transformable))
            table = wire.from_wire(arrays, self.workflow.output_schema)
        else:
            frame = frames.table_to_frame(transformable)
            transformed = frames.frame_to_table(self.workflow._transform_df(frame))
            table = _cast_to_schema(transformed, self.workflow.output_schema)
        if self.request_key is not None:
            table = _in_request_order(table, transformable, self.request_key)
        return table

    def config(self) -> dict[str, Any]:
        return {"keep_request_order": self.keep_request_order, "fast_path": self.fast_path}

    def save_artifacts(self, artifact_path=None) -> None:
        if self.fast_path:
            # compile at export too, so what falls back to NVTabular is logged before serving
            self.compiled_workflow()
        # Workflow.save repoints the statistics of the workflow it saves to the new folder;
        # save a copy so that exporting never changes this operator
        copy.deepcopy(self.workflow).save(os.path.join(artifact_path, WORKFLOW_DIR))

    @classmethod
    def load(cls, config: dict[str, Any], artifact_path: str) -> "TransformWorkflow":
        import nvtabular

        workflow = nvtabular.Workflow.load(os.path.join(artifact_path, WORKFLOW_DIR))
        operator = cls(workflow, **config)
        if operator.fast_path:
            # compile while the model loads, not on the first request
            operator.compiled_workflow()
        return operator


def _groupby_key(workflow) -> str | None:
    """The single key column of the workflow's only Groupby, if it is both input and output."""
    from nvtabular.ops import Groupby

    groupbys = [n.op for n in postorder_iter_nodes(workflow.output_node) if isinstance(n.op, Groupby)]
    if len(groupbys) != 1 or len(groupbys[0].groupby_cols) != 1:
        return None
    key = groupbys[0].groupby_cols[0]
    if key in workflow.input_schema.column_names and key in workflow.output_schema.column_names:
        return key
    return None


def _groupby_columns(workflow) -> list[str] | None:
    """The key columns shared by every Groupby of the workflow ([] without one; None when the
    Groupbys differ or group by a column the request does not carry)."""
    from nvtabular.ops import Groupby

    keys = {tuple(n.op.groupby_cols) for n in postorder_iter_nodes(workflow.output_node) if isinstance(n.op, Groupby)}
    if not keys:
        return []
    if len(keys) > 1 or not set(next(iter(keys))) <= set(workflow.input_schema.column_names):
        return None
    return list(next(iter(keys)))


def _input_sources(node, column: str) -> set[str]:
    """The workflow input columns ``column`` of ``node`` is computed from."""
    parents = node.parents_with_dependencies
    if not parents:
        return {column}
    sources = set()
    for name in node.column_mapping.get(column, [column]):
        for parent in parents:
            if name in parent.output_schema.column_names:
                sources |= _input_sources(parent, name)
    return sources


def _in_request_order(table: TensorTable, request: TensorTable, key: str) -> TensorTable:
    """Rows of ``table`` reordered so their ``key`` values follow first appearance in ``request``."""
    request_keys = np.asarray(request[key].values)
    unique_keys, first_position = np.unique(request_keys, return_index=True)
    output_keys = np.asarray(table[key].values)
    slot = np.clip(np.searchsorted(unique_keys, output_keys), 0, max(len(unique_keys) - 1, 0))
    order = np.argsort(first_position[slot], kind="stable")
    return take_rows(table, order)


def _cast_to_schema(table: TensorTable, schema: Schema) -> TensorTable:
    """Columns in schema order with the schema's dtypes (NVTabular may widen on pandas)."""
    columns = {}
    for column in schema:
        data = table[column.name]
        dtype = wire.column_numpy_dtype(column)
        values = np.asarray(data.values)
        if dtype != np.dtype(object):
            values = values.astype(dtype, copy=False)
        columns[column.name] = (values, data.offsets) if data.offsets is not None else values
    return TensorTable(columns, _unsafe=True)
