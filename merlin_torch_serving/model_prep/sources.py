"""A model given as a path: a TorchScript file, a ``torch.save`` file of a whole module, or the
folder Transformers4Rec's ``Model.save()`` writes (``t4rec_model_class.pkl``, a cloudpickle of the
model, which carries its own input and output schemas).

A Merlin schema file in that folder (``schema.pbtxt``, or ``schema.json``, as Merlin and NVTabular
write them) is read as the model's input schema, restricted to the columns the model takes.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from merlin.schema import Schema

from merlin_torch_serving.exceptions import ModelPreparationError, SchemaError

T4R_MODEL_FILE = "t4rec_model_class.pkl"
SCHEMA_FILES = ("schema.pbtxt", "schema.json")


def load_model(path: str | os.PathLike) -> tuple[torch.nn.Module, Schema | None]:
    """The module at ``path``, and the input schema a saved folder holds (``None`` if none)."""
    path = Path(path)
    if path.is_dir():
        return _load_saved_folder(path)
    if not path.exists():
        raise FileNotFoundError(
            f"no model at {str(path)!r}: pass a TorchScript file, a torch.save file or a saved"
            " model folder"
        )
    try:
        return torch.jit.load(os.fspath(path), map_location="cpu"), None
    except RuntimeError as script_error:
        try:
            module = torch.load(os.fspath(path), map_location="cpu", weights_only=False)
        except Exception:
            raise ModelPreparationError(
                str(path),
                "is neither TorchScript nor a torch.save file"
                f" ({str(script_error).splitlines()[0]})",
            ) from script_error
    if not isinstance(module, torch.nn.Module):
        raise ModelPreparationError(
            str(path),
            f"holds a {type(module).__name__}, not a module",
            "a state_dict needs its model: build the model, load_state_dict, and pass the module",
        )
    return module, None


def _load_saved_folder(folder: Path) -> tuple[torch.nn.Module, Schema | None]:
    pickles = (
        [folder / T4R_MODEL_FILE]
        if (folder / T4R_MODEL_FILE).exists()
        else sorted(folder.glob("*.pkl"))
    )
    if len(pickles) != 1:
        found = ", ".join(p.name for p in pickles) or "none"
        raise ModelPreparationError(
            str(folder),
            f"expected one model pickle ({T4R_MODEL_FILE}, as Transformers4Rec's Model.save()"
            f" writes), found {found}",
        )
    try:
        # Transformers4Rec saves with it; classes defined by value need it to load
        import cloudpickle
    except ImportError:  # pragma: no cover - installed with Transformers4Rec
        cloudpickle = pickle
    with open(pickles[0], "rb") as file:
        try:
            model = cloudpickle.load(file)
        except ModuleNotFoundError as exc:
            raise ModelPreparationError(
                str(pickles[0]),
                f"needs the module {exc.name!r} to load",
                f"install the package that provides {exc.name!r}",
            ) from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelPreparationError(
            str(pickles[0]), f"holds a {type(model).__name__}, not a torch module"
        )
    return model.eval(), _schema_file_input_schema(folder, model)


def _schema_file_input_schema(folder: Path, model: torch.nn.Module) -> Schema | None:
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    present = [name for name in SCHEMA_FILES if (folder / name).exists()]
    if not present:
        return None
    name = present[0]
    if name.endswith(".pbtxt"):
        schema = TensorflowMetadata.from_proto_text_file(
            str(folder), file_name=name
        ).to_merlin_schema()
    else:
        schema = TensorflowMetadata.from_json_file(str(folder), file_name=name).to_merlin_schema()
    model_schema = getattr(model, "input_schema", None)
    if model_schema is None:
        return schema
    missing = [column for column in model_schema.column_names if column not in schema.column_names]
    if missing:
        raise SchemaError(
            "PredictPytorch",
            missing[0],
            f"the column in {str(folder / name)!r}, since the model takes it",
            f"a schema file with {', '.join(map(repr, schema.column_names))}",
        )
    return schema.select_by_name(model_schema.column_names)
