"""How ``./run tests`` shares the suite between its workers (pytest-xdist): whole test files, as
``--dist loadfile`` does, but the files of tests/official as one unit (they share the two official
examples, which each worker would otherwise train again), and the long units handed out first.

xdist hands out units in order and each worker takes the next as it finishes one; by default it
orders them by their number of tests, which put the README's example (one test, a minute) last,
with one worker running it while the other had nothing left. Here the units that train models and
start servers go first, and the many short ones after fill both workers up to the end.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

#: folders whose files share session fixtures that are slow to make: one unit each
SHARED_UNITS = ("tests/official/",)
#: folders in the order their units start: examples (a minute each, one to three tests), the
#: official examples, the other served tests; then everything else
FIRST = ("tests/examples/", "tests/official/", "tests/integration/")


class LongestFirstScheduling(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return next((folder for folder in SHARED_UNITS if path.startswith(folder)), path)

    def _assign_work_unit(self, node) -> None:
        if not getattr(self, "_ordered", False):  # the queue is complete at the first hand-out
            units = sorted(self.workqueue.items(), key=lambda item: (_rank(item[0]), -len(item[1])))
            self.workqueue.clear()
            self.workqueue.update(units)
            self._ordered = True
        super()._assign_work_unit(node)


def _rank(unit: str) -> int:
    return next((i for i, folder in enumerate(FIRST) if unit.startswith(folder)), len(FIRST))
