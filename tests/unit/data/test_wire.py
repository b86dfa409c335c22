import numpy as np
import pytest
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import InputError
from merlin_torch_serving.data import wire


def test_scalar_column_travels_as_one_tensor_with_batch_dim():
    (spec,) = wire.column_specs(ColumnSchema("session_id", dtype="int64"))
    assert (spec.name, spec.dtype, spec.dims, spec.triton_dtype) == (
        "session_id",
        np.dtype("int64"),
        (-1,),
        "INT64",
    )


def test_fixed_list_column_travels_with_its_length():
    (spec,) = wire.column_specs(ColumnSchema("scores", dtype="float32", dims=(None, 33)))
    assert (spec.name, spec.dims, spec.triton_dtype) == ("scores", (-1, 33), "FP32")


def test_ragged_list_column_travels_as_values_and_int32_offsets():
    column = ColumnSchema("item_id-list", dtype="int64", dims=(None, (0, 20)))
    values, offsets = wire.column_specs(column)
    assert (values.name, values.dtype, values.dims) == (
        "item_id-list__values",
        np.dtype("int64"),
        (-1,),
    )
    assert (offsets.name, offsets.dtype, offsets.dims) == (
        "item_id-list__offsets",
        np.dtype("int32"),
        (-1,),
    )


def test_string_column_travels_as_bytes():
    (spec,) = wire.column_specs(ColumnSchema("raw_id", dtype="str"))
    assert spec.triton_dtype == "BYTES"


def test_schema_specs_keep_schema_order():
    schema = Schema(
        [ColumnSchema("b", dtype="int64", dims=(None, None)), ColumnSchema("a", dtype="float32")]
    )
    assert [s.name for s in wire.schema_specs(schema)] == ["b__values", "b__offsets", "a"]


def test_to_wire_and_back_round_trips_ragged_fixed_and_scalar_columns():
    table = TensorTable(
        {
            "items": (np.array([5, 6, 7, 8]), np.array([0, 1, 1, 4])),
            "scores": np.arange(6, dtype=np.float32).reshape(3, 2),
            "session_id": np.array([10, 11, 12]),
        }
    )
    arrays = wire.to_wire(table)
    assert sorted(arrays) == ["items__offsets", "items__values", "scores", "session_id"]
    assert arrays["items__offsets"].dtype == np.int32
    schema = Schema(
        [
            ColumnSchema("items", dtype="int64", dims=(None, None)),
            ColumnSchema("scores", dtype="float32", dims=(None, 2)),
            ColumnSchema("session_id", dtype="int64"),
        ]
    )
    back = wire.from_wire(arrays, schema)
    assert back.columns == ["items", "scores", "session_id"]
    np.testing.assert_array_equal(back["items"].values, [5, 6, 7, 8])
    np.testing.assert_array_equal(back["items"].offsets, [0, 1, 1, 4])
    np.testing.assert_array_equal(back["scores"].values, table["scores"].values)


def test_a_missing_tensor_is_an_input_error_naming_the_column_and_what_it_travels_as():
    schema = Schema(
        [
            ColumnSchema("items", dtype="int64", dims=(None, None)),
            ColumnSchema("session_id", dtype="int64"),
        ]
    )
    arrays = {"items__values": np.array([5, 6]), "session_id": np.array([10, 11])}
    with pytest.raises(
        InputError,
        match=r"input column 'items': expected tensors 'items__values' \(its values\) and"
        r" 'items__offsets' \(int32, rows \+ 1 offsets\): a ragged list column travels as both,"
        r" got no 'items__offsets' \(the tensors are 'items__values', 'session_id'\)",
    ):
        wire.from_wire(arrays, schema)
    with pytest.raises(InputError, match=r"column 'session_id': expected a tensor 'session_id'"):
        wire.from_wire(
            {"items__values": arrays["items__values"]}, schema.select_by_name(["session_id"])
        )


def test_offsets_from_lengths_start_at_zero():
    np.testing.assert_array_equal(wire.offsets_from_lengths(np.array([2, 0, 3])), [0, 2, 2, 5])


def test_output_named_like_a_request_column_travels_with_suffix():
    assert wire.response_name("session_id", ["session_id", "item_id"]) == "session_id__out"
    assert wire.response_name("item_ids", ["session_id", "item_id"]) == "item_ids"


def test_triton_dtype_names_round_trip():
    for dtype in ("int32", "int64", "float32", "float64", "bool"):
        assert wire.numpy_dtype(wire.triton_dtype(np.dtype(dtype))) == np.dtype(dtype)
    assert wire.numpy_dtype("TYPE_STRING") == np.dtype(object)


def test_unknown_triton_dtype_is_an_error():
    with pytest.raises(TypeError, match="'TYPE_NOPE' has no numpy equivalent"):
        wire.numpy_dtype("TYPE_NOPE")
