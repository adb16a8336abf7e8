"""HyDRA's intra-machine reuse level (§III-B2 ②, gnnio/distributed/group_reuse.py): the plan
against a per-row reference, and the sharded store's gathers with ``reuse="machine"`` on
thread-ranks (tests/fake_dist.py): right rows, each host row read once per group, hand-overs
counted as peer bytes, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.distributed.group_reuse import plan
from gnnio.distributed.store import ShardedFeatureStore
from gnnio.features import InMemoryFeatureStore
from gnnio.placement import Placement
from gnnio.placement.topology import load_topology
from tests.fake_dist import run_ranks


def _reference(me, needs, prevs, by_residue=False):
    """Row by row, as the module docstring says it."""
    g = len(needs)
    reads, send = [], [[] for _ in range(g)]
    recv = [[] for _ in range(g)]
    group_reads = recv_prev = 0
    for x in sorted(set().union(*map(set, needs))):
        rem = [k for k in range(g) if x in needs[k] and x not in prevs[k]]
        if not rem:
            continue
        holders = [k for k in range(g) if x in prevs[k]]
        if holders:
            sup = holders[x % len(holders)]
        else:
            sup = x % g if by_residue else rem[x % len(rem)]
            group_reads += 1
            if sup == me:
                reads.append(x)
        for k in rem:
            if k == sup:
                continue
            if sup == me:
                send[k].append(x)
            if k == me:
                recv[sup].append(x)
                recv_prev += bool(holders)
    return reads, send, recv, group_reads, recv_prev


_lists = st.lists(st.lists(st.integers(0, 40), max_size=25), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(needs=_lists, prevs=_lists, by_residue=st.booleans(), data=st.data())
def test_the_plan_is_the_per_row_reference(needs, prevs, by_residue, data):
    g = len(needs)
    prevs = (prevs * g)[:g]
    needs = [np.unique(np.array(a, dtype=np.int64)) for a in needs]
    prevs = [np.unique(np.array(a, dtype=np.int64)) for a in prevs]
    me = data.draw(st.integers(0, g - 1))
    p = plan(me, needs, prevs, by_residue)
    reads, send, recv, group_reads, recv_prev = _reference(
        me, [set(a.tolist()) for a in needs], [set(a.tolist()) for a in prevs], by_residue
    )
    assert p.reads.tolist() == reads
    assert [a.tolist() for a in p.send] == send
    assert [a.tolist() for a in p.recv] == recv
    assert p.host_rows_group == group_reads and p.recv_from_prev == recv_prev
    held = set(prevs[me].tolist())
    assert [a.tolist() for a in p.send_from_prev] == [[x in held for x in s] for s in send]
    assert p.reads_mine.tolist() == [x in set(needs[me].tolist()) for x in reads]
    if by_residue:  # a row no member holds is read by its residue's member
        assert all(x % g == me for x in reads)
    # every row this member needs and lacks arrives exactly once
    lacking = sorted(set(needs[me].tolist()) - held)
    assert sorted([x for x in reads if x in lacking] + sum(recv, [])) == lacking


def test_a_group_of_more_than_62_members_is_planned():
    """A topology's NVLink group may be large (an NVL72 domain: 72 GPUs); the plan flagged the
    members of a row in 64-bit masks and refused groups of more than 62 at the first gather."""
    rng = np.random.default_rng(7)
    g = 72
    needs = [np.unique(rng.integers(0, 300, 20)) for _ in range(g)]
    prevs = [np.unique(rng.integers(0, 300, 20)) for _ in range(g)]
    for by_residue in (False, True):
        for me in (0, 63, 71):
            p = plan(me, needs, prevs, by_residue)
            reads, send, recv, group_reads, recv_prev = _reference(
                me, [set(a.tolist()) for a in needs], [set(a.tolist()) for a in prevs], by_residue
            )
            assert p.reads.tolist() == reads and p.host_rows_group == group_reads
            assert [a.tolist() for a in p.send] == send and [a.tolist() for a in p.recv] == recv
            assert p.recv_from_prev == recv_prev


def test_a_plan_of_mismatched_lists_or_member_is_refused():
    """Needs and previous lists of different counts, or a member outside the group: one line
    (the kernel would read past its list bounds, or plan for another member)."""
    a = np.arange(3, dtype=np.int64)
    for me, needs, prevs in ((0, [a, a], [a]), (2, [a, a], [a, a]), (-1, [a, a], [a, a])):
        with pytest.raises(ValueError, match="group plan: 2 needs"):
            plan(me, needs, prevs)


def test_the_gpu_level_asked_for_is_reported_as_it_is():
    """``--reuse-level gpu`` is the level that runs, on any topology, with nothing to explain."""
    from gnnio.distributed.group_reuse import level_info

    for topology in ("2", "1+1", "pcie-2gpu"):
        assert level_info(load_topology(topology), "gpu") == {"level": "gpu"}


N, DIM = 60, 3
FEATS = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)


def _batches(world: int, seed: int = 0, k: int = 25, n: int = 6) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {r: [torch.randperm(N, generator=gen)[:k] for _ in range(n)] for r in range(world)}


def _run(level, topology, placement, batches, machine_of=None):
    def body(ctx):
        store = ShardedFeatureStore(InMemoryFeatureStore(FEATS), placement, ctx, reuse=level)
        ok = all(torch.equal(store.gather(b), FEATS[b]) for b in batches[ctx.rank])
        gr = store.group_reuse
        return ok, dict(store.counters.rows), None if gr is None else gr.forwarded_rows

    return run_ranks(len(batches), body, topology, machine_of=machine_of)


PL2 = Placement("hand", N, ((0, 1),), [np.arange(10), np.arange(10, 20)])


def test_two_ranks_read_each_host_row_once_and_hand_it_over():
    batches = _batches(2)
    gpu = _run("gpu", load_topology("2"), PL2, batches)
    mach = _run("machine", load_topology("2"), PL2, batches)
    assert all(ok for ok, _, _ in gpu + mach)
    host = {lvl: sum(r[1].get("host", 0) for r in res) for lvl, res in (("gpu", gpu), ("m", mach))}
    assert host["m"] < host["gpu"]
    for (_, g, _), (_, m, fwd) in zip(gpu, mach):
        # the same rows from the own shard and the own previous batch; host reads become peer
        assert m["local"] == g["local"] and m["reuse"] == g["reuse"]
        assert m["host"] + m["peer"] == g["host"] + g["peer"]
        assert m["peer"] - g["peer"] == fwd > 0
    # the group's host reads: each row a rank needs from host and lacks from its own previous
    # batch, once per batch over the two ranks (by hand from the batches' ids)
    want = 0
    prev = [set(), set()]
    for b0, b1 in zip(batches[0], batches[1]):
        need = [{x for x in b.tolist() if x >= 20} for b in (b0, b1)]
        lack = [need[k] - prev[k] for k in (0, 1)]
        want += len({x for x in lack[0] | lack[1] if not any(x in p for p in prev)})
        prev = need
    assert host["m"] == want


def test_a_row_a_member_held_from_its_previous_batch_is_counted_as_such():
    """Rank 1 reads host row 31 for its first batch; rank 0 needs it for its second and gets it
    from rank 1's previous batch: one forwarded row, from a previous batch (the counts ``gnnio
    bench dist`` reports as ``forwarded_bytes`` and ``forwarded_from_prev_bytes``)."""
    batches = {
        0: [torch.tensor([0]), torch.tensor([31])],
        1: [torch.tensor([31]), torch.tensor([12])],
    }

    def body(ctx):
        store = ShardedFeatureStore(InMemoryFeatureStore(FEATS), PL2, ctx, reuse="machine")
        ok = all(torch.equal(store.gather(b), FEATS[b]) for b in batches[ctx.rank])
        gr = store.group_reuse
        return ok, gr.forwarded_rows, gr.forwarded_from_prev

    assert run_ranks(2, body, load_topology("2")) == [(True, 1, 1), (True, 0, 0)]


def test_a_host_row_two_ranks_need_is_read_by_one_of_them():
    batches = {0: [torch.tensor([0, 31, 33])], 1: [torch.tensor([31, 12, 33])]}
    res = _run("machine", load_topology("2"), PL2, batches)
    assert all(ok for ok, _, _ in res)
    # 31 % 2 = 1: rank 1 reads 31 and hands it to rank 0; 33 % 2 = 1 as well
    assert res[0][1] == {"local": 1, "peer": 2}
    assert res[1][1] == {"local": 1, "host": 2}


def test_groups_hand_rows_over_within_themselves_only():
    """Four ranks, two machines of an NVLink pair each: no hand-over crosses machines."""
    pl = Placement("hand", N, ((0, 1), (2, 3)), [np.arange(k * 5, k * 5 + 5) for k in range(4)])
    topo, machines = load_topology("2*2"), [0, 0, 1, 1]
    batches = _batches(4, seed=1)
    gpu = _run("gpu", topo, pl, batches, machines)
    mach = _run("machine", topo, pl, batches, machines)
    assert all(ok for ok, _, _ in gpu + mach)
    for (_, g, _), (_, m, fwd) in zip(gpu, mach):
        assert m.get("network", 0) == 0
        assert m["host"] + m["peer"] == g["host"] + g["peer"] and fwd > 0
    for pair in ((0, 1), (2, 3)):
        assert sum(mach[k][1]["host"] for k in pair) < sum(gpu[k][1]["host"] for k in pair)


def test_a_rank_alone_in_its_group_takes_part_in_the_exchanges():
    """Groups of 2 and 1: every rank issues the same collectives (a rank that skipped them
    would leave the others waiting); the lone rank reads its host rows itself."""
    pl = Placement("hand", N, ((0, 1), (2,)), [np.arange(k * 5, k * 5 + 5) for k in range(3)])
    batches = _batches(3, seed=4)
    gpu = _run("gpu", load_topology("2+1"), pl, batches)
    mach = _run("machine", load_topology("2+1"), pl, batches)
    assert all(ok for ok, _, _ in gpu + mach)
    assert mach[2][1] == gpu[2][1] and mach[2][2] == 0
    assert mach[0][2] > 0 and mach[1][2] > 0


def test_a_group_listed_out_of_rank_order_hands_over_the_right_rows():
    """A topology file may list a group's ranks in any order (``[[2, 0, 1]]``): the hand-over's
    buffers are in rank order, so in the group's order the rows went to the wrong members."""
    from gnnio.placement.topology import Topology

    topo = Topology(name="t", groups=((2, 0, 1),))
    pl = Placement("hand", N, ((0, 1, 2),), [np.arange(k * 5, k * 5 + 5) for k in range(3)])
    res = _run("machine", topo, pl, _batches(3, seed=5))
    assert all(ok for ok, _, _ in res) and all(fwd > 0 for _, _, fwd in res)


