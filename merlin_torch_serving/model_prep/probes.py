"""Varied model inputs built from an input schema, to tell whether a compiled model answers like
the eager one.

A trace records the operations one example went through; a branch on the data, a loop over the
batch or a shape baked in as a constant answer wrong on other inputs, silently. So the candidate
is compared with the eager model on inputs that differ in the ways that break traces: batch size,
list lengths (and so padding), signs, zeros and edge values of each column's domain. The
inputs are what ``WireModel`` hands the model: ragged lists padded to their maximum length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.samples import padded_length


@dataclass(frozen=True)
class Probe:
    """One input batch for the model, named for what it varies."""

    name: str
    inputs: dict[str, torch.Tensor]


@dataclass(frozen=True)
class _Plan:
    name: str
    rows: int
    lengths: str  # ragged row lengths: "mixed", "full", "one", "all" (1 to the maximum)
    floats: str  # "uniform", "negative", "alternating", "zero", "large"
    integers: str  # "random", "min", "max", "negative"


# the first is the example a trace is taken with: neither 1 nor 2 rows, so no size is special
_PLANS = (
    _Plan("3 rows of mixed lengths", 3, "mixed", "uniform", "random"),
    _Plan("1 row", 1, "full", "uniform", "random"),
    _Plan("8 rows from 1 item to the maximum length", 8, "all", "uniform", "random"),
    _Plan("5 rows of negative floats", 5, "mixed", "negative", "random"),
    _Plan("6 rows alternating positive and negative floats", 6, "mixed", "alternating", "random"),
    _Plan("4 rows of zeros, single items and domain minimums", 4, "one", "zero", "min"),
    _Plan("4 rows of large floats and domain maximums", 4, "full", "large", "max"),
    _Plan("5 rows of negative integers", 5, "mixed", "uniform", "negative"),
)


def probe_inputs(
    schema: Schema,
    *,
    pad_value: float = 0.0,
    pad_left: bool = False,
    sample: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
) -> list[Probe]:
    """The probes for ``schema``; a ``sample`` comes first and bounds integers without a domain."""
    rng = np.random.default_rng(seed)
    probes = [Probe("the sample", dict(sample))] if sample else []
    for plan in _PLANS:
        inputs = {}
        for column in schema:
            observed = None if sample is None or column.name not in sample else sample[column.name]
            inputs[column.name] = _column_input(column, plan, rng, observed, pad_value, pad_left)
        probes.append(Probe(plan.name, inputs))
    return probes


def _column_input(
    column: ColumnSchema, plan: _Plan, rng, observed, pad_value: float, pad_left: bool
) -> torch.Tensor:
    if wire.is_ragged(column):
        max_length = padded_length(column)
        lengths = _row_lengths(plan, max_length)
        values = _values(column, plan, rng, observed, lengths)
        return torch.from_numpy(_padded(values, lengths, max_length, pad_value, pad_left))
    inner = [int(d.max) for d in (column.shape.dims or ())[1:]]
    per_row = int(np.prod(inner)) if inner else 1
    values = _values(column, plan, rng, observed, np.full(plan.rows, per_row))
    return torch.from_numpy(values.reshape([plan.rows, *inner]))


def _padded(
    values: np.ndarray, lengths: np.ndarray, max_length: int, pad_value: float, pad_left: bool
) -> np.ndarray:
    """Rows of ``lengths`` values each, padded to ``max_length`` as ``WireModel`` pads them."""
    dense = np.full((len(lengths), max_length), pad_value, dtype=values.dtype)
    starts = wire.offsets_from_lengths(lengths, np.int64)[:-1]
    for row, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        columns = slice(max_length - length, max_length) if pad_left else slice(0, length)
        dense[row, columns] = values[start : start + length]
    return dense


def _row_lengths(plan: _Plan, max_length: int) -> np.ndarray:
    cycle = {
        "full": [max_length],
        "one": [1],
        "mixed": [max_length, 1, max(1, max_length // 2)],
        "all": list(range(1, max_length + 1)),
    }[plan.lengths]
    return np.array([cycle[row % len(cycle)] for row in range(plan.rows)], dtype=np.int64)


def _values(
    column: ColumnSchema, plan: _Plan, rng, observed, row_lengths: np.ndarray
) -> np.ndarray:
    """``sum(row_lengths)`` values for the column, row after row."""
    dtype = wire.column_numpy_dtype(column)
    count = int(row_lengths.sum())
    if dtype.kind == "f":
        return _floats(plan.floats, rng, row_lengths).astype(dtype)
    if dtype.kind == "b":
        return {"zero": np.zeros(count, bool), "large": np.ones(count, bool)}.get(
            plan.floats, rng.random(count) < 0.5
        )
    if dtype.kind in "iu":
        return _integers(column, plan.integers, rng, observed, count).astype(dtype)
    raise TypeError(f"column {column.name!r} has dtype {dtype}, which a torch model cannot take")


def _floats(kind: str, rng, row_lengths: np.ndarray) -> np.ndarray:
    count = int(row_lengths.sum())
    if kind == "zero":
        return np.zeros(count)
    if kind == "negative":
        return -rng.uniform(0.1, 2.0, count)
    if kind == "large":
        return rng.choice([-1.0, 1.0], count) * rng.uniform(1e3, 1e6, count)
    if kind == "alternating":
        signs = np.repeat(np.where(np.arange(len(row_lengths)) % 2 == 0, 1.0, -1.0), row_lengths)
        return signs * rng.uniform(0.1, 2.0, count)
    return rng.uniform(-1.0, 1.0, count)


def _integers(column: ColumnSchema, kind: str, rng, observed, count: int) -> np.ndarray:
    """Integers inside the column's domain (or, without one, the sample's range, else 0 to 9)."""
    low, high = _integer_range(column, observed)
    if kind == "min":
        return np.full(count, low)
    if kind == "max":
        return np.full(count, high)
    if kind == "negative" and low < 0:
        return rng.integers(low, 0, count)
    if kind == "negative" and not _has_domain(column) and observed is None:
        return -rng.integers(1, 10, count)
    # 0 is padding in categorical columns: draw above it when the range allows
    return rng.integers(max(low, 1) if high >= 1 else low, high + 1, count)


def _integer_range(column: ColumnSchema, observed) -> tuple[int, int]:
    domain = column.properties.get("domain") or column.properties.get("int_domain") or {}
    if domain.get("min") is not None and domain.get("max") is not None:
        return int(domain["min"]), int(domain["max"])
    if observed is not None and observed.numel():
        return int(observed.min()), int(observed.max())
    return 0, 9


def _has_domain(column: ColumnSchema) -> bool:
    domain = column.properties.get("domain") or column.properties.get("int_domain") or {}
    return domain.get("max") is not None
