"""Ordering scored candidates back into one row per session: the kernels and the operator base that
``TopKCandidates`` and ``SoftmaxSampling`` share.

The candidates of a session are a ragged list (their offsets say which rows of the ranker's scores
belong to which session); each session's best ``k`` by a sort key come out as ``[-1, k]`` ids and
scores, padded with -1 and -inf when it has fewer, with ``item_count`` saying how many are real. The
sort key is the score, or, for sampling, the score over a temperature plus Gumbel noise (sampling
k without replacement from the softmax). The noise is a hash of the seed, the session's key and
the candidate's id, not a random generator's state: the same session gets the same order in any
request, alone or among others, in-process and served, and the sampling is exact to reproduce.

The kernels are TorchScript, run in-process and in the python step alike. The operators stay on the
python backend (after a ranker on libtorch, one more python step), because they count what they
answered short (``mts_short_answers_total``, ``mts_empty_answers_total``).
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
import zlib
from typing import Any

import numpy as np
import torch
from merlin.dag import Node
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.topk import single_column


def mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash of int64 values (their low 31 bits), without overflow: the
    multiplier is below 2**27, so a 31-bit value times it stays inside int64."""
    x = x & 0x7FFFFFFF
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0x7FFFFFFF
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0x7FFFFFFF
    return (x >> 16) ^ x


