"""Session fixtures shared by every test folder.

``triton_server``: one tritonserver per test session, in explicit model-control mode on an empty
repository; tests write model folders into ``triton_server.repository`` (see
tests/triton_models.py) or export ensembles there, and load them by name.
``toy_workflow`` / ``toy_model``: the small session-based setup of tests/toy_session.py.
"""

from __future__ import annotations

import pytest

from merlin_torch_serving.exceptions import ServerError
from merlin_torch_serving.server import TritonServer
from tests import toy_session


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """A running tritonserver on ports the OS assigns; a server that cannot start fails the tests."""
    server = TritonServer(
        tmp_path_factory.mktemp("triton_repository"),
        model_control="explicit",
        start_timeout_s=120.0,
        # a test kills a stub here, and tritonserver never finishes unloading the instance it
        # served: stop() waits out the exit timeout (0.75 of this), so keep it short
        stop_timeout_s=6.0,
    )
    try:
        server.start()
    except ServerError as error:
        pytest.fail(f"the shared tritonserver could not start: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def toy_workflow(tmp_path_factory):
    return toy_session.fitted_workflow(tmp_path_factory.mktemp("toy_vocabularies"))


@pytest.fixture(scope="session")
def toy_model(toy_workflow):
    """(TorchScript model, input schema, output schema)."""
    return toy_session.scripted_model(toy_workflow)
