"""Row orders for Groupby's sort and its grouping of keys, as pandas 1.5 makes them but for ties.

One difference from pandas is deliberate, and the scripted workflow makes it too: rows whose sort
keys tie keep the order of the request (pandas' ``sort_values(..., kind="stable")``). NVTabular's
``DataFrame.sort_values`` on one column is numpy's unstable quicksort, whose order of ties depends
on every other row of the call (and on the CPU), so a session's tied clicks would come out in
another order when other sessions share its request. With several sort columns pandas sorts stably
already. Nulls go last in both directions, as in pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.batch import null_mask
from merlin_torch_serving.fastpath.errors import Delegate


def sort_order(keys: list[np.ndarray], ascending: bool) -> np.ndarray:
    """Row positions in the order ``DataFrame.sort_values`` gives, ties in row order.

    The call is ``DataFrame.sort_values(by=keys, ascending, na_position="last", kind="stable")``.
    """
    try:
        if len(keys) == 1:
            return _single_key_order(keys[0], ascending)
        return _multi_key_order(keys, ascending)
    except TypeError as error:
        # e.g. strings mixed with numbers: pandas decides whether and how that sorts
        raise Delegate(f"sort keys that numpy cannot compare ({error})") from None


def _single_key_order(values: np.ndarray, ascending: bool) -> np.ndarray:
    # pandas' nargsort with a stable sort: sort the non-null values (reversed first when
    # descending, and the order reversed back after, so that ties keep their row order), then
    # append the null rows in their row order.
    nulls = null_mask(values)
    positions = np.arange(len(values))
    present = values[~nulls]
    present_positions = positions[~nulls]
    if not ascending:
        present = present[::-1]
        present_positions = present_positions[::-1]
    order = present_positions[present.argsort(kind="stable")]
    if not ascending:
        order = order[::-1]
    return np.concatenate([order, np.flatnonzero(nulls)])


def _multi_key_order(keys: list[np.ndarray], ascending: bool) -> np.ndarray:
    # pandas' lexsort_indexer: each key becomes the rank of its value among the key's distinct
    # values (nulls ranked after all of them, in both directions), then a stable sort on the ranks.
    ranks = []
    for values in keys:
        nulls = null_mask(values)
        distinct, rank = np.unique(values[~nulls], return_inverse=True)
        count = len(distinct)
        key_rank = np.full(len(values), count, dtype=np.int64)
        key_rank[~nulls] = rank if ascending else count - rank - 1
        ranks.append(key_rank)
    return np.lexsort(ranks[::-1])


@dataclass(frozen=True)
class Groups:
    """Rows grouped like ``groupby(keys, sort=True, dropna=True)``.

    ``rows`` lists the kept rows group after group, each group in row order; ``counts`` is the
    size of each group; ``keys`` holds each key column's value per group.
    """

    rows: np.ndarray
    counts: np.ndarray
    keys: list[np.ndarray]

    @property
    def starts(self) -> np.ndarray:
        return wire.offsets_from_lengths(self.counts, np.int64)[:-1]


def group_rows(keys: list[np.ndarray]) -> Groups:
    """Groups in ascending key order; rows with a null in any key are dropped, as pandas does."""
    kept = np.ones(len(keys[0]), dtype=bool)
    for values in keys:
        kept &= ~null_mask(values)
    kept_rows = np.flatnonzero(kept)
    try:
        uniques, codes = zip(
            *(np.unique(values[kept], return_inverse=True) for values in keys), strict=True
        )
    except TypeError as error:
        raise Delegate(f"group keys that numpy cannot compare ({error})") from None
    if len(keys) == 1:
        group_of_row = codes[0]
        group_keys = [uniques[0]]
    else:
        # Distinct rows of the code matrix come out in lexicographic order, which is the
        # order pandas gives the groups of several keys.
        code_matrix = np.stack(codes, axis=1)
        distinct, group_of_row = np.unique(code_matrix, axis=0, return_inverse=True)
        group_keys = [uniques[i][distinct[:, i]] for i in range(len(keys))]
    group_of_row = group_of_row.reshape(-1)
    rows = kept_rows[np.argsort(group_of_row, kind="stable")]
    counts = np.bincount(group_of_row, minlength=len(group_keys[0])).astype(np.int64)
    return Groups(rows=rows, counts=counts, keys=group_keys)
