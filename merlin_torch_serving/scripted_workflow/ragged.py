"""TorchScript helpers over the columns a scripted workflow passes between its kernels.

A step's columns are ``values`` (one tensor per column) and ``offsets`` (int64 row offsets, only for
list columns), and its row count. These functions are the ragged-list arithmetic every kernel
shares, written once in TorchScript so that libtorch and in-process runs execute the same code.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import torch

from merlin_torch_serving.aot import exportable

#: what every kernel takes and returns: (values, offsets of list columns, rows)
Columns = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]


def offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """int64 offsets ``[0, l0, l0 + l1, ...]`` of rows of the given lengths."""
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths.to(torch.int64), 0)
    return offsets


def segment_positions(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The flat positions ``starts[r] + 0 .. starts[r] + lengths[r] - 1`` of every row, in order.

    Each output position is its index plus its row's shift (``starts[r]`` minus where the row
    lands); the shifts are laid down as increments at each row's landing place and summed up,
    which costs a few vector operations and no per-row loop.
    """
    lands = offsets_from_lengths(lengths)
    total = 0
    exporting = False
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():  # the total, known when the package runs
            exporting, total = True, exportable.size_of(lands[-1])
    if not exporting:
        total = int(lands[-1])
    shifts = starts.to(torch.int64) - lands[:-1]
    increments = shifts.clone()
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if exporting:  # the same, with no slice that a package could not size for no rows
            increments = shifts - exportable.shifted(shifts)
    if not exporting:
        increments[1:] -= shifts[:-1]
    steps = torch.zeros(total + 1, dtype=torch.int64).index_add_(0, lands[:-1], increments)
    return torch.arange(total, dtype=torch.int64) + torch.cumsum(steps[:total], 0)


def take_rows(
    values: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The list rows at positions ``rows``, in that order: their values and new offsets."""
    starts = offsets[:-1].index_select(0, rows)
    lengths = offsets[1:].index_select(0, rows) - starts
    positions = segment_positions(starts, lengths)
    return values.index_select(0, positions), offsets_from_lengths(lengths)


def take(columns: Columns, rows: torch.Tensor) -> Columns:
    """Every column's rows at positions ``rows``, in that order."""
    values, offsets, _ = columns
    taken: dict[str, torch.Tensor] = {}
    taken_offsets: dict[str, torch.Tensor] = {}
    for name, column in values.items():
        if name in offsets:
            taken[name], taken_offsets[name] = take_rows(column, offsets[name], rows)
        else:
            taken[name] = column.index_select(0, rows)
    return taken, taken_offsets, rows.shape[0]


def refusal(column: str, expected: str, got: str) -> str:
    """A refused input's message, in the shape ``InputError.from_message`` reads back (TorchScript
    has no f-strings)."""
    return "input column '" + column + "': expected " + expected + ", got " + got


def check_offsets(name: str, values: torch.Tensor, offsets: torch.Tensor):
    """Offsets must start at 0, never decrease and end at the number of values."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            exportable.assert_offsets(name, values, offsets)
            return
    column = name + "__offsets"  # wire.OFFSETS_SUFFIX (TorchScript reads no globals)
    expected = (
        "offsets from 0 up to len('"
        + name
        + "__values') = "
        + str(values.shape[0])
        + ", never decreasing"
    )
    if offsets.dim() != 1 or offsets.shape[0] == 0:
        raise ValueError(refusal(column, expected, "no offsets"))
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0 or last != values.shape[0] or bool((offsets[1:] < offsets[:-1]).any()):
        got = "offsets from " + str(first) + " to " + str(last) + " or going back"
        raise ValueError(refusal(column, expected, got))


def integer_cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Floats to integers as pandas' ``astype`` casts them: refused when one is NaN or infinite."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            torch._assert_async(
                torch.isfinite(values).all(),
                "Cannot convert non-finite values (NA or inf) to integer",
            )
            return values.to(dtype)
    if bool((~torch.isfinite(values)).any()):
        raise ValueError("Cannot convert non-finite values (NA or inf) to integer")
    return values.to(dtype)


def to_datetime_ns(values: torch.Tensor, nanoseconds: int) -> torch.Tensor:
    """Integers in a unit as pandas' ``to_datetime`` makes them: int64 nanoseconds since 1970,
    refused outside what datetime64[ns] holds, as pandas refuses them."""
    bound = 9223372036854775807 // nanoseconds
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            torch._assert_async(
                ((values <= bound) & (values >= -bound)).all(),
                "cannot convert input to datetime: a value lies outside 1677-09-21 to 2262-04-11",
            )
            return values * nanoseconds
    if bool(((values > bound) | (values < -bound)).any()):
        raise ValueError(
            "cannot convert input to datetime: a value lies outside 1677-09-21 to 2262-04-11"
            + " (pandas: OutOfBoundsDatetime)"
        )
    return values * nanoseconds


def column_min(values: torch.Tensor) -> torch.Tensor:
    """The column's smallest value, NaN skipped (NaN if all are), as pandas' ``Series.min``."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            return exportable.column_extreme(values, smallest=True)
    if values.is_floating_point():
        present = values[~torch.isnan(values)]
        if present.numel() == 0:
            return torch.full([], float("nan"), dtype=values.dtype)
        return present.min()
    return values.min()


def column_max(values: torch.Tensor) -> torch.Tensor:
    """The column's largest value, NaN skipped (NaN if all are), as pandas' ``Series.max``."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            return exportable.column_extreme(values, smallest=False)
    if values.is_floating_point():
        present = values[~torch.isnan(values)]
        if present.numel() == 0:
            return torch.full([], float("nan"), dtype=values.dtype)
        return present.max()
    return values.max()


def table_lookup(table: torch.Tensor, values: torch.Tensor, low: int) -> torch.Tensor:
    """``table[value - low]`` for each value: a function of a column of known integers, tabulated
    (values outside the table cannot arise, and are refused)."""
    positions = values.to(torch.int64) - low
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            torch._assert_async(
                ((positions >= 0) & (positions < table.shape[0])).all(),
                "a value outside the range the function was tabulated on",
            )
            return exportable.take_safely(table, positions)
    if bool(((positions < 0) | (positions >= table.shape[0])).any()):
        raise ValueError("a value outside the range the function was tabulated on")
    return table.index_select(0, positions)
