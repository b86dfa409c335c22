"""Ensemble: a validated graph of serving operators that runs in-process or exports to Triton."""

from __future__ import annotations

import os
from collections.abc import Mapping

import pandas as pd
from merlin.dag import Node
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.graph.executors import Executor, LocalExecutor
from merlin_torch_serving.graph.plan import REQUEST, Ref, build_plan
from merlin_torch_serving.graph.validation import EntryCheck
from merlin_torch_serving.ops.base import ServingOperator


class Ensemble:
    """A graph of serving operators, with every edge's schema computed and checked at construction.

    Parameters
    ----------
    graph
        The output node of a graph built with ``>>``, ``+`` and ``[]`` (or a single operator).
    input_schema
        The schema of the request columns (for session-based serving, the raw interaction rows:
        usually ``workflow.input_schema``).
    """

    def __init__(self, graph: Node | ServingOperator, input_schema: Schema):
        if isinstance(graph, ServingOperator):
            graph = graph.as_node()
        self.input_schema = input_schema
        self.plan = build_plan(graph, input_schema)
        self.output_schema = self.plan.output_schema
        requests = {name: Ref(REQUEST, name) for name in input_schema.column_names}
        self._entry_check = EntryCheck.for_entry(input_schema, requests, self.plan.calls)

    def run(self, request: TensorTable, executor: Executor | None = None) -> TensorTable:
        """Run on a request table and return the output table (ragged lists as values/offsets).

        The table must hold exactly the input schema's columns, with its dtypes, and valid ragged
        offsets; anything else is an ``InputError`` naming the column (``transform`` converts
        safe dtypes first).
        """
        self._entry_check.check(wire.to_wire(request))
        return (executor or LocalExecutor()).execute(self.plan, request)

    def transform(
        self, data: pd.DataFrame | Mapping[str, object], executor: Executor | None = None
    ) -> pd.DataFrame:
        """Run on raw rows (a DataFrame or a dict of columns) and return a DataFrame with one row
        per output row (per session for session-based graphs); list outputs are array cells.

        The request is checked against the input schema first (``InputError`` names the column).
        """
        request = frames.frame_to_table(data, self.input_schema)
        return frames.table_to_frame(self.run(request, executor))

    def export(
        self,
        path: str | os.PathLike,
        name: str = "recommender",
        *,
        overwrite: bool = False,
        add_version: bool = False,
        options=None,
        storage_options: dict | None = None,
    ):
        """Write a Triton model repository for this ensemble; see ``export.repository``.

        ``path`` is a local folder or an fsspec URL (``s3://bucket/models``; see
        ``export.remote``), ``storage_options`` what that filesystem takes. ``options`` (a
        ``ModelOptions``) configures every step model. Returns the ``ExportResult`` (models
        written, their version). The ensemble itself is not changed by exporting.
        """
        from merlin_torch_serving.deployment.locations import is_url, local_path
        from merlin_torch_serving.export.config import ModelOptions
        from merlin_torch_serving.export.remote import export_to_url
        from merlin_torch_serving.export.repository import export_ensemble

        options = options or ModelOptions()
        if is_url(path):
            return export_to_url(
                self,
                str(path),
                name,
                overwrite=overwrite,
                add_version=add_version,
                options=options,
                storage_options=storage_options,
            )
        if storage_options:
            raise ValueError(f"storage_options are for URLs; {str(path)!r} is a local folder")
        return export_ensemble(
            self,
            local_path(path),
            name,
            overwrite=overwrite,
            add_version=add_version,
            options=options,
        )
