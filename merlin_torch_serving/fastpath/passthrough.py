"""Kernels for operators that only pass columns on: selections, ``+``/``[]``/``-`` nodes, tags,
renames.

They copy no data; what each returns mirrors its operator's ``transform`` (a tagging operator
returns every column it received, a selection only the selected ones).
"""

from __future__ import annotations

from merlin.dag import ColumnSelector

from merlin_torch_serving.fastpath.batch import Batch
from merlin_torch_serving.fastpath.errors import NotCompiled


class Identity:
    """Returns its input unchanged, as the base ``Operator.transform`` and ``AddMetadata`` do."""

    def __call__(self, batch: Batch) -> Batch:
        return batch


class Select:
    """Returns the named columns, in that order."""

    def __init__(self, names: list[str]):
        self.names = list(names)

    def __call__(self, batch: Batch) -> Batch:
        return batch.select(self.names)


class RenameColumns:
    """Returns the selected columns under the names ``Rename.column_mapping`` gives them."""

    def __init__(self, op, selection: ColumnSelector):
        new_names = list(op.column_mapping(selection).keys())
        if len(new_names) != len(selection.names):
            raise NotCompiled(f"renaming {selection.names!r} to {new_names!r} merges columns")
        self.renames = list(zip(selection.names, new_names, strict=True))

    def __call__(self, batch: Batch) -> Batch:
        return Batch({new: batch[old] for old, new in self.renames}, batch.num_rows)
