"""The workflow's rows lined up with the request's sessions, placeholders for filtered ones."""

import numpy as np
import pytest
from merlin.table import TensorTable

from merlin_torch_serving.ops.session_rows import FILTERED_COLUMN, line_up_sessions


def workflow_rows() -> TensorTable:
    """Sessions 4 and 9 (sorted by key, as Groupby returns them), with a list and a count."""
    return TensorTable(
        {
            "session_id": np.array([4, 9]),
            "items": (np.array([10, 11, 12]), np.array([0, 1, 3], dtype=np.int32)),
            "count": np.array([2, 3], dtype=np.int32),
        },
        _unsafe=True,
    )


def test_rows_follow_the_request_and_filtered_sessions_get_marked_placeholders():
    request_keys = np.array([9, 7, 9, 4, 7, 5])
    lined_up = line_up_sessions(workflow_rows(), request_keys, "session_id", FILTERED_COLUMN)
    assert lined_up["session_id"].values.tolist() == [9, 7, 4, 5]
    assert lined_up[FILTERED_COLUMN].values.tolist() == [False, True, False, True]
    assert lined_up["items"].offsets.tolist() == [0, 2, 2, 3, 3]
    assert lined_up["items"].values.tolist() == [11, 12, 10]
    assert lined_up["count"].values.tolist() == [3, 0, 2, 0]
    assert lined_up["count"].values.dtype == np.int32


def test_a_missing_session_without_a_filter_to_blame_is_an_error():
    with pytest.raises(
        ValueError, match=r"dropped the session\(s\) \[7\] although it has no Filter"
    ):
        line_up_sessions(workflow_rows(), np.array([4, 7, 9]), "session_id", None)


def test_a_key_the_request_did_not_send_is_an_error_that_says_what_to_do():
    with pytest.raises(
        ValueError, match=r"values the request did not send \(\[9\]\).*keep_request_order=False"
    ):
        line_up_sessions(workflow_rows(), np.array([4]), "session_id", FILTERED_COLUMN)
