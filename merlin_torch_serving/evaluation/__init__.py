"""The read-out of an answer log: answers joined with the clicks that came after them (``join``),
per variant, branch and overall metrics with intervals (``readout``, ``intervals``), as a table
(``report``) and a chart (``chart``), and the impressions dataset (``impressions``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import pandas as pd

from merlin_torch_serving.evaluation.clicks import ClickColumns, read_clicks
from merlin_torch_serving.evaluation.readout import Readout

__all__ = ["ClickColumns", "Readout", "evaluate_answers", "read_clicks"]

#: the defaults: next clicks within half an hour of an answer, judged at 5 and 10 items
WINDOW = pd.Timedelta(minutes=30)
KS = (5, 10)


def evaluate_answers(
    log,
    clicks: pd.DataFrame | str | os.PathLike,
    *,
    window: pd.Timedelta | str | float = WINDOW,
    ks: Sequence[int] = KS,
    catalog: int | Iterable | None = None,
    control: str | None = None,
    columns: ClickColumns | None = None,
    session_id_key: str | None = None,
) -> Readout:
    """Read out an answer log against the clicks that followed its answers.

    ``log``: the log (a folder, a ``ParquetFolder`` or ``RedisStream``, or ``read_answers``'
    DataFrame); ``clicks``: a DataFrame or a parquet/CSV file, its columns named by ``columns``;
    ``window``: how long after an answer a click counts (a Timedelta, ``"30min"``, or seconds);
    ``ks``: the list lengths judged; ``catalog``: its size or items, for coverage; ``control``:
    the variant the others are compared with (the one with most sessions by default);
    ``session_id_key``: the key the log hashed session ids with.
    """
    from merlin_torch_serving.answer_log.reader import read_answers
    from merlin_torch_serving.evaluation.join import join
    from merlin_torch_serving.evaluation.readout import read_out

    answers = log if isinstance(log, pd.DataFrame) else read_answers(log)
    window = (
        pd.Timedelta(seconds=window) if isinstance(window, int | float) else pd.Timedelta(window)
    )
    if window <= pd.Timedelta(0):
        raise ValueError(f"window must be a positive time span, got {window!r}")
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be list lengths of 1 or more, got {ks!r}")
    joined = join(answers, read_clicks(clicks, columns, session_id_key), window, sorted(set(ks)))
    return read_out(joined, catalog=catalog, control=control)
