"""Eager models for the python backend: saved whole, by value where the server cannot import their
classes, and loaded by a fresh Python process first."""

import importlib
import sys
import textwrap
import types

import cloudpickle
import pytest
import torch

from merlin_torch_serving import ModelNotImportableError
from merlin_torch_serving.model_prep.eager import load_eager_model, save_eager_model
from tests import any_models

ROWS = {"x": torch.tensor([[1.0, -2.0, 0.5], [-3.0, 1.0, 1.0]])}


def test_an_importable_eager_model_is_saved_and_loads_with_its_state(tmp_path):
    model = any_models.PositionalScorer()
    with torch.no_grad():
        model.weights.mul_(3)
    path = save_eager_model(model, tmp_path)  # also loaded by a fresh Python process
    loaded = load_eager_model(path)
    assert isinstance(loaded, any_models.PositionalScorer)
    assert not loaded.training
    assert torch.equal(loaded.weights, model.weights)


def test_a_class_defined_in_a_function_is_saved_by_value_and_answers_as_before(tmp_path):
    class Local(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(3.0))

        def forward(self, inputs):
            return torch.stack(
                [row.sum() * self.scale if row.sum() > 0 else row.max() for row in inputs["x"]]
            )

    model = Local().eval()
    loaded = load_eager_model(save_eager_model(model, tmp_path))
    with torch.no_grad():
        assert torch.equal(loaded(ROWS), model(ROWS))


def test_a_class_of_a_module_made_in_this_process_is_saved_by_value(tmp_path, monkeypatch):
    # a module that exists only in this interpreter, as one made in a notebook would
    module = types.ModuleType("made_in_a_notebook")
    exec(
        "import torch\nclass Scorer(torch.nn.Module):\n    def forward(self, inputs):\n       "
        " return inputs['x'].sum(1) * 2\n",
        module.__dict__,
    )
    monkeypatch.setitem(sys.modules, "made_in_a_notebook", module)

    loaded = load_eager_model(save_eager_model(module.Scorer(), tmp_path))
    assert torch.equal(loaded(ROWS), module.Scorer()(ROWS))


def write_module(folder, name: str, source: str) -> types.ModuleType:
    """``name`` written into ``folder`` and imported from there, as a notebook imports the file
    beside it: the server, started elsewhere, cannot import it."""
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


@pytest.fixture
def private_folder(tmp_path, monkeypatch):
    folder = tmp_path / "beside_the_notebook"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)  # the server's working directory: the module is not under it
    yield folder
    for name in [name for name in sys.modules if name.startswith("beside_")]:
        del sys.modules[name]


def test_a_class_of_a_module_only_this_process_can_import_is_saved_by_value(
    private_folder, tmp_path
):
    module = write_module(
        private_folder,
        "beside_scorers",
        """
        import torch

        OFFSET = 0.25  # a module global the class reads: saved along with it

        def shifted(values):
            return values + OFFSET

        class Scorer(torch.nn.Module):
            def forward(self, inputs):
                return torch.stack([shifted(row).sum() for row in inputs["x"]])
        """,
    )
    model = module.Scorer()

    path = save_eager_model(model, tmp_path)

    assert "beside_scorers" not in cloudpickle.list_registry_pickle_by_value(), (
        "the user's own cloudpickle calls are left as they were"
    )
    assert torch.equal(load_eager_model(path)(ROWS), model(ROWS))


def test_a_module_saved_by_value_that_holds_a_lock_is_named_in_the_export_error(
    private_folder, tmp_path
):
    module = write_module(
        private_folder,
        "beside_locked",
        """
        import threading

        import torch

        LOCK = threading.Lock()

        class Guarded(torch.nn.Module):
            def forward(self, inputs):
                with LOCK:
                    return inputs["x"].sum(1)
        """,
    )
    with pytest.raises(
        ModelNotImportableError,
        match=(
            r"model class 'beside_locked.Guarded' cannot be loaded by the server's Python \(pickle"
            r" cannot save it: cannot pickle '_thread.lock' object \(with the module\(s\)"
            r" 'beside_locked' saved by value\)\)"
        ),
    ) as error:
        save_eager_model(module.Guarded(), tmp_path)
    assert error.value.class_path == "beside_locked.Guarded"


class RereadsItsTable(torch.nn.Module):
    """Reads a file again when unpickled: where the file is gone, it cannot load."""

    def __init__(self, table_path):
        super().__init__()
        self.table_path = str(table_path)

    def __setstate__(self, state):
        super().__setstate__(state)
        with open(self.table_path) as table:
            self.table = table.read()

    def forward(self, inputs):
        return inputs["x"].sum(1)


def test_a_model_that_cannot_be_loaded_in_a_fresh_process_is_named_with_the_reason(tmp_path):
    model = RereadsItsTable(tmp_path / "gone.txt")

    with pytest.raises(
        ModelNotImportableError,
        match=(
            r"model class '.*RereadsItsTable' cannot be loaded by the server's Python \(a fresh"
            r" Python process could not load it: FileNotFoundError: .*gone\.txt'\)"
        ),
    ):
        save_eager_model(model, tmp_path)
