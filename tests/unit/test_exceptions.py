"""The library's errors cross process boundaries (a Dask worker's error reaches the caller) as
themselves: same class, message and fields, whatever their constructors take."""

from __future__ import annotations

import pickle

import pytest

from merlin_torch_serving.exceptions import (
    ArtifactError,
    InputError,
    MissingColumnsError,
    ScoringError,
    ServerError,
    UnknownModelError,
)


@pytest.mark.parametrize(
    "error",
    [
        InputError("item_id", "int64 values", "str values", "send ids", model="reco-0"),
        MissingColumnsError({"session_id": "int64 scalar"}, ["user_session"]),
        ArtifactError("reco-1-predictpytorch", "its file 'model.pt' is missing", "re-export"),
        UnknownModelError("recs", ["reco", "ranking"]),
        ServerError("tritonserver exited", log_tail="E0101 failed"),
        ScoringError("partition 3 could not be scored: ValueError: bad"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_an_error_unpickles_as_itself(error):
    copy = pickle.loads(pickle.dumps(error))

    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)
