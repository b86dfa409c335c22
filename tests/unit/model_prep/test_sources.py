import pytest
import torch
from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

from merlin_torch_serving import ModelPreparationError, SchemaError
from merlin_torch_serving.model_prep.sources import load_model
from tests import any_models, toy_session


@pytest.fixture(scope="module")
def t4r_model(toy_workflow):
    from examples.session_based import model

    return model.build_model(
        toy_workflow.output_schema, max_sequence_length=toy_session.MAX_SEQUENCE_LENGTH, d_model=16
    ).eval()


def test_a_torchscript_file_loads_as_torchscript(tmp_path):
    torch.jit.save(torch.jit.script(any_models.DictScores()), str(tmp_path / "m.pt"))
    module, schema = load_model(tmp_path / "m.pt")
    assert isinstance(module, torch.jit.ScriptModule)
    assert schema is None


def test_a_torch_save_file_of_a_module_loads_the_eager_module(tmp_path):
    torch.save(any_models.SignedRowSum(), tmp_path / "m.pt")
    module, _ = load_model(tmp_path / "m.pt")
    assert isinstance(module, any_models.SignedRowSum)


def test_a_state_dict_file_says_it_needs_its_model(tmp_path):
    torch.save(any_models.PositionalScorer().state_dict(), tmp_path / "weights.pt")
    with pytest.raises(
        ModelPreparationError,
        match="holds a OrderedDict, not a module; a state_dict needs its model",
    ):
        load_model(tmp_path / "weights.pt")


def test_a_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no model at .*nowhere\.pt"):
        load_model(tmp_path / "nowhere.pt")


def test_a_transformers4rec_save_folder_loads_the_model_with_its_schemas(t4r_model, tmp_path):
    t4r_model.save(tmp_path)
    module, schema = load_model(tmp_path)
    assert type(module) is type(t4r_model)
    assert not module.training
    assert schema is None
    assert module.input_schema.column_names == t4r_model.input_schema.column_names
    inputs = {
        name: torch.ones(2, toy_session.MAX_SEQUENCE_LENGTH, dtype=torch.int64)
        for name in module.input_schema.column_names
    }
    with torch.no_grad():
        assert torch.equal(module(dict(inputs)), t4r_model(dict(inputs)))


def test_a_schema_file_in_the_save_folder_gives_the_input_schema_of_the_models_columns(
    t4r_model, toy_workflow, tmp_path
):
    t4r_model.save(tmp_path)
    TensorflowMetadata.from_merlin_schema(toy_workflow.output_schema).to_proto_text_file(
        str(tmp_path)
    )
    _, schema = load_model(tmp_path)
    assert schema.column_names == t4r_model.input_schema.column_names
    assert schema == toy_workflow.output_schema.select_by_name(schema.column_names)


def test_a_schema_file_without_a_model_column_names_it(t4r_model, toy_workflow, tmp_path):
    t4r_model.save(tmp_path)
    partial = toy_workflow.output_schema.select_by_name(["session_id", "item_id-list"])
    TensorflowMetadata.from_merlin_schema(partial).to_proto_text_file(str(tmp_path))
    with pytest.raises(SchemaError, match=r"column 'category-list'.*schema\.pbtxt"):
        load_model(tmp_path)


def test_a_folder_without_a_model_pickle_says_what_it_expected(tmp_path):
    with pytest.raises(
        ModelPreparationError,
        match=r"expected one model pickle \(t4rec_model_class\.pkl.*found none",
    ):
        load_model(tmp_path)
