import pytest

from tests import toy_session


@pytest.fixture(scope="session")
def toy_workflow():
    return toy_session.fitted_workflow()


@pytest.fixture(scope="session")
def toy_model(toy_workflow):
    """(TorchScript model, input schema, output schema)."""
    return toy_session.scripted_model(toy_workflow)
