"""When to reload a python model to give back memory its stubs keep.

Some memory a stub took for a big request does not come back when the request is answered: the
python backend's shared-memory pool keeps the size of the largest request it carried, and Python
keeps some of its own. Reloading the model starts fresh stubs beside the old ones and retires
those once they are done (no request fails), which returns all of it: what gunicorn, uWSGI and
Celery do for their workers (``max_requests``, ``reload-on-rss``, ``max_memory_per_child``).

A model is reloaded when its stubs hold more than ``growth_limit`` (a fraction) and at least
``MIN_GROWTH_BYTES`` more than the least they held since they started, and did no work since the
last look (a stub in the middle of a request holds what it will give back itself once it is
answered, see ``export.heap``). A model that grows back
soon after is reloaded less and less often: the wait before the next reload starts at
``FIRST_WAIT_S`` and doubles each time one follows within ten waits, up to an hour.
"""

from __future__ import annotations

from dataclasses import dataclass

#: growth below this is never worth a reload (a stub's own noise is a few megabytes)
MIN_GROWTH_BYTES = 32 << 20
FIRST_WAIT_S = 30.0
LAST_WAIT_S = 3600.0


@dataclass
class _Model:
    pids: frozenset[int]
    least_bytes: int
    cpu_ticks: int
    wait_s: float = FIRST_WAIT_S
    last_reload: float | None = None


class MemoryWatch:
    """Decides, from the memory each python model's stubs hold, which to reload."""

    def __init__(self, growth_limit: float):
        if not growth_limit > 0:
            raise ValueError(f"growth_limit must be a positive fraction, got {growth_limit!r}")
        self.growth_limit = growth_limit
        self._models: dict[str, _Model] = {}

    def observe(
        self, model: str, pids: frozenset[int], held_bytes: int, cpu_ticks: int, now: float
    ) -> str | None:
        """Why ``model`` should be reloaded now, or None; ``pids`` are its live stubs,
        ``held_bytes`` what they hold (resident memory), ``cpu_ticks`` the CPU time they used."""
        seen = self._models.get(model)
        if seen is None or seen.pids != pids:
            # new stubs: their baseline starts now (the reload wait carries over)
            wait_s = seen.wait_s if seen else FIRST_WAIT_S
            last = seen.last_reload if seen else None
            self._models[model] = _Model(pids, held_bytes, cpu_ticks, wait_s, last)
            return None
        busy = cpu_ticks != seen.cpu_ticks
        seen.cpu_ticks = cpu_ticks
        seen.least_bytes = min(seen.least_bytes, held_bytes)
        growth = held_bytes - seen.least_bytes
        if busy or growth < max(MIN_GROWTH_BYTES, self.growth_limit * seen.least_bytes):
            return None
        if seen.last_reload is not None and now < seen.last_reload + seen.wait_s:
            return None
        return (
            f"its stubs hold {held_bytes / 2**20:.0f} MB against {seen.least_bytes / 2**20:.0f} MB"
            f" since they started (+{growth / seen.least_bytes:.0%}) and are idle"
        )

    def reloaded(self, model: str, now: float) -> None:
        """Record a reload of ``model``; one soon after the last doubles the wait."""
        seen = self._models.get(model)
        if seen is None:
            return
        if seen.last_reload is not None and now - seen.last_reload < 10 * seen.wait_s:
            seen.wait_s = min(seen.wait_s * 2, LAST_WAIT_S)
        else:
            seen.wait_s = FIRST_WAIT_S
        seen.last_reload = now

    def forget(self, model: str) -> None:
        self._models.pop(model, None)


def resident_bytes(pid: int) -> int:
    """What process ``pid`` holds in memory (VmRSS), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_ticks(pid: int) -> int:
    """The CPU time process ``pid`` used so far, in clock ticks (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime
