"""Eager models for the python backend: saved whole, and loaded by a fresh Python process first."""

import sys
import types

import pytest
import torch

from merlin_torch_serving import ModelNotImportableError
from merlin_torch_serving.model_prep.eager import load_eager_model, save_eager_model
from tests import any_models


def test_an_importable_eager_model_is_saved_and_loads_with_its_state(tmp_path):
    model = any_models.PositionalScorer()
    with torch.no_grad():
        model.weights.mul_(3)
    path = save_eager_model(model, tmp_path)  # also loaded by a fresh Python process
    loaded = load_eager_model(path)
    assert isinstance(loaded, any_models.PositionalScorer)
    assert not loaded.training
    assert torch.equal(loaded.weights, model.weights)


def test_a_class_defined_in_a_function_is_named_in_the_export_error(tmp_path):
    class Local(torch.nn.Module):
        def forward(self, inputs):
            return inputs["x"]

    with pytest.raises(
        ModelNotImportableError,
        match=(
            r"model class"
            r" '.*test_a_class_defined_in_a_function_is_named_in_the_export_error\.<locals>\.Local'"
            r" cannot be imported"
        ),
    ):
        save_eager_model(Local(), tmp_path)


def test_a_class_only_this_process_can_import_is_named_in_the_export_error(tmp_path, monkeypatch):
    # a module that exists only in this interpreter, as one made in a notebook would
    module = types.ModuleType("made_in_a_notebook")
    exec(
        "import torch\nclass Scorer(torch.nn.Module):\n    def forward(self, inputs):\n       "
        " return inputs['x']\n",
        module.__dict__,
    )
    monkeypatch.setitem(sys.modules, "made_in_a_notebook", module)

    with pytest.raises(
        ModelNotImportableError,
        match=(
            r"model class 'made_in_a_notebook.Scorer' cannot be imported by the server's Python"
            r" \(ModuleNotFoundError: No module named 'made_in_a_notebook'\)"
        ),
    ) as error:
        save_eager_model(module.Scorer(), tmp_path)
    assert error.value.class_path == "made_in_a_notebook.Scorer"
