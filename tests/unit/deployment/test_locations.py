"""Repository locations: local folders and the object-store URLs tritonserver reads itself."""

from pathlib import Path

import pytest

from merlin_torch_serving.deployment.locations import (
    is_url,
    protocol_of,
    repository_argument,
    server_repository,
)


@pytest.mark.parametrize(
    ("location", "protocol"),
    [
        ("s3://bucket/models", "s3"),
        ("GS://bucket/m", "gs"),
        ("memory://x", "memory"),
        ("file:///tmp/r", None),
        ("relative/s3:", None),
        (Path("s3://x"), None),
    ],
)
def test_protocol_of_names_the_scheme_of_urls_only(location, protocol):
    assert protocol_of(location) == protocol
    assert is_url(location) is (protocol is not None)


def test_server_repository_keeps_object_store_urls_and_makes_local_ones_paths(tmp_path):
    assert (
        server_repository("s3://http://127.0.0.1:9000/bucket/models")
        == "s3://http://127.0.0.1:9000/bucket/models"
    )
    assert server_repository(f"file://{tmp_path}") == tmp_path
    assert (
        repository_argument(server_repository("as://account/container")) == "as://account/container"
    )
    assert repository_argument(Path("relative")) == str(Path("relative").resolve())


def test_server_repository_refuses_a_protocol_tritonserver_cannot_read():
    with pytest.raises(
        ValueError,
        match=r"cannot read a model repository at 'memory://models'.*s3://, gs://, as://",
    ):
        server_repository("memory://models")
