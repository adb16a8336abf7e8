"""Placement rules the broad property tests of test_placement.py do not pin down: which copy a
GPU reads, slow peers, ties, capacity, PaGraph's L hops and cap, the cost report's summaries and
the planner's partition-local traces (each found by a mutation that survived those tests)."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.errors import UsageError
from gnnio.graph import CSRGraph, load
from gnnio.placement import Placement, PlacementRequest, hottest_order, place
from gnnio.placement.costmodel import placement_cost
from gnnio.placement.interleaved import interleave
from gnnio.placement.plan_budget import GPU_NODE_BYTES, plan_fixed_bytes
from gnnio.placement.planner import make_plan
from gnnio.placement.topology import load_topology
from tests.helpers import write_tiny_dataset


def test_lookup_reads_the_lowest_numbered_peer():
    """Node 5 sits on GPUs 1 and 2 of one group: GPU 0 reads it from GPU 1 (the lowest)."""
    topo = load_topology("3")
    pl = Placement("hand", 8, topo.groups, [np.array([0]), np.array([7, 5]), np.array([5, 6])])
    lk = pl.lookup(0)
    assert lk.dev_num[5] == 1 and lk.buf_pos[5] == 1
    assert pl.lookup(2).dev_num[5] == 2  # a local copy always wins


def test_no_peer_reads_means_no_peers():
    """A placement without peer reads (PaGraph) reads local or host rows, even when asked."""
    topo = load_topology("2")
    pl = Placement("hand", 4, topo.groups, [np.array([0]), np.array([1])], peer_reads=False)
    assert pl.peers(0) == ()
    assert pl.lookup(0, peers=True).dev_num.tolist() == [0, -1, -1, -1]


@pytest.mark.parametrize("strategy", ["alg1", "interleaved", "mod"])
def test_slow_peers_give_every_gpu_the_hottest_rows(strategy):
    """C_gpu >= C_cpu (Eq. 5): no GPU can use its peers' rows, so each holds the BSIZE hottest."""
    topo = load_topology("2", peer_bw="5GB/s", host_bw="12GB/s")
    p = np.random.default_rng(0).pareto(1.0, 50)
    pl = place(strategy, PlacementRequest(p, topo, 10, alpha=0.0))
    top = hottest_order(p, k=10).tolist()
    assert [b.tolist() for b in pl.buffers] == [top, top]
    assert not pl.peer_reads


def test_alg1_default_alpha_is_the_topology_ratio():
    """alpha=None takes C_gpu / C_cpu of the topology (Eq. 7), not 0."""
    topo = load_topology("2", peer_bw="20GB/s", host_bw="10GB/s")  # alpha = 0.5
    p = np.array([10.0, 9.0, 8.0, 7.0, 4.0, 3.0, 1.0, 0.5])
    dflt = place("alg1", PlacementRequest(p, topo, 4))
    assert dflt.params["alpha"] == pytest.approx(topo.alpha) and topo.alpha == pytest.approx(0.5)
    same = place("alg1", PlacementRequest(p, topo, 4, alpha=topo.alpha))
    zero = place("alg1", PlacementRequest(p, topo, 4, alpha=0.0))
    assert [b.tolist() for b in dflt.buffers] == [b.tolist() for b in same.buffers]
    assert [b.tolist() for b in dflt.buffers] != [b.tolist() for b in zero.buffers]


def test_hottest_order_ties_by_id_among_unsorted_ids():
    p = np.array([1.0, 5.0, 5.0, 5.0, 2.0, 5.0])
    assert hottest_order(p, among=np.array([5, 3, 1, 4])).tolist() == [1, 3, 5, 4]
    assert hottest_order(p, k=2, among=np.array([5, 3, 1])).tolist() == [1, 3]


def test_check_refuses_one_row_over_capacity():
    pl = Placement("hand", 6, ((0,),), [np.array([0, 1, 2])])
    pl.check(capacity=3)
    with pytest.raises(ValueError, match="3 rows > 2"):
        pl.check(capacity=2)


def test_summary_counts_copies_per_row():
    pl = Placement("hand", 6, ((0, 1),), [np.array([0, 1, 2]), np.array([0, 1, 3])])
    s = pl.summary()
    assert s["distinct_rows"] == 4 and s["copies_per_row"] == pytest.approx(6 / 4)


def test_interleaved_replication_keeps_capacity():
    """With a replicated part each GPU still holds BSIZE rows: R on all, BSIZE - R interleaved."""
    topo = load_topology("2")
    p = np.arange(40, 0, -1, dtype=float)  # node 0 hottest
    pl = place("interleaved", PlacementRequest(p, topo, 6, replicate=0.5))
    assert [b.tolist() for b in pl.buffers] == [[0, 1, 2, 3, 5, 7], [0, 1, 2, 4, 6, 8]]
    pl.check(capacity=6)
    full = interleave(np.arange(40), 2, 6, 3)  # a longer order than the buffers can take
    assert [b.tolist() for b in full] == [[0, 1, 2, 3, 5, 7], [0, 1, 2, 4, 6, 8]]


def test_naive_parts_cover_every_gpu_when_n_is_not_divisible():
    topo = load_topology("4")
    pl = place("naive", PlacementRequest(np.ones(10), topo, 10))
    assert pl.parts.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]  # ranges of ceil(10 / 4) = 3
    assert sorted(np.concatenate(pl.buffers).tolist()) == list(range(10))


