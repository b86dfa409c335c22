"""What the library's wire modules do instead while ``torch.export`` traces them.

A compiled package cannot raise a Python error, read a tensor's value into a Python ``int`` or
branch on it. So here a check is an assertion the package keeps (``torch._assert_async``), with a
message that names the column as ``InputError`` does (``InputError.from_message`` reads it back:
a served request the package refuses gets the named error, without the values Python would have
quoted); and every gather is total: it reads from a tensor with one padding element more, at
indices clamped into it, so that no request, however malformed, makes compiled code read outside
a tensor, and the assertion that names the problem is what the caller sees.

The modules call these only under ``if not torch.jit.is_scripting(): if
torch.compiler.is_exporting():``, which TorchScript does not compile: the TorchScript form keeps its
own checks, which quote the values.
"""

from typing import cast

import torch


def refusal(column: str, expected: str, got: str) -> str:
    return f"input column '{column}': expected {expected}, got {got}"


def shifted(values: torch.Tensor) -> torch.Tensor:
    """``values`` moved one place on, a 0 first: element ``i`` is ``values[i - 1]``. A gather, not
    ``values[:-1]`` (whose size a package compiled for any size may take as ``n - 1`` even where
    ``n`` is 0) nor a slice of ``cat([0, values])`` (AOTInductor reused that buffer for a result
    computed from it in place, and read it back overwritten: torch 2.13)."""
    positions = torch.arange(values.shape[0])
    previous = values.index_select(0, (positions - 1).clamp(min=0))
    return torch.where(positions == 0, torch.zeros_like(previous), previous)


def assert_offsets(name: str, values: torch.Tensor, offsets: torch.Tensor) -> None:
    """Offsets must be there, start at 0, never decrease and end at the number of values; checked
    element by element, with no index computed from their count (see ``at_least_rows``)."""
    count = offsets.shape[0]
    positions = torch.arange(count)
    valid = (
        (torch.full([], count) > 0)
        & ((offsets == 0) | (positions != 0)).all()
        & ((offsets == values.shape[0]) | (positions != count - 1)).all()
        & (offsets >= shifted(offsets)).all()
    )
    torch._assert_async(
        valid,
        refusal(
            name + "__offsets",
            f"offsets from 0 up to len('{name}__values'), never decreasing",
            "offsets that are not",
        ),
    )


def assert_ids(name: str, values: torch.Tensor, limit: int) -> None:
    """Ids must lie in ``[0, limit]``, the model's catalog."""
    torch._assert_async(
        ((values >= 0) & (values <= limit)).all(),
        refusal(name, f"ids from 0 to {limit} (the model's catalog)", "ids outside it"),
    )


def assert_rows(name: str, rows, first: str, expected_rows) -> None:
    """Column ``name`` must hold as many rows as ``first``."""
    torch._assert_async(
        torch.full([], rows) == expected_rows,
        refusal(name, f"as many rows as '{first}'", "another number of rows"),
    )


def rows_like(tensor: torch.Tensor, rows, fill: float = 0) -> torch.Tensor:
    """``tensor``'s first ``rows`` rows, rows past its end holding ``fill``: ``tensor`` itself
    when it has ``rows`` rows, and never a read outside it when it has not."""
    pad = torch.full([1, *tensor.shape[1:]], fill, dtype=tensor.dtype)
    index = torch.arange(rows).clamp(max=tensor.shape[0])
    return torch.cat([tensor, pad])[index]


def gather_padded(values: torch.Tensor, index: torch.Tensor, fill: float) -> torch.Tensor:
    """``values[index]`` where ``index`` is in ``[0, len(values))``, ``fill`` elsewhere."""
    padded = torch.cat([values, torch.full([1], fill, dtype=values.dtype)])
    inside = (index >= 0) & (index < values.shape[0])
    return padded[torch.where(inside, index, torch.full_like(index, values.shape[0]))]


def at_least_rows(
    features: dict[str, torch.Tensor], rows, min_rows: int, pads: dict[str, float]
) -> dict[str, torch.Tensor]:
    """``features`` (``rows`` rows) taken to ``max(rows, min_rows)`` rows, pad rows past their
    last: a model then multiplies at least that many rows whatever the request, as TorchScript's
    wrapper does (``tensors.batch_invariance``), and never a batch it can only bound by 0
    (AOTInductor's matrix products cannot be compiled for such a batch). Gathered by
    ``rows_like``, so that no row count, however wrong, reads outside a tensor."""
    taller_rows = torch.sym_max(rows, min_rows)
    return {
        name: rows_like(tensor, taller_rows, pads.get(name, 0)) for name, tensor in features.items()
    }


def first_rows(tensor: torch.Tensor, rows) -> torch.Tensor:
    """The first ``rows`` rows of ``tensor``, which has at least that many (``at_least_rows``'s
    output): gathered, so that the result has ``rows`` rows to export's eyes as well (a slice's
    size, ``min(rows, max(rows, 4))``, is one export cannot always simplify to ``rows``)."""
    return tensor.index_select(0, torch.arange(rows))


def fetched_count(seen_rows: torch.Tensor, rows, fewest: int, catalog) -> int:
    """How many of each row's best items a top-k selection fetches: ``fewest`` plus the most items
    one row has seen, at most the catalog (a size the package learns at run time)."""
    # index_add rather than bincount, which AOTInductor has no C shim for
    counts = torch.zeros(rows + 1, dtype=torch.int64).index_add_(
        0, seen_rows, torch.ones_like(seen_rows)
    )
    # a SymInt while exporting (int() would specialise it), typed as the int it stands for
    fetched = cast(int, torch.clamp(counts.max() + fewest, max=catalog).item())
    torch._check(fetched >= fewest)
    torch._check(fetched <= catalog)
    return fetched


def size_of(count: torch.Tensor):
    """A one-element count tensor as the size it is: a SymInt the package reads at run time."""
    size = count.item()
    torch._check(size >= 0)
    return size


def take_safely(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``values.index_select(0, positions)`` with positions outside ``values`` reading a row of
    zeros past it rather than outside it: for lookups whose misses are masked."""
    padded = torch.cat([values, values.new_zeros([1, *values.shape[1:]])])
    return padded.index_select(0, positions.clamp(0, values.shape[0]))


def column_extreme(values: torch.Tensor, smallest: bool) -> torch.Tensor:
    """A column's smallest or largest value, NaN skipped, NaN when it holds none (pandas')."""
    bound = float("inf") if smallest else float("-inf")
    if values.is_floating_point():
        present = ~torch.isnan(values)
        filled = torch.where(present, values, torch.full_like(values, bound))
        extreme = torch.cat([filled, filled.new_full([1], bound)])
        found = extreme.amin() if smallest else extreme.amax()
        return torch.where(present.any(), found, torch.full_like(found, float("nan")))
    info = torch.iinfo(values.dtype)
    edge = torch.full([1], info.max if smallest else info.min, dtype=values.dtype)
    padded = torch.cat([values, edge])
    return padded.amin() if smallest else padded.amax()


def fixed_rows(name: str, values: torch.Tensor, lengths: torch.Tensor, rows, width: int):
    """A list column declared ``width`` values per row, as ``[rows, width]``: every row must hold
    that many (an assertion), and its values are read within ``values`` whatever they hold."""
    torch._assert_async(
        (lengths == width).all(),
        f"output column '{name}' is a list of {width} values per row in the output schema, but a"
        " row holds another number; pad the list (ListSlice(pad=True)) or declare it ragged",
    )
    positions = torch.arange(rows * width, dtype=torch.int64)
    return take_safely(values, positions).reshape([rows, width])
