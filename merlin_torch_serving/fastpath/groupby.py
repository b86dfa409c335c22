"""Compiled NVTabular ``Groupby``: sort, group, and aggregate with numpy, with pandas' exact
results.

List, first and last come from the grouped rows; count, sum, mean, min and max are reductions per
group (sums use Kahan summation, as pandas does); the output dtypes follow NVTabular's casts.
"""

from __future__ import annotations

import re

import numpy as np
from merlin.dag import ColumnSelector
from nvtabular.ops import Groupby

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.batch import (
    OFFSETS_DTYPE,
    Batch,
    Column,
    as_python_scalars,
    null_mask,
)
from merlin_torch_serving.fastpath.errors import Delegate, NotCompiled
from merlin_torch_serving.fastpath.ordering import Groups, group_rows, sort_order

_REDUCTIONS = ("count", "sum", "mean", "min", "max")
# Integers this large or larger stop being exact in float64; below it an integer sum needs no
# compensation, so a plain reduction gives Kahan's result.
_EXACT_FLOAT_INTEGER = 2**53


class GroupbyKernel:
    """One Groupby node: which columns it reads, what it computes, and how it names and casts it."""

    def __init__(self, op: Groupby, selection: ColumnSelector):
        if not isinstance(op.ascending, bool):
            raise NotCompiled(f"ascending={op.ascending!r} is not a single bool")
        self.groupby_cols = list(op.groupby_cols)
        self.sort_cols = list(op.sort_cols)
        self.ascending = op.ascending
        self.name_sep = op.name_sep
        allowed = [name for name in selection.names if name not in self.groupby_cols]
        self.reductions: dict[str, list[str]] = {}
        self.list_cols: list[str] = []
        self.picks: list[tuple[str, str]] = []  # (column, "first" | "last")
        for column, aggs in _aggs_per_column(op.conv_aggs, allowed).items():
            for agg in aggs:
                if agg is list:
                    continue
                if agg not in _REDUCTIONS:
                    raise NotCompiled(f"aggregation {agg!r} on column {column!r} is not compiled")
                self.reductions.setdefault(column, []).append(agg)
        for column, aggs in _aggs_per_column(op.list_aggs, allowed).items():
            if "list" in aggs:
                self.list_cols.append(column)
            self.picks.extend((column, agg) for agg in aggs if agg in ("first", "last"))
        aggregated = list(self.reductions) + self.list_cols + [column for column, _ in self.picks]
        self.input_cols = list(dict.fromkeys(self.groupby_cols + self.sort_cols + aggregated))
        output_names = self.groupby_cols + [
            self.output_name(column, agg)
            for column, aggs in self.reductions.items()
            for agg in aggs
        ]
        output_names += [self.output_name(column, "list") for column in self.list_cols]
        output_names += [self.output_name(column, agg) for column, agg in self.picks]
        # NVTabular casts by the output name's suffix, whatever the column holds.
        self.casts: dict[str, np.dtype] = {}
        for name in output_names:
            if re.search(f"{op.name_sep}(count|nunique)$", name):
                self.casts[name] = np.dtype(np.int32)
            elif re.search(f"{op.name_sep}(mean|median|std|var|sum)$", name):
                self.casts[name] = np.dtype(np.float32)

    def output_name(self, column: str, agg: str) -> str:
        return f"{column}{self.name_sep}{agg}"

    def __call__(self, batch: Batch) -> Batch:
        for name in self.input_cols:
            if batch[name].is_list:
                raise Delegate(f"list column {name!r} as a Groupby input")
        rows = np.arange(batch.num_rows)
        if self.sort_cols:
            rows = sort_order([batch[name].values for name in self.sort_cols], self.ascending)
        groups = group_rows([batch[name].values[rows] for name in self.groupby_cols])
        grouped_rows = rows[groups.rows]
        output: dict[str, Column] = {
            name: Column(keys) for name, keys in zip(self.groupby_cols, groups.keys, strict=True)
        }
        for column, aggs in self.reductions.items():
            values = batch[column].values[grouped_rows]
            for agg in aggs:
                output[self.output_name(column, agg)] = Column(_reduce(agg, values, groups))
        offsets = wire.offsets_from_lengths(groups.counts, OFFSETS_DTYPE)
        for column in self.list_cols:
            output[self.output_name(column, "list")] = Column(
                as_python_scalars(batch[column].values[grouped_rows]), offsets
            )
        for column, agg in self.picks:
            values = as_python_scalars(batch[column].values[grouped_rows])
            # NVTabular swaps first and last when sorting descending
            take_first = (agg == "first") == self.ascending
            positions = offsets[:-1] if take_first else offsets[1:] - 1
            output[self.output_name(column, agg)] = Column(values[positions])
        for name, dtype in self.casts.items():
            aggregated = output[name]
            if aggregated.is_list:
                raise Delegate(f"list column {name!r} whose name asks for a {dtype} cast")
            output[name] = Column(aggregated.values.astype(dtype))
        return Batch(output, len(groups.counts))


