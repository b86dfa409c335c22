"""Schemas through JSON (configs, step files, the manifest) keep every column as it was."""

import numpy as np
import pytest
from merlin.schema import ColumnSchema, Schema, Tags

from merlin_torch_serving.data.schemas import schema_from_json, schema_to_json


@pytest.mark.parametrize("dtype", [str, "object"])
def test_string_columns_keep_a_string_dtype_through_json(dtype):
    schema = Schema(
        [
            ColumnSchema("device", dtype=dtype, dims=(None,)),
            ColumnSchema("n", dtype=np.int32, dims=(None,)),
        ]
    )
    back = schema_from_json(schema_to_json(schema))
    assert back["device"].dtype.name == "str"
    assert back["device"].shape.as_tuple == ((0, None),)
    assert back["n"].dtype.name == "int32"


def test_tags_properties_and_ragged_dims_survive_json():
    column = ColumnSchema(
        "items",
        dtype=np.int64,
        dims=(None, (0, 20)),
        tags=[Tags.ITEM, Tags.ID],
        properties={"domain": {"min": 0, "max": 99}},
    )
    back = schema_from_json(schema_to_json(Schema([column])))["items"]
    assert back.shape.as_tuple == ((0, None), (0, 20))
    assert set(back.tags) == {Tags.ITEM, Tags.ID}
    assert back.properties["domain"]["max"] == 99


def test_schema_json_round_trip_keeps_boolean_columns_and_the_others():
    schema = Schema(
        [
            ColumnSchema("filtered_out", dtype="bool", dims=(None,)),
            ColumnSchema("item_ids", tags=[Tags.ITEM_ID], dtype="int64", dims=(None, 5)),
            ColumnSchema("scores", dtype="float32", dims=(None, (0, 20))),
        ]
    )
    assert schema_from_json(schema_to_json(schema)) == schema