def gumbel_noise(seed: int, session_keys: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise (float64), one value per (session key, id) pair and seed."""
    hashed = mix(ids >> 31) ^ mix(ids)
    hashed = mix(hashed ^ mix(session_keys >> 31))
    hashed = mix(hashed ^ mix(session_keys) ^ mix(torch.full_like(ids, seed)))
    uniform = (hashed.to(torch.float64) + 0.5) / 2147483648.0
    return -torch.log(-torch.log(uniform))


def order_segments(
    ids: torch.Tensor, offsets: torch.Tensor, sort_keys: torch.Tensor, scores: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per segment (session) of ``ids`` (cut by ``offsets``), the ``k`` ids with the highest
    ``sort_keys`` (ties: the earlier candidate first), their ``scores``, and how many there are."""
    offsets = offsets.to(torch.int64)
    rows = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    width = k
    if rows > 0:
        width = max(k, int(lengths.max()))
    row_of = torch.repeat_interleave(torch.arange(rows), lengths)
    column_of = torch.arange(ids.numel()) - torch.repeat_interleave(offsets[:-1], lengths)
    keys = torch.where(torch.isnan(sort_keys), torch.full_like(sort_keys, float("-inf")), sort_keys)
    dense_keys = torch.full((rows, width), float("-inf"), dtype=keys.dtype)
    dense_keys[row_of, column_of] = keys
    # padding sorts after every candidate of its row: it is -inf, and later in the row (stable)
    order = torch.sort(dense_keys, dim=1, descending=True, stable=True)[1][:, :k]
    flat = torch.full((rows, width), -1, dtype=torch.int64)
    flat[row_of, column_of] = torch.arange(ids.numel())
    taken = torch.gather(flat, 1, order)
    real = taken >= 0
    safe = torch.clamp(taken, min=0)
    if ids.numel() == 0:
        picked_ids = torch.full((rows, k), -1, dtype=torch.int64)
        picked_scores = torch.full((rows, k), float("-inf"), dtype=scores.dtype)
    else:
        picked_ids = torch.where(real, ids.to(torch.int64)[safe], torch.full_like(taken, -1))
        picked_scores = torch.where(
            real, scores[safe], torch.full(taken.shape, float("-inf"), dtype=scores.dtype)
        )
    return picked_ids, picked_scores, torch.clamp(lengths, max=k).to(torch.int32)


class CandidateOrder(torch.nn.Module):
    """The ordering over wire tensors: the candidates (a ragged list, values and offsets), their
    ranking scores (one per candidate row) and, for sampling, the sessions' keys. Returns ids,
    scores and counts in output order."""

    k: int
    candidates: str
    scores: str
    session_key: str
    temperature: float
    seed: int

    def __init__(
        self, k: int, candidates: str, scores: str, session_key: str, temperature: float, seed: int
    ):
        super().__init__()
        self.k = k
        self.candidates = candidates
        self.scores = scores
        self.session_key = session_key
        self.temperature = temperature
        self.seed = seed

    def forward(
        self, inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = inputs[self.candidates + "__values"]
        offsets = inputs[self.candidates + "__offsets"]
        scores = inputs[self.scores].reshape(-1)
        sort_keys = scores
        if self.temperature > 0.0:
            keys = torch.zeros_like(ids, dtype=torch.int64)
            if self.session_key != "":
                lengths = offsets[1:].to(torch.int64) - offsets[:-1].to(torch.int64)
                keys = torch.repeat_interleave(inputs[self.session_key].to(torch.int64), lengths)
            sort_keys = scores.to(torch.float64) / self.temperature + gumbel_noise(
                self.seed, keys, ids.to(torch.int64)
            )
        return order_segments(ids, offsets, sort_keys, scores, self.k)


class CandidateOrdering(ServingOperator):
    """What ``TopKCandidates`` and ``SoftmaxSampling`` share: the session's candidates as the
    dependency, the ranker's scores as the parent, ``[-1, k]`` ids and scores and a count out."""

    #: sampling temperature; 0 for a plain top-k (subclasses set it)
    temperature: float = 0.0
    seed: int = 0

    def __init__(
        self,
        k: int,
        candidates: Node | str,
        *,
        scores: str | None = None,
        session_key: Node | str | None = None,
        ids_column: str = "item_ids",
        scores_column: str = "item_scores",
        count_column: str = "item_count",
    ):
        super().__init__()
        if int(k) < 1:
            raise ValueError(f"k must be at least 1, got {k!r}")
        self.k = int(k)
        self.candidates_node = candidates
        self.candidates_column = single_column(candidates)
        self.scores_name = scores
        self.key_node = session_key
        self.key_column = single_column(session_key) if session_key is not None else None
        self.ids_column, self.scores_column = ids_column, scores_column
        self.count_column = count_column
        self._module: torch.jit.ScriptModule | None = None

    @property
    def dependencies(self):
        return [n for n in (self.candidates_node, self.key_node) if n is not None]

    # ---- schemas ---------------------------------------------------------------------------

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        columns = [
            input_schema[self._scores(input_schema)],
            input_schema.get(self.candidates_column)
            or ColumnSchema(self.candidates_column, dtype="int64", dims=(None, None)),
        ]
        if self.key_column is not None:
            columns.append(
                input_schema.get(self.key_column) or ColumnSchema(self.key_column, dtype="int64")
            )
        return Schema(columns)

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        candidates = input_schema[self.candidates_column]
        if not wire.is_ragged(candidates) or candidates.dtype.element_type.value != "int":
            raise SchemaError(
                self.label,
                candidates.name,
                "a ragged int list of each session's candidates (FilterCandidates' ids)",
                describe_column(candidates),
            )
        if self.key_column is not None:
            key = input_schema[self.key_column]
            if key.is_list or key.dtype.element_type.value not in ("int", "string"):
                raise SchemaError(
                    self.label, key.name, "one int or text key per session", describe_column(key)
                )

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        scores = input_schema[self._scores(input_schema)]
        return Schema(
            [
                ColumnSchema(
                    self.ids_column,
                    tags=[Tags.ITEM_ID],
                    dtype="int64",
                    dims=(None, self.k),
                ),
                ColumnSchema(
                    self.scores_column, dtype=scores.dtype.without_shape, dims=(None, self.k)
                ),
                ColumnSchema(self.count_column, dtype="int32", dims=(None,)),
            ]
        )

    # ---- running -----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        candidates = transformable[self.candidates_column]
        inputs = {
            self.candidates_column + wire.VALUES_SUFFIX: _tensor(candidates.values),
            self.candidates_column + wire.OFFSETS_SUFFIX: _tensor(candidates.offsets),
            "scores": _tensor(transformable[col_selector.names[0]].values),
        }
        if self.key_column is not None:
            inputs["key"] = _tensor(_int_keys(np.asarray(transformable[self.key_column].values)))
        # as PredictPytorch: TorchScript's optimizing executor would re-specialise for every new
        # count of candidates (a fraction of a second each)
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            ids, scores, counts = self.module(inputs)
        counted = counts.numpy()
        metrics.count(metrics.SHORT_ANSWERS, int((counted < self.k).sum()))
        metrics.count(metrics.EMPTY_ANSWERS, int((counted == 0).sum()))
        return TensorTable(
            {
                self.ids_column: ids.numpy(),
                self.scores_column: scores.numpy(),
                self.count_column: counted,
            },
            _unsafe=True,
        )

    @property
    def module(self) -> torch.jit.ScriptModule:
        """The scripted ordering ``transform`` runs (inputs named ``scores`` and ``key``)."""
        if self._module is None:
            self._module = torch.jit.script(self._order("scores", "key" if self.key_column else ""))
        return self._module

    def torchscript(self, input_schema: Schema) -> None:
        """None: the ordering stays on the python backend, where it counts the sessions answered
        with fewer than k items (a libtorch step publishes no counters of its own)."""
        return None

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "candidates": self.candidates_column,
            "scores": self.scores_name,
            "session_key": self.key_column,
            "ids_column": self.ids_column,
            "scores_column": self.scores_column,
            "count_column": self.count_column,
        }

    # ---- helpers -----------------------------------------------------------------------------

    def _order(self, scores: str, key: str) -> CandidateOrder:
        return CandidateOrder(
            self.k, self.candidates_column, scores, key, float(self.temperature), int(self.seed)
        )

    def _scores(self, input_schema: Schema) -> str:
        if self.scores_name is not None:
            if self.scores_name not in input_schema.column_names:
                raise SchemaError(
                    self.label,
                    self.scores_name,
                    "a float column of one ranking score per candidate row",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
            return self.scores_name
        found = [
            c.name
            for c in input_schema
            if c.name not in (self.candidates_column, self.key_column)
            and c.dtype.element_type.value == "float"
            and not wire.is_ragged(c)
            and (c.shape.dims is None or len(c.shape.dims) == 1 or c.shape.dims[1].max == 1)
        ]
        if len(found) != 1:
            raise SchemaError(
                self.label,
                None,
                "exactly one float column of one score per candidate row (the ranker's output)",
                f"{len(found)} ({', '.join(map(repr, found)) or 'none'})",
                f"name it with {type(self).__name__}(..., scores='column')",
            )
        return found[0]


def _tensor(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def _int_keys(keys: np.ndarray) -> np.ndarray:
    """Session keys as int64: integers as they are, text through a stable hash (CRC-32)."""
    if keys.dtype.kind in "iu":
        return keys.astype(np.int64, copy=False)
    return np.array([zlib.crc32(str(key).encode()) for key in keys], dtype=np.int64)
