"""A tiny model compiled into an AOTInductor package by the library's own compile path, for the
tests of packages in this process and on Triton's pytorch backend, and a copy of a package that
asks for CPU features no CPU has.

The package takes ``b`` (int64 ``[rows, 3]``) and then ``a`` (float32 ``[rows, 3]``): the order its
example dict gave them, which is not the order anyone lists them in, so inputs mapped by position
would swap them. It returns ``a * 2 + b`` and ``b + 1`` and refuses negative ``b`` with a message
naming the column, as the library's wire modules refuse bad requests.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import torch

from merlin_torch_serving.aot.compiling import compiled_package, export_program
from merlin_torch_serving.aot.instruction_sets import REQUIRED_FLAGS_KEY, instruction_set

TINY_REFUSAL = "input column 'b': expected ids from 0 up, got negative ids"
#: a CPU feature no CPU has: a package asking for it is refused everywhere
MISSING_FLAG = "mts_no_such_cpu_feature"


class Tiny(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = inputs["a"], inputs["b"]
        torch._assert_async((b >= 0).all(), TINY_REFUSAL)
        return a * 2 + b.to(a.dtype), b + 1


def tiny_example(rows: int = 3) -> dict[str, torch.Tensor]:
    """``b`` first, then ``a``: the package's order."""
    return {
        "b": torch.arange(rows * 3, dtype=torch.int64).reshape(rows, 3),
        "a": torch.linspace(0, 1, rows * 3, dtype=torch.float32).reshape(rows, 3),
    }


def tiny_package() -> Path:
    """The tiny model's package, compiled for this CPU and one thread (cached by content)."""
    example = tiny_example()
    program = export_program(Tiny(), example, "Tiny")
    return compiled_package(
        program, example, label="Tiny", instruction_set=instruction_set(), threads=1
    )


def asking_for_missing_feature(package: Path, target: Path) -> Path:
    """A copy of ``package`` whose metadata says its code needs ``MISSING_FLAG``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(package) as source, zipfile.ZipFile(target, "w") as copy:
        for entry in source.infolist():
            data = source.read(entry)
            if entry.filename.endswith("_metadata.json"):
                metadata = json.loads(data)
                metadata[REQUIRED_FLAGS_KEY] = f"{metadata[REQUIRED_FLAGS_KEY]} {MISSING_FLAG}"
                data = json.dumps(metadata).encode()
            copy.writestr(entry, data)
    return target


def copy_into(package: Path, folder: Path, name: str = "model.pt2") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(package, folder / name))


def write_package_model(
    repository: Path,
    name: str,
    package: Path,
    *,
    inputs: tuple[str, ...] = ("a", "b"),
    max_batch_size: int = 0,
    instances: int = 1,
) -> Path:
    """A model folder serving ``package`` on Triton's pytorch backend, its config listing
    ``inputs`` in that order (the tiny package's are ``a``, float32, and ``b``, int64, rows of 3),
    one thread per instance; with ``max_batch_size`` Triton batches requests."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    dtypes = {"a": "TYPE_FP32", "b": "TYPE_INT64"}
    dims = [3] if max_batch_size else [-1, 3]
    config = {
        "name": name,
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "default_model_filename": "model.pt2",
        "input": [
            {"name": key, "data_type": dtypes.get(key, "TYPE_INT64"), "dims": dims}
            for key in inputs
        ],
        "output": [
            {"name": "doubled", "data_type": "TYPE_FP32", "dims": dims},
            {"name": "next", "data_type": "TYPE_INT64", "dims": dims},
        ],
        "instance_group": [{"kind": "KIND_CPU", "count": instances}],
        "parameters": {"INTRA_OP_THREAD_COUNT": {"string_value": "1"}},
    }
    if max_batch_size:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": 2000}
    folder = repository / name
    copy_into(package, folder / "1")
    text = text_format.MessageToString(
        json_format.ParseDict(config, model_config_pb2.ModelConfig())
    )
    (folder / "config.pbtxt").write_text(text)
    return folder


class DividesByRows(torch.nn.Module):
    """Integer division by the row count: compiled code divides by zero on a request of no rows,
    which kills the process that runs it (eager PyTorch raises instead)."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        a = inputs["a"]
        return torch.arange(4) % a.shape[0] + a.sum().to(torch.int64)


def dividing_package() -> Path:
    example = {"a": torch.ones(3, dtype=torch.float32)}
    program = export_program(DividesByRows(), example, "DividesByRows")
    return compiled_package(
        program, example, label="DividesByRows", instruction_set=instruction_set(), threads=1
    )
