import re

import pytest
import torch

from merlin_torch_serving.ops.torch_module import WireModel, pad_dense, pad_ragged

MAX = 4


def ragged(rows):
    values = torch.tensor([v for row in rows for v in row], dtype=torch.int64)
    lengths = torch.tensor([len(row) for row in rows])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)
    return values, offsets


@pytest.mark.parametrize(
    ("row", "right_padded", "left_padded"),
    [
        ([7], [7, 0, 0, 0], [0, 0, 0, 7]),  # length 1
        ([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]),  # length max
        (
            [1, 2, 3, 4, 5, 6, 7, 8, 9],
            [6, 7, 8, 9],
            [6, 7, 8, 9],
        ),  # length max + 5: the last items stay
    ],
)
def test_pad_ragged_pads_short_rows_and_keeps_the_most_recent_items(row, right_padded, left_padded):
    values, offsets = ragged([row])
    assert pad_ragged(values, offsets, MAX, 0.0, False).tolist() == [right_padded]
    assert pad_ragged(values, offsets, MAX, 0.0, True).tolist() == [left_padded]


def test_pad_ragged_handles_mixed_lengths_and_empty_rows_in_one_batch():
    values, offsets = ragged([[1], [], [2, 3, 4, 5, 6, 7], [8, 9]])
    dense = pad_ragged(values, offsets, MAX, -1.0, False)
    assert dense.tolist() == [[1, -1, -1, -1], [-1, -1, -1, -1], [4, 5, 6, 7], [8, 9, -1, -1]]
    assert dense.dtype == torch.int64


def test_pad_ragged_with_no_values_gives_all_padding():
    values, offsets = ragged([[], []])
    assert pad_ragged(values, offsets, 3, 0.0, False).tolist() == [[0, 0, 0], [0, 0, 0]]


def test_pad_ragged_keeps_float_values():
    values = torch.tensor([0.5, 1.5])
    offsets = torch.tensor([0, 2], dtype=torch.int32)
    assert pad_ragged(values, offsets, 3, 0.0, False).tolist() == [[0.5, 1.5, 0.0]]


def test_pad_dense_truncates_to_the_last_items_and_pads_by_side():
    dense = torch.tensor([[1, 2, 3, 4, 5, 6]])
    assert pad_dense(dense, 4, 0.0, False).tolist() == [[3, 4, 5, 6]]
    short = torch.tensor([[1, 2]])
    assert pad_dense(short, 4, 0.0, False).tolist() == [[1, 2, 0, 0]]
    assert pad_dense(short, 4, 0.0, True).tolist() == [[0, 0, 1, 2]]


class Echo(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]):
        return inputs["items"], inputs["weight"]


def test_scripted_wire_model_pads_ragged_inputs_and_passes_dense_ones():
    module = torch.jit.script(WireModel(Echo(), ["items"], [3], ["weight"]))
    values, offsets = ragged([[1, 2, 3, 4], [5]])
    items, weight = module(
        {"items__values": values, "items__offsets": offsets, "weight": torch.ones(2)}
    )
    assert items.tolist() == [[2, 3, 4], [5, 0, 0]]
    assert weight.tolist() == [1.0, 1.0]


def test_scripted_wire_model_accepts_an_already_padded_list():
    module = torch.jit.script(WireModel(Echo(), ["items"], [3], ["weight"]))
    items, _ = module({"items": torch.tensor([[1, 2, 3, 4, 5]]), "weight": torch.ones(1)})
    assert items.tolist() == [[3, 4, 5]]


def scripted_wire_model():
    class Sum(torch.nn.Module):
        def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            return inputs["items"].sum(1)

    return torch.jit.script(WireModel(Sum(), ["items"], [MAX], [], id_limits={"items": 9}))


@pytest.mark.parametrize(
    ("values", "offsets", "message"),
    [
        (
            [1, 2, 3],
            [0, 2, 1, 3],
            (
                r"input column 'items__offsets': expected offsets from 0 up to"
                r" len\('items__values'\) = 3"
            ),
        ),
        ([1, 2, 3], [1, 3], r"input column 'items__offsets': .*got offsets from 1 to 3"),
        ([1, 2, 3], [0, 2], r"input column 'items__offsets': .*got offsets from 0 to 2"),
        ([1, 2, 3], [0, 4], r"input column 'items__offsets': .*got offsets from 0 to 4"),
        (
            [1, 2, 30],
            [0, 3],
            (
                r"input column 'items': expected ids from 0 to 9 \(the model's catalog\), got ids"
                r" from 1 to 30"
            ),
        ),
        ([-1, 2], [0, 2], r"input column 'items': expected ids from 0 to 9 .*got ids from -1 to 2"),
    ],
)
def test_wire_model_refuses_bad_offsets_and_ids_outside_the_catalog_in_torchscript(
    values, offsets, message
):
    model = scripted_wire_model()
    inputs = {
        "items__values": torch.tensor(values),
        "items__offsets": torch.tensor(offsets, dtype=torch.int32),
    }
    with pytest.raises(torch.jit.Error) as error:
        model(inputs)
    assert re.search(message, str(error.value).strip().splitlines()[-1])


def test_wire_model_answers_empty_sessions_and_requests_without_rows():
    model = scripted_wire_model()
    answer = model(
        {
            "items__values": torch.tensor([4, 5]),
            "items__offsets": torch.tensor([0, 0, 2], dtype=torch.int32),
        }
    )
    assert answer.tolist() == [0, 9]
    empty = model(
        {
            "items__values": torch.zeros(0, dtype=torch.int64),
            "items__offsets": torch.zeros(1, dtype=torch.int32),
        }
    )
    assert empty.tolist() == []


def test_wire_model_refuses_inputs_of_different_row_counts_which_would_broadcast():
    class Sum(torch.nn.Module):
        def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            return inputs["a"].sum(1) + inputs["b"].sum(1)

    model = torch.jit.script(WireModel(Sum(), ["a", "b"], [MAX, MAX], []))
    two_rows, one_row = ragged([[1], [2]]), ragged([[1, 2]])
    inputs = {
        "a__values": two_rows[0],
        "a__offsets": two_rows[1],
        "b__values": one_row[0],
        "b__offsets": one_row[1],
    }
    with pytest.raises(torch.jit.Error) as error:
        model(inputs)
    assert (
        str(error.value)
        .strip()
        .splitlines()[-1]
        .endswith("input column 'b': expected 2 rows, like 'a', got 1 rows")
    )
