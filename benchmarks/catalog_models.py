"""Next-item models of any catalog size for the catalog sweep, without training on that catalog.

The example's XLNet is trained briefly on its own clicks (a catalog of ~2,000 items). A model of N
items is the same architecture built for N items, holding the trained weights, with an item table
whose first rows are the trained items' embeddings and whose other rows are variants of them: a
trained item's embedding plus Gaussian noise of half the table's spread per dimension, so the
table clusters as trained tables do (similar items near each other); each variant keeps its
source's length. An untrained model is no use
here: its session vectors are all but equal (every session gets the same answer), so recall
against exact would be measured on one query.
"""

from __future__ import annotations

import torch

from examples.session_based import model as session_model

MAX_SEQUENCE_LENGTH = 20
D_MODEL = 64
VARIANT_NOISE = 0.5  # noise sd over the trained table's sd, per dimension


def widened_model(trained: torch.nn.Module, schema, n_items: int, seed: int = 0) -> torch.nn.Module:
    """``trained`` (built by ``session_model.build_model`` on ``schema``) with an item table of
    ``n_items`` rows: its own, then variants of them; ``trained`` itself when its table has
    ``n_items`` rows or more (the workflow encodes ids up to its own catalog)."""
    if n_items <= catalog_size(trained):
        return trained
    wide = session_model.build_model(
        schema, max_sequence_length=MAX_SEQUENCE_LENGTH, d_model=D_MODEL, n_items=n_items, seed=seed
    )
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in trained.state_dict().items():
        target = wide.state_dict()[name]
        state[name] = (
            tensor
            if tensor.shape == target.shape
            else _with_variants(tensor, target.shape[0], generator)
        )
    wide.load_state_dict(state)
    return wide.eval()


def catalog_size(t4r_model: torch.nn.Module) -> int:
    """Rows of the model's item table."""
    from merlin_torch_serving.model_prep.next_item import next_item_scoring

    return int(next_item_scoring(t4r_model).item_vectors.shape[0])


def _with_variants(table: torch.Tensor, rows: int, generator: torch.Generator) -> torch.Tensor:
    extra = rows - table.shape[0]
    sources = torch.randint(0, table.shape[0], (extra,), generator=generator)
    noise = (
        torch.randn(extra, table.shape[1], generator=generator) * table.std(dim=0) * VARIANT_NOISE
    )
    variants = table[sources] + noise
    # each variant as long as its source: an inner product favours long vectors, and noise alone
    # would make every variant longer than the trained items
    variants *= table[sources].norm(dim=1, keepdim=True) / variants.norm(dim=1, keepdim=True)
    return torch.cat([table, variants])
