"""The clicks a read-out joins with the answer log: one row per click (session, item, time), from
a DataFrame or a parquet or CSV file, checked and put in one form (times as UTC timestamps, session
ids hashed as the log hashed them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from merlin_torch_serving.answer_log.records import session_hash
from merlin_torch_serving.exceptions import AnswerLogError


@dataclass(frozen=True)
class ClickColumns:
    """The names of the clicks' columns: the session, the item clicked, and when (seconds since
    the epoch, or datetimes; naive datetimes are taken as UTC)."""

    session: str = "session_id"
    item: str = "item_id"
    time: str = "timestamp"


def read_clicks(
    source: pd.DataFrame | str | os.PathLike,
    columns: ClickColumns | None = None,
    session_id_key: str | None = None,
) -> pd.DataFrame:
    """``session_id``, ``item_id`` and ``clicked_at`` (UTC) of every click of ``source``, in time
    order; ``session_id_key``: hash the session ids as a log kept with that key did."""
    columns = columns or ClickColumns()
    frame = _frame(source)
    missing = [name for name in (columns.session, columns.item, columns.time) if name not in frame]
    if missing:
        raise AnswerLogError(
            f"the clicks have no column {missing[0]!r} (they have"
            f" {', '.join(map(repr, frame.columns))}); name the session, item and time columns"
            " (--session-column, --item-column, --time-column; ClickColumns(...))"
        )
    sessions = frame[columns.session].to_numpy()
    clicks = pd.DataFrame(
        {
            "session_id": session_hash(sessions, session_id_key) if session_id_key else sessions,
            "item_id": frame[columns.item].to_numpy(),
            "clicked_at": _utc(frame[columns.time], columns.time),
        }
    )
    return clicks.sort_values(["clicked_at"], kind="stable").reset_index(drop=True)


def _frame(source) -> pd.DataFrame:
    if isinstance(source, pd.DataFrame):
        return source
    path = Path(source)
    if not path.exists():
        raise AnswerLogError(f"no clicks at {str(path)!r}; pass a parquet or CSV file of clicks")
    if not (path.is_dir() or path.suffix in (".parquet", ".csv")):
        raise AnswerLogError(
            f"the clicks file {str(path)!r} is neither parquet nor CSV; pass a .parquet or .csv"
            " file"
        )
    try:
        return pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    except (OSError, ValueError) as error:  # pyarrow's and pandas' errors of a broken file
        raise AnswerLogError(
            f"the clicks at {str(path)!r} cannot be read ({type(error).__name__}: {error}); pass"
            " a whole parquet or CSV file of clicks"
        ) from error


def _utc(times: pd.Series, name: str) -> pd.Series:
    """``times`` as UTC timestamps: numbers are seconds since the epoch."""
    if pd.api.types.is_datetime64_any_dtype(times):
        stamps = pd.to_datetime(times)
        return stamps.dt.tz_localize("UTC") if stamps.dt.tz is None else stamps.dt.tz_convert("UTC")
    if pd.api.types.is_numeric_dtype(times):
        return pd.to_datetime(times.astype(np.float64), unit="s", utc=True)
    raise AnswerLogError(
        f"the clicks' time column {name!r} holds {times.dtype} values; give seconds since the"
        " epoch or datetimes"
    )
