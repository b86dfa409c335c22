"""The sequence length comes from the model: Transformers4Rec's sequence features, else the explicit
argument, else the schema; a schema or argument that disagrees with the model is a SchemaError."""

import numpy as np
import pytest
import torch
import transformers4rec.torch as tr
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, PredictPytorch, SchemaError

MODEL_LENGTH = 20
CATALOG = 30


def item_lists(max_length: int | None) -> Schema:
    """An item-id list column as ValueCount leaves it: value_count is the longest list seen."""
    dims = (None, (1, max_length)) if max_length else (None, None)
    return Schema(
        [
            ColumnSchema(
                "item_id-list",
                tags=[Tags.ITEM, Tags.ID, Tags.CATEGORICAL, Tags.LIST],
                dtype="int64",
                dims=dims,
                properties={"domain": {"min": 0, "max": CATALOG - 1, "name": "item_id"}},
            )
        ]
    )


def xlnet(
    schema: Schema, *, features_length: int = MODEL_LENGTH, model_length: int | None = None
) -> tr.Model:
    torch.manual_seed(0)
    inputs = tr.TabularSequenceFeatures.from_schema(
        schema, max_sequence_length=features_length, masking="mlm", d_output=16
    )
    config = tr.XLNetConfig.build(d_model=16, n_head=2, n_layer=1, total_seq_length=features_length)
    body = tr.SequentialBlock(inputs, tr.TransformerBlock(config, masking=inputs.masking))
    head = tr.Head(body, tr.NextItemPredictionTask(weight_tying=True), inputs=inputs)
    return tr.Model(head, max_sequence_length=model_length).eval()


@pytest.fixture(scope="module")
def model_whose_schema_saw_shorter_lists():
    return xlnet(item_lists(13))


def test_transformers4rec_model_pads_to_its_features_length_not_to_its_schemas_statistic(
    model_whose_schema_saw_shorter_lists,
):
    model = model_whose_schema_saw_shorter_lists
    op = PredictPytorch(model, backend="python")
    assert op.model_input_schema["item_id-list"].shape.dims[1].max == MODEL_LENGTH

    # a session of 16 clicks: longer than the schema's 13, shorter than the model's 20
    session = np.arange(3, 19, dtype=np.int64)
    served = Ensemble(["item_id-list"] >> op, item_lists(13)).run(
        TensorTable({"item_id-list": (session, np.array([0, len(session)], dtype=np.int32))})
    )
    dense = torch.zeros((1, MODEL_LENGTH), dtype=torch.int64)
    dense[0, : len(session)] = torch.from_numpy(session)
    with torch.no_grad():
        eager = model({"item_id-list": dense}).numpy()
    # tolerance: the traced model runs the same float32 ops; only kernel choices may differ
    np.testing.assert_allclose(served["next-item"].values, eager, rtol=0, atol=1e-5)


def test_an_explicit_length_that_contradicts_the_transformers4rec_model_names_both(
    model_whose_schema_saw_shorter_lists,
):
    with pytest.raises(
        SchemaError, match=r"'item_id-list'.*own sequence length, 20.*max_sequence_length=13"
    ):
        PredictPytorch(model_whose_schema_saw_shorter_lists, max_sequence_length=13)


def test_a_schema_with_longer_lists_than_the_transformers4rec_model_reads_names_both(
    model_whose_schema_saw_shorter_lists,
):
    with pytest.raises(
        SchemaError, match=r"'item_id-list'.*at most 20 items.*lists of 30 items.*ListSlice\(-20\)"
    ):
        PredictPytorch(model_whose_schema_saw_shorter_lists, input_schema=item_lists(30))


def test_a_model_whose_length_differs_from_its_sequence_features_names_both():
    model = xlnet(item_lists(13), model_length=10)
    with pytest.raises(SchemaError, match=r"built for 20 items.*Model\(max_sequence_length=10\)"):
        PredictPytorch(model)


class LastItem(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.catalog = CATALOG

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        items = inputs["item_id-list"]
        return torch.nn.functional.one_hot(items[:, -1], self.catalog).float()


OUTPUT = Schema([ColumnSchema("scores", dtype="float32", dims=(None, CATALOG))])


def test_torchscript_model_takes_the_explicit_length_over_its_schemas_statistic():
    op = PredictPytorch(
        torch.jit.script(LastItem()), item_lists(13), OUTPUT, max_sequence_length=20
    )
    assert op.model_input_schema["item_id-list"].shape.dims[1].max == 20


def test_torchscript_model_without_an_explicit_length_pads_to_its_schemas_maximum():
    op = PredictPytorch(torch.jit.script(LastItem()), item_lists(7), OUTPUT)
    assert op.model_input_schema["item_id-list"].shape.dims[1].max == 7


def test_torchscript_schema_with_longer_lists_than_the_explicit_length_names_both():
    with pytest.raises(
        SchemaError, match=r"at most 5 items \(max_sequence_length is 5\).*lists of 13 items"
    ):
        PredictPytorch(torch.jit.script(LastItem()), item_lists(13), OUTPUT, max_sequence_length=5)
