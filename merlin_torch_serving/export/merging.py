"""Answering a batch of requests in merged runs: the requests Triton's dynamic batcher hands a
step together are concatenated, run through the step's operators once, and the answer is cut
back into one answer per request.

This is the inverse of how ``Client`` splits a big request (``chunks``): rows that a key groups
(the clicks of a session) stay in one run, and the answer to a run is the answers to its
requests one after the other. Two requests that hold the same key (two users who both send
session 7) would be merged into one session, so they go to different runs; so do requests that
would make a run bigger than ``max_rows``.

Requests and answers stay in the wire format here (name -> array; a ragged column as its
``__values`` and ``__offsets``): a batch is merged and cut with a few numpy calls per tensor,
without a table per request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from merlin_torch_serving.data import wire
from merlin_torch_serving.export.config import ROWS_TENSOR
from merlin_torch_serving.graph import metrics

Arrays = Mapping[str, np.ndarray]
Answer = dict[str, np.ndarray] | Exception
#: entered around each call of ``answer``: the indices of the requests it answers, and how many
#: rows each one's answer has
Around = Callable[[list[int], list[int]], AbstractContextManager]


@dataclass
class _Run:
    members: list[int] = field(default_factory=list)
    rows: int = 0
    keys: set = field(default_factory=set)


def plan_runs(requests: Sequence[Arrays], keys: Sequence[str], max_rows: int) -> list[list[int]]:
    """Indices of the requests each merged run holds, every request in exactly one run: the
    first run it fits in (rows within ``max_rows``, none of its ``keys`` values already there)."""
    runs: list[_Run] = []
    for index, request in enumerate(requests):
        size = request_size(request)
        held = _key_values(request, keys)
        run = next((r for r in runs if r.rows + size <= max_rows and not (held & r.keys)), None)
        if run is None:
            run = _Run()
            runs.append(run)
        run.members.append(index)
        run.rows += size
        run.keys |= held
    return [run.members for run in runs]


def answer_in_runs(
    requests: Sequence[Arrays],
    answer: Callable[[Arrays], dict[str, np.ndarray]],
    keys: Sequence[str] | None,
    max_rows: int,
    around: Around | None = None,
) -> list[Answer]:
    """Per request, its answer or the error it alone gets: the requests merged into runs
    (``plan_runs``; one a run when ``keys`` is None, nothing may merge) and each run answered with
    one call of ``answer``, inside ``around`` when given."""
    around = around or _nothing_around
    if keys is None:
        return [_alone(answer, requests, index, around) for index in range(len(requests))]
    answers: dict[int, Answer] = {}
    for run in plan_runs(requests, keys, max_rows):
        parts = _answer_run(requests, run, answer, keys, around)
        answers.update(zip(run, parts, strict=True))
    return [answers[index] for index in range(len(requests))]


def _answer_run(
    requests: Sequence[Arrays],
    run: list[int],
    answer: Callable[[Arrays], dict[str, np.ndarray]],
    keys: Sequence[str],
    around: Around,
) -> list[Answer]:
    """The answers to one run's requests (``run``: their indices): of one merged run, or one by one
    when there is one request or the merged run fails (each request then gets its own error)."""
    if len(run) > 1:
        members = [requests[index] for index in run]
        counts = [answer_rows(request, keys) for request in members]
        # counted only if it answers: a merged run that fails is run again request by request
        with metrics.tentative() as keep:
            try:
                with around(run, counts):
                    merged = answer(concat(members))
                parts = split(merged, counts)
            except Exception:
                parts = None
            if parts is not None:
                keep()
                return list(parts)
    return [_alone(answer, requests, index, around) for index in run]


def _alone(answer, requests: Sequence[Arrays], index: int, around: Around) -> Answer:
    with around([index], [rows(requests[index])]):
        return answer_or_error(answer, requests[index])


def _nothing_around(indices: list[int], answer_rows: list[int]) -> AbstractContextManager:
    return contextlib.nullcontext()


def answer_or_error(answer: Callable[[Arrays], dict[str, np.ndarray]], request: Arrays) -> Answer:
    """``answer(request)``, or the error it raised: one failing request must not fail the others."""
    try:
        return answer(request)
    except Exception as error:
        return error


def answer_rows(request: Arrays, keys: Sequence[str]) -> int:
    """Rows the answer to ``request`` has: one per key value (session), else one per row."""
    if keys:
        return len(_key_values(request, keys))
    return rows(request)


def request_size(request: Arrays) -> int:
    """The most rows the request puts in any one tensor (each value of a ragged list counts)."""
    return max(
        (len(array) for name, array in request.items() if not _is_offsets(name, request)), default=0
    )


def concat(requests: Sequence[Arrays]) -> dict[str, np.ndarray]:
    """One request of all the rows of ``requests`` (of the same tensors), in order."""
    merged = {}
    for name in requests[0]:
        parts = [request[name] for request in requests]
        if _is_offsets(name, requests[0]):
            merged[name] = _concat_offsets(parts)
        else:
            merged[name] = np.concatenate(parts)
    return merged


def split(answer: Arrays, counts: Sequence[int]) -> list[dict[str, np.ndarray]] | None:
    """The answer cut into parts of ``counts`` rows; None when it has another number of rows (the
    operators did not answer row for row, so the requests must be answered one by one)."""
    if answer and rows(answer) != sum(counts):
        return None
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    parts: list[dict[str, np.ndarray]] = [{} for _ in counts]
    for name, array in answer.items():
        if name.endswith(wire.VALUES_SUFFIX) and _offsets_name(name) in answer:
            continue  # cut with its offsets
        if _is_offsets(name, answer):
            values = answer[name[: -len(wire.OFFSETS_SUFFIX)] + wire.VALUES_SUFFIX]
            for part, start, stop in zip(parts, bounds[:-1], bounds[1:], strict=True):
                offsets = array[start : stop + 1]
                part[name] = (offsets - offsets[0]).astype(wire.OFFSETS_DTYPE, copy=False)
                part[_values_name(name)] = values[int(offsets[0]) : int(offsets[-1])]
        else:
            for part, start, stop in zip(parts, bounds[:-1], bounds[1:], strict=True):
                part[name] = array[start:stop]
    return parts


def rows(arrays: Arrays) -> int:
    """Rows of a request or answer: of its first tensor that is not a ragged list's values (a
    list's offsets hold one more)."""
    for name, array in arrays.items():
        if _is_offsets(name, arrays):
            return len(array) - 1
        if not (name.endswith(wire.VALUES_SUFFIX) and _offsets_name(name) in arrays):
            return len(array)
    return 0


