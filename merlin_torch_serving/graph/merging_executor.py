"""In-process batching: concurrent ``Ensemble.transform`` calls answered by merged runs.

A web app that calls ``Ensemble.transform`` from many threads, one session each, pays a whole
plan run per session, and the threads mostly wait for one another on the GIL. ``MergingExecutor``
runs the plan in one thread at a time and lets the calls that arrive meanwhile wait; the next run
takes all of them at once, merged as a batched export's steps merge requests
(``export/merging``): never two calls holding the same session id in one run, at most
``max_batch_rows`` rows a run, and a merged run that fails is run again call by call, so each call
gets its own error. A lone call runs at once, alone, on its own table. The thread of the oldest
waiting call runs the next batch, and only the threads whose calls are answered are woken: with
32 callers, waking every waiting thread after each run cost more than the runs. Answers equal
those of the calls run one at a time, bit for bit (``batch_invariance``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.export import merging
from merlin_torch_serving.export.config import DEFAULT_MAX_BATCH_ROWS
from merlin_torch_serving.graph.executors import LocalExecutor
from merlin_torch_serving.graph.threads import torch_threads

if TYPE_CHECKING:
    from merlin_torch_serving.graph.plan import Plan


@dataclass(eq=False)  # a call is itself: found in the waiting list by identity
class _Call:
    plan: Plan
    request: TensorTable
    answer: TensorTable | BaseException | None = None
    #: set when the call is answered, or when its thread is to run the next batch
    woken: threading.Event = field(default_factory=threading.Event)


class MergingExecutor:
    """Runs the ensemble in this process, merging calls that arrive while a run is under way.

    Parameters
    ----------
    torch_threads
        torch's intra-op threads while a run lasts, as ``LocalExecutor``'s (1 by default).
    max_batch_rows
        The most request rows (clicks) one merged run takes; more waiting calls than that are
        answered in several runs.
    """

    def __init__(self, torch_threads: int | None = 1, max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS):
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be at least 1, got {max_batch_rows!r}")
        self._alone = LocalExecutor(torch_threads)
        self.torch_threads = torch_threads
        self.max_batch_rows = max_batch_rows
        self._lock = threading.Lock()
        self._waiting: list[_Call] = []
        self._running = False
        self._keys: dict[int, tuple[Plan, list[str] | None]] = {}
        #: calls per run, for the runs so far (what merging achieved)
        self.run_sizes: list[int] = []

    def execute(self, plan: Plan, request: TensorTable) -> TensorTable:
        if self._merge_keys(plan) is None:  # no merge of requests is safe for this plan
            return self._alone.execute(plan, request)
        call = _Call(plan, request)
        with self._lock:
            self._waiting.append(call)
            leads = not self._running
            self._running = True
        if not leads:
            call.woken.wait()  # answered, or handed the lead
        if call.answer is None:
            self._lead(call)
        if isinstance(call.answer, BaseException):
            raise call.answer
        return call.answer

    def _lead(self, own: _Call) -> None:
        """Run batches of waiting calls until ``own`` is answered, then hand the lead to the
        oldest call still waiting (one thread is woken per answer, none to find work)."""
        while own.answer is None:
            with self._lock:
                plan = self._waiting[0].plan
                calls = [call for call in self._waiting if call.plan is plan]
                self._waiting = [call for call in self._waiting if call.plan is not plan]
            try:
                answers: list[TensorTable | BaseException] = list(self._answers(plan, calls))
            except BaseException as error:  # the runner's own failure (an interrupt): all share it
                answers = [error] * len(calls)
                with self._lock:
                    if own in self._waiting:
                        self._waiting.remove(own)
                own.answer = error
                raise
            finally:
                for call, answer in zip(calls, answers, strict=True):
                    call.answer = answer
                    call.woken.set()
                with self._lock:
                    self.run_sizes.append(len(calls))
                    if own.answer is not None:  # hand the lead on, or give it up
                        if self._waiting:
                            self._waiting[0].woken.set()
                        else:
                            self._running = False

    def _merge_keys(self, plan: Plan) -> list[str] | None:
        """``plan.request_groups()``, asked once per plan (it walks the plan's operators, which
        cost a lone call 0.16 ms each time)."""
        known = self._keys.get(id(plan))
        if known is None:  # kept with its plan, so the id stays that plan's
            known = self._keys[id(plan)] = (plan, plan.request_groups())
        return known[1]

    def _answers(self, plan: Plan, calls: list[_Call]) -> list[TensorTable | Exception]:
        if len(calls) == 1:
            try:
                return [self._alone.execute(plan, calls[0].request)]
            except Exception as error:
                return [error]

        def answer(arrays: merging.Arrays) -> dict:
            merged = wire.from_wire(arrays, plan.input_schema)
            return wire.to_wire(self._alone.execute(plan, merged))

        requests = [wire.to_wire(call.request) for call in calls]
        with torch_threads(self.torch_threads):
            parts = merging.answer_in_runs(
                requests, answer, self._merge_keys(plan), self.max_batch_rows
            )
        return [
            part if isinstance(part, Exception) else wire.from_wire(part, plan.output_schema)
            for part in parts
        ]