def test_without_faster_peer_links_it_is_the_gpu_level():
    slow = load_topology("2", peer_bw="5GB/s", host_bw="12GB/s")
    batches = _batches(2, seed=2)
    gpu = _run("gpu", slow, PL2, batches)
    mach = _run("machine", slow, PL2, batches)
    assert [r[1] for r in mach] == [r[1] for r in gpu]
    assert [r[2] for r in mach] == [None, None]


def test_a_rewound_checkpoint_resumes_the_same_rows_and_counts():
    batches = _batches(2, seed=3, n=5)

    def body(ctx):
        def store():
            return ShardedFeatureStore(InMemoryFeatureStore(FEATS), PL2, ctx, reuse="machine")

        s = store()
        s.keep_log = True
        for b in batches[ctx.rank][:4]:
            s.gather(b)
        base = dict(s.counters.rows)
        back = s.state_dict(upto=2)
        # an uninterrupted store's counts over batches 3-5 against a resumed one's
        s.gather(batches[ctx.rank][4])
        tail = {k: v - base.get(k, 0) for k, v in s.counters.rows.items()}
        f = store()
        f.load_state_dict(back)
        ok = True
        for b in batches[ctx.rank][2:4]:
            ok &= torch.equal(f.gather(b), FEATS[b])
        f.counters.reset()
        ok &= torch.equal(f.gather(batches[ctx.rank][4]), FEATS[batches[ctx.rank][4]])
        return ok, tail, dict(f.counters.rows)

    for ok, tail, resumed in run_ranks(2, body, load_topology("2")):
        assert ok and resumed == {k: v for k, v in tail.items() if v}


