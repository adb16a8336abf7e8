"""Rules of the placement cost model and of ``gnnio plan`` that a mutation pass over
gnnio/placement (planner, costmodel, baselines, rule1, interleaved, plan_budget) found unguarded
by test_placement.py and test_placement_rules.py: the objective is the *slowest* GPU, empty buffers
and zero reads cost nothing, the predicted cost is ``p`` scaled to one GPU's mean reads, ``best`` is
the smallest trace cost (ties by name), row bytes follow the feature dtype, a presample score never
sees the trace's batches, partition caches are keyed by GPU count and layers, and the plan's
memory estimate counts the CSR, its metis symmetrization and every strategy's node map."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gnnio.errors import DatasetError, UsageError
from gnnio.graph import CSRGraph, load
from gnnio.placement import Placement, PlacementRequest, hottest_order, place
from gnnio.placement.costmodel import CostReport, DeviceCost, placement_cost
from gnnio.placement.interleaved import interleave
from gnnio.placement.plan_budget import plan_fixed_bytes
from gnnio.placement.planner import StrategyOutcome, make_plan
from gnnio.placement.topology import load_topology
from gnnio.placement.trace import regroup, sample_trace
from gnnio.preprocess.budget import MIN_CHUNK
from gnnio.utils.counts import top_count
from tests.helpers import write_tiny_dataset
from tests.test_placement_rules import _chain

PLAN_KW = dict(fanouts=(3, 2), batch_size=8, score="degree", progress=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_dataset(
        tmp_path_factory.mktemp("ds") / "tiny", num_nodes=300, num_edges=2400, feat_dim=8
    )
    return load(path)


@pytest.fixture(scope="module")
def plan2(tiny):
    """One plan on two GPUs, two trace epochs, partition-local seeds for ``naive``."""
    traces: dict = {}
    res = make_plan(
        tiny, load_topology("2"), 30, ["rule1", "alg1", "naive"], trace_epochs=2,
        local_seeds=True, local_trace_cache=traces, **PLAN_KW,
    )  # fmt: skip
    return res, traces


# -- the cost model ---------------------------------------------------------------------------


def test_max_s_is_the_slowest_gpu_and_devices_selects():
    topo = load_topology("2", host_bw=100.0, peer_bw=1000.0)  # C_cpu = 1 s, C_gpu = 0.1 s
    pl = Placement("hand", 4, topo.groups, [np.array([0]), np.array([1])])
    w = np.array([[0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 1.0, 0.0]])  # host rows: 3 on GPU 0, 1 on 1
    rep = placement_cost(pl, topo, w, row_bytes=100)
    assert rep.max_s == pytest.approx(3.0)  # Eq. 4: the max over GPUs, not the min
    one = placement_cost(pl, topo, w, row_bytes=100, devices=[1])
    assert [d.device for d in one.devices] == [1] and one.max_s == pytest.approx(1.0)


def test_empty_buffers_read_everything_from_host():
    """BSIZE = 0: every GPU reads all its rows from host (no GPU is a source)."""
    topo = load_topology("2", host_bw=100.0, peer_bw=1000.0)
    pl = place("alg1", PlacementRequest(np.ones(5), topo, 0))
    rep = placement_cost(pl, topo, np.ones(5), row_bytes=100)
    assert [d.rows for d in rep.devices] == [{"local": 0.0, "peer": 0.0, "host": 5.0}] * 2
    assert [d.rows_by_source.shape for d in rep.devices] == [(3,), (3,)]
    assert rep.max_s == pytest.approx(5.0)


def test_no_reads_have_no_shares():
    topo = load_topology("2")
    pl = Placement("hand", 3, topo.groups, [np.array([0]), np.array([1])])
    rep = placement_cost(pl, topo, np.zeros(3), row_bytes=8)
    assert rep.shares == {"local": 0.0, "peer": 0.0, "host": 0.0} and rep.max_s == 0.0


def test_mismatched_topology_or_weights_are_refused():
    pl = Placement("hand", 3, ((0, 1),), [np.array([0]), np.array([1])])
    with pytest.raises(ValueError, match="topology has 4"):
        placement_cost(pl, load_topology("4"), np.ones(3), row_bytes=8)
    with pytest.raises(ValueError, match="weights"):
        placement_cost(pl, load_topology("2"), np.ones((3, 3)), row_bytes=8)  # 3 GPUs' reads


# -- the planner --------------------------------------------------------------------------------


def _outcome(name: str, trace_s: float, predicted_s: float) -> StrategyOutcome:
    def rep(s):
        d = DeviceCost(0, {"local": 0.0, "peer": 0.0, "host": s}, np.zeros(2), s, 1)
        return CostReport([d], 1)

    return StrategyOutcome(
        name, placement=None, trace_cost=rep(trace_s), predicted_cost=rep(predicted_s)
    )


def test_best_is_the_smallest_trace_cost_ties_by_name(plan2):
    res = dataclasses.replace(plan2[0], outcomes={})
    res.outcomes = {"rule1": _outcome("rule1", 2.0, 1.0), "naive": _outcome("naive", 3.0, 0.5)}
    assert res.best == "rule1"  # the sampled epoch decides, not the prediction
    res.outcomes = {"rule1": _outcome("rule1", 2.0, 1.0), "alg1": _outcome("alg1", 2.0, 1.0)}
    assert res.best == "alg1"


def test_predicted_cost_is_p_scaled_to_the_mean_reads(plan2):
    """Every GPU gets the same ``p``, scaled to one GPU's mean rows per epoch of the trace."""
    res, _ = plan2
    mean_reads = float(res.trace.rows_per_device.mean())
    pred = res.outcomes["rule1"].predicted_cost
    assert [sum(d.rows.values()) for d in pred.devices] == pytest.approx([mean_reads] * 2)
    trace_rows = [sum(d.rows.values()) for d in res.outcomes["rule1"].trace_cost.devices]
    assert trace_rows == pytest.approx(res.trace.rows_per_device.tolist())
    assert trace_rows[0] != pytest.approx(trace_rows[1])  # so the two are told apart


