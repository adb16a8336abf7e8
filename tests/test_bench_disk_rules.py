"""The figures ``gnnio bench disk`` and ``gnnio bench tiers --bandwidth`` (``tier_bandwidth``'s
``_gpu_tier``) print, recounted from the same run or checked with fake timers: the ceilings'
rounds (the warm-up left out; the store held to the ceiling in its own read unit, the 4 KiB one
beside it), each configuration's ceilings measured around it, the rounds' bytes and reads by hand,
bytes (not elements) over GPU (not host) time against the device-to-device copy, and the bench's
refusals. A second mutation pass over gnnio/bench/disk.py and tier_bandwidth.py found each rule
unguarded (the first pass's tests are in tests/test_bench_figures_rules.py, whose fake clock this
file reuses; that file was at its line budget)."""

from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.helpers import write_tiny_dataset
from tests.test_bench_figures_rules import _Script


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("bd") / "d", num_nodes=40, num_edges=160)


# ---- bench disk: the ceilings' rounds, the store's rates, the ceilings each configuration meets ----


class _Growing:
    """A fake ``time`` module whose readings are ever further apart: no two timed spans are equal,
    so a median, a mean and a maximum differ, and a warm-up counted in changes the median."""

    def __init__(self):
        self.t = self.d = 0.0

    def perf_counter(self):
        self.d += 1e-3
        self.t += self.d
        return self.t


def test_disk_timed_gather_is_device_bytes_and_rows_asked_for_per_second(monkeypatch):
    from gnnio.bench import disk as bd

    monkeypatch.setattr(bd, "time", _Script([1.0, 5.0]))
    store = SimpleNamespace(stats=SimpleNamespace(bytes_read=100))
    store.gather = lambda ids: setattr(store.stats, "bytes_read", store.stats.bytes_read + 8192)
    assert bd._timed_gather(store, np.array([3, 3, 4, 9])) == (2048.0, 1.0)  # repeats are rows


class _FakeReader:
    """Records the plans; each read returns its blocks' bytes less 100 (a short last block)."""

    def __init__(self):
        self.bytes_read, self.plans = 0, []

    def read(self, plan):
        self.plans.append(plan)
        self.bytes_read += int(plan.pages.size) * plan.block - 100


def test_disk_random_round_reads_whole_spans_at_distinct_places(monkeypatch):
    """A 3,200-byte span in 512-byte blocks is 7 blocks: 10 blocks hold 4 starting places, so at
    most 4 reads, each of its 7 blocks; 4 KiB rounds read distinct pages, no more than the file
    has. The figures are what the reader returned, and the reads issued."""
    from gnnio.bench import disk as bd

    monkeypatch.setattr(bd, "time", _Script([1.0, 3.0, 10.0, 11.0]))
    r = _FakeReader()
    assert bd._random_round(r, 10, 50, np.random.default_rng(0), 512, 3200) == (2.0, 5020, 4)
    plan = r.plans[0]
    assert plan.block == 512 and plan.pages.tolist() == list(range(10))
    assert bd._random_round(r, 3, 10, np.random.default_rng(0)) == (1.0, 3 * 4096 - 100, 3)
    assert r.plans[1].pages.tolist() == [0, 1, 2] and r.plans[1].block == 4096


def test_disk_seq_round_is_the_bytes_read_in_1_mib_reads(monkeypatch):
    from gnnio.bench import disk as bd

    monkeypatch.setattr(bd, "time", _Script([1.0, 5.0]))
    r = _FakeReader()
    t, b = bd._seq_round(r, 1000, 2, 7919)
    pages = np.concatenate([p.pages for p in r.plans])
    assert (t, b) == (4.0, 512 * 4096 - 100 * len(r.plans))
    assert pages.size == 512 and np.all(np.diff(pages) == 1) and 0 <= pages[0] <= 1000 - 512
    assert all(set(p.run_len.tolist()) == {256} for p in r.plans)  # 1 MiB per read


