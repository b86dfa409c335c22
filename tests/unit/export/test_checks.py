"""Export checks libtorch steps against the contract of Triton's pytorch backend: each case the
backend would refuse, misread or crash on fails the export with a message naming the model and the
column, and leaves the repository untouched (none of these models reaches a server)."""

from __future__ import annotations

import warnings

import pytest
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import Ensemble, ModelCheckError, ModelOptions, PredictPytorch, TopK
from merlin_torch_serving.export.checks import check_libtorch_return_type, check_libtorch_schemas
from tests import toy_session


class ListOfScores(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [inputs["x"].to(torch.float32).unsqueeze(1).repeat(1, 4)]


class DictOfScores(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"scores": inputs["x"].to(torch.float32).unsqueeze(1)}


class ScoresAsFloat(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]):
        return inputs["x"].to(torch.float32).unsqueeze(1).repeat(1, 4)


class IdsAsUint64(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]):
        return inputs["x"].to(torch.uint64).unsqueeze(1)


class ScoresAndCounts(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        scores = inputs["x"].to(torch.float32).unsqueeze(1)
        return scores, (scores > 0).sum(1)


def one_column(dtype: str = "int64") -> Schema:
    return Schema([ColumnSchema("x", dtype=dtype, properties={"domain": {"min": 0, "max": 9}})])


def export_libtorch(
    module, input_schema: Schema, output_schema: Schema, path, then=None, name: str = "reco"
):
    node = PredictPytorch(
        torch.jit.script(module), input_schema, output_schema, backend="pytorch"
    ).as_node()
    if then is not None:
        node = node >> then
    return Ensemble(node, input_schema).export(path, name)


@pytest.mark.parametrize("then", [None, TopK(2)], ids=["alone", "with TopK compiled in"])
def test_a_model_returning_a_list_of_tensors_reaches_libtorch_as_a_tensor(tmp_path, then):
    # PredictPytorch calls such a model through an adapter that returns its one result as a tensor
    result = export_libtorch(
        ListOfScores(), one_column(), Schema([ColumnSchema("scores")]), tmp_path / "repo", then
    )
    step = next(model for model in result.models if model != "reco")
    module = torch.jit.load(str(tmp_path / "repo" / step / "1" / "model.pt"))
    returned = module.forward.schema.returns[0].type
    assert returned.kind() in ("TensorType", "TupleType")
    check_libtorch_return_type(step, module)


def test_a_model_returning_a_dict_is_rejected():
    # PredictPytorch turns dict results into tuples; the check guards libtorch regardless
    with pytest.raises(
        ModelCheckError,
        match=(
            r"model 'reco-0-predictpytorch' failed the libtorch check: the model expected"
            r" forward\(\) to return a "
            r"Tensor or a tuple of Tensors, got a Dict\[str, Tensor\]"
        ),
    ):
        check_libtorch_return_type("reco-0-predictpytorch", torch.jit.script(DictOfScores()))


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_an_unsigned_input_wider_than_a_byte_is_rejected_naming_the_column(tmp_path, dtype):
    with pytest.raises(
        ModelCheckError,
        match=(
            rf"model 'reco-0-predictpytorch' failed the libtorch check: input column 'x' expected a"
            rf" dtype Triton's "
            rf"pytorch backend accepts \(BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, FP32,"
            rf" FP64\), got "
            rf"{dtype.upper()} \({dtype}\); cast the column to a signed integer or float type"
        ),
    ):
        export_libtorch(
            ScoresAsFloat(), one_column(dtype), Schema([ColumnSchema("scores")]), tmp_path / "repo"
        )


def test_an_unsigned_output_is_rejected_naming_the_column(tmp_path):
    with pytest.raises(
        ModelCheckError, match=r"output column 'ids' expected a dtype .* got UINT64 \(uint64\)"
    ):
        export_libtorch(
            IdsAsUint64(), one_column(), Schema([ColumnSchema("ids")]), tmp_path / "repo"
        )


def test_text_columns_cannot_cross_a_libtorch_step():
    # no operator produces text for a libtorch model today; the check still guards the contract
    names = Schema([ColumnSchema("item_name", dtype="str", dims=(None, (0, None)))])
    with pytest.raises(
        ModelCheckError,
        match=(
            r"model 'reco-1-predictpytorch' failed the libtorch check: input column 'item_name'"
            r" \(tensor "
            r"'item_name__values'\) expected a dtype .* got BYTES \(object\)"
        ),
    ):
        check_libtorch_schemas("reco-1-predictpytorch", names, Schema([]))


def test_outputs_named_with_indexes_that_disagree_with_their_positions_are_rejected(tmp_path):
    # (scores, counts) returned, but the names send 'scores__1' to the second result
    swapped = Schema([ColumnSchema("scores__1"), ColumnSchema("counts__0")])
    with pytest.raises(
        ModelCheckError,
        match=(
            r"output 'scores__1' expected to be the model's result number 1, since every output"
            r" name ends in "
            r"'__<index>' .* got it at position 0; rename the output columns"
        ),
    ):
        export_libtorch(ScoresAndCounts(), one_column(), swapped, tmp_path / "repo")


def test_outputs_named_with_indexes_that_match_their_positions_are_exported(tmp_path):
    in_order = Schema([ColumnSchema("scores__0"), ColumnSchema("counts__1")])
    result = export_libtorch(ScoresAndCounts(), one_column(), in_order, tmp_path / "repo")
    assert result.models == ["reco-0-predictpytorch", "reco"]


def test_only_outputs_that_all_end_in_an_index_are_matched_by_it(tmp_path):
    # one name without '__<digits>': the backend matches by position, so the order is what counts
    mixed = Schema([ColumnSchema("scores__1"), ColumnSchema("counts")])
    export_libtorch(ScoresAndCounts(), one_column(), mixed, tmp_path / "repo")


def test_libtorch_models_asking_for_different_thread_counts_in_one_repository_warn(
    toy_workflow, toy_model, tmp_path
):
    graph = toy_session.session_graph(toy_workflow, toy_model, backend="pytorch")
    Ensemble(graph, toy_workflow.input_schema).export(
        tmp_path, "one-thread", options=ModelOptions(torch_threads=1)
    )
    # recorded rather than pytest.warns: that re-emits the other warnings of the export (torch's
    # TorchScript deprecation) from its own frame, where the named exception no longer matches
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Ensemble(graph, toy_workflow.input_schema).export(
            tmp_path, "two-threads", options=ModelOptions(torch_threads=2)
        )
    assert [str(w.message) for w in caught if "INTRA_OP_THREAD_COUNT" in str(w.message)] == [
        "the repository's libtorch models ask for different INTRA_OP_THREAD_COUNTs"
        " ('one-thread-1-predictpytorch_topk': 1, 'two-threads-1-predictpytorch_topk': 2);"
        " Triton's pytorch backend sets torch's threads for the whole server process, so all"
        " of them run with the count of whichever model loads last. Export them with the same"
        " ModelOptions(torch_threads=...)"
    ]


def test_libtorch_models_asking_for_the_same_thread_count_do_not_warn(
    toy_workflow, toy_model, tmp_path
):
    graph = toy_session.session_graph(toy_workflow, toy_model, backend="pytorch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Ensemble(graph, toy_workflow.input_schema).export(tmp_path, "first")
        Ensemble(graph, toy_workflow.input_schema).export(tmp_path, "second")
    assert [str(w.message) for w in caught if "INTRA_OP_THREAD_COUNT" in str(w.message)] == []