def test_local_trace_samples_as_many_epochs(plan2):
    res, traces = plan2
    assert res.trace.epochs == 2 and traces[("naive", 2)].epochs == 2


def test_buffer_fraction_is_per_gpu(plan2):
    assert plan2[0].to_dict()["buffer_fraction"] == pytest.approx(30 / 300)  # BSIZE / N


def test_row_bytes_follow_the_feature_dtype(tmp_path):
    path = write_tiny_dataset(tmp_path / "h", num_nodes=40, num_edges=200, feat_dim=8,
                              feat_dtype=np.float16)  # fmt: skip
    res = make_plan(load(path), load_topology("2"), 4, ["rule1"], **PLAN_KW)
    assert res.row_bytes == 16
    assert res.outcomes["rule1"].cost.devices[0].row_bytes == 16


def test_a_plan_without_training_nodes_is_refused(tiny):
    ds = dataclasses.replace(tiny, train_idx=np.empty(0, dtype=np.int64))
    with pytest.raises(DatasetError, match="placement needs them"):  # before the score
        make_plan(ds, load_topology("2"), 4, ["rule1"], **PLAN_KW)


def test_presample_score_uses_another_seed_than_the_trace(tiny, monkeypatch):
    import gnnio.preprocess.hotness as hot

    seen = {}

    def spy(name, ds, **kw):
        seen.update(kw)
        return np.ones(ds.num_nodes)

    monkeypatch.setattr(hot, "compute_score", spy)
    kw = {**PLAN_KW, "score": "presample"}
    make_plan(tiny, load_topology("2"), 4, ["rule1"], seed=5, **kw)
    assert seen["seed"] == 6


def test_a_wider_trace_is_dealt_to_the_plans_gpus(tiny, plan2):
    """A precomputed trace of 4 slots costs a 2-GPU plan as the same epoch dealt to 2 GPUs."""
    res, _ = plan2
    train = np.asarray(tiny.train_idx)
    t4 = sample_trace(tiny.graph, train, (3, 2), 8, 4, seed=0, progress=False)
    topo = load_topology("2")
    got = make_plan(tiny, topo, 30, ["rule1"], probs=np.ones(tiny.num_nodes), trace=t4, **PLAN_KW)
    pl = got.outcomes["rule1"].placement
    want = placement_cost(pl, topo, regroup(t4, 2).per_epoch, got.row_bytes)
    assert got.outcomes["rule1"].cost.max_s == pytest.approx(want.max_s)


def test_the_plan_refuses_a_strategy_over_capacity(tiny, monkeypatch):
    import gnnio.placement.rule1 as r1

    def overfull(req):
        return Placement("rule1", req.num_nodes, req.topology.groups,
                         [hottest_order(req.probs, k=req.buffer_rows + 1)] * 2)  # fmt: skip

    monkeypatch.setattr(r1, "place_rule1", overfull)
    with pytest.raises(ValueError, match="5 rows > 4"):
        make_plan(tiny, load_topology("2"), 4, ["rule1"], probs=np.ones(300), **PLAN_KW)


def test_the_plan_budget_counts_every_gpu(tiny):
    """``make_plan`` checks its budget for the topology's GPUs, not one GPU."""
    g, strategies = tiny.graph, ["rule1"]
    budget = plan_fixed_bytes(g, 1, 4, strategies) + MIN_CHUNK  # enough for one GPU's plan
    assert plan_fixed_bytes(g, 4, 4, strategies) + MIN_CHUNK > budget
    with pytest.raises(UsageError, match="on 4 GPUs"):
        make_plan(tiny, load_topology("4"), 4, strategies, memory_budget=budget, **PLAN_KW)


# -- the plan's memory estimate -------------------------------------------------------------------


