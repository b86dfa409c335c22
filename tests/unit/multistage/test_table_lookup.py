"""LookupFeatures: features of each key from a table, scalar and list, a declared default for keys
the table lacks (counted), and the table written without pickle and read back."""

import numpy as np
import pandas as pd
import pytest
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, SchemaError
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.multistage import LookupFeatures

TABLE = pd.DataFrame(
    {
        "item_id": [30, 10, 20],
        "price": np.array([3.5, 1.5, 2.5], dtype=np.float32),
        "tags": [[3], [1, 1], []],
    }
)
REQUEST = Schema([ColumnSchema("item_id", dtype="int64", dims=(None,))])


def lookup(op, keys):
    return Ensemble(op.as_node(), REQUEST).run(
        TensorTable({"item_id": np.asarray(keys, dtype=np.int64)})
    )


def test_features_of_known_keys_and_defaults_for_the_others():
    op = LookupFeatures(TABLE, key="item_id", defaults={"price": -1.0, "tags": [0]})

    with metrics.collecting() as counted:
        found = lookup(op, [20, 99, 10, 30])

    np.testing.assert_array_equal(found["price"].values, np.float32([2.5, -1.0, 1.5, 3.5]))
    np.testing.assert_array_equal(found["tags"].values, [0, 1, 1, 3])
    np.testing.assert_array_equal(found["tags"].offsets, [0, 0, 1, 3, 4])
    assert counted.totals[(metrics.MISSING_ENTITIES, (("lookup", "item_id features"),))] == 1


def test_the_exported_table_is_read_back_without_pickle(tmp_path):
    op = LookupFeatures(TABLE, key="item_id", features={"price": "float64", "tags": "list[int32]"})
    op.save_artifacts(str(tmp_path))

    loaded = LookupFeatures.load(op.config(), str(tmp_path))

    for key in ([10, 20, 30, 5], []):
        want, got = lookup(op, key), lookup(loaded, key)
        for name in ("price", "tags"):
            np.testing.assert_array_equal(got[name].values, want[name].values)
            assert got[name].values.dtype == want[name].values.dtype
    assert loaded.compute_output_schema(REQUEST, None) == op.compute_output_schema(REQUEST, None)


def test_a_table_with_a_repeated_key_is_refused():
    with pytest.raises(ValueError, match="key 10 appears more than once"):
        LookupFeatures(pd.DataFrame({"item_id": [10, 10], "x": [1, 2]}), key="item_id")


def test_a_list_of_keys_needs_unrolling_first():
    schema = Schema([ColumnSchema("item_id", dtype="int64", dims=(None, None))])
    with pytest.raises(SchemaError, match="UnrollCandidates"):
        Ensemble(["item_id"] >> LookupFeatures(TABLE, key="item_id"), schema)


def test_text_features_are_refused_with_the_fix():
    frame = TABLE.assign(name=["a", "b", "c"])
    with pytest.raises(ValueError, match="Encode text features as ids"):
        LookupFeatures(frame, key="item_id", features=["name"])
