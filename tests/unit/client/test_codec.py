"""A model's requests and answers as the clients build and read them: columns that already have
the input's dtype are taken as they come, anything else gets the strict checks (and their errors,
naming the column), and an answer (a real tritonclient result, decoded from its body) becomes the
DataFrame or the dict of columns the clients return."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import tritonclient.http
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import InputError
from merlin_torch_serving.client.codec import ModelCodec
from merlin_torch_serving.client.model_schemas import ModelSchemas
from merlin_torch_serving.data import frames

INPUTS = Schema(
    [
        ColumnSchema("session_id", dtype="int64"),
        ColumnSchema("item_id", dtype="int64"),
        ColumnSchema("weights", dtype="float32", dims=(None, None)),
    ]
)
OUTPUTS = Schema(
    [
        ColumnSchema("session_id", dtype="int64"),
        ColumnSchema("item_ids", dtype="int64", dims=(None, 3)),
        ColumnSchema("seen", dtype="int64", dims=(None, None)),
    ]
)


def codec(request_dim: bool = False) -> ModelCodec:
    names = {"session_id": "session_id__out", "item_ids": "item_ids", "seen": "seen"}
    return ModelCodec(
        ModelSchemas(INPUTS, OUTPUTS, names, ["session_id"], None, request_dim), tritonclient.http
    )


def rows() -> pd.DataFrame:
    return pd.DataFrame(
        {"session_id": [7, 7, 8], "item_id": [3, 4, 5], "weights": [[0.5], [1.0, 2.0], []]}
    )


def answer(request_dim: bool = False):
    """A real tritonclient HTTP result for two sessions, decoded from the body Triton sends."""
    lead = [1] if request_dim else []
    outputs = [
        ("session_id__out", [*lead, 2], [7, 8]),
        ("item_ids", [*lead, 2, 3], [1, 2, 3, 4, 5, 6]),
        ("seen__values", [*lead, 3], [3, 4, 5]),
        ("seen__offsets", [*lead, 3], [0, 2, 3]),
    ]
    body = {
        "model_name": "m",
        "outputs": [
            {"name": name, "datatype": "INT32" if "offsets" in name else "INT64", "shape": shape}
            | {"data": data}
            for name, shape, data in outputs
        ],
    }
    return tritonclient.http.InferResult.from_response_body(json.dumps(body).encode())


def test_a_request_is_what_the_strict_conversion_makes_of_it():
    sent = codec().request_columns(rows(), None)
    checked = frames.checked_columns(dict(rows().items()), INPUTS)
    assert list(sent) == ["session_id", "item_id", "weights"]
    np.testing.assert_array_equal(sent["session_id"], checked["session_id"])
    np.testing.assert_array_equal(sent["weights"][0], checked["weights"][0])
    np.testing.assert_array_equal(sent["weights"][1], checked["weights"][1])
    assert sent["weights"][0].dtype == np.float32


def test_a_column_of_another_dtype_is_converted_or_refused_by_name():
    converted = codec().request_columns(rows().astype({"item_id": "int32"}), None)
    assert converted["item_id"].dtype == np.int64
    fractional = rows().astype({"item_id": "float64"})
    fractional.loc[0, "item_id"] = 3.5
    with pytest.raises(InputError, match="'item_id': expected int64 scalar, got float64 values"):
        codec().request_columns(fractional, None)


def test_a_request_under_the_callers_names_is_renamed_to_the_inputs():
    sent = codec().request_columns(
        rows().rename(columns={"session_id": "visit"}), {"visit": "session_id"}
    )
    assert sent["session_id"].tolist() == [7, 7, 8]


@pytest.mark.parametrize("request_dim", [False, True])
def test_an_answer_becomes_a_frame_and_a_dict_of_columns(request_dim):
    model = codec(request_dim)
    columns = model.answer_columns(answer(request_dim))
    frame = model.frame(columns, {"visit": "session_id"})
    assert list(frame.columns) == ["visit", "item_ids", "seen"]
    assert frame["visit"].tolist() == [7, 8]
    assert [cell.tolist() for cell in frame["item_ids"]] == [[1, 2, 3], [4, 5, 6]]
    assert [cell.tolist() for cell in frame["seen"]] == [[3, 4], [5]]
    plain = model.columns(columns, None)
    assert plain["item_ids"].shape == (2, 3)
    assert [cell.tolist() for cell in plain["seen"]] == [[3, 4], [5]]
    plain["session_id"][0] = 9  # the caller owns what it gets
    assert model.frame(model.answer_columns(answer(request_dim)), None)["session_id"][0] == 7


def test_the_answers_to_parts_of_a_request_are_joined_in_order():
    model = codec()
    parts = [model.answer_columns(answer()), model.answer_columns(answer())]
    joined = model.columns(model.joined(parts), None)
    assert joined["session_id"].tolist() == [7, 8, 7, 8]
    assert [cell.tolist() for cell in joined["seen"]] == [[3, 4], [5], [3, 4], [5]]


def test_a_request_bigger_than_the_row_limit_is_split_by_session():
    model = codec()
    parts = model.requests(model.request_columns(rows(), None), max_rows=2)
    assert [part["session_id"].tolist() for part in parts] == [[7, 7], [8]]
