"""What `pip install merlin-torch-serving` pulls in, read from the installed packages' metadata."""

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirement_closure(name: str, extras: frozenset = frozenset()) -> set[str]:
    """Every distribution an install of ``name[extras]`` requires.

    Found through the installed metadata.
    """
    seen, pending = set(), [(canonicalize_name(name), extras)]
    while pending:
        current, current_extras = pending.pop()
        if (current, current_extras) in seen:
            continue
        seen.add((current, current_extras))
        for text in metadata.requires(current) or []:
            requirement = Requirement(text)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({"extra": extra}) for extra in current_extras or {""}
            )
            if wanted:
                pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return {dist for dist, _ in seen}


def test_an_install_without_extras_pulls_neither_cuda_python_nor_the_bundled_server():
    closure = requirement_closure("merlin-torch-serving")
    assert {
        "tritonclient",
        "grpcio",
        "geventhttpclient",
        "merlin-core",
        "nvtabular",
        "torch",
        "cloudpickle",  # eager models' classes that the server cannot import travel by value
        "aiohttp",  # AsyncClient over HTTP (tritonclient.http.aio); grpcio has its asyncio client
    } <= closure
    assert not closure & {"cuda-python", "nvidia-pytriton", "perf-analyzer", "tensorflow"}
    assert not closure & {"fastapi", "uvicorn"}  # the web service example's, in the `web` extra


def test_the_web_extra_brings_fastapi_and_uvicorn():
    assert {"fastapi", "uvicorn"} <= requirement_closure("merlin-torch-serving", frozenset({"web"}))


def test_the_server_extra_brings_the_bundled_tritonserver():
    assert "nvidia-pytriton" in requirement_closure("merlin-torch-serving", frozenset({"server"}))