def test_disk_ceilings_recount_from_the_same_rounds(tmp_path, monkeypatch):
    """``bench disk``'s ceilings with a sub-page store: every figure is the median over the timed
    rounds (the warm-up round left out) of the rounds' own bytes, reads and rows over their own
    times; the store's fraction of the ceiling is held to the single-block ceiling (its read
    unit), the 4 KiB one kept beside it; rows/s over the 4 KiB store's pairs the same ids."""
    from gnnio.bench import disk as bd
    from gnnio.bench._timing import median
    from gnnio.features.stores.disk import DiskFeatureStore

    path = tmp_path / "f.npy"
    np.save(path, np.random.default_rng(0).standard_normal((2000, 800)).astype(np.float32))
    store = DiskFeatureStore(path, block_size=512)
    fds = len(os.listdir("/proc/self/fd"))
    amp = []
    reset = store.reset_stats
    store.reset_stats = lambda: (amp.append(store.stats.read_amplification), reset())
    rounds, seqs, gathers = [], [], []

    def spy(log, fn, key):
        def wrapped(*a):
            out = fn(*a)
            log.append((key(a), out))
            return out

        return wrapped

    monkeypatch.setattr(bd, "time", _Growing())
    monkeypatch.setattr(bd, "_random_round", spy(rounds, bd._random_round,
                                                 lambda a: (a[4] if len(a) > 4 else 4096, a[1])))  # fmt: skip
    monkeypatch.setattr(bd, "_seq_round", spy(seqs, bd._seq_round, lambda a: None))
    monkeypatch.setattr(bd, "_timed_gather", spy(gathers, bd._timed_gather, lambda a: a[0]))
    args = SimpleNamespace(queue_depth=2, seed=0, random_reads=200, seq_mib=1, repeats=3)
    r = bd.ceilings(store, args)
    assert len(os.listdir("/proc/self/fd")) == fds  # its readers and its 4 KiB store closed
    assert r["store_read_amplification"] == amp[0] and store.stats.gathers == 0
    assert amp[0] < r["store_4k_read_amplification"]  # 3,200-byte rows: 7 blocks, not 2 pages
    store.close()
    size = path.stat().st_size  # each round's random places range over the whole file
    assert {k for k, _ in rounds} == {(4096, size // 4096), (512, size // 512)}
    four_k = [o for (blk, _), o in rounds if blk == 4096]
    block = [o for (blk, _), o in rounds if blk == 512]
    assert len(four_k) == 4 and len(block) == 3 and len(seqs) == 3  # (four_k[0]: the warm-up)
    mine = [o for s, o in gathers if s is store]
    other = [o for s, o in gathers if s is not store]
    assert len(mine) == len(other) == 3
    ceil4k = median([b / t for t, b, _ in four_k[1:]])
    ceil = median([b / t for t, b, _ in block])
    store_bps = median([o[0] for o in mine])
    assert r["seq_read_GBps"] == pytest.approx(
        median([b / t for t, b in (o for _, o in seqs)]) / 1e9
    )
    assert r["random_4k_iops"] == pytest.approx(median([n / t for t, _, n in four_k[1:]]))
    assert r["random_4k_MBps"] == pytest.approx(ceil4k / 1e6)
    assert r["random_block_iops"] == pytest.approx(median([n / t for t, _, n in block]))
    assert r["random_block_MBps"] == pytest.approx(ceil / 1e6)
    assert r["ceiling_block_bytes"] == 512 and r["_ceiling_Bps"] == pytest.approx(ceil)
    assert r["store_random_MBps"] == pytest.approx(store_bps / 1e6)
    assert r["random_read_fraction_of_ceiling"] == pytest.approx(store_bps / ceil)
    assert r["random_read_fraction_of_4k_ceiling"] == pytest.approx(store_bps / ceil4k)
    assert r["store_4k_random_MBps"] == pytest.approx(median([o[0] for o in other]) / 1e6)
    assert r["rows_per_s_over_4k"] == pytest.approx(
        median([a[1] / b[1] for a, b in zip(mine, other, strict=True)])
    )


def test_bench_disk_holds_each_configuration_to_the_ceilings_around_it(tiny, monkeypatch):
    """Per configuration: the ceiling measured right before and right after its epochs, in the
    store's read unit (blocks of a row's span when the unit is under 4 KiB), their mean as
    ``ceiling_MBps``; ``ratio_to_bound`` = steady epoch over max(memory epoch, disk bytes over
    that ceiling), ``ratio_to_run_ceiling`` the same with the run's ceiling; ``feature_bytes``
    in bytes."""
    from gnnio.bench import disk as bd

    units, ceil = [], iter([100.0, 300.0, 1000.0, 3000.0])

    def ceiling(args, path, block=4096, span=0, rounds=1):
        units.append((block, span))
        return next(ceil)

    runs = iter([{"first_epoch_s": 3.0, "steady_epoch_s": 2.0, "epoch_s": [3.0, 2.0]},
                 {"steady_epoch_s": 8.0, "disk_bytes": 1000},
                 {"steady_epoch_s": 3.0, "disk_bytes": 3000}])  # fmt: skip
    monkeypatch.setattr(
        bd, "ceilings", lambda *a: {"ceiling_block_bytes": 512, "_ceiling_Bps": 50.0}
    )
    monkeypatch.setattr(bd, "_ceiling_Bps", ceiling)
    monkeypatch.setattr(bd, "_epochs", lambda *a: dict(next(runs)))
    p = argparse.ArgumentParser()
    bd.add_arguments(p)
    try:
        r = bd.run(p.parse_args([str(tiny), "--sizes", "0.5", "--policies", "sieve", "--epochs",
                                 "2", "--batches", "1", "--batch-size", "4", "--fanouts", "2",
                                 "--no-progress"]))  # fmt: skip
    except bd.UsageError:
        pytest.skip("this filesystem refuses O_DIRECT")
    assert r["row_bytes"] == 16 and r["feature_bytes"] == 40 * 16
    assert units == [(512, 16)] * 4
    none, sieve = r["disk"]
    assert none["ceiling_MBps"] == pytest.approx(200 / 1e6)
    assert none["ratio_to_bound"] == pytest.approx(8.0 / (1000 / 200))  # the disk bound
    assert none["ratio_to_run_ceiling"] == pytest.approx(8.0 / (1000 / 50))
    assert sieve["ceiling_MBps"] == pytest.approx(2000 / 1e6)
    assert sieve["ratio_to_bound"] == pytest.approx(3.0 / 2.0)  # the memory epoch bounds it
    assert sieve["ratio_to_run_ceiling"] == pytest.approx(3.0 / (3000 / 50))


@pytest.mark.parametrize("opt", ["--queue-depth", "--repeats", "--random-reads"])
def test_bench_disk_refuses_zero_counts_and_a_zero_cache_size(tiny, opt):
    from gnnio.bench import disk as bd
    from gnnio.errors import UsageError

    p = argparse.ArgumentParser()
    bd.add_arguments(p)
    with pytest.raises(UsageError, match=f"{opt} must be >= 1, got 0"):
        bd._check(p.parse_args([str(tiny), opt, "0"]))
    with pytest.raises(UsageError, match="--sizes: every size must be in"):
        bd._check(p.parse_args([str(tiny), "--sizes", "0,0.1"]))


def test_disk_versus_without_a_read_by_the_best_policy_has_no_ratio():
    """A policy that read nothing (every row a hit) leaves ``lookahead_over_best`` out for that
    size rather than dividing by zero at the end of the run."""
    from gnnio.bench.disk import _versus

    configs = [{"host_cache": 0.5, "policy": p, "disk_bytes": b}
               for p, b in (("static", 0), ("sieve", 200), ("lookahead", 100))]  # fmt: skip
    assert _versus(configs) == {"disk_bytes_over_optimal": {}, "lookahead_over_best": {}}


# ---- the GPU tier's bandwidth (gnnio.bench.tier_bandwidth._gpu_tier), its arithmetic on the CPU ----


def test_gpu_tier_rates_are_useful_bytes_over_gpu_time_held_to_the_copy(monkeypatch):
    """Each figure is the rows' bytes (not elements) over the GPU seconds of one call (not the
    host's); the wide rows move a quarter of the ids at 4x the width; every ratio's denominator
    is the device-to-device copy of the same bytes."""
    from gnnio.bench import tier_bandwidth as tb

    gpu_s = iter([1e-3, 2e-3, 4e-3, 8e-3, 16e-3])  # resident, index_select, d2d, in order, wide
    monkeypatch.setattr(tb, "_gpu_seconds", lambda fn: (next(gpu_s, 1e-3), 2e-5))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    wall = iter([3.0, 1.5])
    feat = torch.randn(1001, 128)
    ids = torch.randint(0, 1001, (402,), generator=torch.Generator().manual_seed(0))
    r = tb._gpu_tier(feat, ids, torch.empty(402, 128), lambda fn: next(wall))
    useful = 402 * 512
    assert r["gpu_resident"] == {"gbps": pytest.approx(useful / 1e-3 / 1e9),
                                 "host_us_per_call": pytest.approx(20.0)}  # fmt: skip
    assert r["gpu_resident_index_select"]["gbps"] == pytest.approx(useful / 2e-3 / 1e9)
    assert r["d2d_copy"]["gbps"] == pytest.approx(useful / 4e-3 / 1e9)
    assert r["wide_rows_gpu_resident"]["gbps"] == pytest.approx(100 * 2048 / 16e-3 / 1e9)
    assert r["ratio"]["gpu_resident_wall/d2d_copy_wall"] == pytest.approx(2.0)
    assert r["ratio"]["ids_in_order/d2d_copy"] == pytest.approx(0.5)
    assert r["ratio"]["wide_rows/d2d_copy"] == pytest.approx((100 * 2048 / 16) / (useful / 4))
