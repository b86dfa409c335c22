"""Route: each session of a request answered by one of several branches (sub-graphs), chosen per
session by rules, an experiment's weights or a default; the answers merged back, one row per
session in request order, with the branch that answered.

Branches are graphs built on the node the route follows (usually the workflow's output), exactly
as they would be without the route. In-process each runs its plan on its sessions; served, each is
a Triton ensemble of its own that the route's python step calls through BLS, or (``inline``) a
python step computed inside the route's own (``branches``). A branch that fails leaves the other
branches' sessions answered: its own get a named error in the error column, or go to the fallback
branch when there is one.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from merlin.dag import Node
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import tables
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.session_rows import FILTERED_COLUMN
from merlin_torch_serving.ops.sub_models import SubModel, read_sub_models
from merlin_torch_serving.routing import answers
from merlin_torch_serving.routing.branches import (
    Branch,
    LocalBranch,
    TritonBranch,
    hosted_branch,
)
from merlin_torch_serving.routing.conditions import (
    Condition,
    condition_config,
    condition_from_config,
)
from merlin_torch_serving.routing.experiment import Experiment


class Route(ServingOperator):
    """Send each session to one branch and merge their answers.

    Parameters
    ----------
    branches
        Branch name -> sub-graph, built on the node the route follows (e.g. ``features >>
        PredictPytorch(model) >> TopK(...) >> DecodeItemIds(...)``). Every branch returns the same
        columns (names, dtypes, shapes): scalars or fixed-length lists.
    rules
        ``(condition, branch)`` pairs, tried in order: a session goes to the branch of the first
        condition it meets (``FilteredOut()``, ``FewerKnownItems(n)``, ``AllItemsUnknown()``,
        ``Predicate(...)``).
    default
        Where the other sessions go: a branch name, or an ``Experiment`` whose variants are
        branches (each session to one variant, by a stable hash of its id).
    fallback
        A branch that answers the sessions whose branch failed (its model unloaded or erroring);
        without one they are answered blank, with the error.
    inline
        Branches computed inside the route's own python step when served, instead of in a model
        of their own called through BLS: no extra hop (a python branch served on its own costs a
        second python stub per request), but no separate loading, scaling or isolation from the
        route's step. Their operators must all run on the python backend. A most-popular
        fallback inline is always available to answer for a failed branch.
    branch_column, variant_column, error_column
        Output columns: the branch that answered each session (empty for a session the workflow
        filtered out that no rule routed: it is answered blank, as without a route), the session's
        variant in the experiment (only with one), and why its branch failed (empty if it did not).
    """

    reloadable_config = ("weights",)

    def __init__(
        self,
        branches: Mapping[str, Node | SubModel],
        *,
        rules: Sequence[tuple[Condition, str]] = (),
        default: str | Experiment,
        fallback: str | None = None,
        inline: Sequence[str] = (),
        branch_column: str = "branch",
        variant_column: str = "variant",
        error_column: str = "branch_error",
    ):
        super().__init__()
        self.branches = dict(branches)
        if not self.branches:
            raise ValueError("a Route needs at least one branch")
        for name in self.branches:
            if not name or "/" in name:
                raise ValueError(f"branch names are non-empty strings without '/', got {name!r}")
        self.rules = [self._rule(rule) for rule in rules]
        self.experiment = default if isinstance(default, Experiment) else None
        self.default = None if self.experiment else self._branch(default, "default")
        if self.experiment is not None:
            for variant in self.experiment.variants:
                self._branch(variant, f"variant of experiment {self.experiment.name!r}")
        self.fallback = None if fallback is None else self._branch(fallback, "fallback")
        self.inline = [self._branch(name, "inline branch") for name in inline]
        self.branch_column = branch_column
        self.variant_column = variant_column
        self.error_column = error_column
        self._bound_rules: list[tuple[Condition, str]] | None = None
        self._runners: dict[str, Branch] = {
            name: hosted_branch(sub.inline) if sub.inline else TritonBranch(sub)
            for name, sub in self.branches.items()
            if isinstance(sub, SubModel)
        }
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._merged: Schema | None = None

    @property
    def label(self) -> str:
        return f"Route({', '.join(self.branches)})"

    @property
    def dependencies(self):
        # the branches' nodes, so that merlin.dag computes their schemas before the route's
        return [node for node in self.branches.values() if isinstance(node, Node)]

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """New weights for the experiment's variants (one each), for the next requests in-process
        and the next export; a served route takes them from the file ``routing.weights`` writes.
        """
        if self.experiment is None:
            raise ValueError(f"{self.label} has no experiment to weigh")
        self.experiment = self.experiment.with_weights(weights)

    # ---- graph building ---------------------------------------------------------------------

    def compute_input_schema(self, root_schema, parents_schema, deps_schema, selector) -> Schema:
        return parents_schema  # the branches' outputs reach the route through their plans

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return input_schema

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        self._bound_rules = [(cond.bind(self.label, input_schema), b) for cond, b in self.rules]
        if self.experiment is not None:
            key = input_schema.get(self.experiment.key)
            if key is None or key.is_list:
                raise SchemaError(
                    self.label,
                    self.experiment.key,
                    f"the session id (a scalar column) to assign experiment"
                    f" {self.experiment.name!r}'s variants by",
                    "no such column" if key is None else describe_column(key),
                    "pass Experiment(..., key=<the session id column>)",
                )
        self._merged = None  # the branches' schemas were computed anew
        columns = list(self._merged_schema())
        added = [self.branch_column, self.error_column]
        if self.experiment is not None:
            added.insert(1, self.variant_column)
        for name in added:
            if name in [column.name for column in columns]:
                raise SchemaError(
                    self.label,
                    name,
                    "a column name free for the route's own outputs",
                    "a branch output of that name",
                    "rename it, or pass another branch_column/variant_column/error_column",
                )
        columns += [ColumnSchema(name, dtype="str", dims=(None,)) for name in added]
        return Schema(columns)

    def returned_columns(self) -> list[str]:
        variant = [self.variant_column] if self.experiment is not None else []
        return [self.branch_column, *variant, self.error_column]

    def handles_filtered_rows(self) -> bool:
        return True

    def sub_graphs(self) -> dict[str, Node]:
        return {name: node for name, node in self.branches.items() if isinstance(node, Node)}

    def inline_sub_graphs(self) -> list[str]:
        return list(self.inline)

    def bind_sub_plans(self, plans: dict) -> None:
        self._runners.update({name: LocalBranch(plan) for name, plan in plans.items()})

    # ---- running ----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        names = list(self.branches)
        rows = tables.num_rows(transformable)
        target, variants = self._targets(transformable, names, rows)
        errors = np.full(rows, "", dtype=object)
        answered: list[tuple[np.ndarray, TensorTable]] = []
        failed: list[np.ndarray] = []
        chosen = [
            (names[index], np.flatnonzero(target == index))
            for index in range(len(names))
            if np.any(target == index)
        ]
        outcomes = self._run_all(chosen, transformable)
        for (name, rows_of), outcome in zip(chosen, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                answered.append((rows_of, outcome))
                continue
            errors[rows_of] = answers.error_message(name, outcome)
            if self.fallback is not None and name != self.fallback:
                failed.append(rows_of)
            else:
                target[rows_of] = -1
        fallback = self.fallback
        if failed and fallback is not None:
            rows_of = np.concatenate(failed)
            (outcome,) = self._run_all([(fallback, rows_of)], transformable)
            if isinstance(outcome, Exception):
                note = f"; the fallback {answers.error_message(fallback, outcome)}"
                errors[rows_of] = errors[rows_of] + note
                target[rows_of] = -1
            else:
                target[rows_of] = names.index(fallback)
                answered.append((rows_of, outcome))
        columns = answers.merged(self._merged_schema(), rows, answered)
        branch = np.array(["", *names], dtype=object)[target + 1]
        columns[self.branch_column] = branch
        if self.experiment is not None:
            columns[self.variant_column] = np.array(self.experiment.variants, dtype=object)[
                variants
            ]
        columns[self.error_column] = errors
        self._count(names, target, variants)
        return TensorTable(columns, _unsafe=True)

    def _targets(
        self, table: TensorTable, names: list[str], rows: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Per session, the index of its branch (-1: answered blank) and of its variant."""
        variants = None
        if self.experiment is not None:
            variants = self.experiment.assign(np.asarray(table[self.experiment.key].values))
            of_variant = np.array([names.index(v) for v in self.experiment.variants])
            target = of_variant[variants]
        else:
            target = np.full(rows, names.index(str(self.default)), dtype=np.int64)
        matched = np.zeros(rows, dtype=bool)
        for condition, branch in reversed(self._bound_rules or self.rules):  # the first one wins
            holds = condition.evaluate(table)
            target[holds] = names.index(branch)
            matched |= holds
        if FILTERED_COLUMN in table.columns:
            # placeholder rows: no branch computes anything from them unless a rule sends them
            unrouted = np.asarray(table[FILTERED_COLUMN].values, dtype=bool) & ~matched
            target[unrouted] = -1
        return target, variants

    def _run_all(
        self, chosen: list[tuple[str, np.ndarray]], table: TensorTable
    ) -> list[TensorTable | Exception]:
        """Each branch's answer for its rows of ``table``, or the error it failed with; served
        branches are called at the same time."""
        rows = tables.num_rows(table)
        parts = [
            # a branch that answers every session gets the table as it is
            (name, table if len(rows_of) == rows else tables.take_rows(table, rows_of))
            for name, rows_of in chosen
        ]
        if len(parts) > 1 and all(isinstance(self._runner(n), TritonBranch) for n, _ in parts):
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(len(self.branches))
            futures = [self._pool.submit(self._timed, name, part) for name, part in parts]
            results = [future.result() for future in futures]
        else:
            results = [self._timed(name, part) for name, part in parts]
        for (name, part), (outcome, seconds) in zip(parts, results, strict=True):
            metrics.count(metrics.BRANCH_CALLS, 1, branch=name)
            metrics.count(metrics.BRANCH_SECONDS, seconds, branch=name)
            if isinstance(outcome, Exception):
                metrics.count(metrics.BRANCH_ERRORS, tables.num_rows(part), branch=name)
        return [outcome for outcome, _ in results]

    def _timed(self, name: str, part: TensorTable) -> tuple[TensorTable | Exception, float]:
        started = time.perf_counter()
        try:
            outcome: TensorTable | Exception = self._runner(name).run(part)
            sessions, answered = tables.num_rows(part), tables.num_rows(outcome)
            if answered != sessions:
                outcome = ValueError(f"it answered {answered} rows for {sessions} sessions")
        except Exception as error:  # the branch's sessions get the error, the others their answer
            outcome = error
        return outcome, time.perf_counter() - started

    def _runner(self, name: str) -> Branch:
        runner = self._runners.get(name)
        if runner is None:
            raise RuntimeError(
                f"{self.label} runs its branches inside an Ensemble: build one with it"
            )
        return runner

    def _count(self, names: list[str], target: np.ndarray, variants: np.ndarray | None) -> None:
        """``mts_sessions_total`` per branch (and variant): the step counts no session twice."""
        if not metrics.is_collecting():
            return
        width = len(self.experiment.variants) if self.experiment is not None else 1
        keys = (target + 1) * width + (variants if variants is not None else 0)
        for key, count in zip(*np.unique(keys, return_counts=True), strict=True):
            branch = ["", *names][int(key) // width]
            labels = {"branch": branch}
            if self.experiment is not None:
                labels["variant"] = self.experiment.variants[int(key) % width]
            metrics.count(metrics.SESSIONS, int(count), **labels)

    # ---- schemas ----------------------------------------------------------------------------

    def _merged_schema(self) -> Schema:
        """The columns every branch returns (the first branch's schemas), once they agree."""
        if self._merged is None:
            schemas = {name: self._branch_schema(name) for name in self.branches}
            self._merged = answers.common_schema(self.label, schemas)
        return self._merged

    def _branch_schema(self, name: str) -> Schema:
        branch = self.branches[name]
        if isinstance(branch, SubModel):
            return branch.output_schema
        if branch.output_schema is None:
            raise SchemaError(self.label, None, f"branch {name!r} built", "its schema unknown")
        return branch.output_schema

    def _rule(self, rule) -> tuple[Condition, str]:
        try:
            condition, branch = rule
        except (TypeError, ValueError):
            raise TypeError(
                "a rule is a (condition, branch) pair, e.g. (FilteredOut(), 'popular'); got"
                f" {rule!r}"
            ) from None
        if not isinstance(condition, Condition):
            raise TypeError(f"a rule's condition must be a Condition, got {condition!r}")
        return condition, self._branch(branch, f"target of rule {condition.describe()}")

    def _branch(self, name, role: str) -> str:
        if name not in self.branches:
            raise ValueError(
                f"the {role} must be one of the route's branches ({', '.join(self.branches)}),"
                f" got {name!r}"
            )
        return name

    # ---- export -----------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        rules = self._bound_rules or self.rules
        experiment = self.experiment
        return {
            "branches": list(self.branches),
            "rules": [{"when": condition_config(c), "branch": b} for c, b in rules],
            "default": self.default,
            "experiment": experiment.config() if experiment is not None else None,
            "weights": dict(experiment.weights) if experiment is not None else None,
            "fallback": self.fallback,
            "inline": self.inline,
            "branch_column": self.branch_column,
            "variant_column": self.variant_column,
            "error_column": self.error_column,
        }

    def save_artifacts(self, artifact_path=None) -> None:
        for position, (condition, _) in enumerate(self._bound_rules or self.rules):
            condition.save_artifacts(str(artifact_path), f"rule_{position}")

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        served = read_sub_models(artifact_path)
        missing = [name for name in config["branches"] if name not in served]
        if missing:
            raise ValueError(
                f"the export recorded no served model for the route's branch(es) {missing};"
                " export the ensemble again"
            )
        experiment = config["experiment"]
        return {
            "branches": {name: served[name] for name in config["branches"]},
            "rules": [
                (
                    condition_from_config(rule["when"], artifact_path, f"rule_{position}"),
                    rule["branch"],
                )
                for position, rule in enumerate(config["rules"])
            ],
            "default": (
                Experiment(weights=config["weights"], **experiment)
                if experiment is not None
                else config["default"]
            ),
            "fallback": config["fallback"],
            "inline": config["inline"],
            "branch_column": config["branch_column"],
            "variant_column": config["variant_column"],
            "error_column": config["error_column"],
        }
