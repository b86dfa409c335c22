"""A step's warm-up sample on disk: one file per input in Triton's raw ``input_data_file`` format
(``model_warmup`` reads them), in the ``warmup`` folder beside the step's versions. Batched python
steps read the same files back to warm up in their own stub (see ``python_model``). An ensemble's
folder holds the request the steps' samples came from, in the same form, which the launcher sends
through the whole ensemble once it loads (``launcher.warmup``; Triton warms no ensemble).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from merlin.schema import Schema

from merlin_torch_serving.data import wire

#: the folder of a step model (beside its versions) that holds its warm-up sample
WARMUP_DIR = "warmup"
#: in an ensemble's WARMUP_DIR: its request sample's files and how many times to send it
REQUEST_SAMPLE_FILE = "request.json"


def write_warmup_files(
    warmup_dir: Path, input_schema: Schema, arrays: Mapping[str, np.ndarray]
) -> dict:
    """Write the sample; returns input name -> (file name, config dtype, dims)."""
    return write_warmup_arrays(
        warmup_dir,
        {
            spec.name: np.ascontiguousarray(arrays[spec.name], dtype=spec.dtype)
            for spec in wire.schema_specs(input_schema)
        },
    )


def write_warmup_arrays(warmup_dir: Path, arrays: Mapping[str, np.ndarray]) -> dict:
    """Write ``arrays`` (input name -> array) as the sample, in place of any sample there."""
    if warmup_dir.exists():
        shutil.rmtree(warmup_dir)
    warmup_dir.mkdir()
    files = {}
    for i, (name, array) in enumerate(arrays.items()):
        file_name = f"input_{i}"
        (warmup_dir / file_name).write_bytes(_raw_bytes(np.ascontiguousarray(array)))
        config_dtype = wire.TensorSpec(name, array.dtype, array.shape).config_dtype
        files[name] = (file_name, config_dtype, array.shape)
    return files


def read_warmup_files(warmup_dir: str, files: Mapping[str, list]) -> dict[str, np.ndarray]:
    """The sample ``write_warmup_files`` wrote, from what it returned."""
    arrays = {}
    for name, (file_name, dtype, dims) in files.items():
        with open(os.path.join(warmup_dir, file_name), "rb") as f:
            data = f.read()
        numpy_dtype = wire.numpy_dtype(dtype)
        if numpy_dtype == np.dtype(object):
            values, position = [], 0
            while position < len(data):
                size = int.from_bytes(data[position : position + 4], "little")
                values.append(data[position + 4 : position + 4 + size])
                position += 4 + size
            array = np.array(values, dtype=object)
        else:
            array = np.frombuffer(data, dtype=numpy_dtype).copy()
        arrays[name] = array.reshape(dims)
    return arrays


def write_request_sample(ensemble_dir: Path, arrays: Mapping[str, np.ndarray], count: int) -> None:
    """Save ``arrays`` (the ensemble's input tensors, as a client sends them) as its request
    sample, to be sent ``count`` times."""
    files = write_warmup_arrays(ensemble_dir / WARMUP_DIR, arrays)
    (ensemble_dir / WARMUP_DIR / REQUEST_SAMPLE_FILE).write_text(
        json.dumps(
            {
                "count": count,
                "inputs": {
                    name: [f, dtype, list(dims)] for name, (f, dtype, dims) in files.items()
                },
            }
        )
    )


def read_request_sample(ensemble_dir: Path) -> tuple[dict[str, np.ndarray], int] | None:
    """The request sample of the ensemble in ``ensemble_dir`` and its count; None without one."""
    path = ensemble_dir / WARMUP_DIR / REQUEST_SAMPLE_FILE
    if not path.is_file():
        return None
    sample = json.loads(path.read_text())
    return read_warmup_files(str(ensemble_dir / WARMUP_DIR), sample["inputs"]), int(sample["count"])


def _raw_bytes(array: np.ndarray) -> bytes:
    if array.dtype != np.dtype(object):
        return array.tobytes()
    # BYTES elements: a 4-byte little-endian length, then the bytes
    chunks = []
    for value in array.ravel():
        data = value if isinstance(value, bytes) else str(value).encode("utf-8")
        chunks.append(len(data).to_bytes(4, "little") + data)
    return b"".join(chunks)
