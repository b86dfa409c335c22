"""TopKCandidates: each session's k best candidates by the ranking model's score.

See ``ordering`` for the layout of its inputs and outputs; fewer than k candidates are answered
with what there is (``item_count``), the rest padded with -1 and -inf.
"""

from __future__ import annotations

from merlin.dag import Node

from merlin_torch_serving.multistage.ordering import CandidateOrdering


class TopKCandidates(CandidateOrdering):
    """Per session, the ``k`` candidates with the highest ranking scores, best first (ties: the
    candidate retrieved first): ``item_ids`` and ``item_scores`` ``[-1, k]`` and ``item_count``.

    Parameters
    ----------
    k
        How many items to answer per session.
    candidates
        The sessions' candidate lists the scored rows were unrolled from (``FilterCandidates``'
        ``candidate_ids``, as a selection such as ``candidates["candidate_ids"]``).
    scores
        The ranking score column (one per candidate row); by default the only float column
        it receives.
    ids_column, scores_column, count_column
        Names of the outputs.
    """

    def __init__(
        self,
        k: int,
        candidates: Node | str,
        *,
        scores: str | None = None,
        ids_column: str = "item_ids",
        scores_column: str = "item_scores",
        count_column: str = "item_count",
    ):
        super().__init__(
            k,
            candidates,
            scores=scores,
            ids_column=ids_column,
            scores_column=scores_column,
            count_column=count_column,
        )

    @property
    def label(self) -> str:
        return f"TopKCandidates(k={self.k})"

    def config(self):
        config = super().config()
        del config["session_key"]
        return config
