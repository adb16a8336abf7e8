"""A process-wide pool of plain Python threads, made on first use, grown on demand, and made again
in a forked child.

gnnio's own CPU kernels (numba, ``nogil``) run on such pools: the block SpMM over row ranges
(:mod:`gnnio.train.spmm`). Idle between calls, like torch's intra-op threads; not named ``gnnio-*``, the prefix of threads owned by
a loader, sampler or store. A child forked after the pool ran keeps the executor but not its
threads and would wait forever on its first task, and the lock in whatever state another thread
left it: both are dropped at fork (``os.register_at_fork``) and made again on first use.
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

__all__ = ["LazyPool"]

_POOLS: weakref.WeakSet[LazyPool] = weakref.WeakSet()


class LazyPool:
    """``LazyPool(prefix).get(k)``: an executor with at least ``k`` threads named ``prefix-*``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._forget()
        _POOLS.add(self)

    def _forget(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self, k: int = 1) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool._max_workers < k:
                self._pool = ThreadPoolExecutor(max_workers=k, thread_name_prefix=self.prefix)
            return self._pool

    @property
    def made(self) -> bool:
        """Whether the executor exists (made and not dropped by a fork since)."""
        return self._pool is not None


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
