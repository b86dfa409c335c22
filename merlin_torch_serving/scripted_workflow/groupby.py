"""Scripted NVTabular ``Groupby``: sort, group and aggregate in torch, with pandas' results (the
counterpart of ``fastpath.groupby``: list, first and last from the grouped rows; count, sum,
mean, min and max per group, sums with Kahan's compensation as pandas adds them; NVTabular's casts
by output name). Ties of the sort keep the request's order (see ``ordering``).
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import numpy as np
import torch
from merlin.dag import ColumnSelector
from nvtabular.ops import Groupby

from merlin_torch_serving.aot import exportable
from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.fastpath.groupby import GroupbyKernel
from merlin_torch_serving.scripted_workflow.columns import (
    LIST_CELLS,
    ColumnType,
    python_scalar_dtype,
    torch_dtype,
)
from merlin_torch_serving.scripted_workflow.ordering import group_rows, sort_order
from merlin_torch_serving.scripted_workflow.ragged import offsets_from_lengths


def _group_of_rows(counts: torch.Tensor) -> torch.Tensor:
    """Each row's group, for rows laid out group after group (groups are never empty)."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():  # no slice a package could not size for no groups
            total = exportable.size_of(counts.sum())
            ends = torch.cumsum(counts, 0)
            marks = torch.zeros(total + 1, dtype=torch.int64).index_add_(
                0, ends, torch.ones_like(ends)
            )
            return torch.cumsum(marks[:total], 0)
    rows = int(counts.sum()) if counts.shape[0] > 0 else 0
    marks = torch.zeros(rows, dtype=torch.int64)
    marks[torch.cumsum(counts, 0)[:-1]] = 1
    return torch.cumsum(marks, 0)


