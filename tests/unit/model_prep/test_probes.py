import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.model_prep.probes import probe_inputs

SESSION = ColumnSchema(
    "items", dtype="int64", dims=(None, (0, 4)), properties={"domain": {"min": 0, "max": 30}}
)
PRICE = ColumnSchema("price", dtype="float32", dims=(None,))
COUNT = ColumnSchema("count", dtype="int64", dims=(None, 2))
SCHEMA = Schema([SESSION, PRICE, COUNT])


def test_probes_vary_the_batch_size():
    sizes = {probe.inputs["price"].shape[0] for probe in probe_inputs(SCHEMA)}
    assert {1, 3, 8} <= sizes
    assert len(sizes) >= 4


def test_probes_hold_sessions_from_one_item_to_the_full_length_padded_as_the_model_gets_them():
    lengths = set()
    for probe in probe_inputs(SCHEMA, pad_value=0):
        items = probe.inputs["items"]
        assert items.shape[1] == 4
        assert items.dtype == torch.int64
        lengths |= set((items != 0).sum(1).tolist())
    assert {1, 2, 4} <= lengths


def test_left_padding_puts_the_padding_first():
    (probe,) = [
        p
        for p in probe_inputs(SCHEMA, pad_value=-1, pad_left=True)
        if p.name.startswith("4 rows of zeros")
    ]
    assert probe.inputs["items"][:, :3].eq(-1).all()
    assert probe.inputs["items"][:, 3].ne(-1).all()


def test_probes_cover_negative_positive_zero_and_large_floats():
    prices = torch.cat([probe.inputs["price"] for probe in probe_inputs(SCHEMA)])
    assert (prices < 0).any()
    assert (prices > 0).any()
    assert (prices == 0).any()
    assert prices.abs().max() > 1e3
    assert any(bool((p.inputs["price"] < 0).all()) for p in probe_inputs(SCHEMA))
    alternating = next(p for p in probe_inputs(SCHEMA) if "alternating" in p.name).inputs["price"]
    assert (alternating[0::2] > 0).all()
    assert (alternating[1::2] < 0).all()


def test_integers_with_a_domain_stay_inside_it_and_reach_both_edges():
    values = torch.cat([probe.inputs["items"].flatten() for probe in probe_inputs(SCHEMA)])
    assert values.min() == 0
    assert values.max() == 30


def test_integers_without_a_domain_include_negative_values():
    values = torch.cat([probe.inputs["count"].flatten() for probe in probe_inputs(SCHEMA)])
    assert values.min() < 0
    assert values.max() > 0


def test_a_sample_comes_first_and_bounds_integers_without_a_domain():
    sample = {
        "items": torch.ones(2, 4, dtype=torch.int64),
        "price": torch.ones(2),
        "count": torch.tensor([[5, 7], [6, 5]]),
    }
    probes = probe_inputs(SCHEMA, sample=sample)
    assert probes[0].name == "the sample"
    assert probes[0].inputs["count"] is sample["count"]
    values = torch.cat([probe.inputs["count"].flatten() for probe in probes])
    assert values.min() == 5
    assert values.max() == 7


def test_probes_are_the_same_every_time():
    first, second = probe_inputs(SCHEMA), probe_inputs(SCHEMA)
    assert all(
        torch.equal(a.inputs[n], b.inputs[n])
        for a, b in zip(first, second, strict=True)
        for n in SCHEMA.column_names
    )
