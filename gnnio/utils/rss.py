"""Memory figures: the process's resident memory (RSS), for the per-epoch record and the memory
tests, and the machine's available memory, for size checks before large allocations."""

from __future__ import annotations

import os
import resource
import sys

__all__ = ["available_ram", "peak_rss_bytes", "rss_bytes", "rss_by_kind"]


def rss_bytes() -> int:
    """Resident set size of this process now, in bytes (``/proc/self/statm`` on Linux; on other
    systems the peak, :func:`peak_rss_bytes`, the closest figure they give without psutil)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """The largest RSS this process has had, in bytes (``getrusage``: KiB on Linux, bytes on
    macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def rss_by_kind() -> dict[str, int]:
    """Resident memory now by kind, in bytes: ``anon`` (heap, tensors), ``file`` (pages of mapped
    files: libraries, memory-mapped datasets; shared with other processes through the page
    cache), ``shmem`` (shared memory, e.g. ``/dev/shm``). Empty where ``/proc/self/status`` does
    not say (not Linux)."""
    keys = {"RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem"}
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k = line.split(maxsplit=1)[0] if line.strip() else ""
                if k in keys:
                    out[keys[k]] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def available_ram() -> int | None:
    """``MemAvailable`` in bytes (None where ``/proc/meminfo`` does not say)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
