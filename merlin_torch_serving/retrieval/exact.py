"""Exact top-k by inner product, scored a block of items at a time.

Scoring the whole catalog first (``[rows, catalog]`` floats), copying it to mask exclusions and
reading it again to rank reads and writes three times what one pass needs; at a million items
that is most of the time for a batch of sessions. Here each block of items is scored, masked and
reduced to its ``k`` best while it is still in cache, and merged into a running top-k. Each score
is the same ``query @ items.T`` product (then the same division by the temperature) that a
Transformers4Rec model computes, element by element, so the ids and scores are the model's own.

TorchScript-compatible, so it runs the same in-process, in the python backend and in libtorch.
"""

import torch

from merlin_torch_serving.retrieval.selection import best_of_rows
from merlin_torch_serving.tensors.batch_invariance import MIN_ROWS, repeated_rows

#: items per block: at a million items, scoring and selecting 65,536 items at a time took 32
#: sessions 0.65 times as long as TopK's scoring of the whole catalog then selecting from it, and
#: one session 1.1 to 1.2 times as long (the catalog sweep, one thread; before TopK selected long
#: rows in two passes, one session took half as long here)
DEFAULT_BLOCK_ITEMS = 65536


def exact_top_k(
    queries: torch.Tensor,
    item_vectors: torch.Tensor,
    k: int,
    excluded_ids: torch.Tensor,
    seen_values: torch.Tensor | None = None,
    seen_offsets: torch.Tensor | None = None,
    temperature: float = 0.0,
    block_items: int = DEFAULT_BLOCK_ITEMS,
    min_rows: int = MIN_ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and scores of the ``k`` highest ``queries @ item_vectors.T`` per row, best first.

    ``excluded_ids`` are never returned; ``seen_values`` / ``seen_offsets`` (a ragged list per
    row; offsets ``None`` for a dense ``[rows, L]`` list) name each row's own exclusions. Ids
    outside the catalog are ignored. Scores are divided by ``temperature`` when it is above 0.
    Rows with fewer than ``k`` items left get id -1 and score -inf in the remaining places.
    Blocks are of even size (no last block of a few items) and at least 256 items: below that
    torch may take another kernel (a matrix-vector product at one item) whose sums round
    differently from those of the whole catalog's product; for the same reason fewer than
    ``min_rows`` queries are scored repeated (see ``batch_invariance``).
    """
    answered = queries.shape[0]
    if 0 < answered < min_rows:  # scored in a taller batch, as models score (batch_invariance)
        queries = queries[repeated_rows(answered, min_rows)]
    rows = queries.shape[0]
    catalog = item_vectors.shape[0]
    blocks = max(1, -(-catalog // max(block_items, 256)))
    block_items = -(-catalog // blocks)
    best_scores = torch.full((rows, k), float("-inf"), dtype=queries.dtype)
    best_ids = torch.full((rows, k), -1, dtype=torch.int64)
    seen_rows, seen_ids = seen_pairs(answered, seen_values, seen_offsets)
    for start in range(0, catalog, block_items):
        end = min(start + block_items, catalog)
        scores = torch.matmul(queries, item_vectors[start:end].t())
        if temperature > 0.0:
            scores = torch.div(scores, temperature)
        excluded = excluded_ids[(excluded_ids >= start) & (excluded_ids < end)]
        if excluded.numel() > 0:
            scores[:, excluded - start] = float("-inf")
        inside = (seen_ids >= start) & (seen_ids < end)
        if bool(inside.any()):
            scores[seen_rows[inside], seen_ids[inside] - start] = float("-inf")
        block_scores, block_ids = best_of_rows(scores, min(k, end - start))
        merged_scores = torch.cat([best_scores, block_scores], dim=1)
        merged_ids = torch.cat([best_ids, block_ids + start], dim=1)
        order = torch.topk(merged_scores, k, dim=1, largest=True, sorted=True).indices
        best_scores = torch.gather(merged_scores, 1, order)
        best_ids = torch.gather(merged_ids, 1, order)
    best_ids = torch.where(
        torch.isinf(best_scores) & (best_scores < 0), torch.full_like(best_ids, -1), best_ids
    )
    return best_ids[:answered], best_scores[:answered]


def seen_pairs(
    rows: int, seen_values: torch.Tensor | None, seen_offsets: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, item id) of every seen item, as two int64 vectors."""
    if seen_values is None:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    if seen_offsets is None:
        length = seen_values.shape[1] if seen_values.dim() > 1 else 1
        row_of_value = torch.arange(rows).repeat_interleave(length)
        return row_of_value, seen_values.reshape(-1).to(torch.int64)
    lengths = (seen_offsets[1:] - seen_offsets[:-1]).to(torch.int64)
    return torch.arange(rows).repeat_interleave(lengths), seen_values.to(torch.int64)