def _chain(n: int) -> CSRGraph:
    """Node i's in-neighbour is i + 1 (a chain read from its head)."""
    src = np.arange(1, n)
    return CSRGraph.from_edges(src, src - 1, n)


def test_pagraph_closes_over_all_l_hops():
    """PV_i holds the full L-hop in-neighbourhood: 2 hops from node 0 reach nodes 1 and 2."""
    g = _chain(8)
    topo = load_topology("1+1")
    req = PlacementRequest(np.ones(8), topo, 8, graph=g, train_idx=np.array([0]), num_layers=2)
    pl = place("pagraph", req)
    assert pl.params["part_rows"] == [3, 0]
    assert sorted(pl.buffers[0].tolist()) == [0, 1, 2]


def test_pagraph_cap_is_inclusive():
    g = _chain(8)
    topo = load_topology("1+1")
    ok = PlacementRequest(np.ones(8), topo, 2, graph=g, train_idx=np.array([0]))
    ok.pagraph_max_nodes = 8
    place("pagraph", ok)  # exactly at the cap: allowed
    ok.pagraph_max_nodes = 7
    with pytest.raises(UsageError, match="cap"):
        place("pagraph", ok)


def test_reused_partition_seconds_count_in_prep_s():
    g = _chain(16)
    topo = load_topology("2")
    cache: dict = {}
    place("metis", PlacementRequest(np.ones(16), topo, 4, graph=g, partition_cache=cache))
    ((_, secs),) = cache.values()
    cache[("metis", 2)] = (cache[("metis", 2)][0], secs + 100.0)  # a slow first partitioning
    again = place("metis", PlacementRequest(np.ones(16), topo, 4, graph=g, partition_cache=cache))
    assert again.params["partition_reused_s"] == pytest.approx(secs + 100.0)
    assert again.prep_s >= 100.0


def test_cost_report_slowest_device_and_remote_bytes():
    topo = load_topology("2", host_bw=100.0, peer_bw=1000.0)  # C_cpu = 1 s, C_gpu = 0.1 s
    pl = Placement("hand", 4, topo.groups, [np.array([0, 1]), np.array([2])])
    w = np.array([[0.0, 0.0, 5.0, 0.0], [0.0, 0.0, 0.0, 1.0]])  # GPU 0: 5 peer rows; 1: 1 host
    rep = placement_cost(pl, topo, w, row_bytes=100)
    assert [d.seconds for d in rep.devices] == pytest.approx([0.5, 1.0])
    assert rep.slowest_device == 1
    assert rep.max_remote_bytes == pytest.approx(500.0)  # GPU 0's peer bytes count as remote


def test_plan_fixed_bytes_counts_every_gpus_trace():
    """The trace holds per-GPU counts of every node: each GPU adds GPU_NODE_BYTES per node."""
    g = _chain(100)
    one, four = (plan_fixed_bytes(g, k, 0, ["alg1"]) for k in (1, 4))
    assert four - one == 3 * GPU_NODE_BYTES * (g.num_nodes + 1)


def test_local_seeds_plan_costs_the_partition_local_trace(tmp_path):
    path = write_tiny_dataset(tmp_path / "tiny", num_nodes=300, num_edges=2400, feat_dim=8)
    ds = load(path)
    topo = load_topology("2")
    traces: dict = {}
    kw = dict(fanouts=(3, 2), batch_size=8, score="degree", progress=False)
    res = make_plan(ds, topo, 30, ["naive"], local_seeds=True, local_trace_cache=traces, **kw)
    out = res.outcomes["naive"]
    assert out.seeds_mode == "parts"
    local = placement_cost(out.placement, topo, traces[("naive", 2)].per_epoch, res.row_bytes)
    glob = placement_cost(out.placement, topo, res.trace.per_epoch, res.row_bytes)
    assert out.trace_cost.max_s == pytest.approx(local.max_s)
    assert local.max_s != pytest.approx(glob.max_s)


def test_equal_bandwidths_mean_no_peer_reads():
    """Eq. 3 takes peer reads only when ``C_gpu < C_cpu``; at equal links a host read is as good."""
    topo = load_topology("2", peer_bw="10GB/s", host_bw="10GB/s")
    assert not topo.peers_cheaper and topo.alpha == 1.0


def test_buffer_rows_from_a_budget_round_down():
    topo = load_topology("2", feature_budget_bytes=1000)
    assert topo.buffer_rows(300) == 3 and topo.buffer_rows(250) == 4


def test_every_reader_of_a_multidevice_store_keeps_the_topology():
    """A second reader made with for_reader reads from host, not a slow peer, as the first does."""
    import torch

    from gnnio.features.tiers.multidevice import MultiDeviceFeatureStore

    feats = np.arange(60, dtype=np.float32).reshape(30, 2)
    slow = load_topology("2", peer_bw="1GB/s", host_bw="10GB/s")
    pl = place("naive", PlacementRequest(np.ones(30), load_topology("2"), 10))
    s1 = MultiDeviceFeatureStore(feats, pl, reader=0, topology=slow).for_reader(1)
    assert torch.equal(s1.gather(np.arange(30)), torch.from_numpy(feats))
    assert s1.counters.snapshot()["rows"] == {"local": 10, "peer": 0, "host": 20}
