"""The two official examples, fitted and trained once per test session and shared read-only."""

from __future__ import annotations

import pytest

from tests.official import end_to_end, getting_started
from tests.official.example import Example, prepare


@pytest.fixture(scope="session")
def getting_started_example(tmp_path_factory) -> Example:
    return prepare(getting_started, str(tmp_path_factory.mktemp("getting_started_categories")))


@pytest.fixture(scope="session")
def end_to_end_example(tmp_path_factory) -> Example:
    return prepare(end_to_end, str(tmp_path_factory.mktemp("end_to_end_categories")))


@pytest.fixture(scope="session", params=["getting_started", "end_to_end"])
def example(request) -> Example:
    return request.getfixturevalue(f"{request.param}_example")
