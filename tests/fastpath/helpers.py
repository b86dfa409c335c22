"""Test utilities for the fast path: the NVTabular oracle in wire format, and workflows to compile.

The oracle runs ``workflow.transform`` on a pandas DataFrame and converts its output here, without
the library's code, so that the comparison does not check the library against itself. It sorts as
the library documents: pandas sorting stably, so that rows whose sort keys tie keep the request's
order (NVTabular's own single-column sort is numpy's unstable quicksort, whose order of ties
depends on the other rows of the call and on the CPU).
"""

from __future__ import annotations

import contextlib
import itertools
from unittest import mock

import merlin.io
import numpy as np
import nvtabular as nvt
import pandas as pd
from merlin.core.dispatch import create_multihot_col
from merlin.schema import Schema, Tags

VALUES = "__values"
OFFSETS = "__offsets"


# ---------------------------------------------------------------------------------------------
# oracle


def request_frame(columns: dict[str, np.ndarray], input_schema: Schema) -> pd.DataFrame:
    """The DataFrame NVTabular gets for a request: ragged inputs as object columns of row arrays."""
    frame = {}
    for name in input_schema.column_names:
        if name in columns:
            frame[name] = columns[name]
        else:
            frame[name] = create_multihot_col(
                pd.Series(columns[name + OFFSETS]), pd.Series(columns[name + VALUES])
            )
    return pd.DataFrame(frame)


@contextlib.contextmanager
def stable_sorts():
    """``DataFrame.sort_values`` sorting stably unless told otherwise: ties keep their row order."""
    sort_values = pd.DataFrame.sort_values

    def stable(self, *args, **kwargs):
        kwargs.setdefault("kind", "stable")
        return sort_values(self, *args, **kwargs)

    with mock.patch.object(pd.DataFrame, "sort_values", stable):
        yield


def nvtabular_transform(workflow: nvt.Workflow, frame: pd.DataFrame) -> pd.DataFrame:
    """``workflow.transform(frame)``, rows whose sort keys tie kept in the frame's order."""
    with stable_sorts():
        return workflow.transform(frame)


