"""The benchmarks' own arithmetic (the figures docs/benchmarks.md quotes): medians, warm-up,
denominators, ceilings, ratios and JSON keys, checked with fake timers or recomputed from the same
run's raw counts. Nothing here asserts a speed."""

from __future__ import annotations

import argparse
import json
import statistics
from types import SimpleNamespace

import numpy as np
import pytest

from gnnio.bench import _timing
from tests.helpers import write_tiny_dataset

# ---- _timing: warm-up untimed, one interval per pass, the median -----------------------------------


class _Clock:
    """A fake ``time`` module: ``perf_counter`` reads ``t``, which the work advances."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        return self.t


def test_time_passes_times_each_pass_alone_and_not_the_warmup(monkeypatch):
    """Each timed pass reports its own duration (not the running total), warm-up calls none."""
    clock = _Clock()
    monkeypatch.setattr(_timing, "time", clock)
    durations = iter([100.0, 200.0, 1.0, 2.0, 4.0])  # two warm-up calls first, then three timed

    def fn():
        clock.t += next(durations)

    assert _timing.time_passes(fn, warmup=2, passes=3) == [1.0, 2.0, 4.0]


def test_time_passes_stops_the_timer_after_the_sync(monkeypatch):
    """With ``sync`` the asynchronous work it waits for is inside each timed interval."""
    clock = _Clock()
    monkeypatch.setattr(_timing, "time", clock)
    pending = []

    def fn():  # launches work that only completes at the barrier
        clock.t += 0.5
        pending.append(3.0)

    def sync():
        while pending:
            clock.t += pending.pop()

    assert _timing.time_passes(fn, warmup=1, passes=2, sync=sync) == [3.5, 3.5]


def test_median_is_the_middle_value_not_the_mean():
    """An outlier pass moves the mean, not the median the benches report."""
    assert _timing.median([1.0, 2.0, 30.0]) == 2.0
    assert _timing.median([1.0, 2.0, 3.0, 30.0]) == 2.5
    assert _timing.median((5.0,)) == 5.0


# ---- gather: GB/s, the fastest ceiling, the ratios ------------------------------------------------

#: scripted seconds of the timed passes, per pass function, in the order each is called
_PASS_S = {
    "gather": [0.4, 0.1, 0.2],  # median 0.2 (min 0.1, mean 0.233)
    "aten_index_select": [0.5, 0.3, 0.4],  # median 0.4
    "numba_u64_rows": [0.2, 0.25, 0.1],  # median 0.2: the fastest ceiling
    "numba_memcpy_rows": [0.8, 0.9, 1.0],  # median 0.9: the slowest
}
_CEILING_BYTES = 2_000_000_000


def _run_gather(monkeypatch, tmp_path, argv):
    """``bench gather`` with scripted pass times; returns its result, the calls in order and the
    ids of the batches it gathered (sampled again here with the same arguments)."""
    from gnnio.bench import gather as bg

    ceilings = {k: (lambda k=k: calls.append(k)) for k in _PASS_S if k != "gather"}
    calls: list[str] = []
    timed = {k: 0 for k in _PASS_S}

    def fake_time_passes(fn, warmup=1, passes=5, sync=None):
        assert warmup == 0 and passes == 1
        name = next((k for k, f in ceilings.items() if f is fn), "gather")
        fn()
        if name == "gather":
            calls.append("gather")
        timed[name] += 1
        return [_PASS_S[name][timed[name] - 1]]

    monkeypatch.setattr(bg, "time_passes", fake_time_passes)
    monkeypatch.setattr(bg, "make_evict", lambda nbytes: lambda: None)
    monkeypatch.setattr(bg, "make_ceiling", lambda rows, gib, seed, pr: (ceilings, _CEILING_BYTES))
    monkeypatch.setattr(bg, "available_ram", lambda: 64 << 30)
    path = write_tiny_dataset(tmp_path / "tiny")
    p = argparse.ArgumentParser()
    bg.add_arguments(p)
    args = p.parse_args([str(path), *argv, "--quiet"])
    res = bg.run(args)
    import gnnio

    ids = bg.sample_batches(gnnio.load(path), p.parse_args([str(path), *argv, "--quiet"]))
    return res, calls, ids


def test_gather_figures_follow_from_the_median_pass_and_the_fastest_ceiling(monkeypatch, tmp_path):
    """GB/s = useful bytes / median gather pass; the ceiling is the fastest copy's median rate;
    the fraction is gather / ceiling; the paired fraction pairs each pass with the best ceiling's;
    warm-up passes are never among the timed ones."""
    argv = ["--batches", "4", "--passes", "3", "--warmup", "2", "--batch-size", "4"]
    res, calls, ids = _run_gather(monkeypatch, tmp_path, [*argv, "--fanouts", "2,2"])
    rows = [int(i.shape[0]) for i in ids]
    row_bytes = res["row_bytes"]
    useful = sum(rows) * row_bytes
    # the store's own count: every gather pass (2 warm-up + 3 timed) read the useful bytes once
    assert sum(res["counters"]["bytes"].values()) == 5 * useful
    assert res["rows_per_batch"] == pytest.approx(statistics.mean(rows))
    assert res["ms_per_batch"] == pytest.approx(0.2 / 4 * 1e3)  # 4 batches a pass
    assert res["gb_per_s"] == pytest.approx(useful / 0.2 / 1e9)
    rates = {k: _CEILING_BYTES / statistics.median(v) / 1e9 for k, v in _PASS_S.items()}
    for k in ("aten_index_select", "numba_u64_rows", "numba_memcpy_rows"):
        assert res[f"ceiling_{k}_gb_per_s"] == pytest.approx(rates[k])
    assert res["ceiling_impl"] == "numba_u64_rows"
    assert res["ceiling_gb_per_s"] == pytest.approx(10.0)
    assert res["fraction_of_ceiling"] == pytest.approx(res["gb_per_s"] / 10.0)
    per_pass = [
        (c / g) * useful / _CEILING_BYTES
        for c, g in zip(_PASS_S["numba_u64_rows"], _PASS_S["gather"])
    ]  # 0.5, 2.5, 0.5 times useful / ceiling bytes
    assert res["fraction_of_ceiling_paired"] == pytest.approx(statistics.median(per_pass))
    # warm-up: each ceiling twice (untimed) before any timed pass; then three timed passes each
    assert calls[:6] == [k for k in _PASS_S if k != "gather" for _ in range(2)]
    assert sorted(calls[6:]) == sorted(list(_PASS_S) * 3)


def test_gather_pass_order_is_drawn_from_seed(monkeypatch, tmp_path):
    """Each round's pass order is a fresh permutation from ``--seed`` (not a fixed seed)."""
    argv = ["--batches", "2", "--passes", "3", "--warmup", "0", "--batch-size", "4"]
    res, calls, _ = _run_gather(monkeypatch, tmp_path, [*argv, "--fanouts", "2,2", "--seed", "7"])
    rng = np.random.default_rng(7)
    assert calls == [str(k) for _ in range(3) for k in rng.permutation(list(_PASS_S))]
    rng0 = np.random.default_rng(0)
    assert calls != [str(k) for _ in range(3) for k in rng0.permutation(list(_PASS_S))]


