"""SoftmaxSampling: each session's k candidates drawn without replacement, each draw by the softmax
of the ranking scores over a temperature: an order that explores beyond the best few.

The draw is the Gumbel-top-k trick (the k largest of score / temperature plus Gumbel noise), with
the noise a hash of the seed, the session's key and the candidate (see ``ordering``): a fixed seed
gives the same order for the same session every time, in-process and served. Merlin Systems'
``SoftmaxSampling`` draws from numpy's global generator (no seed), weighs by
``exp(temperature * score) / sum(score)`` and answers one session per request.
"""

from __future__ import annotations

from merlin.dag import Node

from merlin_torch_serving.multistage.ordering import CandidateOrdering


class SoftmaxSampling(CandidateOrdering):
    """Per session, ``k`` candidates sampled without replacement with probabilities
    ``softmax(score / temperature)``, in the order drawn; their ranking scores and how many.

    Parameters
    ----------
    k
        How many items to answer per session.
    candidates
        The sessions' candidate lists the scored rows were unrolled from.
    temperature
        Above 0: higher explores more, lower approaches the top-k.
    seed
        The same seed gives the same order for the same session and candidates.
    session_key
        The session's key (e.g. ``features["session_id"]``), so that sessions get draws of their
        own; without it every session with the same candidates and scores gets the same order.
    scores, ids_column, scores_column, count_column
        As for ``TopKCandidates``.
    """

    def __init__(
        self,
        k: int,
        candidates: Node | str,
        *,
        temperature: float = 1.0,
        seed: int = 0,
        session_key: Node | str | None = None,
        scores: str | None = None,
        ids_column: str = "item_ids",
        scores_column: str = "item_scores",
        count_column: str = "item_count",
    ):
        if not temperature > 0:
            raise ValueError(f"temperature must be above 0, got {temperature!r}")
        if not 0 <= int(seed) < 2**31:
            raise ValueError(f"seed must be in [0, 2**31), got {seed!r}")
        self.temperature = float(temperature)
        self.seed = int(seed)
        super().__init__(
            k,
            candidates,
            scores=scores,
            session_key=session_key,
            ids_column=ids_column,
            scores_column=scores_column,
            count_column=count_column,
        )

    @property
    def label(self) -> str:
        return f"SoftmaxSampling(k={self.k}, temperature={self.temperature:g})"

    def config(self):
        return {**super().config(), "temperature": self.temperature, "seed": self.seed}
