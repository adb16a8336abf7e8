"""A rank's freed batch-sized blocks go back to the system (issue 26, item 5): every rank fixes
glibc's mmap threshold (gnnio.utils.heap.limit_heap), and glibc then maps a block it would
otherwise have served from a heap that keeps it."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from gnnio.utils import heap

GLIBC = heap.glibc() is not None and hasattr(heap.glibc(), "mallinfo2")

# A fresh process frees a mapped 30 MiB block (which makes glibc raise its threshold past 20
# MiB), then allocates 20 MiB: prints whether that block was mapped (glibc's own count of
# mapped bytes, mallinfo2's hblkhd, grew by it).
_PROBE = """
import ctypes, sys
from gnnio.utils.heap import HEAP_MMAP_THRESHOLD, glibc, limit_heap
lib = glibc()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
lib.mallinfo2.restype = Info
lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
lib.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "limit":
    assert limit_heap() == HEAP_MMAP_THRESHOLD
lib.free(lib.malloc(30 << 20))
before = lib.mallinfo2().hblkhd
p = lib.malloc(20 << 20)
print(lib.mallinfo2().hblkhd - before >= 20 << 20)
"""


def _probe(mode: str) -> bool:
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_* tunables from the caller's environment
    r = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                       timeout=60, env={**env, "PYTHONPATH": ":".join(sys.path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == "True"


@pytest.mark.skipif(not GLIBC, reason="glibc >= 2.33 only (mallopt, mallinfo2)")
def test_limit_heap_maps_the_blocks_glibc_would_keep():
    assert not _probe("default")  # glibc's own rule: the 20 MiB block comes from the heap
    assert _probe("limit")  # fixed at 1 MiB: mapped, and returned to the system when freed


def test_limit_heap_leaves_a_users_malloc_settings_and_other_libcs(monkeypatch):
    for k in (*heap._USER_ENV, "GLIBC_TUNABLES"):
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr(heap, "glibc", lambda: calls.append(1))
    for k, v in (("MALLOC_MMAP_THRESHOLD_", "131072"), ("MALLOC_TRIM_THRESHOLD_", "0"),
                 ("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")):  # fmt: skip
        with monkeypatch.context() as m:
            m.setenv(k, v)
            assert heap.limit_heap() is None and not calls  # glibc is not even asked
    assert heap.limit_heap() is None and calls == [1]  # no tunables: glibc asked; None: not glibc


def test_a_rank_limits_its_heap_before_it_builds_anything(monkeypatch):
    from gnnio.distributed import train as dtrain

    calls = []
    monkeypatch.setattr(dtrain, "limit_heap", lambda: calls.append("limit") or 123)
    ctx = types.SimpleNamespace(rank=0, world_size=2, is_main=True)
    run = dtrain.DistRun(ctx)
    assert calls == ["limit"] and run.heap_threshold == 123
