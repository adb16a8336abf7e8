"""Core affinity for the pipeline's CPU stages: what ``--isolation auto`` pins, and where.

BGL isolates stages by giving each a fixed share of the machine. Thread counts alone do not do
that on the GPU path: the GPU sampler and the zero-copy gather run no CPU thread pool, yet their
threads (the loader's sampling worker that launches the sampler's kernels, the gather thread that
launches the row kernels and copies) still compete with everything else for cores. So an
allocation also gets disjoint **core sets**, contiguous blocks of the cores this process may use,
one per stage (:func:`core_sets`), and every thread of a stage pins itself to its stage's set when
it starts (:func:`pin_current_thread`): the loader's sampling workers and the sampler's own pool
(``sample``), the loader's gather thread (``gather``), and the training thread with torch's
intra-op threads (``compute``). Those intra-op threads (OpenMP's team of the training thread,
numba's under its ``omp`` layer) already run when the plan is applied (profiling started them) and
a thread's cores are not inherited after it starts, so :func:`pin_native_threads` pins every
thread Python did not start to ``compute``'s set then (under numba's ``workqueue`` layer its one
pool is pinned there too); training on the CPU only (:func:`gnnio.train.isolate.apply`).

When the stages' threads add up to more than the cores (a 2-core machine training on the CPU), the
sets would overlap: nothing is pinned and the allocation says so (``cores_by_stage`` is None).
Linux only (``os.sched_setaffinity``); elsewhere nothing is pinned. ``pinned()`` lists what was
pinned (thread name -> stage and cores), for the summary and the tests.
"""

from __future__ import annotations

import os
import threading

__all__ = [
    "activate",
    "available_cores",
    "core_sets",
    "deactivate",
    "native_pinned",
    "pin_current_thread",
    "pin_native_threads",
    "pinned",
]

_plan: dict[str, list[int]] | None = None
_pinned: dict[str, tuple[str, tuple[int, ...]]] = {}
_native: list[int] = []
_lock = threading.Lock()


def available_cores() -> list[int]:
    """The cores this process may run on (all of them where affinity is not supported)."""
    get = getattr(os, "sched_getaffinity", None)
    return sorted(get(0)) if get is not None else list(range(os.cpu_count() or 1))


def core_sets(threads: dict[str, int], cores: list[int]) -> dict[str, list[int]] | None:
    """Disjoint contiguous blocks of ``cores``, ``threads[stage]`` cores each, in the order
    ``sample``, ``gather``, ``compute`` (then any other stage); None when they do not fit."""
    order: list[str] = [s for s in ("sample", "gather", "compute") if s in threads]
    order += [s for s in threads if s not in order]
    if sum(max(1, int(threads[s])) for s in order) > len(cores):
        return None
    out: dict[str, list[int]] = {}
    at = 0
    for s in order:
        n = max(1, int(threads[s]))
        out[s] = list(cores[at : at + n])
        at += n
    return out


def activate(plan: dict[str, list[int]] | None) -> None:
    """Make ``plan`` (stage -> cores) the one threads pin themselves to; None turns it off."""
    global _plan
    with _lock:
        _plan = None if plan is None else {k: list(v) for k, v in plan.items()}
        _pinned.clear()
        _native.clear()


def deactivate() -> None:
    activate(None)


def pin_current_thread(stage: str) -> bool:
    """Pin the calling thread to ``stage``'s cores if a plan is active; True if it did."""
    plan = _plan
    setaff = getattr(os, "sched_setaffinity", None)
    if plan is None or stage not in plan or setaff is None:
        return False
    cores = plan[stage]
    setaff(0, cores)  # Linux: 0 is the calling thread
    with _lock:
        _pinned[threading.current_thread().name] = (stage, tuple(cores))
    return True


def pinned() -> dict[str, tuple[str, tuple[int, ...]]]:
    """Thread name -> (stage, cores) for every thread pinned since the plan was activated."""
    with _lock:
        return dict(_pinned)


def pin_native_threads(stage: str) -> list[int]:
    """Pin the threads of this process that Python did not start (torch's OpenMP workers,
    numba's, a GPU driver's) to ``stage``'s cores if a plan is active; returns their ids (Linux:
    ``/proc/self/task``; elsewhere none)."""
    plan = _plan
    setaff = getattr(os, "sched_setaffinity", None)
    if plan is None or stage not in plan or setaff is None or not os.path.isdir("/proc/self/task"):
        return []
    python = {t.native_id for t in threading.enumerate()}
    done = []
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        if tid in python:
            continue
        try:
            setaff(tid, plan[stage])
        except OSError:  # ended meanwhile
            continue
        done.append(tid)
    with _lock:
        _native.extend(done)
    return done


def native_pinned() -> list[int]:
    """The thread ids :func:`pin_native_threads` pinned since the plan was activated."""
    with _lock:
        return list(_native)