def _totals(values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-group sums of integers (exact, wrapping as numpy's do): differences of a running sum."""
    running = torch.zeros(values.shape[0] + 1, dtype=torch.int64)
    running[1:] = torch.cumsum(values.to(torch.int64), 0)
    ends = torch.cumsum(counts, 0)
    return running.index_select(0, ends) - running.index_select(0, ends - counts)


def _kahan_sums(values: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group sums of the non-NaN values with Kahan's compensation, added in row order, position
    by position across all groups at once (as ``fastpath.groupby._kahan_sums``)."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():  # its loop runs as often as the longest group is long
            raise NotImplementedError(
                "Groupby's sums and means of floats (added with Kahan's compensation, position by"
                " position) have no form torch.export takes"
            )
    groups = counts.shape[0]
    total = torch.zeros(groups, dtype=values.dtype)
    compensation = torch.zeros(groups, dtype=values.dtype)
    observed = torch.zeros(groups, dtype=torch.int64)
    starts = offsets_from_lengths(counts)[:-1]
    longest = int(counts.max()) if groups > 0 else 0
    for position in range(longest):
        group = torch.nonzero(counts > position).flatten()
        step = values[starts[group] + position]
        present = ~torch.isnan(step)
        group = group[present]
        step = step[present]
        observed[group] += 1
        y = step - compensation[group]
        t = total[group] + y
        compensation[group] = t - total[group] - y
        total[group] = t
    return total, observed


def _mean(total: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
    mean = total / observed.to(total.dtype)
    return torch.where(observed == 0, torch.full_like(mean, float("nan")), mean)


def _extreme(values: torch.Tensor, counts: torch.Tensor, smallest: bool) -> torch.Tensor:
    """numpy's ``fmin``/``fmax`` per group (NaN skipped); for floats the group's first value equal
    to it, as pandas picks it (0.0 and -0.0 differ only in their sign)."""
    group = _group_of_rows(counts)
    groups = counts.shape[0]
    if not values.is_floating_point():
        start = torch.zeros(groups, dtype=values.dtype)
        return start.scatter_reduce(
            0, group, values, "amin" if smallest else "amax", include_self=False
        )
    nans = torch.isnan(values)
    bound = float("inf") if smallest else float("-inf")
    filled = torch.where(nans, torch.full_like(values, bound), values)
    start = torch.full([groups], bound, dtype=values.dtype)
    extremes = start.scatter_reduce(
        0, group, filled, "amin" if smallest else "amax", include_self=True
    )
    present = _totals(~nans, counts)
    extremes = torch.where(present == 0, torch.full_like(extremes, float("nan")), extremes)
    rows = values.shape[0]
    candidates = torch.where(
        values == extremes[group],
        torch.arange(rows, dtype=torch.int64),
        torch.full_like(group, rows),
    )
    first = torch.full([groups], rows, dtype=torch.int64).scatter_reduce(
        0, group, candidates, "amin", include_self=True
    )
    found = first < rows
    picked = extremes.clone()
    picked[found] = values[first[found]]
    return picked


def _reduce(agg: str, values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    if agg == "count":
        if values.is_floating_point():
            return _totals(~torch.isnan(values), counts)
        return counts.to(torch.int64)
    if agg == "min" or agg == "max":
        return _extreme(values, counts, agg == "min")
    if not values.is_floating_point():
        integers = values.to(torch.int64)
        if agg == "sum":
            return _totals(integers, counts)
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
            if torch.compiler.is_exporting():
                raise NotImplementedError(
                    "Groupby's means of integers (exact below 2**53, compensated above) have no"
                    " form torch.export takes"
                )
        largest = float(torch.abs(integers.to(torch.float64)).max()) if values.shape[0] > 0 else 0.0
        # below 2**53 an integer sum is exact in float64 and needs no compensation
        if largest * values.shape[0] < 9007199254740992.0:
            return _totals(integers, counts).to(torch.float64) / counts.to(torch.float64)
        total, observed = _kahan_sums(integers.to(torch.float64), counts)
        return _mean(total, observed)
    total, observed = _kahan_sums(values, counts)
    if agg == "sum":
        return total
    return _mean(total, observed)


class GroupbyScript(torch.nn.Module):
    """One Groupby node: sorts, groups by ``groupby_cols``, aggregates and casts."""

    groupby_cols: list[str]
    sort_cols: list[str]
    ascending: bool
    reductions: list[tuple[str, str, str]]  # (column, aggregation, output column)
    lists: list[tuple[str, str]]  # (column, output column)
    picks: list[tuple[str, str, bool]]  # (column, output column, take the group's first row)
    scalar_dtypes: dict[str, torch.dtype]  # what python lists make of each column's values
    casts: dict[str, torch.dtype]

    def __init__(self, kernel: GroupbyKernel, scalar_dtypes, casts):
        super().__init__()
        self.groupby_cols = list(kernel.groupby_cols)
        self.sort_cols = list(kernel.sort_cols)
        self.ascending = bool(kernel.ascending)
        self.reductions = [
            (column, agg, kernel.output_name(column, agg))
            for column, aggs in kernel.reductions.items()
            for agg in aggs
        ]
        self.lists = [(column, kernel.output_name(column, "list")) for column in kernel.list_cols]
        # NVTabular swaps first and last when sorting descending
        self.picks = [
            (column, kernel.output_name(column, agg), (agg == "first") == kernel.ascending)
            for column, agg in kernel.picks
        ]
        self.scalar_dtypes = scalar_dtypes
        self.casts = casts

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        order = torch.arange(rows, dtype=torch.int64)
        if len(self.sort_cols) > 0:
            order = sort_order([values[name] for name in self.sort_cols], self.ascending)
        grouped, counts, keys = group_rows([values[name][order] for name in self.groupby_cols])
        grouped_rows = order.index_select(0, grouped)
        output: dict[str, torch.Tensor] = {}
        output_offsets: dict[str, torch.Tensor] = {}
        for position, name in enumerate(self.groupby_cols):
            output[name] = keys[position]
        for column, agg, name in self.reductions:
            output[name] = _reduce(agg, values[column].index_select(0, grouped_rows), counts)
        list_offsets = offsets_from_lengths(counts)
        for column, name in self.lists:
            output[name] = (
                values[column].index_select(0, grouped_rows).to(self.scalar_dtypes[column])
            )
            output_offsets[name] = list_offsets
        for column, name, take_first in self.picks:
            picked = values[column].index_select(0, grouped_rows).to(self.scalar_dtypes[column])
            positions = list_offsets[:-1] if take_first else list_offsets[1:] - 1
            output[name] = picked.index_select(0, positions)
        for name, dtype in self.casts.items():
            output[name] = output[name].to(dtype)
        return output, output_offsets, counts.shape[0]


def build(op: Groupby, selection: ColumnSelector, types: dict[str, ColumnType]):
    kernel = GroupbyKernel(op, selection)  # the fast path's own checks of the configuration
    for name in kernel.input_cols:
        if types[name].is_list:
            raise NotCompiled(f"list column {name!r} as a Groupby input")
    output: dict[str, ColumnType] = {name: types[name].scalar() for name in kernel.groupby_cols}
    scalar_dtypes = {}
    for column, aggs in kernel.reductions.items():
        dtype = types[column].dtype
        for agg in aggs:
            if agg != "count" and (
                dtype.kind not in "iuf" or (dtype.kind == "u" and dtype.itemsize == 8)
            ):
                raise NotCompiled(f"{agg} of column {column!r} of dtype {dtype}")
            result: np.dtype
            if agg == "count":
                result = np.dtype(np.int64)
            elif agg in ("min", "max") or dtype.kind == "f":
                result = dtype
            else:
                result = np.dtype(np.int64 if agg == "sum" else np.float64)
            output[kernel.output_name(column, agg)] = ColumnType(result)
    for column in kernel.list_cols + [column for column, _ in kernel.picks]:
        scalar = python_scalar_dtype(types[column].dtype, f"column {column!r}")
        scalar_dtypes[column] = torch_dtype(scalar, f"column {column!r}")
    for column in kernel.list_cols:
        scalar = python_scalar_dtype(types[column].dtype, f"column {column!r}")
        output[kernel.output_name(column, "list")] = ColumnType(scalar, True, LIST_CELLS)
    for column, agg in kernel.picks:
        scalar = python_scalar_dtype(types[column].dtype, f"column {column!r}")
        output[kernel.output_name(column, agg)] = ColumnType(scalar)
    casts = {}
    for name, dtype in kernel.casts.items():
        if output[name].is_list:
            raise NotCompiled(f"list column {name!r} whose name asks for a {dtype} cast")
        casts[name] = torch_dtype(dtype, f"column {name!r}")
        output[name] = output[name].with_dtype(dtype)
    for name in kernel.sort_cols + kernel.groupby_cols:
        if types[name].dtype.kind not in "iufb":
            raise NotCompiled(f"sort or group key {name!r} of dtype {types[name].dtype}")
    return GroupbyScript(kernel, scalar_dtypes, casts), output
