"""Fitted workflows shared by the fast-path tests.

Fitting takes seconds, so each is fitted once.
"""

from __future__ import annotations

import pytest

from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath import helpers


@pytest.fixture(scope="session")
def train():
    return helpers.interactions(seed=7)


@pytest.fixture(scope="session")
def categories_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fastpath_categories"))


@pytest.fixture(scope="session")
def session_workflow(train, categories_path):
    return helpers.session_workflow(train, categories_path)


@pytest.fixture(scope="session")
def padded_session_workflow(train, categories_path):
    return helpers.session_workflow(train, categories_path + "/padded", pad=True)


@pytest.fixture(scope="session")
def rich_session_workflow(train, categories_path):
    return helpers.rich_session_workflow(train, categories_path + "/rich")


@pytest.fixture(scope="session")
def compiled_session(session_workflow):
    return compile_workflow(session_workflow)
