import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, InputError, PredictPytorch, SchemaError
from merlin_torch_serving.data import frames
from tests import toy_session

ITEMS = ColumnSchema(
    "item_id-list", dtype="int64", dims=(None, (0, 4)), properties={"domain": {"min": 0, "max": 9}}
)


class LastItemTopK(torch.nn.Module):
    """Scores = one-hot of the last item; returns (scores, ids) of the 2 best, like T4R's top_k."""

    def forward(self, inputs: dict[str, torch.Tensor]):
        items = inputs["item_id-list"]
        scores = torch.nn.functional.one_hot(items[:, -1], 10).float()
        best = torch.topk(scores, 2)
        return best.values, best.indices


def test_predict_pytorch_reports_the_true_dims_of_top_k_outputs():
    declared = Schema(
        [
            ColumnSchema("item_id_scores", dtype="float32", dims=(None, 10)),  # what T4R declares
            ColumnSchema("item_ids", dtype="int64", dims=(None, 10)),
        ]
    )
    op = PredictPytorch(
        torch.jit.script(LastItemTopK()), Schema([ITEMS]), declared, backend="python"
    )
    ensemble = Ensemble(["item_id-list"] >> op, Schema([ITEMS]))
    assert ensemble.output_schema["item_id_scores"].shape.as_tuple == ((0, None), 2)
    assert ensemble.output_schema["item_ids"].shape.as_tuple == ((0, None), 2)
    assert ensemble.output_schema["item_ids"].dtype.name == "int64"


def test_predict_pytorch_pads_ragged_sessions_to_the_model_length_keeping_recent_items():
    op = PredictPytorch(
        torch.jit.script(LastItemTopK()),
        Schema([ITEMS]),
        Schema([ColumnSchema("s", dtype="float32"), ColumnSchema("i", dtype="int64")]),
        backend="python",
    )
    ensemble = Ensemble(["item_id-list"] >> op, Schema([ITEMS]))
    # rows of length 1, 4 (max) and 9 (max + 5); right padding puts 0 last for short rows
    rows = [[3], [1, 2, 3, 4], [9, 8, 7, 6, 5, 4, 3, 2, 1]]
    values = np.array([v for row in rows for v in row])
    offsets = np.array([0, 1, 5, 14], dtype=np.int32)
    result = ensemble.run(TensorTable({"item_id-list": (values, offsets)}))
    # last position: 0 (padding) for the short row, 4 for the full row, 1 for the truncated row
    assert result["i"].values[:, 0].tolist() == [0, 4, 1]


def right_padded(rows, length):
    return torch.tensor([list(row[-length:]) + [0] * (length - len(row[-length:])) for row in rows])


def test_predict_pytorch_compiles_an_eager_module_from_its_schemas(toy_workflow):
    _, input_schema, output_schema = toy_session.scripted_model(toy_workflow)
    catalog = output_schema["next-item"].shape.dims[1].max
    categories = input_schema["category-list"].properties["domain"]["max"] + 1
    eager = toy_session.PositionalSessionModel(catalog, categories, toy_session.MAX_SEQUENCE_LENGTH)
    op = PredictPytorch(eager, input_schema, output_schema, backend="python")
    features = toy_workflow.transform(toy_session.interactions(5, seed=3))

    result = Ensemble(input_schema.column_names >> op, input_schema).run(
        frames.frame_to_table(features[input_schema.column_names])
    )

    length = toy_session.MAX_SEQUENCE_LENGTH
    dense = {name: right_padded(features[name], length) for name in input_schema.column_names}
    with torch.no_grad():
        expected = eager(dense).numpy()
    np.testing.assert_allclose(result["next-item"].values, expected, rtol=1e-6)


def test_predict_pytorch_needs_schemas_for_a_model_without_them():
    with pytest.raises(SchemaError, match=r"input_schema and output_schema.*pass PredictPytorch"):
        PredictPytorch(torch.jit.script(LastItemTopK()))


def test_predict_pytorch_needs_a_maximum_length_for_ragged_inputs():
    unbounded = ColumnSchema("item_id-list", dtype="int64", dims=(None, None))
    with pytest.raises(SchemaError, match=r"'item_id-list'.*maximum length.*max_sequence_length"):
        PredictPytorch(
            torch.jit.script(LastItemTopK()),
            Schema([unbounded]),
            Schema([ColumnSchema("s", dtype="float32")]),
        )


def test_predict_pytorch_rejects_an_output_count_that_differs_from_the_schema():
    with pytest.raises(
        SchemaError, match=r"1 output\(s\) as its output_schema declares.*got 2 tensor"
    ):
        PredictPytorch(
            torch.jit.script(LastItemTopK()),
            Schema([ITEMS]),
            Schema([ColumnSchema("s", dtype="float32")]),
        )


def test_predict_pytorch_rejects_an_unknown_backend():
    with pytest.raises(
        ValueError, match=r"backend must be one of None, .pytorch., .python., got .onnx."
    ):
        PredictPytorch(
            torch.jit.script(LastItemTopK()), Schema([ITEMS]), Schema([]), backend="onnx"
        )


@pytest.mark.parametrize("execution", ["torchscript", "eager"])
def test_predict_pytorch_refuses_ids_outside_the_model_catalog_naming_the_column(
    toy_workflow, toy_model, execution
):
    _, input_schema, output_schema = toy_model
    catalog_size = input_schema["item_id-list"].properties["domain"]["max"] + 1
    categories = input_schema["category-list"].properties["domain"]["max"] + 1
    eager = toy_session.PositionalSessionModel(
        catalog_size, categories, toy_session.MAX_SEQUENCE_LENGTH
    )
    op = PredictPytorch(eager, input_schema, output_schema, backend="python", execution=execution)
    ensemble = Ensemble(input_schema.column_names >> op, input_schema)
    catalog = input_schema["item_id-list"].properties["domain"]["max"]
    request = {"item_id-list": [[3, catalog + 1]], "category-list": [[1, 2]]}
    with pytest.raises(
        InputError,
        match=(
            rf"input column 'item_id-list': expected ids from 0 to {catalog} \(the model's"
            rf" catalog\), got ids from 3 to {catalog + 1}"
        ),
    ):
        ensemble.transform(request)


def test_predict_pytorch_answers_empty_sessions_and_empty_requests(toy_model):
    scripted, input_schema, output_schema = toy_model
    ensemble = Ensemble(
        input_schema.column_names
        >> PredictPytorch(scripted, input_schema, output_schema, backend="python"),
        input_schema,
    )
    answer = ensemble.transform({"item_id-list": [[5, 6], []], "category-list": [[1, 2], []]})
    assert len(answer) == 2
    alone = ensemble.transform({"item_id-list": [[5, 6]], "category-list": [[1, 2]]})
    # a batch of another shape may round the last bit differently (float32 matmul)
    np.testing.assert_allclose(answer["next-item"][0], alone["next-item"][0], rtol=1e-5)
    assert len(ensemble.transform({"item_id-list": [], "category-list": []})) == 0