@pytest.mark.parametrize("lists", ["none", "another group's"])
def test_a_checkpoint_without_this_groups_lists_resumes_without_a_previous_batch(lists):
    """A checkpoint with no group lists (a gpu-level run's) or another group size's: the resumed
    members start with no previous batch at all (they plan from the same lists, or none has one)
    and read the right rows, counted as a fresh store's first gather is."""
    batches = _batches(2, seed=4, n=3)

    def body(ctx):
        def store():
            return ShardedFeatureStore(InMemoryFeatureStore(FEATS), PL2, ctx, reuse="machine")

        s = store()
        for b in batches[ctx.rank][:2]:
            s.gather(b)
        state = s.state_dict()
        state["group_prev"] = None if lists == "none" else state["group_prev"][:1]
        resumed, fresh = store(), store()
        resumed.load_state_dict(state)
        last = batches[ctx.rank][2]
        ok = torch.equal(resumed.gather(last), FEATS[last])
        fresh.gather(last)
        return ok, dict(resumed.counters.rows), dict(fresh.counters.rows)

    for ok, resumed, fresh in run_ranks(2, body, load_topology("2")):
        assert ok and resumed == fresh


def test_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="reuse"):
        run_ranks(
            2,
            lambda ctx: ShardedFeatureStore(InMemoryFeatureStore(FEATS), PL2, ctx, reuse="x"),
            load_topology("2"),
        )


def test_caches_in_front_of_host_memory_act_as_one_machine_cache():
    """BGL's CPU level, one per machine: with a cache in front of host memory, a row no member
    holds is read by member ``id mod g`` (needed by it or not), so each rank's cache holds one
    residue and the group's caches hold distinct rows. Rank 0's batches alternate two sets of
    20 host rows, rank 1's the first half of each (no reuse from a previous batch): per-rank
    caches of 20 rows (gpu level): rank 0's holds one set and misses every row of the next; the machine
    level's two caches hold both sets (20 rows each, one residue) and hit every row after the
    first two batches. Read by one of the members that need it instead, rank 0 would read the
    rows only it needs, both residues, 30 rows for its 20-row cache."""
    from gnnio.features.caches.cache import FeatureCache

    sets = [torch.arange(20, 40), torch.arange(40, 60)]
    batches = {0: [sets[t % 2] for t in range(6)], 1: [sets[t % 2][:10] for t in range(6)]}

    def body(level):
        def fn(ctx):
            cache = FeatureCache(InMemoryFeatureStore(FEATS), 20, "fifo", tier="cache")
            store = ShardedFeatureStore(cache, PL2, ctx, reuse=level)
            ok = all(torch.equal(store.gather(b), FEATS[b]) for b in batches[ctx.rank])
            return ok, dict(store.counters.rows), cache.cached_ids().numpy()

        return run_ranks(2, fn, load_topology("2"))

    gpu, mach = body("gpu"), body("machine")
    assert all(r[0] for r in gpu + mach)
    # rank 0 misses every row of every batch; rank 1's 20 rows fit its cache
    assert [(r[1].get("host", 0), r[1].get("cache", 0)) for r in gpu] == [(120, 0), (20, 40)]
    for k, (_, rows, cached) in enumerate(mach):
        assert sorted(cached % 2) == [k] * 20  # its residue only, both sets
        assert rows["host"] == 20 and rows["cache"] == 40  # read once, then hits
    # rank 0 gets the odd rows of its sets; rank 1 the even rows of its halves (and reads the
    # odd rows only rank 0 needs, for it)
    assert [r[1]["peer"] for r in mach] == [60, 30]


@pytest.mark.parametrize("level,groups", [("gpu", "2"), ("machine", "2"), ("machine", "1,0")])
def test_a_static_cache_holds_the_hottest_rows_of_its_residue(tmp_path, level, groups):
    """``gnnio train --cache-policy static`` with the machine level: each rank's cache holds
    the hottest host rows of its residue (it reads no other), at the gpu level of any residue.
    The residue is the rank's position in ascending order, as the plan counts it, also where
    the topology lists the group as ``[[1, 0]]``."""
    from gnnio.distributed.train import DistRun
    from gnnio.graph import load
    from gnnio.train.config import TrainConfig
    from tests.helpers import write_tiny_dataset

    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=200, num_edges=1600, seed=2))
    cfg = TrainConfig(
        fanouts=[3, 2], batch_size=16, score="degree", cache_policy="static", cache_size=0.1,
        placement_strategy="alg1", buffer=0.2, progress=False, reuse_level=level,
    )  # fmt: skip

    def body(ctx):
        setup = DistRun(ctx).build_store(ds, cfg, torch.device("cpu"))
        return setup.store.host_store.cached_ids().numpy(), setup.store.dev_num.numpy()

    from gnnio.placement.topology import Topology

    topo = Topology(name="t", groups=((1, 0),)) if groups == "1,0" else load_topology(groups)
    res = run_ranks(2, body, topo)
    from gnnio.train.setup import hot_score

    score = hot_score(ds, cfg, progress=False)
    for k, (cached, dev_num) in enumerate(res):
        assert cached.size == 20 and (dev_num[cached] < 0).all()
        if level == "machine":
            assert (cached % 2 == k).all()
        hottest = np.argsort(-score, kind="stable")  # the rows it may hold, hottest first
        hottest = hottest[dev_num[hottest] < 0]
        if level == "machine":
            hottest = hottest[hottest % 2 == k]
        assert sorted(cached.tolist()) == sorted(hottest[:20].tolist())
    if level == "gpu":  # (both ranks read the same host rows here: the same hottest ones)
        assert not (res[0][0] % 2 == 0).all()


@pytest.mark.parametrize("policy", ["lru", "static"])
def test_a_cache_of_size_0_is_no_cache(tmp_path, policy):
    """``--cache-policy P --cache-size 0`` (a fraction in [0, 1]): a rank reads host memory
    directly, and the summary has no ``cache`` entry (as ``--cache-policy none``)."""
    from gnnio.distributed.train import DistRun
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.graph import load
    from gnnio.train.config import TrainConfig
    from tests.helpers import write_tiny_dataset

    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=100, num_edges=600, seed=1))
    cfg = TrainConfig(fanouts=[2], batch_size=8, cache_policy=policy, cache_size=0.0,
                      score="degree", progress=False, placement_strategy="alg1", buffer=0.2)  # fmt: skip

    def body(ctx):
        setup = DistRun(ctx).build_store(ds, cfg, torch.device("cpu"))
        return isinstance(setup.store.host_store, FeatureCache), "cache" in setup.info

    assert run_ranks(2, body, load_topology("2")) == [(False, False)] * 2


@pytest.mark.parametrize("policy", ["lru", "sieve", "s3fifo"])
def test_evaluation_leaves_the_groups_caches_alone(tmp_path, policy):
    """Evaluation reads below a dynamic cache (as in one process): its batches must not evict
    the training rows of a rank's residue cache. SIEVE and S3-FIFO caches were read through."""
    from gnnio.distributed.train import DistRun
    from gnnio.graph import load
    from gnnio.train.config import TrainConfig
    from tests.helpers import write_tiny_dataset

    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=200, num_edges=1600, seed=2))
    cfg = TrainConfig(
        fanouts=[3, 2], batch_size=16, cache_policy=policy, cache_size=0.1, progress=False,
        placement_strategy="alg1", buffer=0.2, reuse_level="machine",
    )  # fmt: skip

    def body(ctx):
        setup = DistRun(ctx).build_store(ds, cfg, torch.device("cpu"))
        cache = setup.store.host_store
        setup.store.gather(torch.arange(0, 200, 3))
        held = cache.cached_ids().sort().values
        want = torch.from_numpy(np.asarray(ds.features))
        ok = torch.equal(setup.eval_store.gather(torch.arange(200)), want)
        return ok, torch.equal(cache.cached_ids().sort().values, held)

    assert run_ranks(2, body, load_topology("2")) == [(True, True)] * 2


@pytest.mark.parametrize(
    "topology,want",
    [
        ("2", {"level": "machine"}),
        ("1+1", {"level": "gpu", "asked": "machine", "why": "no NVLink group has two ranks"}),
        ("pcie-2gpu", {"level": "gpu", "asked": "machine"}),
    ],
)
def test_the_summary_says_which_level_ran(tmp_path, topology, want):
    """``data_setup.reuse``: the machine level where it runs, else the gpu level and why (one
    warning line on the main rank)."""
    import warnings

    from gnnio.distributed.train import DistRun
    from gnnio.graph import load
    from gnnio.train.config import TrainConfig
    from tests.helpers import write_tiny_dataset

    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=100, num_edges=600, seed=1))
    cfg = TrainConfig(fanouts=[2], batch_size=8, progress=False, reuse_level="machine",
                      placement_strategy="alg1", buffer=0.2)  # fmt: skip

    def body(ctx):
        return DistRun(ctx).build_store(ds, cfg, torch.device("cpu")).info["reuse"]

    with warnings.catch_warnings(record=True) as got:  # (process-wide: around both ranks)
        warnings.simplefilter("always")
        infos = run_ranks(2, body, load_topology(topology))
    for info in infos:
        assert {k: v for k, v in info.items() if k in want} == want
    warned = [str(w.message) for w in got if "--reuse-level" in str(w.message)]
    assert len(warned) == (want["level"] == "gpu")  # the main rank's one line
