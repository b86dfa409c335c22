"""``bundle``: a copy of a model repository that serves on a tritonserver whose own Python lacks
this library (NVIDIA's containers ship another Python, without merlin or torch).

Each python step gets the packed environment (``python-env/``, or ``python-env.tar.gz``), the
python-backend stub built for that environment's Python (the backend runs a model folder's own
``triton_python_backend_stub`` instead of its default), and ``EXECUTION_ENV_PATH`` pointing at the
environment through ``$$TRITON_MODEL_DIRECTORY``, so the bundle still works once copied or served
from object storage. Other models are copied as they are.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from merlin_torch_serving.backends import bundle as wheel
from merlin_torch_serving.backends.layout import STUB_NAME
from merlin_torch_serving.bundling import environment as envs
from merlin_torch_serving.exceptions import BundleError
from merlin_torch_serving.export import config as configs

ENV_FOLDER = "python-env"
ENV_ARCHIVE = "python-env.tar.gz"


@dataclass(frozen=True)
class BundleResult:
    path: Path
    python_steps: list[str]  # the models that got the environment
    environment: envs.PackedEnvironment


def bundle_repository(
    repository: str | os.PathLike,
    out: str | os.PathLike,
    *,
    environment: str | os.PathLike | None = None,
    extra_distributions: Iterable[str] = (),
    archive: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> BundleResult:
    """Write the self-sufficient copy of ``repository`` to ``out`` (which must not exist).

    ``environment`` reuses a folder ``pack_environment`` made (one pack for many bundles);
    otherwise the running Python is packed with ``extra_distributions`` beside the library's own.
    """
    repository, out = Path(repository), Path(out)
    if not repository.is_dir():
        raise BundleError(f"model repository {str(repository)!r} is not a folder")
    if out.exists():
        raise BundleError(f"{str(out)!r} already exists; remove it or bundle into a new folder")
    steps = _python_steps(repository)
    if not steps:
        raise BundleError(
            f"{str(repository)!r} has no python-backend model; it needs no Python environment"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        if environment is None:
            progress("packing the Python environment")
            packed = envs.pack_environment(
                staging / ".environment",
                envs.serving_distributions(extra_distributions),
                progress=progress,
            )
        else:
            packed = envs.read_packed(environment)
        stub = _stub_for(packed.python_version)
        staged = staging / "repository"
        envs.link_tree(repository, staged)
        env_file = ENV_ARCHIVE if archive else ENV_FOLDER
        if archive:
            progress(f"archiving the environment into {ENV_ARCHIVE} (a minute or two for ~1.5 GB)")
            envs.archive(packed.path, staging / ENV_ARCHIVE)
        for step in steps:
            progress(
                f"{step}: {env_file}, the Python {packed.python_version} stub, EXECUTION_ENV_PATH"
            )
            model_dir = staged / step
            for stale in (ENV_FOLDER, ENV_ARCHIVE, STUB_NAME):
                _remove(model_dir / stale)
            if archive:
                os.link(staging / ENV_ARCHIVE, model_dir / ENV_ARCHIVE)
            else:
                envs.link_tree(packed.path, model_dir / ENV_FOLDER)
            shutil.copy2(stub, model_dir / STUB_NAME)
            _set_execution_env(model_dir / "config.pbtxt", f"$$TRITON_MODEL_DIRECTORY/{env_file}")
        os.rename(staged, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BundleResult(out, steps, packed)


def _python_steps(repository: Path) -> list[str]:
    steps = []
    for config_file in sorted(repository.glob("*/config.pbtxt")):
        config = configs.from_pbtxt(config_file.read_text())
        if config.backend == "python":
            steps.append(config_file.parent.name)
    return steps


def _stub_for(python_version: str) -> Path:
    root = wheel.pytriton_server_root()
    stub = root / "python_backend_stubs" / python_version / STUB_NAME if root is not None else None
    if stub is None or not stub.is_file():
        raise BundleError(
            f"no python-backend stub for Python {python_version} found (they ship in the"
            " nvidia-pytriton wheel: `pip install 'merlin-torch-serving[server]'`)"
        )
    return stub


def _set_execution_env(config_file: Path, value: str) -> None:
    config = configs.from_pbtxt(config_file.read_text())
    config.parameters[configs.EXECUTION_ENV_PARAMETER].string_value = value
    config_file.unlink()  # a hard link into the source repository: never write through it
    config_file.write_text(configs.to_pbtxt(config))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
