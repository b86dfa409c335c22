"""Schemas through JSON (configs, step files, the manifest) keep every column as it was."""

from merlin.schema import ColumnSchema, Schema, Tags

from merlin_torch_serving.schemas import schema_from_json, schema_to_json


def test_schema_json_round_trip_keeps_boolean_columns_and_the_others():
    schema = Schema(
        [
            ColumnSchema("filtered_out", dtype="bool", dims=(None,)),
            ColumnSchema("item_ids", tags=[Tags.ITEM_ID], dtype="int64", dims=(None, 5)),
            ColumnSchema("scores", dtype="float32", dims=(None, (0, 20))),
        ]
    )
    assert schema_from_json(schema_to_json(schema)) == schema
