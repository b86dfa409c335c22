"""Where a model repository lives: a local folder or an object-store URL (``s3://``, ``gs://``,
``as://``, any fsspec protocol), and the form tritonserver takes it in.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: the object stores tritonserver reads a model repository from by itself
SERVER_PROTOCOLS = ("s3", "gs", "as")

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def protocol_of(location: str | os.PathLike) -> str | None:
    """The URL scheme of ``location`` (``"s3"``), or None for a local path.

    A ``file://`` URL counts as a local path.
    """
    if not isinstance(location, str):
        return None
    match = _URL.match(location)
    if match is None or match.group(1).lower() in ("file", "local"):
        return None
    return match.group(1).lower()


def is_url(location: str | os.PathLike) -> bool:
    return protocol_of(location) is not None


def local_path(location: str | os.PathLike) -> Path:
    """The local folder of a path or ``file://`` URL."""
    text = os.fspath(location)
    for prefix in ("file://", "local://"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return Path(text)


def server_repository(location: str | os.PathLike) -> str | Path:
    """What TritonServer keeps as its repository: the URL as given, or the local folder.

    tritonserver reads ``s3://``, ``gs://`` and ``as://`` itself; an S3-compatible store other
    than AWS is named with its endpoint, ``s3://http://host:port/bucket/path``.
    """
    protocol = protocol_of(location)
    if protocol is None:
        return local_path(location)
    if protocol not in SERVER_PROTOCOLS:
        raise ValueError(
            f"tritonserver cannot read a model repository at {str(location)!r}: it reads local"
            f" folders and {', '.join(p + '://' for p in SERVER_PROTOCOLS)} URLs; copy the"
            " repository to one of those"
        )
    return str(location)


def repository_argument(repository: str | Path) -> str:
    """``--model-repository``'s value: a URL as it is, a local folder as an absolute path."""
    return str(repository.resolve()) if isinstance(repository, Path) else repository


def download_model_folder(repository: str, model: str, destination: Path) -> None:
    """Copy the folder of ``model`` from a repository in object storage, named as tritonserver
    names it, into ``destination`` (credentials from the environment, as the server reads them)."""
    filesystem, root = _repository_filesystem(repository)
    filesystem.get(f"{root.rstrip('/')}/{model}/", str(destination), recursive=True)


def _repository_filesystem(repository: str):
    """The fsspec filesystem and root path of a repository URL; an S3-compatible store at an
    endpoint of its own (``s3://http://host:port/bucket/path``) gets that endpoint."""
    import fsspec

    protocol, _, rest = repository.partition("://")
    if protocol.lower() == "s3" and rest.startswith(("http://", "https://")):
        import s3fs

        scheme, _, location = rest.partition("://")
        host, _, path = location.partition("/")
        endpoint = f"{scheme}://{host}"
        return s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}), path
    return fsspec.core.url_to_fs(repository)
