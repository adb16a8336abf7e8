"""The lookahead cache and the offline optimum (issue 18, part 2): ``optimal`` equals an exhaustive
search for the most hits on small traces, ``lookahead`` with a window as long as the trace equals
``optimal``, rows are always right, and the robustness cases (K = 0, a window longer than the
epoch, a cache smaller than a batch, a cache as large as the graph, a batch served that was not
announced)."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.features.caches.cache import FeatureCache
from gnnio.features.caches.lookahead import LookaheadPolicy, make_any_policy
from gnnio.features.stores.memory import InMemoryFeatureStore


def _store(n: int, dim: int = 3) -> InMemoryFeatureStore:
    return InMemoryFeatureStore(np.arange(n * dim, dtype=np.float32).reshape(n, dim))


def _hits(trace, n, cap, policy, k=None, kernels=None, hot=None, out=None):
    """Hits per batch of the bare policy on ``trace`` (lists of distinct ids), ``k`` batches
    announced ahead (None = all first): what :class:`FeatureCache` does, without the rows.
    ``kernels``: force the numba (True) or torch (False) path; ``out``: a list the policy is
    appended to."""
    pol = make_any_policy(policy, cap, n, lookahead=k or 0, hot_keys=hot)
    if kernels is not None:
        pol.use_kernels = kernels
    if out is not None:
        out.append(pol)
    ahead, announced, hits = (len(trace) if k is None else k), 0, []
    for t, ids in enumerate(trace):
        while announced < min(len(trace), t + 1 + ahead):
            if isinstance(pol, LookaheadPolicy):
                pol.announce(torch.tensor(trace[announced], dtype=torch.int64))
            announced += 1
        keys = torch.tensor(ids, dtype=torch.int64)
        if isinstance(pol, LookaheadPolicy) and keys.numel():
            pol.begin_batch(keys)
        slots = pol.lookup(keys)
        hit = slots >= 0
        ticks = t * 100 + torch.arange(keys.numel())
        pol.touch(slots[hit], ticks[hit])
        pol.admit(keys[~hit], ticks[~hit])
        hits.append(int(hit.sum()))
        assert pol.filled <= pol.capacity
    return hits


def _run(trace, n, cap, policy, k=None, hot=None, static=0, check_rows=True):
    """Serve ``trace`` (lists of ids) through a :class:`FeatureCache`, announcing ``k`` batches
    ahead (None = all first); returns the hits per batch."""
    store = _store(n)
    c = FeatureCache(store, cap, policy, hot_ids=hot, lookahead=k or 0, static_capacity=static)
    ahead = len(trace) if k is None else k
    announced, hits = 0, []
    for t, ids in enumerate(trace):
        while announced < min(len(trace), t + 1 + ahead):
            c.announce(torch.tensor(trace[announced], dtype=torch.int64))
            announced += 1
        before = c.stats.hits
        x = c.gather(torch.tensor(ids, dtype=torch.int64))
        if check_rows:
            assert torch.equal(x, store.gather(torch.tensor(ids, dtype=torch.int64)))
        hits.append(c.stats.hits - before)
        assert c.policy.filled <= c.capacity
        cached = c.cached_ids()
        assert torch.unique(cached).numel() == cached.numel()
    return hits


def brute_force_max_hits(trace, cap) -> int:
    """Most hits any cache of ``cap`` ids can have on ``trace`` (each batch's distinct ids hit if
    cached before it; afterwards any ``cap`` ids of the cached ones and the batch may stay)."""
    sets = [frozenset(b) for b in trace]

    @functools.cache
    def best(t: int, cache: frozenset) -> int:
        if t == len(sets):
            return 0
        u = sets[t]
        hits = len(u & cache)
        pool = sorted(cache | u)
        top = 0
        for r in range(min(cap, len(pool)) + 1):
            for keep in itertools.combinations(pool, r):
                top = max(top, best(t + 1, frozenset(keep)))
        return hits + top

    return best(0, frozenset())


trace_st = st.lists(
    st.lists(st.integers(0, 5), min_size=0, max_size=4, unique=True), min_size=1, max_size=6
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st, cap=st.integers(1, 3))
def test_optimal_matches_exhaustive_min(trace, cap):
    hits = _hits(trace, 7, cap, "optimal")
    assert sum(hits) == brute_force_max_hits(trace, cap)
    # a window as long as the trace (or longer) is the offline optimum
    assert _hits(trace, 7, cap, "lookahead", k=len(trace) + 3) == hits


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st, cap=st.integers(0, 8), k=st.integers(0, 4))
def test_lookahead_never_beats_the_optimum(trace, cap, k):
    assert sum(_hits(trace, 7, cap, "lookahead", k=k)) <= sum(_hits(trace, 7, cap, "optimal"))


def _random_trace(n=400, batches=20, size=60, seed=0):
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** 0.8  # skewed, like sampled input nodes
    return [rng.choice(n, size, replace=False, p=w / w.sum()).tolist() for _ in range(batches)]


def test_lookahead_beats_the_history_policies_and_nears_the_optimum():
    trace = _random_trace()
    opt = sum(_hits(trace, 400, 40, "optimal"))
    la = sum(_hits(trace, 400, 40, "lookahead", k=8))
    others = {p: sum(_hits(trace, 400, 40, p)) for p in ("fifo", "lru", "lfu")}
    assert la <= opt and la >= max(others.values()), (la, opt, others)


def test_robustness_cases():
    trace = _random_trace(batches=6)
    # K = 0: nothing announced, the frequency fallback alone; works, rows right
    _run(trace, 400, 40, "lookahead", k=0)
    # cache smaller than one batch
    assert sum(_run(trace, 400, 5, "lookahead", k=3)) <= sum(_hits(trace, 400, 5, "optimal"))
    assert _run(trace, 400, 5, "optimal") == _hits(trace, 400, 5, "optimal")
    # cache as large as the graph: every id read before is a hit
    hits = _run(trace, 400, 400, "lookahead", k=2)
    seen: set = set()
    for ids, h in zip(trace, hits, strict=True):
        assert h == len(seen & set(ids))
        seen |= set(ids)
    # capacity 0
    assert sum(_run(trace, 400, 0, "lookahead", k=2)) == 0
    # static hot part (pinned, never evicted) and warm start from the hot ids; rows stay right
    hot = np.arange(399, -1, -1)
    store = _store(400)
    c = FeatureCache(store, 30, "lookahead", hot_ids=hot, lookahead=1, static_capacity=10)
    assert c.policy.filled == 30 and set(c.cached_ids().tolist()) == set(range(370, 400))
    assert torch.equal(c.buffer, store.gather(c.policy.key_of))
    for ids in trace:
        x = c.gather(torch.tensor(ids))
        assert torch.equal(x, store.gather(torch.tensor(ids)))
    assert set(range(390, 400)) <= set(c.cached_ids().tolist())
    _run(trace, 400, 30, "optimal", hot=hot, static=5)


def test_window_longer_than_the_epoch_and_mismatch():
    trace = _random_trace(batches=4)
    c = FeatureCache(_store(400), 50, "lookahead", lookahead=10)
    for ids in trace:  # all four announced: the window is longer than the "epoch"
        c.announce(torch.tensor(ids))
    assert c.policy.window == 4
    for ids in trace:
        c.gather(torch.tensor(ids))
    assert c.policy.window == 0
    c.gather(torch.tensor(trace[0]))  # not announced: served like K = 0
    c.announce(torch.tensor(trace[1]))
    with pytest.raises(ValueError, match="not the batch announced"):
        c.gather(torch.tensor(trace[2]))
    c.reset_window()
    c.gather(torch.tensor(trace[2]))
    assert c.lookahead == 10 and FeatureCache(_store(4), 2, "lru").lookahead == 0


def test_bench_cache_reports_lookahead_and_optimal(tmp_path):
    import argparse

    from gnnio.bench import cache as bench
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "tiny", num_nodes=300, num_edges=1500)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(
        [str(path), "--batch-size", "8", "--fanouts", "3,2", "--batches", "5", "--warmup", "1",
         "--policies", "static,lru,lookahead,optimal", "--sizes", "0.05,0.2", "--eta-batch-sizes",
         "", "--score", "degree", "--lookahead", "2", "--lookahead-ks", "0,1,4", "--no-progress"]
    )  # fmt: skip
    r = bench.run(args)
    keys = {f"{p}+{o}" for p in ("static", "lru", "lookahead", "optimal") for o in ("random", "po")}
    assert set(r["hit_ratio"]) == keys and set(r["rows_fetched"]) == keys
    for o in ("random", "po"):
        for s in ("0.05", "0.2"):
            opt, la = r["rows_fetched"][f"optimal+{o}"][s], r["rows_fetched"][f"lookahead+{o}"][s]
            assert opt <= la and opt <= r["rows_fetched"][f"lru+{o}"][s]
            assert set(r["lookahead_by_k"][o][s]) == {"0", "1", "4"}


# ---- through the loader and gnnio train --------------------------------------------------------


@pytest.mark.parametrize("k", [0, 3, 50])
def test_loader_with_a_lookahead_cache_delivers_the_same_rows(k):
    from gnnio.ordering import RandomOrder
    from gnnio.pipeline.loader import NodeLoader
    from gnnio.sampling import UniformSampler
    from tests.helpers import random_graph

    g = random_graph(800, 6000, seed=4)
    store = _store(800, dim=4)
    cache = FeatureCache(store, 120, "lookahead", lookahead=k)
    order = RandomOrder(np.arange(800), 64, seed=1)
    plain = NodeLoader(UniformSampler(g, [4, 3], seed=2), store, order, num_workers=2)
    cached = NodeLoader(UniformSampler(g, [4, 3], seed=2), cache, order, num_workers=2)
    for epoch in range(2):
        it = cached.epoch(epoch)
        for a, b in zip(plain.epoch(epoch), it, strict=True):
            assert torch.equal(a.input_nodes, b.input_nodes) and torch.equal(a.x, b.x)
        # what is left announced: the next epoch's first batches, K ahead of the last batch
        assert cache.policy.window == min(k, len(cached))
    assert cache.stats.hits > 0
    # an epoch closed early leaves announced batches behind: the next epoch starts clean
    it = cached.epoch(2)
    next(it)
    it.close()
    for a, b in zip(plain.epoch(3), cached.epoch(3), strict=True):
        assert torch.equal(a.x, b.x)


def test_the_window_runs_into_the_next_epoch(monkeypatch):
    import gnnio.pipeline.stages as stages
    from gnnio.ordering import RandomOrder
    from gnnio.pipeline.loader import NodeLoader
    from gnnio.sampling import UniformSampler
    from tests.helpers import random_graph

    g = random_graph(800, 6000, seed=4)
    store = _store(800, dim=4)
    order = RandomOrder(np.arange(800), 64, seed=1)
    n = order.num_batches

    def two_epochs():
        cache = FeatureCache(store, 120, "lookahead", lookahead=2 * n)
        loader = NodeLoader(UniformSampler(g, [4, 3], seed=2), cache, order)
        for _ in loader.epoch(0):
            pass
        window, m0 = cache.policy.window, cache.stats.misses
        for b in loader.epoch(1):  # takes the carried batches; rows are the store's
            assert torch.equal(b.x, store.gather(b.input_nodes))
        for _ in loader.epoch(5, start=3):  # not the carried epoch: starts clean
            pass
        return window, m0, cache.stats.misses - m0

    window, m0, m1 = two_epochs()
    assert window == n  # all of epoch 1, announced before epoch 0 ended
    # epoch 0 fetches what MIN told epochs 0 and 1 in advance fetches
    sampler = UniformSampler(g, [4, 3], seed=2)
    trace = [sampler.sample(s, epoch_seed=(e << 32) + i).input_nodes
             for e in (0, 1) for i, s in enumerate(order.batches(e))]  # fmt: skip
    opt = FeatureCache(store, 120, "optimal")
    for ids in trace:
        opt.announce(ids)
    for ids in trace[:n]:
        opt.gather(ids)
    assert m0 == opt.stats.misses
    # a window that stops at the epoch's end keeps worse rows for epoch 1 (5,698 against 5,673)
    monkeypatch.setattr(stages, "NextEpoch", lambda *a: None)
    window_b, m0_b, m1_b = two_epochs()
    assert window_b == 0 and m0_b == m0 and m1 < m1_b


def test_cli_train_with_the_lookahead_cache(tmp_path, capsys):
    import json

    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=200, num_edges=1500)
    summary = tmp_path / "s.json"
    rc = main(["train", str(d), "--cache-policy", "lookahead", "--lookahead", "4", "--epochs", "1",
               "--fanouts", "3,2", "--batch-size", "16", "--hidden", "8", "--summary",
               str(summary), "--quiet"])  # fmt: skip
    assert rc == 0
    s = json.loads(summary.read_text())
    assert s["config"]["cache_policy"] == "lookahead" and s["config"]["lookahead"] == 4
    # the cache changes where rows come from, never which rows: training is bit-identical
    plain = tmp_path / "p.json"
    rc = main(["train", str(d), "--epochs", "1", "--fanouts", "3,2", "--batch-size", "16",
               "--hidden", "8", "--summary", str(plain), "--quiet"])  # fmt: skip
    assert rc == 0
    p = json.loads(plain.read_text())
    assert p["loss_history"] == s["loss_history"] and p["test_acc"] == s["test_acc"]
    assert s["bytes_by_tier"].get("cache", 0) > 0 and "cache" not in p["bytes_by_tier"]
    rc = main(["train", str(d), "--lookahead", "4", "--quiet"])
    assert rc == 2 and "--lookahead" in capsys.readouterr().err


def test_state_dict_round_trip_keeps_the_hits():
    trace = _random_trace(batches=8)
    a = make_any_policy("lookahead", 40, 400, lookahead=2)
    b = make_any_policy("lookahead", 40, 400, lookahead=2)

    def serve(pol, ids):
        keys = torch.tensor(ids)
        pol.begin_batch(keys)
        hit = pol.lookup(keys) >= 0
        pol.admit(keys[~hit], keys[~hit])
        return int(hit.sum())

    for ids in trace[:4]:
        serve(a, ids)
    a.announce(torch.tensor(trace[4]))  # announced, not served: dropped by the state
    b.load_state_dict(a.state_dict())
    a.reset_window()
    for ids in trace[4:]:
        assert serve(a, ids) == serve(b, ids)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    k=st.integers(0, 6),
    cap=st.integers(1, 120),
    with_hot=st.booleans(),
)
def test_numba_kernels_equal_the_torch_path(seed, k, cap, with_hot):
    """The CPU kernels and the torch path (what a GPU runs) keep the same state on the same
    trace: ranks, serials, fallbacks, the ring (long enough to wrap around) and the hits."""
    rng = np.random.default_rng(seed)
    n = 300
    trace = [list(rng.choice(n, size=int(rng.integers(0, 80)), replace=False)) for _ in range(40)]
    hot = rng.permutation(n)[: int(rng.integers(1, n))] if with_hot else None
    pols: list = []
    a = _hits(trace, n, cap, "lookahead", k=k, kernels=True, hot=hot, out=pols)
    b = _hits(trace, n, cap, "lookahead", k=k, kernels=False, hot=hot, out=pols)
    assert a == b
    pa, pb = pols
    for name in ("keystate", "key_of", "slot_of", "ring_ids", "ring_next"):
        assert torch.equal(getattr(pa, name), getattr(pb, name)), name
    # the kernels' per-slot mirror of the cached keys' ranks is exact
    f = pa.filled
    assert torch.equal(pa.slot_rank[:f], pa.rank_of[pa.key_of[:f]])
    assert (pa.consumed, pa.next_serial) == (pb.consumed, pb.next_serial)


def test_the_numba_kernels_refuse_a_batch_that_was_not_announced():
    pol = make_any_policy("lookahead", 4, 20, lookahead=2)
    assert pol.use_kernels
    pol.announce(torch.tensor([1, 2, 3]))
    before = pol.keystate.clone()
    with pytest.raises(ValueError, match="not the batch announced next"):
        pol.begin_batch(torch.tensor([1, 2, 4]))
    assert torch.equal(pol.keystate, before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("policy", ["lookahead", "optimal"])
def test_lookahead_cache_on_cuda_equals_the_cpu_kernels(policy):  # pragma: no cover - GPU only
    """On a real GPU (the torch path) the cache serves the right rows with the hits of the CPU
    kernels, batch for batch."""
    n, k = 400, 3
    trace = [torch.tensor(t) for t in _random_trace(n, batches=30, size=70, seed=3)]
    store = _store(n, dim=5)
    hot = np.arange(n)[::-1].copy()
    caches = {d: FeatureCache(store, 45, policy, hot_ids=hot, lookahead=k, device=d)
              for d in ("cpu", "cuda")}  # fmt: skip
    assert caches["cpu"].policy.use_kernels and not caches["cuda"].policy.use_kernels
    ahead = len(trace) if policy == "optimal" else k
    for dev, c in caches.items():
        ids = [t.to(dev) for t in trace]
        announced, hits = 0, []
        for t, x in enumerate(ids):
            while announced < min(len(ids), t + 1 + ahead):
                c.announce(ids[announced])
                announced += 1
            before = c.stats.hits
            got = c.gather(x)
            assert got.device.type == torch.device(dev).type
            assert torch.equal(got.cpu(), store.gather(trace[t]))
            hits.append(c.stats.hits - before)
        caches[dev] = hits
    assert caches["cpu"] == caches["cuda"] and sum(caches["cpu"]) > 0


@pytest.mark.parametrize("k", [0, 2, 7])
def test_announce_deduplicates_in_the_kernel_pass(k):
    """FeatureCache.announce on the CPU deduplicates inside the kernels' announce pass (no separate
    dedup): with repeated ids in every batch, the cache's hits and rows equal those of the torch
    path (dedup, then announce), batch for batch, and the state is the same."""
    rng = np.random.default_rng(k)
    n = 500
    store = _store(n, dim=3)
    hot = rng.permutation(n)
    trace = [torch.from_numpy(rng.integers(0, n, int(rng.integers(0, 150)))) for _ in range(25)]
    out = []
    for kernels in (True, False):
        c = FeatureCache(store, 60, "lookahead", hot_ids=hot, lookahead=k)
        c.policy.use_kernels = kernels
        hits, announced = [], 0
        for t, ids in enumerate(trace):
            while announced < min(len(trace), t + 1 + k):
                c.announce(trace[announced])
                announced += 1
            before = c.stats.hits
            assert torch.equal(c.gather(ids), store.gather(ids))
            hits.append(c.stats.hits - before)
        out.append((hits, c.policy))
    (ha, pa), (hb, pb) = out
    assert ha == hb and sum(ha) > 0
    for name in ("keystate", "key_of", "ring_ids", "ring_next"):
        assert torch.equal(getattr(pa, name), getattr(pb, name)), name
    # the fused pass's (unique, inverse) is what the separate dedup gives
    pol = make_any_policy("lookahead", 10, n, lookahead=2)
    ids = torch.tensor([5, 3, 5, 9, 3, 3, 0])
    uniq, inv = pol.announce_ids(ids)
    assert uniq.tolist() == [5, 3, 9, 0] and inv.tolist() == [0, 1, 0, 2, 1, 1, 3]
    uniq, inv = pol.announce_ids(torch.tensor([4, 1]))
    assert uniq.tolist() == [4, 1] and inv is None


def test_host_ids_on_a_device_cache_are_checked_on_the_host(monkeypatch):
    """A CPU sampler feeding a GPU lookahead cache: the batch announced is served with the dedup
    made at announce() after comparing the ids with a host copy, never with their device copy
    (that comparison reads the device back, a sync per batch); ids changed in place since are
    still caught. Simulated on the CPU: ``ids_on`` returns a copy, as a device copy would be."""
    import gnnio.features.caches.cache as cache_mod

    copies = []

    def ids_on(store, ids, device):
        copies.append(torch.as_tensor(ids, dtype=torch.int64).clone())
        return copies[-1]

    monkeypatch.setattr(cache_mod, "ids_on", ids_on)
    monkeypatch.setattr(cache_mod, "_host_ids", lambda ids, idx: isinstance(ids, torch.Tensor))
    equal = torch.equal
    read = []

    def spy(a, b):
        read.extend(x for x in (a, b) if any(x is c for c in copies))
        return equal(a, b)

    monkeypatch.setattr(torch, "equal", spy)

    def after_the_first(c):
        assert read == [] and c.policy.window == 1

    _refuses_a_batch_changed_after_announce(equal, after_the_first)


def _refuses_a_batch_changed_after_announce(equal=torch.equal, after_the_first=None) -> None:
    """Two batches announced to a lookahead cache: the first gathers the store's rows (then
    ``after_the_first(cache)``); the second, changed in place after announce(), is refused."""
    trace = _random_trace(batches=3)
    store = _store(400)
    c = FeatureCache(store, 50, "lookahead", lookahead=2)
    batches = [torch.tensor(ids) for ids in trace]
    for b in batches[:2]:
        c.announce(b)
    assert equal(c.gather(batches[0]), store.gather(batches[0]))
    if after_the_first is not None:
        after_the_first(c)
    batches[1][0] = (batches[1][0] + 1) % 400  # changed in place after announce()
    with pytest.raises(ValueError, match="not the batch announced"):
        c.gather(batches[1])


def test_ids_changed_in_place_after_announce_are_caught_on_the_cpu():
    """On the CPU ``ids_on`` gives the announced ids as a tensor over the same memory, so the
    batch compared with it at gather() always matched: ids changed in place after announce()
    (a reused buffer, say) were served with the rows of the ids announced. Now they are
    compared with a copy made at announce() and refused, as on a GPU."""
    _refuses_a_batch_changed_after_announce()


def test_unknown_policy_names_every_policy_the_cache_takes():
    """FeatureCache takes lookahead, optimal, sieve and s3fifo too: its refusal names them."""
    store = InMemoryFeatureStore(np.zeros((8, 2), np.float32))
    with pytest.raises(ValueError, match="unknown cache policy 'foo'") as e:
        FeatureCache(store, 4, "foo")
    assert all(p in str(e.value) for p in ("lookahead", "optimal", "sieve", "s3fifo"))
