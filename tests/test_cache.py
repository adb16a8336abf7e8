"""Feature caches: exact rows, the batch semantics against a per-id reference, edge sizes, the
sharded multi-GPU cache, compositions, flat memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.features import FeatureStore, InMemoryFeatureStore
from gnnio.features.caches.cache import (
    POLICIES,
    FeatureCache,
    FirstOccurrence,
    capacity_rows,
    move_rows,
    static_plus_dynamic,
    two_level_cache,
)
from gnnio.features.caches.multi import ShardedFeatureCache

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- the per-id reference --------------------------------------------------------------------


def reference_simulation(policy, capacity, batches, num_rows, hot_ids=None):
    """Replay the documented batch semantics one id at a time with dicts (no tensors).

    Returns ``(per_batch, final)``: per non-empty batch a dict of ``hits``, ``misses``,
    ``insertions``, ``evictions`` (unique ids; rows for static), and the set of cached ids.
    """
    cap = min(int(capacity), num_rows)
    out = []
    if policy == "static":
        hot = set(int(h) for h in list(hot_ids)[:cap])
        for b in batches:
            if len(b) == 0:
                continue
            h = sum(1 for x in b if int(x) in hot)
            out.append(dict(hits=h, misses=len(b) - h, insertions=0, evictions=0))
        return out, hot
    cache: dict[int, dict] = {}  # id -> {"ins": insertion number, "tick": recency, "freq": count}
    clock = 0
    inserted = 0
    for b in batches:
        if len(b) == 0:
            continue
        uniq = []
        for x in b:  # first occurrences, in order
            if int(x) not in uniq:
                uniq.append(int(x))
        ticks = {x: clock + i for i, x in enumerate(uniq)}
        clock += len(uniq)
        hits = [x for x in uniq if x in cache]  # every lookup before any change
        misses = [x for x in uniq if x not in cache]
        for x in hits:
            if policy in ("lru", "lfu"):
                cache[x]["tick"] = ticks[x]
            if policy == "lfu":
                cache[x]["freq"] += 1
        admitted = misses[-cap:] if cap else []
        before = set(cache)  # victims only among entries present before this batch's insertions
        evictions = 0
        for x in admitted:
            if len(cache) == cap:
                cand = [k for k in cache if k in before]
                if policy == "fifo":
                    victim = min(cand, key=lambda k: cache[k]["ins"])
                elif policy == "lru":
                    victim = min(cand, key=lambda k: cache[k]["tick"])
                else:
                    victim = min(cand, key=lambda k: (cache[k]["freq"], cache[k]["tick"]))
                del cache[victim]
                evictions += 1
            cache[x] = {"ins": inserted, "tick": ticks[x], "freq": 1}
            inserted += 1
        out.append(
            dict(hits=len(hits), misses=len(misses), insertions=len(admitted), evictions=evictions)
        )
    return out, set(cache)


@st.composite
def workloads(draw, max_rows=25, max_batches=10, max_len=25):
    n = draw(st.integers(1, max_rows))
    cap = draw(st.integers(0, n + 3))
    batches = draw(
        st.lists(
            st.lists(st.integers(0, n - 1), max_size=max_len), min_size=1, max_size=max_batches
        )
    )
    seed = draw(st.integers(0, 2**31))
    return n, cap, batches, seed


def _feats(n, dim=3, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(dtype)


def _hot(n, seed):
    return np.random.default_rng(seed).permutation(n)


def _cache(policy, feats, cap, seed=0, **kw):
    return FeatureCache(
        InMemoryFeatureStore(feats), cap, policy, hot_ids=_hot(len(feats), seed), **kw
    )


# ---- correctness of rows ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@HYP
@given(w=workloads(), use_out=st.booleans())
def test_every_policy_returns_the_backing_rows(policy, w, use_out):
    n, cap, batches, seed = w
    feats = _feats(n, seed=seed % 1000)
    cache = _cache(policy, feats, cap, seed)
    out = torch.full((40, 3), 9.0)
    for b in batches:
        ids = np.array(b, dtype=np.int64)
        got = cache.gather(ids, out=out if use_out else None)
        assert torch.equal(got, torch.from_numpy(feats[ids]))


@pytest.mark.parametrize("policy", ["fifo", "lru", "lfu"])
@HYP
@given(w=workloads())
def test_counters_match_the_per_id_reference(policy, w):
    n, cap, batches, seed = w
    cache = _cache(policy, _feats(n), cap, seed)
    want, final = reference_simulation(policy, cap, batches, n)
    got = []
    for b in batches:
        cache.gather(np.array(b, dtype=np.int64))
        if b:
            last = cache.stats.last
            got.append({k: last[k] for k in ("hits", "misses", "insertions", "evictions")})
    assert got == want
    assert set(cache.cached_ids().tolist()) == final
    s = cache.stats
    assert s.hits == sum(x["hits"] for x in want) and s.evictions == sum(
        x["evictions"] for x in want
    )


@HYP
@given(w=workloads())
def test_static_counters_match_the_reference(w):
    n, cap, batches, seed = w
    cache = _cache("static", _feats(n), cap, seed)
    want, final = reference_simulation("static", cap, batches, n, hot_ids=_hot(n, seed))
    got = []
    for b in batches:
        cache.gather(np.array(b, dtype=np.int64))
        if b:
            got.append(
                {k: cache.stats.last[k] for k in ("hits", "misses", "insertions", "evictions")}
            )
    assert got == want and set(cache.cached_ids().tolist()) == final


def test_policies_differ_as_documented():
    """Capacity 2; batches [1, 2], [1], [3]: FIFO evicts 1 (oldest insertion), LRU evicts 2 (1 was
    used later), LFU evicts 2 (1 was used twice)."""
    feats = _feats(5)
    left = {}
    for pol in ("fifo", "lru", "lfu"):
        c = FeatureCache(InMemoryFeatureStore(feats), 2, pol)
        for b in ([1, 2], [1], [3]):
            c.gather(b)
        left[pol] = sorted(c.cached_ids().tolist())
    assert left == {"fifo": [2, 3], "lru": [1, 3], "lfu": [1, 3]}
    # LFU keeps the frequent id even when it is the least recent: [1] [1] [2] [3] with capacity 2
    c = FeatureCache(InMemoryFeatureStore(feats), 2, "lfu")
    for b in ([1], [1], [2], [3]):
        c.gather(b)
    assert sorted(c.cached_ids().tolist()) == [1, 3]


def test_repeats_inside_a_batch_are_fetched_once():
    feats = _feats(10)
    store = InMemoryFeatureStore(feats)
    c = FeatureCache(store, 4, "lru")
    got = c.gather([7, 7, 3, 7, 3])
    assert torch.equal(got, torch.from_numpy(feats[[7, 7, 3, 7, 3]]))
    assert store.counters.snapshot()["rows"] == {"host": 2}
    assert c.counters.snapshot()["rows"] == {"cache": 3, "host": 2}
    assert c.stats.last["unique"] == 2 and c.stats.last["insertions"] == 2


# ---- edge sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fifo", "lru", "lfu"])
def test_cache_smaller_than_a_batch_makes_progress(policy):
    """GraphBolt deadlocked when one batch needed more rows than the cache holds (dgl#7646)."""
    feats = _feats(500)
    c = FeatureCache(InMemoryFeatureStore(feats), 4, policy)
    ids = np.arange(100, 400)
    assert torch.equal(c.gather(ids), torch.from_numpy(feats[ids]))
    assert sorted(c.cached_ids().tolist()) == [396, 397, 398, 399]  # the last 4 misses
    c.gather([396, 397, 398, 399])
    assert c.stats.last["hits"] == 4
    for _ in range(3):  # keeps working batch after batch
        ids = np.random.default_rng(_).integers(0, 500, 1000)
        assert torch.equal(c.gather(ids), torch.from_numpy(feats[ids]))
        assert c.policy.size() == 4


@pytest.mark.parametrize("policy", POLICIES)
def test_size_zero_and_size_at_least_n(policy):
    feats = _feats(30)
    ids = np.random.default_rng(0).integers(0, 30, 50)
    zero = _cache(policy, feats, 0)
    for _ in range(2):
        assert torch.equal(zero.gather(ids), torch.from_numpy(feats[ids]))
    assert zero.stats.hits == 0 and zero.capacity == 0 and zero.buffer.shape == (0, 3)
    full = _cache(policy, feats, 1000)
    assert full.capacity == 30
    full.gather(np.arange(30))
    full.reset_stats()
    assert torch.equal(full.gather(ids), torch.from_numpy(feats[ids]))
    assert full.stats.hit_ratio == 1.0 and full.stats.evictions == 0
    assert full.counters.snapshot()["rows"] == {"cache": 50}


def test_capacity_rows():
    assert capacity_rows(0.1, 1000) == 100
    assert capacity_rows(0.0, 1000) == 0
    assert capacity_rows(250, 100) == 100
    assert capacity_rows(1.0, 100) == 1  # a float >= 1 is a row count
    with pytest.raises(ValueError):
        capacity_rows(-1, 10)


@pytest.mark.parametrize("policy", POLICIES)
def test_memory_stays_flat_over_many_batches(policy):
    feats = _feats(2000, dim=4)
    c = _cache(policy, feats, 300)
    rng = np.random.default_rng(5)
    c.gather(rng.integers(0, 2000, 500))
    before = c.nbytes()
    tensors = [c.buffer, c.policy.slot_of, c.policy.key_of]
    ptrs = [t.data_ptr() for t in tensors]
    for _ in range(300):  # many "epochs" of varied batches
        c.gather(rng.integers(0, 2000, int(rng.integers(1, 800))))
    assert c.nbytes() == before
    assert [t.data_ptr() for t in (c.buffer, c.policy.slot_of, c.policy.key_of)] == ptrs
    assert c.policy.size() <= c.capacity


# ---- counters, timers, errors ----------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_counters_cover_every_row_and_timers_run(policy):
    feats = _feats(100)
    c = _cache(policy, feats, 20)
    ids = np.random.default_rng(1).integers(0, 100, 300)
    c.gather(ids)
    c.gather(ids)
    snap = c.counters.snapshot()
    assert sum(snap["rows"].values()) == 600
    assert all(snap["bytes"][t] == r * 12 for t, r in snap["rows"].items())
    assert c.stats.manage_s > 0 and c.stats.copy_s > 0 and c.stats.batches == 2
    quiet = _cache(policy, feats, 20, timing=False)
    quiet.gather(ids)
    assert quiet.stats.manage_s == 0 and quiet.stats.copy_s == 0


def test_bad_arguments():
    store = InMemoryFeatureStore(_feats(10))
    with pytest.raises(ValueError, match="policy"):
        FeatureCache(store, 3, "arc")
    with pytest.raises(ValueError, match="hot_ids"):
        FeatureCache(store, 3, "static")
    with pytest.raises(ValueError, match=">= 0"):
        FeatureCache(store, -2, "fifo")
    with pytest.raises(ValueError, match="duplicates"):
        FeatureCache(store, 3, "static", hot_ids=[1, 1, 2])
    with pytest.raises(TypeError):
        FeatureCache(np.zeros((3, 3)), 3, "fifo")
    c = FeatureCache(store, 3, "lru")
    with pytest.raises(IndexError, match="out of range"):
        c.gather([3, 10])
    assert c.stats.batches == 0 and not c.counters.snapshot()["rows"]


def test_first_occurrence_dedup():
    d = FirstOccurrence(50, torch.device("cpu"))
    ids = torch.tensor([5, 3, 5, 9, 3, 3, 1])
    uniq, inv = d(ids)
    assert uniq.tolist() == [5, 3, 9, 1] and torch.equal(uniq[inv], ids)
    same, none = d(torch.tensor([4, 2, 8]))
    assert same.tolist() == [4, 2, 8] and none is None
    assert bool((d.pos == 2**31 - 1).all())  # scratch reset


def test_move_rows_numba_and_torch_agree():
    src = torch.arange(40, dtype=torch.float16).reshape(10, 4)
    si = torch.tensor([3, 0, 9])
    di = torch.tensor([1, 4, 2])
    a, b = torch.zeros(5, 4, dtype=torch.float16), torch.zeros(5, 4, dtype=torch.float16)
    move_rows(src, si, a, di)
    b.index_copy_(0, di, src.index_select(0, si))
    assert torch.equal(a, b)


# ---- compositions ----------------------------------------------------------------------------


def test_static_plus_dynamic_never_caches_a_row_twice():
    feats = _feats(60)
    c = static_plus_dynamic(InMemoryFeatureStore(feats), 10, 15, np.arange(60), "fifo")
    rng = np.random.default_rng(2)
    for _ in range(20):
        ids = rng.integers(0, 60, 40)
        assert torch.equal(c.gather(ids), torch.from_numpy(feats[ids]))
    static = set(c.cached_ids().tolist())
    dynamic = set(c.backing.cached_ids().tolist())
    assert static == set(range(10)) and not static & dynamic
    rows = c.counters.snapshot()["rows"]
    assert set(rows) <= {"static_cache", "dynamic_cache", "host"} and sum(rows.values()) == 800


def test_two_level_counts_each_level():
    feats = _feats(50)
    c = two_level_cache(InMemoryFeatureStore(feats), 5, 20, "fifo")
    ids = np.arange(30)
    c.gather(ids)  # cold: everything from host; GPU keeps 25..29, CPU keeps 10..29
    c.gather(ids)
    rows = c.counters.snapshot()["rows"]
    assert rows == {"host": 30 + 10, "gpu_cache": 5, "cpu_cache": 15}
    assert c.root is c.backing.backing
    st2 = two_level_cache(InMemoryFeatureStore(feats), 5, 10, "static", hot_ids=np.arange(50)[::-1])
    assert sorted(st2.cached_ids().tolist()) == list(range(45, 50))
    assert sorted(st2.backing.cached_ids().tolist()) == list(range(35, 45))
    assert torch.equal(st2.gather(np.arange(50)), torch.from_numpy(feats))
    assert st2.counters.snapshot()["rows"] == {"gpu_cache": 5, "cpu_cache": 10, "host": 35}


# ---- sharded multi-GPU cache -----------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(max_rows=40, max_batches=12), shards=st.integers(1, 4))
def test_sharded_cache_rows_and_no_duplicates(policy, w, shards):
    n, cap, batches, seed = w
    feats = _feats(n)
    c = ShardedFeatureCache(InMemoryFeatureStore(feats), shards, cap, policy, hot_ids=_hot(n, seed))
    readers = [c] + [c.for_reader(r) for r in range(1, shards)]
    for i, b in enumerate(batches):
        r = readers[i % shards]
        ids = np.array(b, dtype=np.int64)
        assert torch.equal(r.gather(ids), torch.from_numpy(feats[ids]))
        rows = r.counters.snapshot()["rows"]
        assert sum(rows.values()) == r.stats.queries
    held = torch.cat(c.cached_ids()).tolist()
    assert len(held) == len(set(held))  # never stored twice
    for k, ids in enumerate(c.cached_ids()):
        assert all(v % shards == k for v in ids.tolist())  # only by its owner


def test_sharded_cache_local_and_peer_reads():
    feats = _feats(40)
    store = InMemoryFeatureStore(feats)
    c = ShardedFeatureCache(store, 2, 10, "fifo", reader=0)
    c1 = c.for_reader(1)
    c.gather(np.arange(20))  # shard 0 keeps evens, shard 1 odds
    store.counters.reset()
    c1.gather(np.arange(20))
    assert c1.counters.snapshot()["rows"] == {"local": 10, "peer": 10}
    assert c1.shard_counters.snapshot()["rows"] == {"gpu0": 10, "gpu1": 10}
    assert not store.counters.snapshot()["rows"]


# ---- device ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("policy", POLICIES)
def test_cache_on_cuda(policy):
    feats = _feats(300)
    c = FeatureCache(InMemoryFeatureStore(feats), 50, policy, hot_ids=np.arange(300), device="cuda")
    rng = np.random.default_rng(0)
    for _ in range(10):
        ids = torch.from_numpy(rng.integers(0, 300, 120)).cuda()
        got = c.gather(ids)
        assert got.device.type == "cuda"
        assert torch.equal(got.cpu(), torch.from_numpy(feats[ids.cpu().numpy()]))


def test_cache_is_a_feature_store():
    assert isinstance(_cache("fifo", _feats(3), 1), FeatureStore)


# ---- the bench -------------------------------------------------------------------------------


def test_bench_cache_reports_the_documented_keys(tmp_path):
    import argparse

    from gnnio.bench import cache as bench
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "tiny", num_nodes=300, num_edges=1500)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    png = tmp_path / "c.png"
    args = p.parse_args(
        [str(path), "--batch-size", "8", "--fanouts", "3,2", "--batches", "4", "--warmup", "1",
         "--sizes", "0.05,0.2", "--eta-batch-sizes", "4,16", "--eta-batches", "3",
         "--score", "degree", "--no-progress", "--plot", str(png)]
    )  # fmt: skip
    r = bench.run(args)
    keys = {f"{p}+{o}" for p in ("static", "fifo", "lru", "lfu") for o in ("random", "po")}
    assert set(r["hit_ratio"]) == keys and set(r["overhead_ms"]) == keys
    assert all(set(v) == {"0.05", "0.2"} for v in r["hit_ratio"].values())
    assert all(0.0 <= x <= 1.0 for v in r["hit_ratio"].values() for x in v.values())
    assert set(r["eta1"]) == {"4", "16"} and all(0 <= x <= 1 for x in r["eta1"].values())
    assert r["static_score"] == "degree" and png.stat().st_size > 0
    from gnnio.errors import UsageError

    with pytest.raises(UsageError, match="policies"):
        bench.run(p.parse_args([str(path), "--policies", "arc"]))