def _aggs_per_column(aggs: dict, allowed: list[str]) -> dict[str, list]:
    """Groupby's aggregations for the columns it actually receives ("__all__" means every one)."""
    if "__all__" in aggs:
        return {column: list(aggs["__all__"]) for column in allowed}
    return {column: list(value) for column, value in aggs.items() if column in allowed}


def _first_equal(values: np.ndarray, extremes: np.ndarray, groups: Groups) -> np.ndarray:
    """Each group's extreme as the group's first value equal to it, as pandas picks it: fmin and
    fmax keep the last of equal values, which differ between 0.0 and -0.0 only in their sign."""
    row_group = np.repeat(np.arange(len(groups.counts)), groups.counts)
    rows = np.arange(len(values))
    first = np.minimum.reduceat(
        np.where(values == extremes[row_group], rows, len(values)), groups.starts
    )
    found = first < len(values)
    picked = extremes.copy()
    picked[found] = values[first[found]]
    return picked


def _reduce(agg: str, values: np.ndarray, groups: Groups) -> np.ndarray:
    kind = values.dtype.kind
    nulls = null_mask(values)
    if agg == "count":
        return _group_totals((~nulls).astype(np.int64), groups)
    if kind not in "iufb" or (kind == "u" and values.dtype.itemsize == 8):
        raise Delegate(f"{agg} of values of dtype {values.dtype}")
    if agg in ("min", "max"):
        if kind == "b":
            raise Delegate(f"{agg} of booleans")
        if len(groups.counts) == 0:
            return values[:0]
        # fmin/fmax skip NaN, as pandas does
        reduce: np.ufunc = np.fmin if agg == "min" else np.fmax
        extremes = reduce.reduceat(values, groups.starts)
        return _first_equal(values, extremes, groups) if kind == "f" else extremes
    if kind in "iub":
        integers = values.astype(np.int64)
        if agg == "sum":
            return _group_totals(integers, groups)
        # in float64, so that the bound itself cannot overflow
        largest_sum = np.abs(integers.astype(np.float64)).max(initial=0.0) * len(values)
        if largest_sum < _EXACT_FLOAT_INTEGER:
            return _group_totals(integers, groups).astype(np.float64) / groups.counts
        total, observed = _kahan_sums(integers.astype(np.float64), groups)
        return _mean(total, observed)
    total, observed = _kahan_sums(values, groups)
    if agg == "sum":
        return total
    return _mean(total, observed)


def _group_totals(values: np.ndarray, groups: Groups) -> np.ndarray:
    if len(groups.counts) == 0:
        return values[:0]
    return np.add.reduceat(values, groups.starts)


def _kahan_sums(values: np.ndarray, groups: Groups) -> tuple[np.ndarray, np.ndarray]:
    """Per-group sums of the non-NaN values with Kahan compensation, added in row order.

    pandas adds each group's values one by one with compensation; this does the same additions,
    position by position across all groups at once, so the loop runs over the longest group's
    length rather than over rows.
    """
    total = np.zeros(len(groups.counts), dtype=values.dtype)
    compensation = np.zeros_like(total)
    observed = np.zeros(len(groups.counts), dtype=np.int64)
    starts = groups.starts
    longest = int(groups.counts.max(initial=0))
    # infinities make NaN compensations, in pandas as here; that is the result, not an accident
    with np.errstate(invalid="ignore", over="ignore"):
        for position in range(longest):
            group_ids = np.flatnonzero(groups.counts > position)
            step = values[starts[group_ids] + position]
            present = ~np.isnan(step)
            group_ids = group_ids[present]
            step = step[present]
            observed[group_ids] += 1
            y = step - compensation[group_ids]
            t = total[group_ids] + y
            compensation[group_ids] = t - total[group_ids] - y
            total[group_ids] = t
    return total, observed


def _mean(total: np.ndarray, observed: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / observed.astype(total.dtype)
    mean[observed == 0] = np.nan
    return mean
