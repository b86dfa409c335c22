"""Transport errors in the library's tree, and which are retried."""

import pytest
from tritonclient.utils import InferenceServerException

from merlin_torch_serving import (
    InferenceError,
    InputError,
    RequestTimeoutError,
    ServerUnavailableError,
)
from merlin_torch_serving.client import transport


def mapped(error, model="reco"):
    return transport.mapped(error, url="host:1", model=model, timeout_s=2.5)


@pytest.mark.parametrize(
    ("error", "kind", "retried"),
    [
        (ConnectionRefusedError(111, "Connection refused"), ServerUnavailableError, True),
        (ConnectionResetError(104, "Connection reset by peer"), ServerUnavailableError, True),
        (TimeoutError("timed out"), RequestTimeoutError, False),
        (
            InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED"),
            RequestTimeoutError,
            False,
        ),
        (
            InferenceServerException(
                "failed to connect to all addresses", status="StatusCode.UNAVAILABLE"
            ),
            ServerUnavailableError,
            True,
        ),
        (
            InferenceServerException(
                "Request for unknown model: 'reco' has no available versions", status="400"
            ),
            InferenceError,
            True,
        ),
        (
            InferenceServerException(
                "in ensemble 'reco', Stub process 'reco-0_0_0' is not healthy.", status="400"
            ),
            InferenceError,
            True,
        ),
        (
            InferenceServerException(
                "Request for unknown model: 'reco' is not found", status="400"
            ),
            InferenceError,
            False,
        ),
    ],
)
def test_transport_errors_become_library_errors_and_only_safe_ones_are_retried(
    error, kind, retried
):
    result, retryable = mapped(error)
    assert type(result) is kind
    assert retryable is retried


def test_a_timeout_names_the_model_and_the_timeout():
    result, _ = mapped(TimeoutError("timed out"))
    assert "no answer within timeout_s=2.5 s" in str(result)
    assert "'reco'" in str(result)


def test_a_served_refusal_of_an_input_is_an_input_error_naming_the_step_and_column():
    message = (
        "in ensemble 'reco', model 'reco-0-step': input column 'item_id': expected 3 rows, like"
        " 'timestamp', got 2 rows; every column needs one entry per row"
    )
    result, retryable = mapped(InferenceServerException(message, status="400"))
    assert isinstance(result, InputError)
    assert not retryable
    assert (result.model, result.column, result.expected, result.got) == (
        "reco-0-step",
        "item_id",
        "3 rows, like 'timestamp'",
        "2 rows",
    )
