"""Requests whose columns are named otherwise than the model's inputs: a mapping from the
caller's names to the inputs' (``{"user_session": "session_id"}``), given in code or on the
command line as ``user_session=session_id,item=item_id``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import pandas as pd

from merlin_torch_serving.data import frames
from merlin_torch_serving.exceptions import InputError


def parse(text: str) -> dict[str, str]:
    """``"a=x,b=y"`` -> ``{"a": "x", "b": "y"}``.

    A malformed pair is a ValueError that shows the form.
    """
    mapping = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        yours, sep, theirs = (side.strip() for side in pair.partition("="))
        if not sep or not yours or not theirs:
            raise ValueError(
                "write column mappings as YOURS=INPUT,... (e.g. user_session=session_id), got"
                f" {pair!r}"
            )
        mapping[yours] = theirs
    return mapping


def argument(text: str) -> dict[str, str]:
    """``parse`` as an argparse ``type=``: a malformed mapping is a usage error, not a traceback."""
    try:
        return parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def rename(data: pd.DataFrame | Mapping[str, object], mapping: Mapping[str, str] | None):
    """``data`` with its columns renamed through ``mapping`` (the caller's name -> the input's).
    A mapped column the data lacks, or a rename onto a column it already has, is an InputError."""
    if not mapping:
        return data
    _check(list(data.columns) if isinstance(data, pd.DataFrame) else list(data), mapping)
    if isinstance(data, pd.DataFrame):
        return data.rename(columns=dict(mapping))
    return {mapping.get(name, name): values for name, values in data.items()}


def columns_of(
    data: pd.DataFrame | Mapping[str, object], mapping: Mapping[str, str] | None
) -> dict[Any, object]:
    """``data``'s columns (a DataFrame's as the arrays it holds) under the inputs' names:
    ``rename`` without building a renamed DataFrame."""
    columns: dict[Any, object] = (
        frames.frame_columns(data) if isinstance(data, pd.DataFrame) else dict(data.items())
    )
    if not mapping:
        return columns
    _check(list(columns), mapping)
    return {mapping.get(name, name): values for name, values in columns.items()}


def answer_names(mapping: Mapping[str, str] | None) -> dict[str, str]:
    """Input name -> the caller's name, for answer columns named like a mapped input."""
    return {theirs: yours for yours, theirs in mapping.items()} if mapping else {}


def _check(names: list, mapping: Mapping[str, str]) -> None:
    for yours, theirs in mapping.items():
        if yours not in names:
            raise InputError(
                yours,
                "a column of the request (the mapping renames it)",
                "no such column",
                f"the request has {', '.join(map(repr, names)) or 'no columns'}; fix the mapping"
                f" {yours}={theirs}",
            )
        if theirs in names and theirs not in mapping:
            raise InputError(
                theirs,
                f"one column of that name, after renaming {yours!r} to it",
                "two",
                "drop one of them",
            )


def restore(frame: pd.DataFrame, mapping: Mapping[str, str] | None) -> pd.DataFrame:
    """The answer, with the columns that are mapped inputs under the caller's names again.

    Such a column is an input that comes back, like the session id.
    """
    if not mapping:
        return frame
    back = {theirs: yours for yours, theirs in mapping.items() if theirs in frame.columns}
    return frame.rename(columns=back) if back else frame
