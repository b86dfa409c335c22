"""Blanking the rows of filtered sessions: by dtype in numpy, and the same in TorchScript."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from merlin.dag import ColumnSelector
from merlin.table import TensorTable

from merlin_torch_serving.ops.filtered import BlankFilteredRows, blank_rows


def blank(columns: dict, filtered) -> TensorTable:
    op = BlankFilteredRows("filtered_out", list(columns))
    table = TensorTable({**columns, "filtered_out": np.asarray(filtered)}, _unsafe=True)
    return op.transform(ColumnSelector(list(columns) + ["filtered_out"]), table)


def test_blanking_gives_minus_one_nan_false_empty_strings_and_empty_lists():
    result = blank(
        {
            "ids": np.array([[3, 4], [5, 6], [7, 8]]),
            "scores": np.array([0.5, 0.25, 0.125], dtype=np.float32),
            "seen": np.array([True, True, True]),
            "names": np.array(["a", "b", "c"], dtype=object),
            "lists": (np.array([1, 2, 3, 4, 5]), np.array([0, 2, 3, 5], dtype=np.int32)),
        },
        [False, True, True],
    )
    assert result["ids"].values.tolist() == [[3, 4], [-1, -1], [-1, -1]]
    assert result["scores"].values[0] == 0.5
    assert np.isnan(result["scores"].values[1:]).all()
    assert result["seen"].values.tolist() == [True, False, False]
    assert result["names"].values.tolist() == ["a", "", ""]
    assert result["lists"].values.tolist() == [1, 2]
    assert result["lists"].offsets.tolist() == [0, 2, 2, 2]
    assert "filtered_out" not in result.columns


@settings(max_examples=60, deadline=None)
@given(
    values=st.one_of(
        hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6)),
        hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6)),
    ),
    data=st.data(),
)
def test_torchscript_blanking_equals_the_python_operator(values, data):
    filtered = np.array(
        data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    )
    expected = blank({"column": values}, filtered)["column"].values
    got = torch.jit.script(blank_rows)(
        torch.from_numpy(values.copy()), torch.from_numpy(filtered)
    ).numpy()
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == expected.dtype
