"""Answering a batch of requests in merged runs: the requests Triton's dynamic batcher hands a
step together are concatenated, run through the step's operators once, and the answer is cut
back into one answer per request.

This is the inverse of how ``Client`` splits a big request (``chunks``): rows that a key groups
(the clicks of a session) stay in one run, and the answer to a run is the answers to its
requests one after the other. Two requests that hold the same key (two users who both send
session 7) would be merged into one session, so they go to different runs; so do requests that
would make a run bigger than ``max_rows``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving import tables


@dataclass
class _Run:
    members: list[int] = field(default_factory=list)
    rows: int = 0
    keys: set = field(default_factory=set)


def plan_runs(requests: Sequence[TensorTable], keys: Sequence[str], max_rows: int) -> list[list[int]]:
    """Indices of the requests each merged run holds, every request in exactly one run: the
    first run it fits in (rows within ``max_rows``, none of its ``keys`` values already there)."""
    runs: list[_Run] = []
    for index, request in enumerate(requests):
        rows = request_size(request)
        held = _key_values(request, keys)
        run = next((r for r in runs if r.rows + rows <= max_rows and not (held & r.keys)), None)
        if run is None:
            run = _Run()
            runs.append(run)
        run.members.append(index)
        run.rows += rows
        run.keys |= held
    return [run.members for run in runs]


def answer_rows(request: TensorTable, keys: Sequence[str]) -> int:
    """Rows the answer to ``request`` has: one per key value (session), else one per row."""
    if keys:
        return len(_key_values(request, keys))
    return tables.num_rows(request)


def request_size(request: TensorTable) -> int:
    """The most rows the request puts in any one tensor (each value of a ragged list counts)."""
    return max((len(column.values) for column in request.values()), default=0)


def split_answer(answer: TensorTable, counts: Sequence[int]) -> list[TensorTable] | None:
    """The answer cut into parts of ``counts`` rows; None when it has another number of rows (the
    operators did not answer row for row, so the requests must be answered one by one)."""
    if tables.num_rows(answer) != sum(counts) and answer.columns:
        return None
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return [tables.slice_rows(answer, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _key_values(request: TensorTable, keys: Sequence[str]) -> set:
    if not keys:
        return set()
    if len(keys) == 1:
        return set(np.asarray(request[keys[0]].values).tolist())
    return set(zip(*(np.asarray(request[key].values).tolist() for key in keys)))
