"""Wall seconds of a run's parts (``gnnio bench step``'s ``phases_s``): where a short benchmark
process spends its time besides the batches it times -- start-up, loading, building -- which a
one-shot GPU session's budget pays once per process."""

from __future__ import annotations

import os
import time


class Phases:
    """Wall seconds of a run's parts, in order: ``start`` is the process's age when the clock
    is made (interpreter, imports, argument parsing; from ``/proc`` where there is one), then
    each :meth:`mark`'s part, timed since the mark before."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        start = process_age_s()
        if start is not None:
            self.phases["start"] = round(start, 3)
        self._t = time.perf_counter()

    def mark(self, name: str, when: bool = True) -> None:
        """The part ``name`` ended now (not recorded where ``when`` is false: a part not run)."""
        now = time.perf_counter()
        if when:
            self.phases[name] = round(now - self._t, 3)
        self._t = now

    def run(self, name: str, fn, *args):
        """``fn(*args)``, timed as the part ``name``."""
        out = fn(*args)
        self.mark(name)
        return out


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc``), else None."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