def test_plan_bytes_cover_the_arrays_the_plan_holds():
    """Per node the plan holds at least probs and expected reads (float64), a lookup (int16 +
    int32) and its int64 index copy; per node and GPU the trace's int32 counts and their float64
    copy; every strategy's int16 node map; and the whole CSR."""
    small = _chain(50)
    src, dst = np.divmod(np.arange(50 * 8), 8)  # node i's in-neighbours are 0..7
    dense = CSRGraph.from_edges(src, dst, 50)
    assert dense.num_edges > small.num_edges

    def fixed(g, strategies=("rule1",)):
        return plan_fixed_bytes(g, 1, 0, list(strategies))

    n = small.num_nodes + 1
    assert fixed(small) >= (8 + 8 + 2 + 4 + 8 + 4 + 8 + 2) * n + small.indptr.nbytes
    assert fixed(small, ("rule1", "naive")) - fixed(small) >= 2 * n
    assert fixed(dense) - fixed(small) == dense.indices.nbytes - small.indices.nbytes


# -- the strategies ---------------------------------------------------------------------------------


def test_interleave_never_exceeds_the_buffer():
    """A replicated part larger than BSIZE is clipped to it: each GPU holds BSIZE rows."""
    assert [b.tolist() for b in interleave(np.arange(10), 2, 3, 5)] == [[0, 1, 2], [0, 1, 2]]


def test_interleaved_fills_every_group_of_an_uneven_topology():
    """'2+1': the pair holds 2 * BSIZE distinct rows, the lone GPU the BSIZE hottest."""
    p = np.arange(20, 0, -1, dtype=float)  # node 0 hottest
    pl = place("interleaved", PlacementRequest(p, load_topology("2+1"), 3))
    assert [b.tolist() for b in pl.buffers] == [[0, 2, 4], [1, 3, 5], [0, 1, 2]]


def test_interleaved_replicated_rows_use_the_top_count_rule():
    """replicate = 0.3 of 5 rows is top_count(0.3, 5) = 2 rows (nearest), not int(1.5) = 1."""
    p = np.arange(20, 0, -1, dtype=float)
    pl = place("interleaved", PlacementRequest(p, load_topology("2"), 5, replicate=0.3))
    assert pl.params["replicated_rows"] == top_count(0.3, 5) == 2
    assert pl.buffers[0][:2].tolist() == pl.buffers[1][:2].tolist() == [0, 1]


def test_random_parts_follow_the_seed():
    topo = load_topology("2")
    a, b, c = (place("random", PlacementRequest(np.ones(40), topo, 4, seed=s)) for s in (1, 1, 2))
    assert a.parts.tolist() == b.parts.tolist() != c.parts.tolist()


def test_a_partition_cache_is_keyed_by_gpu_count_and_layers():
    """A cache shared by plans of 2 and 4 GPUs (or 1 and 2 layers) never hands one the other's."""
    g, cache = _chain(16), {}
    for spec in ("2", "4"):
        pl = place("metis", PlacementRequest(np.ones(16), load_topology(spec), 4, graph=g,
                                             partition_cache=cache))  # fmt: skip
    assert sorted(set(pl.parts.tolist())) == [0, 1, 2, 3]
    rows = []
    for layers in (1, 2):
        req = PlacementRequest(np.ones(16), load_topology("1+1"), 8, graph=g, num_layers=layers,
                               train_idx=np.array([0]), partition_cache=cache)  # fmt: skip
        rows.append(place("pagraph", req).params["part_rows"])
    assert rows == [[2, 0], [3, 0]]


def test_pagraph_visits_training_nodes_in_id_order_once():
    """Unsorted or repeated training ids partition as the sorted unique ids do."""
    g = _chain(24)
    topo = load_topology("2")

    def parts(train):
        req = PlacementRequest(np.ones(24), topo, 6, graph=g, train_idx=np.asarray(train))
        return place("pagraph", req).parts.tolist()

    want = parts([2, 9, 13, 20])
    assert parts([20, 13, 9, 2]) == want and parts([2, 9, 9, 13, 20, 2]) == want


def test_baselines_refuse_missing_inputs():
    topo = load_topology("2")
    with pytest.raises(UsageError, match="metis.*needs the graph"):
        place("metis", PlacementRequest(np.ones(8), topo, 2))
    req = PlacementRequest(np.ones(8), topo, 2, graph=_chain(8), train_idx=np.empty(0, np.int64))
    with pytest.raises(DatasetError, match="needs training nodes"):
        place("pagraph", req)


def test_pagraph_prefers_the_part_with_fewer_nodes():
    """Equal shared training nodes and training counts: the part with the smaller ``PV_i`` wins
    (the score divides by ``|PV_i|``). Nodes 0 and 1 (training) open parts 0 and 1; part 0 also
    took 0's in-neighbours 3 and 4; node 2 reads both 0 and 1 and joins part 1."""
    g = CSRGraph.from_edges(np.array([3, 4, 0, 1]), np.array([0, 0, 2, 2]), 5)
    req = PlacementRequest(np.ones(5), load_topology("2"), 5, graph=g, num_layers=1,
                           train_idx=np.array([0, 1, 2]))  # fmt: skip
    pl = place("pagraph", req)
    assert pl.parts.tolist()[:3] == [0, 1, 1]
    assert pl.params["part_rows"] == [3, 3]
