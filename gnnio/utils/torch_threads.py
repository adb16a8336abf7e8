"""``set_torch_threads(n)``: ``torch.set_num_threads(n)`` that stays set once numba's threads start.

torch reads its intra-op thread count from OpenMP (``omp_get_max_threads``), and numba's ``omp``
threading layer binds to the OpenMP runtime torch loaded first (torch's wheel ships its own
``libgomp``; ``LD_DEBUG=bindings`` shows numba's ``omp_set_num_threads`` bound to it). When numba
starts its thread pool (its first parallel kernel, or ``numba.get_num_threads()``), the OpenMP
count of the thread that starts it (the count is per thread) is set to numba's own count,
``NUMBA_NUM_THREADS`` (all the cores unless set). So ``torch.set_num_threads(1)`` followed by
gnnio's first gather or sampling kernel on the same thread left torch at 2 threads on the 2-core
development VM (``gnnio bench loader --threads 1``; an isolation allocation's ``compute``
threads alike; on a GPU machine all 16). Starting numba's pool first makes the setting stay
(tests/test_torch_threads.py). Under numba's ``workqueue`` or ``tbb`` layers nothing is reset
and this is harmless.

A user script that sets torch's threads itself before gnnio's first kernel runs sees the same
reset: call this function instead, or set them after gnnio's first batch. Note that a process
whose numba pool runs under GNU OpenMP must not ``fork`` and then run a parallel kernel in the
child (libgomp ends such a child: "fork() called from a process already using GNU OpenMP");
gnnio itself starts its ranks with ``spawn`` and its tools with ``exec``.
"""

from __future__ import annotations

import torch

from .warnings_at import warn

__all__ = ["set_torch_threads", "start_numba_threads"]

_warned = False


def start_numba_threads() -> None:
    """Start numba's thread pool now, if numba is installed (a no-op once it runs). A threading
    layer that cannot load (``NUMBA_THREADING_LAYER=tbb`` without tbb) is left for numba's first
    parallel kernel to report: one warning here, nothing raised."""
    global _warned
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return
    try:
        numba.get_num_threads()  # (starts the pool: numba.np.ufunc.parallel._launch_threads)
    except Exception as e:  # noqa: BLE001 - e.g. "No threading layer could be loaded"
        if not _warned:
            _warned = True
            warn(f"gnnio: numba's thread pool did not start ({e})")


def set_torch_threads(n: int) -> None:
    """``torch.set_num_threads(n)``, after starting numba's thread pool (see the module doc)."""
    start_numba_threads()
    torch.set_num_threads(int(n))
