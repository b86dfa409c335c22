"""The shared tritonserver: one per test session, in explicit model-control mode on an empty repository.

Tests write model folders into ``triton_server.repository`` (see tests/triton_models.py) and load them by name.
"""

from __future__ import annotations

import pytest

from merlin_torch_serving.exceptions import ServerError
from merlin_torch_serving.server import TritonServer


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """A running tritonserver on ports the OS assigns; a server that cannot start fails the tests."""
    server = TritonServer(
        tmp_path_factory.mktemp("triton_repository"),
        model_control="explicit",
        start_timeout_s=120.0,
    )
    try:
        server.start()
    except ServerError as error:
        pytest.fail(f"the shared tritonserver could not start: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()
