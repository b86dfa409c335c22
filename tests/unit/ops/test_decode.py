import numpy as np
import pandas as pd
import pytest
from merlin.dag import ColumnSelector
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import CategoryVocabulary, DecodeItemIds, Ensemble, SchemaError, TopK


def vocabulary():
    # ids 0-2 reserved, 3 -> 500, 4 -> 731, 5 -> 512
    raw = np.array([-1, -1, -1, 500, 731, 512])
    return CategoryVocabulary("item_id", raw, raw >= 0)


def test_vocabulary_from_workflow_knows_reserved_ids_and_raw_values(toy_workflow):
    vocab = CategoryVocabulary.from_workflow(toy_workflow, "item_id")
    assert vocab.reserved_ids == [0, 1, 2]
    one_row = pd.DataFrame({"session_id": [1], "item_id": [503], "category": [0], "timestamp": [0]})
    encoded = toy_workflow.transform(one_row)["item_id-list"][0][0]
    assert vocab.decode(np.array([encoded])).tolist() == [503]


def test_vocabulary_of_an_unknown_column_names_the_known_ones(toy_workflow):
    with pytest.raises(
        ValueError, match=r"no fitted Categorify vocabulary for 'price'.*'category', 'item_id'"
    ):
        CategoryVocabulary.from_workflow(toy_workflow, "price")


def test_decode_maps_ids_to_raw_values_and_reserved_ids_to_missing():
    assert vocabulary().decode(np.array([[3, 5], [0, 99]])).tolist() == [[500, 512], [-1, -1]]


def test_decode_item_ids_decodes_its_columns_and_passes_the_others():
    op = DecodeItemIds(vocabulary())
    table = TensorTable(
        {"item_ids": np.array([[4, 3]]), "item_scores": np.array([[0.5, 0.25]], dtype=np.float32)}
    )
    result = op.transform(ColumnSelector(["item_ids", "item_scores"]), table)
    assert result["item_ids"].values.tolist() == [[731, 500]]
    assert result["item_scores"].values.tolist() == [[0.5, 0.25]]


def test_decode_item_ids_after_topk_keeps_scores_and_raw_dtype():
    schema = Schema([ColumnSchema("scores", dtype="float32", dims=(None, 6))])
    ensemble = Ensemble(
        ["scores"] >> TopK(2, exclude_ids=[0, 1, 2]) >> DecodeItemIds(vocabulary()), schema
    )
    result = ensemble.run(
        TensorTable({"scores": np.array([[9, 9, 9, 0.1, 0.3, 0.2]], dtype=np.float32)})
    )
    assert result["item_ids"].values.tolist() == [[731, 512]]
    assert ensemble.output_schema.column_names == ["item_ids", "item_scores"]


def test_decode_item_ids_names_a_missing_column():
    schema = Schema([ColumnSchema("scores", dtype="float32", dims=(None, 6))])
    with pytest.raises(
        SchemaError, match=r"'item_ids' at the input of DecodeItemIds\('item_id'\).*no such column"
    ):
        Ensemble(["scores"] >> DecodeItemIds(vocabulary()), schema)
