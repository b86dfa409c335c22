"""Item indexes: described by specs, built, saved and loaded, and searched.

A search applies each row's exclusions.
"""

import numpy as np
import pytest
import torch

from merlin_torch_serving import ExactIndex, HNSWIndex, IVFIndex
from merlin_torch_serving.retrieval.indexes import build_index, load_index
from merlin_torch_serving.retrieval.specs import index_spec, to_config

CATALOG, DIMENSION, K = 5_000, 16, 10
EXCLUDED = [0, 1, 2]


@pytest.fixture(scope="module")
def items():
    """Clustered vectors, as trained item embeddings are (approximate indexes need structure)."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((50, DIMENSION))
    return torch.from_numpy(
        (
            centres[rng.integers(0, 50, CATALOG)] + 0.3 * rng.standard_normal((CATALOG, DIMENSION))
        ).astype(np.float32)
    )


@pytest.fixture(scope="module")
def queries():
    return torch.randn(40, DIMENSION, generator=torch.Generator().manual_seed(1))


def seen_lists(exact_ids):
    """Each row has seen two of its own best items and an id outside the catalog."""
    values = torch.stack(
        [exact_ids[:, 0], exact_ids[:, 3], torch.full_like(exact_ids[:, 0], CATALOG + 7)], 1
    ).reshape(-1)
    return values, torch.arange(0, len(values) + 1, 3)


def search(index, queries, seen=(None, None), temperature=0.0):
    return index.search(queries, K, torch.tensor(EXCLUDED), seen[0], seen[1], temperature)


def name(spec):
    return f"{spec.kind}-{spec.codes}" if isinstance(spec, IVFIndex) else spec.kind


@pytest.mark.parametrize(
    "spec",
    [
        ExactIndex(),
        HNSWIndex(m=16),
        IVFIndex(lists=32, probes=32),
        IVFIndex(lists=32, probes=32, codes="sq8"),
    ],
    ids=name,
)
def test_index_never_returns_excluded_or_seen_items(items, queries, spec):
    exact_ids, _ = search(build_index(ExactIndex(), items, EXCLUDED), queries)
    seen = seen_lists(exact_ids)
    ids, scores = search(build_index(spec, items, EXCLUDED), queries, seen)
    for row, (values, seen_row) in enumerate(
        zip(ids.tolist(), seen[0].reshape(-1, 3).tolist(), strict=True)
    ):
        assert len(set(values)) == K
        assert -1 not in values
        assert not set(values) & (set(EXCLUDED) | set(seen_row)), f"row {row}"
    assert torch.all(scores[:, :-1] >= scores[:, 1:])  # best first


def test_ivf_probing_every_list_finds_the_exact_items(items, queries):
    exact_ids, exact_scores = search(build_index(ExactIndex(), items, EXCLUDED), queries)
    ids, scores = search(build_index(IVFIndex(lists=16, probes=16), items, EXCLUDED), queries)
    assert torch.equal(ids, exact_ids)
    torch.testing.assert_close(scores, exact_scores, rtol=0, atol=1e-4)


def recall_at_k(ids, exact_ids) -> float:
    return float(
        np.mean(
            [
                len(set(a) & set(b)) / K
                for a, b in zip(ids.tolist(), exact_ids.tolist(), strict=True)
            ]
        )
    )


@pytest.mark.parametrize(
    "spec", [HNSWIndex(m=16), IVFIndex(lists=64, probes=8, codes="sq8")], ids=name
)
def test_recall_at_10_against_exact_is_at_least_0_95(items, queries, spec):
    exact_ids, _ = search(build_index(ExactIndex(), items, EXCLUDED), queries)
    ids, _ = search(build_index(spec, items, EXCLUDED), queries)
    recall = recall_at_k(ids, exact_ids)
    assert recall >= 0.95, f"recall@10 {recall:.3f}"


def test_sq8_codes_rerank_to_the_exact_scores_of_what_they_find(items, queries):
    ids, scores = search(
        build_index(IVFIndex(lists=64, probes=8, codes="sq8"), items, EXCLUDED), queries
    )
    exact = (queries @ items.T).gather(1, ids)
    torch.testing.assert_close(scores, exact, rtol=0, atol=1e-4)


def test_sq8_codes_with_every_list_probed_find_the_exact_items(items, queries):
    exact_ids, _ = search(build_index(ExactIndex(), items, EXCLUDED), queries)
    spec = IVFIndex(lists=16, probes=16, codes="sq8")
    ids, _ = search(build_index(spec, items, EXCLUDED), queries)
    assert torch.equal(ids, exact_ids)


def test_approximate_scores_are_divided_by_the_temperature(items, queries):
    index = build_index(HNSWIndex(m=16), items, EXCLUDED)
    ids, scores = search(index, queries)
    cooled_ids, cooled = search(index, queries, temperature=0.5)
    assert torch.equal(ids, cooled_ids)
    torch.testing.assert_close(cooled, scores / 0.5)


@pytest.mark.parametrize(
    "spec",
    [
        ExactIndex(block_items=1_000),
        HNSWIndex(m=8, ef_search=40),
        IVFIndex(lists=8, probes=2),
        IVFIndex(lists=8, probes=2, codes="sq8", rerank=2),
    ],
    ids=name,
)
def test_a_saved_index_loads_and_answers_the_same(items, queries, spec, tmp_path):
    built = build_index(spec, items, EXCLUDED)
    built.save(str(tmp_path))
    loaded = load_index(index_spec(to_config(spec)), str(tmp_path), CATALOG)
    for got, want in zip(search(loaded, queries), search(built, queries), strict=True):
        assert torch.equal(got, want)
    assert loaded.spec == spec
    assert (loaded.catalog_size, loaded.dimension) == (CATALOG, DIMENSION)


def test_index_spec_reads_names_and_configs():
    assert index_spec("hnsw") == HNSWIndex()
    assert index_spec({"kind": "ivf", "lists": 8, "probes": 2}) == IVFIndex(8, 2)
    assert index_spec(ExactIndex(block_items=512)) == ExactIndex(512)
    sq8 = IVFIndex(lists=8, probes=2, codes="sq8", rerank=3)
    assert index_spec(to_config(sq8)) == sq8


def test_index_spec_refuses_unknown_kinds_and_bad_knobs():
    with pytest.raises(
        ValueError,
        match=(
            r"index must be ExactIndex\(\), HNSWIndex\(...\), IVFIndex\(...\) or one of 'exact',"
            r" 'hnsw', 'ivf', got 'flat'"
        ),
    ):
        index_spec("flat")
    with pytest.raises(ValueError, match=r"HNSWIndex.ef_search must be a positive integer, got 0"):
        HNSWIndex(ef_search=0)
    with pytest.raises(ValueError, match=r"IVFIndex.codes must be one of 'flat', 'sq8', got 'pq'"):
        IVFIndex(codes="pq")
    with pytest.raises(ValueError, match=r"IVFIndex.rerank must be a positive integer, got 0"):
        IVFIndex(codes="sq8", rerank=0)
