import argparse

import pandas as pd
import pytest

from merlin_torch_serving import InputError
from merlin_torch_serving.client import column_names


def test_a_mapping_is_read_from_the_command_line_form():
    assert column_names.parse("user_session=session_id, product = item_id,") == {
        "user_session": "session_id",
        "product": "item_id",
    }


@pytest.mark.parametrize("text", ["user_session", "=session_id", "user_session="])
def test_a_malformed_pair_is_a_usage_error_that_shows_the_form(text):
    with pytest.raises(argparse.ArgumentTypeError, match="write column mappings as YOURS=INPUT,"):
        column_names.argument(text)


def test_renaming_maps_a_frame_or_a_dict_and_the_answer_gets_the_callers_names_back():
    frame = pd.DataFrame({"visit": [1], "item_id": [2]})
    mapping = {"visit": "session_id"}
    assert list(column_names.rename(frame, mapping).columns) == ["session_id", "item_id"]
    assert list(column_names.rename(dict(frame), mapping)) == ["session_id", "item_id"]
    answer = pd.DataFrame({"session_id": [1], "item_ids": [[3]]})
    assert list(column_names.restore(answer, mapping).columns) == ["visit", "item_ids"]


def test_a_rename_onto_a_column_the_data_has_is_refused():
    frame = pd.DataFrame({"visit": [1], "session_id": [2]})
    with pytest.raises(
        InputError,
        match="input column 'session_id': expected one column of that name, after renaming 'visit'",
    ):
        column_names.rename(frame, {"visit": "session_id"})
