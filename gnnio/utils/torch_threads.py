"""``set_torch_threads(n)``: ``torch.set_num_threads(n)`` that stays set once numba's threads start.

torch's CPU wheels and numba's ``omp`` threading layer share one OpenMP runtime (the wheel's
``libgomp``), and torch reads its intra-op thread count from OpenMP (``omp_get_max_threads``).
When numba starts its thread pool (the first parallel kernel, or ``numba.get_num_threads()``),
the runtime's thread count of the thread that starts it (the count is per OpenMP thread) goes
back to numba's default, all the cores. So ``torch.set_num_threads(1)`` followed by gnnio's
first gather or sampling kernel on the same thread left torch at 2 threads on the 2-core
development VM (``gnnio bench loader --threads 1``; an isolation allocation's ``compute``
threads alike, on a GPU machine all 16). Starting numba's pool first makes the setting stay
(tests/test_torch_threads.py).

A user script that sets torch's threads itself before gnnio's first kernel runs sees the same
reset: call this function instead, or set them after gnnio's first batch.
"""

from __future__ import annotations

import torch

__all__ = ["set_torch_threads", "start_numba_threads"]


def start_numba_threads() -> None:
    """Start numba's thread pool now, if numba is installed (a no-op once it runs)."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return
    numba.get_num_threads()  # (starts the pool: numba.np.ufunc.parallel._launch_threads)


def set_torch_threads(n: int) -> None:
    """``torch.set_num_threads(n)``, after starting numba's thread pool (see the module doc)."""
    start_numba_threads()
    torch.set_num_threads(int(n))
