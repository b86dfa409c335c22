"""Clicks simulated from the example's held-out sessions: each session replayed click by click
against a graph that answers (served or in-process), its next click taken from the data and stamped
with the time it is made, after the answer it follows.

At step t every session of t clicks or more sends its first t clicks (one request for all of them,
as many users clicking at once), right after its click t is written down with the time now; the
graph logs the answers; the next step writes click t + 1 down, so each click comes after the answer
it may have been drawn to (a session's last answer is followed by none). The clicks file has the
data's columns and ``clicked_at`` (seconds since the epoch, wall time): the read-out joins the log
with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

CLICKED_AT = "clicked_at"


def replay(
    sessions: pd.DataFrame,
    answer: Callable[[pd.DataFrame], pd.DataFrame],
    clicks_path: str | Path,
    *,
    progress: bool = True,
) -> pd.DataFrame:
    """Replay ``sessions`` (raw clicks) through ``answer`` and write the clicks, stamped, to
    ``clicks_path`` (parquet); returns them."""
    ordered = sessions.sort_values(["session_id", "timestamp"], kind="stable")
    position = ordered.groupby("session_id").cumcount().to_numpy()
    longest = int(position.max()) + 1
    made = []
    for step in range(1, longest + 1):
        clicked = ordered[position == step - 1].assign(**{CLICKED_AT: time.time()})
        made.append(clicked)
        request = ordered[ordered["session_id"].isin(clicked["session_id"]) & (position < step)]
        answer(request)
        if progress and step % 10 == 0:
            print(f"  step {step}/{longest}: {len(request['session_id'].unique())} sessions")
    stamped = pd.concat(made, ignore_index=True)
    Path(clicks_path).parent.mkdir(parents=True, exist_ok=True)
    stamped.to_parquet(clicks_path, index=False)
    return stamped
