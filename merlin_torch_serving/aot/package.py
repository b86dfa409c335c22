"""A package (``.pt2``) loaded in this process and called as Triton's pytorch backend, with the
project's change, calls it: one tensor per input, found by the name the package's call spec gives
it (never by the order a caller lists its inputs in: a dict flattened in another key order would
feed one column in place of another), its outputs in order.

The package's code is checked against this CPU first (``instruction_sets.check_cpu``), and every
input against the dtype and rank it was compiled for (``INPUTS_KEY``): compiled code reads a
tensor's memory as the type it expects, whatever it is given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from merlin_torch_serving.aot.instruction_sets import check_cpu
from merlin_torch_serving.exceptions import InputError, PackageError

#: the model a package holds (a package may hold several; a step serves one)
MODEL_NAME = "model"
#: metadata key: JSON ``{input name: [dtype, rank]}``
INPUTS_KEY = "input_tensors"
_DICT_TYPES = ("builtins.dict", "collections.OrderedDict", "collections.defaultdict")


class CompiledPackage:
    """The package at ``path``; ``label`` names what it computes in errors."""

    def __init__(self, path: str | os.PathLike, label: str):
        self.path = Path(path)
        self.label = label
        loader_class = torch._C._aoti.AOTIModelPackageLoader
        try:
            metadata = loader_class.load_metadata_from_package  # type: ignore[attr-defined]
            self.metadata = dict(metadata(str(path), MODEL_NAME))
        except RuntimeError as error:
            raise PackageError(
                f"{label}: {str(path)!r} is not an AOTInductor package: {error}"
            ) from error
        check_cpu(self.metadata, self.path, label)
        self._loader = loader_class(str(path), MODEL_NAME, False, 1, -1)
        self.input_names = input_names(self._loader.get_call_spec()[0])
        self.inputs: dict[str, list] = json.loads(self.metadata.get(INPUTS_KEY, "{}"))

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """The package's outputs for ``inputs`` (by name; others are ignored)."""
        ordered = []
        for name in self.input_names:
            if name not in inputs:
                raise InputError(name, "a tensor", "no such input", model=self.label)
            tensor = inputs[name]
            if name in self.inputs:
                dtype, rank = self.inputs[name]
                if str(tensor.dtype).removeprefix("torch.") != dtype or tensor.dim() != rank:
                    raise InputError(
                        name,
                        f"a {rank}-dimensional tensor of {dtype}",
                        f"a {tensor.dim()}-dimensional tensor of {tensor.dtype}",
                        model=self.label,
                    )
            ordered.append(tensor.contiguous())
        with torch.inference_mode():
            return self._loader.run(ordered)

    def __reduce__(self):
        # loaded again from its file (a loader holds the compiled library, which does not pickle)
        return (CompiledPackage, (self.path, self.label))

    def __deepcopy__(self, memo) -> CompiledPackage:
        return self  # nothing in it changes after loading


def input_names(in_spec: str) -> list[str]:
    """The names of a package's inputs, in the order it takes them, from its serialized input
    spec (``[version, tree]``): each tensor is named by the dict key it sits under."""
    names: list[str] = []

    def collect(node: dict, key: str | None) -> None:
        if node["type"] is None:
            if key is None:
                raise PackageError(
                    f"the package's input number {len(names)} is a positional argument, without"
                    " a name; export a forward that takes one Dict[str, Tensor]"
                )
            names.append(key)
            return
        children = node["children_spec"]
        keys = json.loads(node["context"]) if node["type"] in _DICT_TYPES else None
        for position, child in enumerate(children):
            collect(child, keys[position] if keys is not None else key)

    collect(json.loads(in_spec)[1], None)
    if len(set(names)) != len(names):
        raise PackageError(f"the package names two inputs alike: {names}")
    return names


def tensor_signature(example: Mapping[str, torch.Tensor]) -> str:
    """``INPUTS_KEY``'s value for a package compiled on ``example``."""
    return json.dumps(
        {
            name: [str(tensor.dtype).removeprefix("torch."), tensor.dim()]
            for name, tensor in example.items()
        },
        sort_keys=True,
    )