def test_cli_train_with_the_two_level_cache(tmp_path, capsys):
    """``--cpu-cache-size``: BGL's GPU + CPU cache from the command line; each level counts its
    rows, the GPU level is labeled simulated on a CPU, and training is bit-identical to no cache."""
    import json

    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=200, num_edges=1500)
    common = ["--epochs", "1", "--fanouts", "3,2", "--batch-size", "16", "--hidden", "8", "--quiet"]
    two, plain = tmp_path / "two.json", tmp_path / "plain.json"
    rc = main(["train", str(d), "--cache-policy", "fifo", "--cache-size", "0.05",
               "--cpu-cache-size", "0.2", "--summary", str(two), *common])  # fmt: skip
    assert rc == 0
    assert main(["train", str(d), "--summary", str(plain), *common]) == 0
    s, p = json.loads(two.read_text()), json.loads(plain.read_text())
    assert s["bytes_by_tier"]["gpu_cache"] > 0 and s["bytes_by_tier"]["cpu_cache"] > 0
    assert sum(s["bytes_by_tier"].values()) == sum(p["bytes_by_tier"].values())
    assert s["loss_history"] == p["loss_history"]
    assert any("two-level" in x for x in s["simulated_parts"])
    for bad, word in ((["--cpu-cache-size", "0.2"], "--cache-policy"),
                      (["--cache-policy", "lookahead", "--cpu-cache-size", "0.2"], "lookahead"),
                      (["--cache-policy", "lru", "--cpu-cache-size", "2"], "fraction")):  # fmt: skip
        capsys.readouterr()
        assert main(["train", str(d), *bad, *common]) == 2
        assert word in capsys.readouterr().err