# ---- tiers: per epoch, per batch, per tier ---------------------------------------------------------


def test_tiers_divides_by_epochs_and_by_every_measured_batch(tmp_path):
    """Over two epochs: bytes are per epoch, the per-batch means are over all measured batches, and
    the per-batch hit ratio is each batch's own GPU share -- recomputed from the same batches."""
    import gnnio
    from gnnio.bench.tiers import host_traffic_experiment
    from gnnio.features.tiers.tiered import hot_rows_for_fraction
    from gnnio.ordering import RandomOrder
    from gnnio.sampling import UniformSampler

    ds = gnnio.load(write_tiny_dataset(tmp_path / "t", num_nodes=300, num_edges=2000, feat_dim=3))
    fanouts, bs, epochs, seed = (3, 2), 40, 2, 4
    score = np.random.default_rng(2).random(ds.num_nodes)
    hot = np.argsort(-score, kind="stable")[: hot_rows_for_fraction(0.2, ds.num_nodes)]
    # the documented batches: RandomOrder(train, bs, seed), epoch_seed = epoch << 32 | batch
    sampler = UniformSampler(ds.graph, fanouts, seed=seed)
    order = RandomOrder(np.asarray(ds.train_idx), bs, seed=seed)
    batches = [
        sampler.sample(s, epoch_seed=(ep << 32) + b).input_nodes.numpy()
        for ep in range(epochs)
        for b, s in enumerate(order.batches(ep))
    ]
    per_epoch = -(-len(ds.train_idx) // bs)  # a short last batch counts as a batch
    assert len(batches) == epochs * per_epoch
    gpu = [int(np.isin(b, hot).sum()) for b in batches]
    rows = sum(b.size for b in batches)
    rb = 3 * 4
    for count_only in (True, False):
        res = host_traffic_experiment(ds, {"r": score}, (0.0, 0.2), fanouts, bs, epochs, seed,
                                      count_only=count_only, progress=False)  # fmt: skip
        assert res["full_batches_per_epoch"] == res["batches_per_epoch"] == per_epoch
        assert res["mean_rows_per_batch"] == pytest.approx(rows / len(batches))
        r0, r = res["rows"]
        assert r["gpu_rows_per_epoch"] == sum(gpu) / epochs
        assert r["gpu_bytes_per_epoch"] == sum(gpu) * rb / epochs
        assert r["host_bytes_per_epoch"] == (rows - sum(gpu)) * rb / epochs
        assert r["hit_ratio"] == pytest.approx(sum(gpu) / rows)
        want = statistics.mean(g / b.size for g, b in zip(gpu, batches))
        assert r["hit_ratio_batch_mean"] == pytest.approx(want)
        assert r0["hit_ratio_batch_mean"] == 0.0 and r0["gpu_bytes_per_epoch"] == 0
        assert r["traffic_reduction"] == pytest.approx(sum(gpu) / rows)
        assert res["reduction_pct"]["r"]["0.2"] == pytest.approx(100 * sum(gpu) / rows)


# ---- cache: measured batches only, ms per measured batch, eta1 -------------------------------------


class _FakeCache:
    """Stands in for FeatureCache: every row is a miss; management ms = capacity, copy ms = 0.5;
    each announce costs 1 ms on the fake clock. Records what it was fed around ``reset_stats``."""

    made: list = []
    clock: _Clock

    def __init__(self, store, capacity, policy, hot_ids=None, lookahead=0):
        self.capacity, self.policy, self.fed, self.before_reset = capacity, policy, [], None
        self.stats = SimpleNamespace()
        self.reset_stats()
        _FakeCache.made.append(self)

    def reset_stats(self):
        if self.before_reset is None and self.fed:
            self.before_reset = len(self.fed)
        self.stats.misses = self.stats.batches = 0
        self.stats.hit_ratio = 0.0
        self.stats.manage_ms_per_batch = float(self.capacity)
        self.stats.copy_ms_per_batch = 0.5

    def announce(self, ids):
        _FakeCache.clock.t += 1e-3

    def gather(self, ids, out=None):
        self.fed.append(int(ids.numel()))
        self.stats.misses += int(ids.numel())
        self.stats.batches += 1


def test_cache_bench_counts_only_the_measured_batches(monkeypatch, tmp_path):
    """Rows fetched and ms per batch are over the ``--batches`` measured batches (warm-up fills,
    is not counted); announce ms join the management ms; copy ms stay apart; the reference size is
    the middle of the sorted sizes; eta1 is the random order's mean over consecutive batches."""
    import gnnio
    from gnnio.bench import cache as bench
    from gnnio.features.caches import cache as cache_mod
    from gnnio.features.caches.cache import capacity_rows
    from gnnio.ordering import RandomOrder
    from gnnio.sampling import UniformSampler

    _FakeCache.made, _FakeCache.clock = [], _Clock()
    monkeypatch.setattr(cache_mod, "FeatureCache", _FakeCache)
    monkeypatch.setattr(bench, "time", _FakeCache.clock)
    path = write_tiny_dataset(tmp_path / "tiny", num_nodes=300, num_edges=1500)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(
        [str(path), "--batch-size", "8", "--fanouts", "3,2", "--batches", "4", "--warmup", "2",
         "--policies", "lru,lookahead", "--lookahead", "2", "--sizes", "0.2,0.05,0.15",
         "--eta-batch-sizes", "8", "--eta-batches", "4", "--score", "degree", "--no-progress",
         "--lookahead-ks", "1"]
    )  # fmt: skip
    r = bench.run(args)
    n = 300
    assert r["overhead_size"] == 0.15
    for c in _FakeCache.made:
        assert c.before_reset == 2 and len(c.fed) == 6
    for o in ("random", "po"):
        fed = _FakeCache.made[0 if o == "random" else 6].fed
        mean_rows = round(statistics.mean(fed[2:]), 1)
        assert r["orders"][o]["input_nodes_mean"] == pytest.approx(statistics.mean(fed[2:]))
        for s in ("0.2", "0.05", "0.15"):
            cap = capacity_rows(float(s), n)
            assert r["rows_fetched"][f"lru+{o}"][s] == mean_rows
            assert r["lookahead_by_k"][o][s]["1"] == {"hit_ratio": 0.0, "rows_fetched": mean_rows}
            assert r["copy_ms_by_size"][f"lru+{o}"][s] == 0.5
            # every cache is told the batch it serves (1 ms each); K = 2 announces batches 4, 5
            # (of 0..5) while serving the measured batches 2 and 3: 2 ms over 4 measured batches
            assert r["overhead_ms_by_size"][f"lru+{o}"][s] == pytest.approx(cap + 1.0)
            assert r["overhead_ms_by_size"][f"lookahead+{o}"][s] == pytest.approx(cap + 0.5)
        assert r["overhead_ms"][f"lru+{o}"] == pytest.approx(capacity_rows(0.15, n) + 1.0)
    # eta1: consecutive random-order batches of 8 seeds, shared share of the later batch's ids
    ds = gnnio.load(path)  # the benches' seeds: the training split
    order = RandomOrder(np.asarray(ds.train_idx, dtype=np.int64), 8, seed=0)
    sampler = UniformSampler(ds.graph, [3, 2], seed=0)
    tr = []
    for s in order.batches(0):
        tr.append(np.unique(sampler.sample(s, epoch_seed=len(tr)).input_nodes.numpy()))
        if len(tr) == 4:
            break
    rates = [np.intersect1d(a, b).size / b.size for a, b in zip(tr, tr[1:])]
    assert r["eta1"] == r["eta1_by_order"]["random"]
    assert r["eta1"]["8"] == pytest.approx(statistics.mean(rates), abs=1e-6)


# ---- locality: bytes, shares and per-batch means over the sampled batches --------------------------


def _locality(path, capsys, *extra):
    from gnnio.cli.main import main

    argv = ["bench", "locality", str(path), "--fanouts", "4,3", "--batch-size", "8",
            "--score", "degree", "--json", "--no-progress", *extra]  # fmt: skip
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_locality_figures_recount_from_the_same_batches(tmp_path, capsys):
    """Host / GPU bytes, per-batch means (over the ``--batches`` sampled, not a whole epoch), the
    neighbour entries read under ``--prune``, the modeled host seconds and ``monotone`` (over the
    scales in increasing order) agree with the batches sampled again here."""
    import gnnio
    from gnnio.features.tiers.tiered import hot_rows_for_fraction
    from gnnio.ordering import RandomOrder
    from gnnio.placement.topology import DEFAULT_HOST_BW
    from gnnio.preprocess.hotness import compute_score
    from gnnio.preprocess.reorder import order_by_score
    from gnnio.sampling import LocalitySampler

    # 1 KiB rows: the modeled host seconds (rounded to 1e-6) are not all 0
    path = write_tiny_dataset(tmp_path / "tiny", num_nodes=400, num_edges=4000, feat_dim=256)
    out = _locality(path, capsys, "--scales", "4,1,2", "--gpu-cache-fraction", "0.1",
                    "--batches", "3", "--prune", "1,1")  # fmt: skip
    ds = gnnio.load(path)
    score = compute_score("degree", ds, fanouts=[4, 3], batch_size=8, progress=False)
    hot = np.sort(order_by_score(score)[: hot_rows_for_fraction(0.1, ds.num_nodes)])
    order = RandomOrder(np.asarray(ds.train_idx, dtype=np.int64), 8, seed=0)
    batches = list(order.batches(0))
    assert out["batches"] == 3 and out["batches_per_epoch"] == len(batches) > 3
    assert out["epoch_fraction"] == round(3 / len(batches), 6)
    deg = np.diff(np.asarray(ds.graph.indptr, dtype=np.int64))
    rb = out["row_bytes"]
    sampler = LocalitySampler(ds.graph, [4, 3], hot_ids=hot, seed=0, num_threads=2,
                              prune=(1.0, 1.0), weights="none")  # fmt: skip
    thr = [int(t) for t in sampler.thresholds]
    assert out["thresholds"] == thr and all(t > 0 for t in thr)
    for s in (4.0, 1.0, 2.0):
        sampler.scale = s
        host = rows = edges = nbr = 0
        for i, seeds in enumerate(batches[:3]):
            mb = sampler.sample(seeds, epoch_seed=i)
            inp = mb.input_nodes.numpy()
            host += int((~np.isin(inp, hot)).sum())
            rows += inp.size
            edges += mb.num_sampled_edges
            hops = mb.meta["hop_nodes"]
            nbr += sum(int(np.minimum(deg[inp[: hops[h]]], t).sum()) for h, t in enumerate(thr))
        k = f"{s:g}"
        assert out["host_bytes"][k] == host * rb
        assert out["gpu_bytes"][k] == (rows - host) * rb
        assert out["host_share"][k] == round(host / rows, 6)
        assert out["input_nodes_per_batch"][k] == round(rows / 3, 1)
        assert out["edges_per_batch"][k] == round(edges / 3, 1)
        assert out["nbr_entries_per_batch"][k] == round(nbr / 3, 1)
        assert out["modeled_host_s"][k] == round(host * rb / DEFAULT_HOST_BW, 6) > 0
    sampler.close()
    h = [out["host_bytes"][k] for k in ("1", "2", "4")]
    assert out["monotone"] == (h[0] >= h[1] >= h[2])


def test_locality_equal_host_bytes_count_as_monotone(tmp_path, capsys):
    """Every row on the GPU: host bytes are 0 at every scale, which never rise, so ``monotone``."""
    path = write_tiny_dataset(tmp_path / "tiny", num_nodes=200, num_edges=1500, feat_dim=4)
    out = _locality(path, capsys, "--scales", "1,2", "--gpu-cache-fraction", "1", "--batches", "2")
    assert out["host_bytes"] == {"1": 0, "2": 0} and out["monotone"] is True


# ---- hotness: the curve, the oracle and the ratio to it --------------------------------------------


def test_cumulative_curve_by_hand():
    """x is the share of nodes taken (k / N after k nodes), y the share of accesses they hold."""
    from gnnio.bench.hotness import cumulative_curve

    counts = np.array([5.0, 0.0, 3.0, 2.0])  # ranking by score: 1, 2, 3, 0
    x, y = cumulative_curve(counts, np.array([1.0, 4.0, 3.0, 2.0]))
    assert x.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert y.tolist() == pytest.approx([0.0, 0.0, 0.3, 0.5, 1.0])


def test_hotness_oracle_and_ratios_recount_from_the_measured_trace(tmp_path):
    """``oracle`` ranks by the measured run's own counts (not the last score's), ``accesses`` and
    ``nodes_accessed`` count that run, and ``ratio_to_oracle`` is score share / oracle share."""
    import gnnio
    from gnnio.bench import hotness as bench
    from gnnio.ordering import RandomOrder
    from gnnio.sampling import UniformSampler

    path = write_tiny_dataset(tmp_path / "d", num_nodes=400, num_edges=3000)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args([str(path), "--fanouts", "4,3", "--batch-size", "16", "--seed", "3",
                         "--scores", "degree,presample", "--fractions", "0.05,0.25", "--quiet"])  # fmt: skip
    res = bench.run(args)
    ds = gnnio.load(path)
    sampler = UniformSampler(ds.graph, [4, 3], seed=3)
    counts = np.zeros(ds.num_nodes, dtype=np.int64)
    for b, s in enumerate(RandomOrder(np.asarray(ds.train_idx), 16, seed=3).batches(0)):
        counts[sampler.sample(s, epoch_seed=b).input_nodes.numpy()] += 1
    assert res["accesses"] == counts.sum() and res["nodes_accessed"] == np.count_nonzero(counts)
    assert res["nodes_accessed"] < ds.num_nodes  # (so the count is not just N)
    for f in (0.05, 0.25):
        k = max(1, round(f * ds.num_nodes))
        top = np.sort(counts)[::-1][:k].sum() / counts.sum()  # the best any k nodes can hold
        assert res["captured"]["oracle"][str(f)] == pytest.approx(top)
        for name in ("degree", "presample"):
            v = res["captured"][name][str(f)]
            assert res["ratio_to_oracle"][name][str(f)] == pytest.approx(v / top)