def padded_for_libtorch(arrays: Arrays, answer_rows: int | None = None) -> dict[str, np.ndarray]:
    """``arrays`` as a python step sends them to a batched libtorch step: each flat with one element
    more (Triton's pytorch backend mishandles a batch holding an empty tensor), and
    ``ROWS_TENSOR``: one byte per row the step answers (``answer_rows``, by default the rows of
    ``arrays``), its shape telling Triton how to cut the answer."""
    sent = {name: padded(array) for name, array in arrays.items()}
    count = rows(arrays) if answer_rows is None else answer_rows
    sent[ROWS_TENSOR] = np.zeros(count, dtype=np.uint8)
    return sent


def padded(array: np.ndarray) -> np.ndarray:
    """``array`` flat, with one element more (see ``padded_for_libtorch``)."""
    return np.concatenate([array.ravel(), np.zeros(1, array.dtype)])


def _concat_offsets(parts: Sequence[np.ndarray]) -> np.ndarray:
    lengths = np.concatenate([np.diff(part) for part in parts])
    return wire.offsets_from_lengths(lengths, parts[0].dtype)


def _is_offsets(name: str, arrays: Arrays) -> bool:
    return name.endswith(wire.OFFSETS_SUFFIX) and _values_name(name) in arrays


def _values_name(offsets_name: str) -> str:
    return offsets_name[: -len(wire.OFFSETS_SUFFIX)] + wire.VALUES_SUFFIX


def _offsets_name(values_name: str) -> str:
    return values_name[: -len(wire.VALUES_SUFFIX)] + wire.OFFSETS_SUFFIX


def _key_values(request: Arrays, keys: Sequence[str]) -> set:
    if not keys:
        return set()
    if len(keys) == 1:
        return set(np.asarray(request[keys[0]]).tolist())
    return set(zip(*(np.asarray(request[key]).tolist() for key in keys), strict=True))
