"""A rank's freed batch-sized blocks go back to the system (issue 26, item 5): every rank fixes
glibc's mmap threshold (gnnio.utils.heap.limit_heap), and glibc then maps a block it would
otherwise have served from a heap that keeps it."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from gnnio.utils import heap

GLIBC = heap.glibc() is not None and hasattr(heap.glibc(), "mallinfo2")

# glibc's malloc, free and mallinfo2 (its counts of mapped chunks and bytes) in a fresh process
_LIBC = """
import ctypes, sys
from gnnio.utils.heap import glibc
lib = glibc()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
lib.mallinfo2.restype = Info
lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
lib.free.argtypes = [ctypes.c_void_p]
"""

# A fresh process frees a mapped 30 MiB block (which makes glibc raise its threshold past 20
# MiB), then allocates 20 MiB: prints whether that block was mapped (glibc's own count of
# mapped bytes, mallinfo2's hblkhd, grew by it).
_PROBE = (
    _LIBC
    + """
from gnnio.utils.heap import HEAP_MMAP_THRESHOLD, limit_heap
if sys.argv[1] == "limit":
    assert limit_heap() == HEAP_MMAP_THRESHOLD
lib.free(lib.malloc(30 << 20))
before = lib.mallinfo2().hblkhd
p = lib.malloc(20 << 20)
print(lib.mallinfo2().hblkhd - before >= 20 << 20)
"""
)


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


# A fresh process touches a 64 MiB block, frees it, allocates and touches another: prints the
# page faults of the second (ru_minflt) and whether it was mapped (mallinfo2's hblkhd).
_KEEP_PROBE = (
    _LIBC
    + """
import resource
from gnnio.utils.heap import keep_heap
if sys.argv[1] == "keep":
    assert keep_heap() == "kept"
n = 64 << 20
p = lib.malloc(n)
ctypes.memset(p, 1, n)
lib.free(p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
mapped = lib.mallinfo2().hblkhd
q = lib.malloc(n)
ctypes.memset(q, 1, n)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, lib.mallinfo2().hblkhd > mapped)
"""
)


def _keep_probe(mode: str) -> tuple[int, bool]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}  # no MALLOC_* tunables
    r = subprocess.run([sys.executable, "-c", _KEEP_PROBE, mode], capture_output=True,
                       text=True, timeout=60, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    faults, mapped = r.stdout.split()
    return int(faults), mapped == "True"


@pytest.mark.skipif(not GLIBC, reason="glibc >= 2.33 only (mallopt, mallinfo2)")
def test_keep_heap_reuses_a_freed_large_block_without_faulting_it_in_again():
    faults, mapped = _keep_probe("default")
    assert mapped and faults > 8000  # glibc's own rule: mapped afresh, 16,384 pages faulted in
    faults, mapped = _keep_probe("keep")
    assert not mapped and faults < 1000  # from the heap: the freed block's pages, resident


def test_keep_heap_leaves_a_users_malloc_settings_and_other_libcs(monkeypatch):
    for k in (*heap._USER_ENV, "GLIBC_TUNABLES"):
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr(heap, "glibc", lambda: calls.append(1))
    for k, v in (
        ("MALLOC_MMAP_MAX_", "65536"),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1"),
    ):
        with monkeypatch.context() as m:
            m.setenv(k, v)
            assert heap.keep_heap().startswith("system (MALLOC_*") and not calls
    assert heap.keep_heap() == "system (not glibc)" and calls == [1]


def test_apply_heap_keeps_it_on_the_cpu_unless_told_otherwise(monkeypatch):
    monkeypatch.setattr(heap, "keep_heap", lambda: "kept")
    assert heap.apply_heap("auto", "cpu") == "kept"
    assert heap.apply_heap("auto", "cpu", "mmap") == "kept"
    assert heap.apply_heap("auto", "cpu", "disk") == "system"  # bound by the disk and memory
    assert heap.apply_heap("keep", "cpu", "disk") == "kept"
    assert heap.apply_heap("auto", "cuda") == "system"
    assert heap.apply_heap("keep", "cuda") == "kept"
    assert heap.apply_heap("system", "cpu") == "system"


def test_train_keeps_the_heap_before_it_builds_anything_and_says_so(monkeypatch, tmp_path):
    from gnnio.train import TrainConfig, loop, train
    from tests.helpers import write_tiny_dataset

    ds = write_tiny_dataset(tmp_path / "d", num_nodes=60, num_edges=300)
    calls = []
    real_build = loop.build_training
    monkeypatch.setattr(
        loop, "apply_heap", lambda mode, dev, store: calls.append((mode, dev)) or "kept"
    )
    monkeypatch.setattr(loop, "build_training", lambda *a: calls.append("build") or real_build(*a))
    s = train(ds, TrainConfig(fanouts=(3,), batch_size=8, epochs=1, hidden=4, progress=False))
    assert calls == [("auto", "cpu"), "build"] and s["heap"] == "kept"
    calls.clear()
    s = train(ds, TrainConfig(fanouts=(3,), batch_size=8, epochs=1, hidden=4, progress=False,
                              heap="system"))  # fmt: skip
    assert calls == [("system", "cpu"), "build"]


def test_heap_options_are_checked():
    from gnnio.errors import UsageError
    from gnnio.train import TrainConfig

    with pytest.raises(UsageError, match="--heap: must be auto, keep or system"):
        TrainConfig(heap="never").validate()
    with pytest.raises(UsageError, match="--heap keep: single-process only"):
        TrainConfig(heap="keep", nproc=2).validate_dist(2)


def test_limit_heap_allows_mapping_again_after_keep_heap(monkeypatch):
    for k in (*heap._USER_ENV, "GLIBC_TUNABLES"):
        monkeypatch.delenv(k, raising=False)
    calls = []

    class Lib:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(heap, "glibc", lambda: Lib())
    assert heap.keep_heap() == "kept" and (heap._M_MMAP_MAX, 0) in calls
    calls.clear()
    assert heap.limit_heap() == heap.HEAP_MMAP_THRESHOLD
    assert (heap._M_MMAP_MAX, 65536) in calls  # otherwise the 1 MiB threshold would do nothing


def test_bench_step_sets_the_heap_as_train_does(monkeypatch, tmp_path, capsys):
    """``gnnio bench step`` times the step under the heap ``gnnio train`` would set: kept on the
    CPU with the features in memory, glibc's own with ``--features-on disk`` (``--heap auto``)."""
    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    ds = write_tiny_dataset(tmp_path / "d", num_nodes=60, num_edges=300)
    calls = []
    monkeypatch.setattr(heap, "keep_heap", lambda: calls.append("keep") or "kept")
    args = ["bench", "step", str(ds), "--device", "cpu", "--batches", "1", "--warmup", "0",
            "--fanouts", "3", "--batch-size", "8", "--hidden", "4", "--quiet", "--json"]  # fmt: skip
    for extra, want in (([], "kept"), (["--features-on", "disk"], "system")):
        calls.clear()
        assert main([*args, *extra]) == 0
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["heap"] == want and calls == (["keep"] if want == "kept" else []), extra
