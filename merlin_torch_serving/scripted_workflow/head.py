"""What runs before a workflow's TorchScript form when part of it has none (``split``): the nodes
the python step runs on the fast path, and the columns it sends the TorchScript part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.scripted_workflow.columns import ColumnType


@dataclass(frozen=True)
class Head:
    """The part of a workflow that runs before its TorchScript form.

    ``nodes``: what the head runs (positions in run order; every parent of one among them);
    ``external``: those whose outputs the tail takes from the head instead of computing them;
    ``columns``: each column the head sends, by name, as (node, column of that node).
    """

    nodes: frozenset[int]
    external: frozenset[int]
    columns: dict[str, tuple[int, str]]
    schema: dict[str, ColumnSchema] = field(default_factory=dict)

    @property
    def types(self) -> dict[str, ColumnType]:
        return {
            name: ColumnType(wire.column_numpy_dtype(column), bool(column.is_list))
            for name, column in self.schema.items()
        }

    def output_schema(self) -> Schema:
        return Schema(list(self.schema.values()))
