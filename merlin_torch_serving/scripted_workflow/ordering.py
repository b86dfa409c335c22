"""Row orders for the scripted Groupby: the sort NVTabular asks pandas for, and its grouping.

One difference from pandas is deliberate, and the fast path makes it too: rows whose sort keys
tie keep the order of the request. ``DataFrame.sort_values`` on one column is numpy's unstable
quicksort, whose order of ties depends on the CPU (AVX-512 sorting networks on this machine,
introsort elsewhere) and on every other row of the call, so NVTabular orders a session's tied
clicks differently on different machines and when other sessions share its request. With several
sort columns pandas sorts stably, and so does this.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import torch

from merlin_torch_serving.aot import exportable


def stable_order(values: torch.Tensor, ascending: bool) -> torch.Tensor:
    """Positions of ``values`` sorted, ties in row order, NaN last in row order (pandas puts nulls
    last in both directions)."""
    exporting = False
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():  # floats take the path for NaNs, whether any or not
            exporting = True
    if not values.is_floating_point() or (not exporting and not bool(torch.isnan(values).any())):
        return torch.sort(values, stable=True, descending=not ascending)[1]
    nans = torch.isnan(values)
    present = torch.nonzero(~nans).flatten()
    ordered = present[torch.sort(values[present], stable=True, descending=not ascending)[1]]
    return torch.cat([ordered, torch.nonzero(nans).flatten()])


def sort_order(keys: list[torch.Tensor], ascending: bool) -> torch.Tensor:
    """Row positions sorted by the keys (the first key first): stable sorts from the last key."""
    order = stable_order(keys[-1], ascending)
    for position in range(len(keys) - 2, -1, -1):
        tied = keys[position].index_select(0, order)
        order = order.index_select(0, stable_order(tied, ascending))
    return order


def group_rows(keys: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Rows grouped like ``groupby(keys, sort=True, dropna=True)``: the kept rows' positions group
    after group (each group in row order), each group's size, and each key's value per group."""
    rows = torch.arange(keys[0].shape[0], dtype=torch.int64)
    for values in keys:
        if values.is_floating_point():  # a null key drops its row
            rows = rows[~torch.isnan(values[rows])]
    rows = rows.index_select(0, sort_order([values.index_select(0, rows) for values in keys], True))
    grouped = [values.index_select(0, rows) for values in keys]
    size = rows.shape[0]
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():  # no slice a package could not size for no rows
            first = torch.arange(size) == 0
            for values in grouped:
                first = first | (values != exportable.shifted(values))
            starts = torch.nonzero(first).flatten()
            counts = torch.diff(starts, append=torch.full([1], size, dtype=torch.int64))
            return rows, counts, [values.index_select(0, starts) for values in grouped]
    change = torch.zeros(max(size - 1, 0), dtype=torch.bool)
    for values in grouped:
        change = change | (values[1:] != values[:-1])
    starts = torch.nonzero(torch.cat([torch.ones(min(size, 1), dtype=torch.bool), change]))
    starts = starts.flatten()
    counts = torch.diff(starts, append=torch.tensor([size], dtype=torch.int64))
    return rows, counts, [values.index_select(0, starts) for values in grouped]