def oracle(workflow: nvt.Workflow, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``workflow.transform`` on the request's DataFrame, ties in request order.

    The result is in the wire format of the output schema.
    """
    output = nvtabular_transform(workflow, request_frame(columns, workflow.input_schema))
    return wire_from_frame(output, workflow.output_schema)


def wire_from_frame(frame: pd.DataFrame, schema: Schema) -> dict[str, np.ndarray]:
    arrays = {}
    for column in schema:
        dtype = _schema_dtype(column)
        series = frame[column.name]
        if not column.is_list:
            arrays[column.name] = _cast(series.to_numpy(), dtype)
            continue
        rows = [list(row) for row in series]
        flat = list(itertools.chain.from_iterable(rows))
        values = _cast(np.array(flat, dtype=object if dtype == np.dtype(object) else None), dtype)
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        if column.is_ragged:
            arrays[column.name + VALUES] = values
            arrays[column.name + OFFSETS] = np.concatenate([[0], np.cumsum(lengths)]).astype(
                np.int32
            )
        else:
            width = int(column.shape.dims[1].max)
            if np.any(lengths != width):
                raise ValueError(
                    f"NVTabular's rows of {column.name!r} are not all {width} long: {lengths}"
                )
            arrays[column.name] = values.reshape(len(rows), width)
    return arrays


def _schema_dtype(column) -> np.dtype:
    if column.dtype.element_type.value == "string":
        return np.dtype(object)
    return np.dtype(column.dtype.to_numpy)


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if len(values) == 0:
        return np.array([], dtype=dtype)
    if dtype.kind in "iub" and values.dtype.kind == "f" and np.isnan(values).any():
        raise ValueError("NVTabular produced NaN in an integer column")
    return values.astype(dtype)


def reloaded(module):
    """A scripted module saved and loaded back, as a libtorch step loads what an export wrote."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


# workflow id -> (workflow, its loaded module): the workflow is kept so that its id stays its own
_SCRIPTED: dict[int, tuple] = {}


def scripted_module(workflow, non_null_inputs=()):
    """The workflow's TorchScript form (which must cover every node), saved and loaded back; built
    once per workflow."""
    from merlin_torch_serving.scripted_workflow import ScriptedWorkflow

    if id(workflow) not in _SCRIPTED:
        scripted = ScriptedWorkflow(workflow, non_null_inputs)
        assert scripted.uncompiled == [], scripted.uncompiled
        _SCRIPTED[id(workflow)] = (workflow, reloaded(scripted.scripted()))
    return _SCRIPTED[id(workflow)][1]


def has_torchscript_form(workflow) -> bool:
    from merlin_torch_serving.scripted_workflow import ScriptedWorkflow

    return id(workflow) in _SCRIPTED or ScriptedWorkflow(workflow).complete


def run_module(module, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A scripted workflow's answer in the wire format, called as libtorch calls it."""
    import torch

    # columns the workflow does not read may be strings, which no tensor holds
    inputs = {
        name: torch.from_numpy(np.ascontiguousarray(array))
        for name, array in columns.items()
        if array.dtype != np.dtype(object)
    }
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        return {name: tensor.numpy() for name, tensor in module(inputs).items()}


def assert_wire_equal(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Same arrays, names, dtypes and shapes; NaN equals NaN, -0.0 differs from 0.0."""
    assert sorted(got) == sorted(expected), f"arrays {sorted(got)} != {sorted(expected)}"
    for name, want in expected.items():
        have = got[name]
        assert have.dtype == want.dtype, f"{name!r}: dtype {have.dtype} != {want.dtype}"
        assert have.shape == want.shape, f"{name!r}: shape {have.shape} != {want.shape}"
        if want.dtype == object:
            for position, (a, b) in enumerate(zip(have.tolist(), want.tolist(), strict=True)):
                same = (
                    (a is None and b is None)
                    or (a == b and type(a) is type(b))
                    or (a != a and b != b)
                )
                assert same, f"{name!r}[{position}]: {a!r} != {b!r}"
        elif want.dtype.kind == "f":
            np.testing.assert_array_equal(have, want, err_msg=name)
            numbers = ~np.isnan(want)
            assert np.array_equal(np.signbit(have[numbers]), np.signbit(want[numbers])), (
                f"{name!r}: signs of zero differ"
            )
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)


# ---------------------------------------------------------------------------------------------
# workflows


def interactions(
    seed: int, rows: int = 3000, sessions: int = 300, items: int = 200
) -> pd.DataFrame:
    """Raw training rows: sessions of several interactions, item popularity skewed (Zipf)."""
    rng = np.random.default_rng(seed)
    item_ids = (rng.zipf(1.3, rows) % items) + 1
    return pd.DataFrame(
        {
            "session_id": rng.integers(0, sessions, rows),
            "timestamp": rng.integers(0, 100_000, rows),
            "item_id": item_ids,
            "category": item_ids % 17,
            "price": np.round(rng.gamma(2.0, 10.0, rows), 2),
        }
    )


def fit(outputs, train: pd.DataFrame) -> nvt.Workflow:
    workflow = nvt.Workflow(outputs)
    workflow.fit(merlin.io.Dataset(train, cpu=True))
    return workflow


def session_workflow(
    train: pd.DataFrame, categories_path: str, *, pad: bool = False
) -> nvt.Workflow:
    """The session-based workflow of Transformers4Rec's examples (optionally with padded lists)."""
    categorify = ["item_id", "category"] >> nvt.ops.Categorify(out_path=categories_path)
    groupby = (["session_id", "timestamp"] + categorify) >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={"item_id": ["list", "count"], "category": ["list"], "timestamp": ["first", "last"]},
        name_sep="-",
    )
    item_list = (
        groupby["item_id-list"]
        >> nvt.ops.ListSlice(-20, pad=pad)
        >> nvt.ops.AddMetadata(tags=[Tags.ITEM, Tags.ID, Tags.CATEGORICAL, Tags.LIST])
    )
    category_list = (
        groupby["category-list"]
        >> nvt.ops.ListSlice(-20, pad=pad)
        >> nvt.ops.AddMetadata(tags=[Tags.CATEGORICAL, Tags.LIST])
    )
    return fit(
        item_list + category_list + groupby["session_id", "item_id-count", "timestamp-first"],
        train[["session_id", "timestamp", "item_id", "category"]],
    )


def rich_session_workflow(train: pd.DataFrame, categories_path: str) -> nvt.Workflow:
    """A workflow on sessions with string item ids.

    It has a continuous feature, a LambdaOp, a session Filter and padding.
    """
    categorify = ["item_id", "category"] >> nvt.ops.Categorify(out_path=categories_path)
    price_log = ["price"] >> nvt.ops.LogOp() >> nvt.ops.Rename(postfix="_log")
    price_norm = ["price"] >> nvt.ops.Normalize() >> nvt.ops.Rename(postfix="_norm")
    hour = ["timestamp"] >> nvt.ops.LambdaOp(lambda col: col // 3600) >> nvt.ops.Rename(name="hour")
    groupby = (
        ["session_id", "timestamp"] + categorify + price_log + price_norm + hour
    ) >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={
            "item_id": ["list", "count"],
            "category": ["list"],
            "price_log": ["list", "mean", "sum", "min", "max"],
            "price_norm": ["list"],
            "hour": ["list", "first"],
            "timestamp": ["first", "last"],
        },
        name_sep="-",
    )
    sessions = groupby >> nvt.ops.Filter(f=lambda df: df["item_id-count"] >= 2)
    item_list = (
        sessions["item_id-list"]
        >> nvt.ops.ListSlice(-20, pad=True, pad_value=0)
        >> nvt.ops.AddTags(tags=[Tags.ITEM, Tags.ID, Tags.CATEGORICAL, Tags.LIST])
    )
    lists = sessions[
        "category-list", "price_log-list", "price_norm-list", "hour-list"
    ] >> nvt.ops.ListSlice(-20)
    scalars = sessions[
        "session_id",
        "item_id-count",
        "price_log-mean",
        "price_log-sum",
        "price_log-min",
        "price_log-max",
        "hour-first",
        "timestamp-last",
    ]
    train = train.assign(item_id="item-" + train["item_id"].astype(str))
    train.loc[train.index % 13 == 0, "price"] = np.nan
    return fit(item_list + lists + scalars, train)


def known_ids(workflow: nvt.Workflow, column: str) -> list:
    """The values in a fitted Categorify vocabulary, read from the path in the output schema."""
    for schema_column in workflow.output_schema:
        if schema_column.properties.get("domain", {}).get("name") == column:
            path = schema_column.properties["cat_path"]
            return pd.read_parquet(path)[column].dropna().tolist()
    raise KeyError(column)
