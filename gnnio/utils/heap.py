"""How much freed memory ``malloc`` may keep (glibc; issue 26, item 5).

glibc serves an allocation below its *mmap threshold* from a heap (an "arena"; threads get their
own) and keeps what is freed there for later allocations, resident and counted in RSS. The
threshold starts at 128 KiB, but each time a mapped block is freed glibc raises it to that
block's size, up to 32 MiB (and the heap's trim threshold to twice that). A rank of a distributed
run frees batch-sized blocks of 1-32 MiB on several threads (sampler, gather, training); once the
threshold has risen past them they come from the arenas, the freed ones stay there, and more stay
with every epoch: 170-270 MiB of a rank's peak RSS on the 2^22 graph (docs/benchmarks.md).
:func:`limit_heap` fixes the threshold at 1 MiB, so those blocks are mapped on allocation and
returned when freed, while the many smaller ones keep reusing the heap's pages (glibc's initial
128 KiB, ``MALLOC_TRIM_THRESHOLD_=131072``, made epochs 25-30 % slower: every small tensor of a
batch faulting its pages in again). The price of 1 MiB there: warm epochs within the noise at
the default batch, ~17 % slower at batch 128 (blocks mapped and faulted in again each time).

One process training on the CPU wants the opposite (:func:`keep_heap`, ``--heap auto|keep``):
there a batch's large tensors (dropout's masks, the layers' activations and gradients: 30-100 MiB
each on the 2^21 graph) are above glibc's largest threshold, so each is a fresh mapping whose
pages fault in on first touch, every batch; on the 2-core development VM that was a third of the
CPU step and 94 s of system time in a two-epoch run (docs/benchmarks.md, "Freed memory kept").
:func:`keep_heap` serves every allocation from the heaps (``M_MMAP_MAX = 0``) and keeps up to
2 GiB free at the top of each heap (``M_TRIM_THRESHOLD``; the main heap and each thread's arena
alike), so the next batch reuses pages already resident. The price: memory freed is mostly kept
for the process's life (peak RSS +1.5 % on the 2^17 graph, +2.6 % on the 2^21 graph over two
epochs; docs/benchmarks.md), and a large block freed below live data is never returned (without
``mmap`` it cannot be unmapped). With the features on disk ``auto`` does not keep it.

A no-op (returns None) where the C library is not glibc, and where the user has tuned glibc's
``malloc`` through the environment (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_MAX_`` or ``GLIBC_TUNABLES``): their setting wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["HEAP_MODES", "HEAP_MMAP_THRESHOLD", "KEEP_TRIM_THRESHOLD", "apply_heap", "keep_heap",
           "limit_heap"]  # fmt: skip

HEAP_MMAP_THRESHOLD = 2**20  # blocks this size and larger: mapped, returned when freed
#: free bytes a heap keeps at its top before glibc trims it (mallopt's largest: an int)
KEEP_TRIM_THRESHOLD = 2**31 - 1
#: ``--heap``: auto (keep on the CPU in one process), keep, system (glibc's defaults)
HEAP_MODES = ("auto", "keep", "system")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # glibc's <malloc.h>
_DEFAULT_MMAP_MAX = 65536  # glibc's
_USER_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_")


def _user_tuned() -> bool:
    return any(k in os.environ for k in _USER_ENV) or "malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )


def glibc():
    """glibc's handle (None elsewhere: musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return lib if hasattr(lib, "gnu_get_libc_version") and hasattr(lib, "mallopt") else None


def limit_heap(threshold: int = HEAP_MMAP_THRESHOLD) -> int | None:
    """Serve every allocation of ``threshold`` bytes or more by its own mapping, returned to the
    system when freed; the heap is trimmed when ``2 * threshold`` at its top is free (glibc's own
    ratio). Fixing the threshold stops glibc from raising it. Returns the threshold set, or None
    (not glibc, glibc refused it, or the environment tunes ``malloc``: module docstring)."""
    if _user_tuned():
        return None
    lib = glibc()
    if lib is None or not lib.mallopt(_M_MMAP_THRESHOLD, int(threshold)):
        return None
    lib.mallopt(_M_TRIM_THRESHOLD, 2 * int(threshold))
    lib.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)  # mapping allowed again after a keep_heap()
    return int(threshold)


def keep_heap() -> str:
    """Serve every allocation from glibc's heaps and keep freed memory there for reuse (module
    docstring); process-wide and for the process's life. Returns what holds now: ``"kept"``, or
    ``"system"`` with the reason (``"system (not glibc)"``, ``"system (MALLOC_* or
    GLIBC_TUNABLES set)"``, ``"system (mallopt refused)"``)."""
    if _user_tuned():
        return "system (MALLOC_* or GLIBC_TUNABLES set)"
    lib = glibc()
    if lib is None:
        return "system (not glibc)"
    if not lib.mallopt(_M_MMAP_MAX, 0):
        return "system (mallopt refused)"
    lib.mallopt(_M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD)
    return "kept"


def apply_heap(mode: str, device_type: str, store: str = "memory") -> str:
    """``--heap``: ``"keep"`` calls :func:`keep_heap`; ``"auto"`` does where the model trains on
    the CPU with the features in memory (one process: ranks bound their heap instead,
    :func:`limit_heap`; on a GPU the large tensors live in torch's caching allocator, and keeping
    the host's is unmeasured; with ``store="disk"`` the run is bound by the disk and by memory:
    there keeping measured 3 % faster epochs for 9 % more peak memory); ``"system"`` leaves glibc
    as it is. Returns what holds, for the run's summary (``heap``)."""
    if mode == "keep" or (mode == "auto" and device_type == "cpu" and store != "disk"):
        return keep_heap()
    return "system"
