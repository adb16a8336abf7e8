"""Placement strategies, lookup arrays, the cost model, traces, the planner and ``gnnio plan``."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.errors import UsageError
from gnnio.graph import CSRGraph, load
from gnnio.placement import (
    STRATEGIES,
    Placement,
    PlacementRequest,
    hottest_order,
    load_placement,
    place,
    save_placement,
)
from gnnio.placement.alg1 import algorithm1, algorithm1_reference
from gnnio.placement.costmodel import expected_reads, placement_cost
from gnnio.placement.topology import Topology, load_topology
from gnnio.placement.trace import regroup, sample_trace
from tests.helpers import write_tiny_dataset

HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GRAPHLESS = ("alg1", "rule1", "interleaved", "mod", "naive", "random")
TOPOLOGIES = ("2", "4", "2+2", "1+1", "2*3", "3")

# Song & Jiang §3.2 worked example: six nodes, p = f / N_t with f = [4, 6, 6, 6, 5, 5]
EXAMPLE_P = np.array([4 / 6, 1, 1, 1, 5 / 6, 5 / 6])


# ---- the paper's worked example ---------------------------------------------------------------


def test_worked_example_buffers():
    """Two NVLink-connected GPUs, two slots each, alpha = 0.3: B_1 = [1, 3], B_2 = [4, 2]."""
    assert hottest_order(EXAMPLE_P).tolist() == [1, 2, 3, 4, 5, 0]  # the paper's V
    req = PlacementRequest(EXAMPLE_P, load_topology("2"), buffer_rows=2, alpha=0.3)
    pl = place("alg1", req)
    assert [b.tolist() for b in pl.buffers] == [[1, 3], [4, 2]]
    assert algorithm1_reference(EXAMPLE_P, 2, 2, 0.3) == [[1, 3], [4, 2]]


def test_worked_example_lookup_arrays():
    """dev_num on GPU-1 = [-1, 1, 2, 1, 2, -1] in the paper's 1-based GPU numbers (host = -1);
    buf_pos = [0, 0, 1, 1, 0, 5] (the paper prints a 7th entry, a typo: there are 6 nodes)."""
    pl = place("alg1", PlacementRequest(EXAMPLE_P, load_topology("2"), buffer_rows=2, alpha=0.3))
    lk = pl.lookup(0)
    paper = np.array([-1, 1, 2, 1, 2, -1])
    assert lk.dev_num.tolist() == np.where(paper > 0, paper - 1, -1).tolist()
    assert lk.buf_pos.tolist() == [0, 0, 1, 1, 0, 5]
    # "the two arrays are the same on GPU-1 and GPU-2 because there is no duplicate nodes"
    lk2 = pl.lookup(1)
    assert lk2.dev_num.tolist() == lk.dev_num.tolist()
    assert lk2.buf_pos.tolist() == lk.buf_pos.tolist()
    assert lk.tiers().tolist() == [2, 0, 1, 0, 1, 2]


def test_alpha_controls_replication():
    """A larger alpha stops earlier and keeps more duplicates (§3.2, last paragraph)."""
    p = np.array([10.0, 9, 8, 1, 0.5, 0.1])
    t = load_topology("2")
    stored = []
    for alpha in (0.0, 0.05, 0.2, 1.0):
        pl = place("alg1", PlacementRequest(p, t, buffer_rows=3, alpha=alpha))
        stored.append(pl.summary()["distinct_rows"])
    assert stored == sorted(stored, reverse=True)
    assert stored[0] == 6 and stored[-1] == 3  # alpha 0: all distinct; alpha 1: Rule 1


# ---- Algorithm 1: kernel vs reference, invariants --------------------------------------------


@HYP
@given(
    n_nodes=st.integers(1, 40),
    n_dev=st.integers(1, 5),
    bsize=st.integers(0, 45),
    alpha=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.9, 1.0]),
    seed=st.integers(0, 2**31),
    levels=st.integers(1, 8),
)
def test_alg1_kernel_matches_reference(n_nodes, n_dev, bsize, alpha, seed, levels):
    rng = np.random.default_rng(seed)
    p = rng.integers(0, levels, n_nodes) / levels  # few levels: many ties, some zeros
    got, info = algorithm1(p, n_dev, bsize, alpha)
    want = algorithm1_reference(p, n_dev, bsize, alpha)
    assert got.tolist() == want
    bs = min(bsize, n_nodes)
    assert got.shape == (n_dev, bs)
    # every node sits on all GPUs or on exactly one, but the old node of a round cut short by the
    # stop test; at most min(N, n*BSIZE) distinct rows
    ids, copies = np.unique(got, return_counts=True)
    assert np.count_nonzero((copies != 1) & (copies != n_dev)) <= 1
    assert ids.size == bs + info["replaced"] <= min(n_nodes, n_dev * bs) or bs == 0
    for row in got:
        assert np.unique(row).size == row.size
    # the stored rows are the hottest ones: a prefix of V
    V = hottest_order(p)
    assert set(ids.tolist()) == set(V[: ids.size].tolist())


def test_alg1_balances_p_sum():
    rng = np.random.default_rng(0)
    p = np.sort(rng.pareto(1.0, 10_000))[::-1].copy()
    bufs, info = algorithm1(p, 4, 1000, 0.0)
    ps = np.array(info["p_sum"])
    assert ps.max() - ps.min() <= p[1000]  # within one new node's probability
    assert np.unique(bufs).size == 4000


# ---- every strategy: capacity, lookup arrays resolve every node ------------------------------


def _check_lookups(pl: Placement, topo: Topology, capacity: int) -> None:
    pl.check(capacity=capacity)
    n = pl.num_nodes
    for d in range(topo.num_gpus):
        lk = pl.lookup(d)
        own = np.zeros(n, dtype=bool)
        own[pl.buffers[d]] = True
        for j in range(n):
            k, pos = int(lk.dev_num[j]), int(lk.buf_pos[j])
            if k < 0:
                assert pos == j  # host holds every row at its id
                assert not own[j]
                if pl.peer_reads:  # no peer of the group holds it either
                    assert all(j not in set(pl.buffers[q].tolist()) for q in topo.peers(d))
            else:
                assert pl.buffers[k][pos] == j  # the lookup points at the right row
                assert k == d or (pl.peer_reads and k in topo.peers(d))
                assert (k == d) == bool(own[j])  # a local copy is always preferred


@HYP
@given(
    strategy=st.sampled_from(GRAPHLESS),
    spec=st.sampled_from(TOPOLOGIES),
    n_nodes=st.integers(1, 60),
    frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
    replicate=st.sampled_from([0.0, 0.5]),
)
def test_strategies_respect_capacity_and_resolve(strategy, spec, n_nodes, frac, seed, replicate):
    topo = load_topology(spec)
    p = np.random.default_rng(seed).pareto(1.5, n_nodes)
    bs = int(frac * n_nodes)
    pl = place(strategy, PlacementRequest(p, topo, bs, seed=seed, replicate=replicate))
    assert pl.strategy == strategy and pl.num_devices == topo.num_gpus
    _check_lookups(pl, topo, capacity=bs)


def _two_communities(k: int = 12) -> CSRGraph:
    """Two cliques of k nodes joined by one edge (both directions)."""
    src, dst = [], []
    for base in (0, k):
        for a in range(k):
            for b in range(k):
                if a != b:
                    src.append(base + a)
                    dst.append(base + b)
    src += [0, k]
    dst += [k, 0]
    return CSRGraph.from_edges(np.array(src), np.array(dst), 2 * k)


def test_metis_separates_communities():
    g = _two_communities()
    topo = load_topology("2")
    p = np.ones(g.num_nodes)
    pl = place("metis", PlacementRequest(p, topo, 12, graph=g))
    parts = pl.parts
    assert set(parts[:12].tolist()) | set(parts[12:].tolist()) == {0, 1}
    assert len(set(parts[:12].tolist())) == 1 and len(set(parts[12:].tolist())) == 1
    _check_lookups(pl, topo, 12)


def test_pagraph_partitions_training_nodes_and_reads_no_peers():
    g = _two_communities()
    topo = load_topology("2")
    train = np.array([1, 2, 3, 13, 14, 15])
    pl = place("pagraph", PlacementRequest(np.ones(24), topo, 5, graph=g, train_idx=train))
    assert not pl.peer_reads
    assert (pl.parts[train] >= 0).all() and (np.delete(pl.parts, train) == -1).all()
    # balanced training nodes, and each clique's training nodes kept together
    assert np.bincount(pl.parts[train], minlength=2).tolist() == [3, 3]
    assert len(set(pl.parts[[1, 2, 3]].tolist())) == 1
    _check_lookups(pl, topo, 5)
    with pytest.raises(UsageError, match="cap"):
        place(
            "pagraph",
            PlacementRequest(np.ones(24), topo, 5, graph=g, train_idx=train, pagraph_max_nodes=10),
        )


def test_partition_baselines_split_evenly():
    topo = load_topology("2+2")
    p = np.arange(100, dtype=float)
    for name in ("naive", "random"):
        pl = place(name, PlacementRequest(p, topo, 10, seed=3))
        assert np.bincount(pl.parts, minlength=4).tolist() == [25] * 4
        for d, b in enumerate(pl.buffers):  # each GPU buffers its part's hottest rows
            mine = np.flatnonzero(pl.parts == d)
            assert set(b.tolist()) == set(mine[np.argsort(-p[mine])][:10].tolist())
    naive = place("naive", PlacementRequest(p, topo, 10))
    assert naive.buffers[0].tolist() == list(range(24, 14, -1))


def test_interleaved_and_mod_layouts():
    topo = load_topology("2")
    p = np.arange(20, 0, -1, dtype=float)  # node 0 hottest
    il = place("interleaved", PlacementRequest(p, topo, 4))
    assert [b.tolist() for b in il.buffers] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    rep = place("interleaved", PlacementRequest(p, topo, 4, replicate=0.5))
    assert [b.tolist() for b in rep.buffers] == [[0, 1, 2, 4], [0, 1, 3, 5]]
    md = place("mod", PlacementRequest(p[::-1].copy(), topo, 3))  # node 19 hottest
    assert [b.tolist() for b in md.buffers] == [[18, 16, 14], [19, 17, 15]]


def test_slow_peers_mean_rule1():
    """Eq. 3 second case (C_gpu >= C_cpu): no peer reads; Algorithm 1 reduces to Rule 1."""
    topo = load_topology("2", peer_bw="5GB/s", host_bw="12GB/s")
    p = np.random.default_rng(0).pareto(1.0, 50)
    a = place("alg1", PlacementRequest(p, topo, 10, alpha=0.0))
    r = place("rule1", PlacementRequest(p, topo, 10))
    assert [b.tolist() for b in a.buffers] == [b.tolist() for b in r.buffers]
    assert not a.peer_reads


def test_request_validation():
    t = load_topology("2")
    with pytest.raises(UsageError):
        PlacementRequest(np.array([1.0, -1.0]), t, 1)
    with pytest.raises(UsageError):
        PlacementRequest(np.array([1.0, np.nan]), t, 1)
    with pytest.raises(UsageError):
        PlacementRequest(np.ones(3), t, -1)
    with pytest.raises(UsageError):
        PlacementRequest(np.ones(3), t, 1, alpha=2.0)
    with pytest.raises(UsageError, match="unknown placement strategy"):
        place("magic", PlacementRequest(np.ones(3), t, 1))
    assert set(STRATEGIES) >= {*GRAPHLESS, "metis", "pagraph"}


# ---- save / load ------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    g = _two_communities()
    topo = load_topology("2+2")
    p = np.random.default_rng(1).random(24)
    for name in ("alg1", "metis"):
        pl = place(name, PlacementRequest(p, topo, 5, graph=g, alpha=0.2))
        path = save_placement(pl, tmp_path / f"{name}.npz")
        back = load_placement(path)
        assert back.strategy == name and back.groups == pl.groups
        assert [b.tolist() for b in back.buffers] == [b.tolist() for b in pl.buffers]
        assert back.params == pl.params and back.peer_reads == pl.peer_reads
        assert (back.parts is None) == (pl.parts is None)
        for d in range(4):
            assert back.lookup(d).dev_num.tolist() == pl.lookup(d).dev_num.tolist()
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="junk.npz"):
        load_placement(tmp_path / "junk.npz")
    with pytest.raises(UsageError, match="not found"):
        load_placement(tmp_path / "none.npz")


# ---- cost model (Eq. 3-6) ---------------------------------------------------------------------


def test_cost_model_by_hand():
    topo = load_topology("2", host_bw=100.0, peer_bw=1000.0)  # C_cpu = 1 s, C_gpu = 0.1 s (100 B)
    pl = Placement("hand", 4, topo.groups, [np.array([0, 1]), np.array([2])])
    w = np.array([1.0, 2.0, 3.0, 4.0])
    rep = placement_cost(pl, topo, w, row_bytes=100)
    d0, d1 = rep.devices
    assert d0.rows == {"local": 3.0, "peer": 3.0, "host": 4.0}
    assert d0.seconds == pytest.approx(0.1 * 3 + 1.0 * 4)
    assert d1.rows == {"local": 3.0, "peer": 3.0, "host": 4.0}
    assert rep.max_s == pytest.approx(4.3)
    assert d0.rows_by_source.tolist() == [4.0, 3.0, 3.0]
    assert sum(rep.shares.values()) == pytest.approx(1.0)
    # C_gpu >= C_cpu: everything not local comes from the host (Eq. 3 second case)
    slow = load_topology("2", host_bw=100.0, peer_bw=50.0)
    rep2 = placement_cost(pl, slow, w, row_bytes=100)
    assert rep2.devices[0].rows == {"local": 3.0, "peer": 0.0, "host": 7.0}
    assert rep2.max_s == pytest.approx(7.0)


@HYP
@given(
    strategy=st.sampled_from(GRAPHLESS),
    spec=st.sampled_from(TOPOLOGIES),
    seed=st.integers(0, 1000),
)
def test_cost_model_equals_per_node_sum(strategy, spec, seed):
    """E[C_i] = sum_j p_j cost_i(j) (Eq. 3 in expectation), against a direct per-node loop."""
    topo = load_topology(spec)
    rng = np.random.default_rng(seed)
    n = 30
    p = rng.pareto(1.2, n)
    pl = place(strategy, PlacementRequest(p, topo, 7))
    w = rng.random((topo.num_gpus, n))
    rep = placement_cost(pl, topo, w, row_bytes=512)
    for d in range(topo.num_gpus):
        want = 0.0
        for j in range(n):
            if j in pl.buffers[d]:
                continue
            on_peer = any(j in pl.buffers[k] for k in topo.peers(d))
            want += w[d, j] * (topo.c_peer(512) if on_peer else topo.c_host(512))
        assert rep.devices[d].seconds == pytest.approx(want)
        assert sum(rep.devices[d].rows.values()) == pytest.approx(w[d].sum())


def test_alg1_beats_partitions_on_skewed_access():
    """The paper's claim in kind: on skewed p, all-connected GPUs, Algorithm 1's modeled max cost
    is below every partitioning baseline's."""
    rng = np.random.default_rng(0)
    p = rng.pareto(1.0, 5000)
    topo = load_topology("4")
    w = expected_reads(p, 1000.0)
    costs = {
        s: placement_cost(place(s, PlacementRequest(p, topo, 500, seed=1)), topo, w, 4).max_s
        for s in ("alg1", "naive", "random")
    }
    assert costs["alg1"] < min(costs["naive"], costs["random"])


def test_expected_reads_scales():
    assert expected_reads(np.array([1.0, 3.0]), 8.0).tolist() == [2.0, 6.0]
    assert expected_reads(np.zeros(2), 8.0).tolist() == [0.0, 0.0]


# ---- trace, planner, CLI ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_dataset(
        tmp_path_factory.mktemp("ds") / "tiny", num_nodes=300, num_edges=2400, feat_dim=8
    )
    return load(path)


def test_trace_counts_and_regroup(tiny):
    train = tiny.train_idx
    t4 = sample_trace(tiny.graph, train, [3, 2], 8, 4, seed=5, progress=False)
    t2 = sample_trace(tiny.graph, train, [3, 2], 8, 2, seed=5, progress=False)
    assert sum(t4.batches) == -(-train.size // 8)
    assert (t4.counts.sum(axis=0) == t2.counts.sum(axis=0)).all()  # same epoch, dealt differently
    assert (regroup(t4, 2).counts == t2.counts).all()  # exact: b mod 4 mod 2 == b mod 2
    assert t4.counts.max() <= max(t4.batches)  # a node is read at most once per batch
    with pytest.raises(ValueError):
        regroup(t4, 3)
    parts = np.arange(tiny.num_nodes) % 2
    tp = sample_trace(tiny.graph, train, [3], 8, 2, seed=5, seed_parts=parts, progress=False)
    assert tp.seeds_mode == "parts"
    seeds_on = [set(np.flatnonzero(tp.counts[d]).tolist()) for d in range(2)]
    for t in train:  # every training node is read by its own partition's GPU (it is a seed)
        assert t in seeds_on[parts[t]]


def _plan_cli(argv: list[str]) -> int:
    from gnnio.cli import plan

    parser = argparse.ArgumentParser(prog="gnnio")
    sub = parser.add_subparsers()
    plan.register(sub)
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


def test_plan_cli_json(tiny, capsys, tmp_path):
    out = tmp_path / "best.npz"
    argv = [str(tiny.path), "--topology", "2+2", "--buffer", "0.1", "--json", "--fanouts", "4,3"]
    argv += ["--batch-size", "16", "--trace-epochs", "2", "--save", str(out)]
    assert _plan_cli(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["trace"]["epochs"] == 2
    assert sum(res["trace"]["batches_per_device"]) == 2 * -(-tiny.train_idx.size // 16)
    names = {"alg1", "rule1", "interleaved", "mod", "naive", "random", "metis", "pagraph"}
    assert set(res["strategies"]) == names
    for v in res["strategies"].values():
        assert {"max_cost_s", "local", "peer", "host", "prep_s"} <= set(v)
        assert v["local"] + v["peer"] + v["host"] == pytest.approx(1.0)
        assert v["max_cost_s"] >= 0 and v["prep_s"] >= 0
    assert res["strategies"]["pagraph"]["peer"] == 0.0
    assert res["strategies"]["rule1"]["peer"] == 0.0
    best = res["best"]
    assert res["strategies"][best]["max_cost_s"] == min(
        v["max_cost_s"] for v in res["strategies"].values()
    )
    assert load_placement(out).strategy == best


def test_plan_cli_table_and_pagraph_cap(tiny, capsys):
    argv = [str(tiny.path), "--topology", "2", "--buffer", "0.2", "--fanouts", "3"]
    argv += ["--batch-size", "32", "--pagraph-max-nodes", "10", "--strategies", "alg1,pagraph"]
    argv += ["--quiet", "--local-seeds"]
    assert _plan_cli(argv) == 0
    text = capsys.readouterr().out
    assert "alg1" in text and "skipped" in text and "best: alg1" in text


def test_plan_table_costs_in_a_unit_that_shows_them(tiny, capsys):
    """A small graph's modeled costs (microseconds) print in a unit where they are not all
    0.0000, and each row's figures are the JSON's seconds in that unit."""
    argv = [str(tiny.path), "--topology", "2+2", "--buffer", "0.1", "--fanouts", "4,3"]
    argv += ["--batch-size", "16", "--quiet", "--strategies", "alg1,naive,rule1"]
    assert _plan_cli([*argv, "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["strategies"]
    assert _plan_cli(argv) == 0
    text = capsys.readouterr().out
    top = max(v["max_cost_s"] for v in res.values())
    assert 0 < top < 1e-4  # (the tiny graph: else this test checks another unit)
    assert "modeled microseconds per epoch" in text and "max cost us" in text
    for name, v in res.items():
        row = next(ln for ln in text.splitlines() if ln.startswith(f"{name} "))
        cost, predicted = map(float, row.split()[1:3])
        assert cost == pytest.approx(v["max_cost_s"] * 1e6, abs=1e-4)
        assert predicted == pytest.approx(v["predicted_max_cost_s"] * 1e6, abs=1e-4)
    best = min(res, key=lambda k: res[k]["max_cost_s"])
    ratio = res["naive"]["max_cost_s"] / res[best]["max_cost_s"]
    if ratio < 1.005:  # (a tie is not "1.00x less")
        assert f"best: {best} (the same modeled loading time as naive, to 0.5 %)" in text
    else:
        assert f"best: {best} ({ratio:.2f}x less modeled loading time than naive)" in text
    from gnnio.cli.plan import cost_unit, versus

    assert versus(2.0, 2.009, "naive") == " (the same modeled loading time as naive, to 0.5 %)"
    assert versus(2.0, 2.011, "metis") == " (1.01x less modeled loading time than metis)"
    assert versus(0.0, 1.0, "naive") == ""

    assert cost_unit([0.5, 0.1]) == ("seconds", "s", 1.0)
    assert cost_unit([0.1]) == ("seconds", "s", 1.0)  # (0.1 s itself: seconds, not 100 ms)
    assert cost_unit([0.0999, 0.0]) == ("milliseconds", "ms", 1e3)
    assert cost_unit([1e-4]) == ("milliseconds", "ms", 1e3)
    assert cost_unit([0.99e-4]) == ("microseconds", "us", 1e6)
    assert cost_unit([]) == ("seconds", "s", 1.0)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--topology", "2+", "--buffer", "0.1"], "topology"),
        (["--topology", "2", "--buffer", "1.5"], "--buffer"),
        (["--topology", "2", "--buffer", "0"], "--buffer"),  # none: 0.1 N (test_topology)
        (["--topology", "2", "--buffer", "0.1", "--strategies", "alg1,zzz"], "zzz"),
        (["--topology", "2", "--buffer", "0.1", "--fanouts", "a"], "--fanouts"),
        (["--topology", "2", "--buffer", "0.1", "--alpha", "3"], "alpha"),
        (["--topology", "2", "--buffer", "0.1", "--alpha", "much"], "alpha"),
    ],
)
def test_plan_cli_errors(tiny, argv, match):
    with pytest.raises(UsageError, match=match):
        _plan_cli([str(tiny.path), *argv, "--quiet"])


def test_alpha_choices():
    from gnnio.placement.alg1 import paper_alpha, resolve_alpha

    assert paper_alpha(load_topology("4")) == 0.0 and paper_alpha(load_topology("2*4")) == 0.2
    assert resolve_alpha("paper", load_topology("2+2")) == 0.2
    assert resolve_alpha("eq7", load_topology("2")) is None
    assert resolve_alpha("0.25", load_topology("2")) == 0.25
    for bad in ("1.5", "lots"):
        with pytest.raises(UsageError, match="alpha"):
            resolve_alpha(bad, load_topology("2"))


def test_bench_placement_shows_progress_and_quiet_hides_it(capsys, monkeypatch):
    """The graph-free timings take ~45 s at the default 10^7 nodes: a bar says where they are."""
    from gnnio.cli.main import main

    monkeypatch.delenv("GNNIO_NO_PROGRESS", raising=False)
    argv = ["bench", "placement", "--num-nodes", "20000", "--passes", "1", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    res = json.loads(out.strip().splitlines()[-1])
    assert {"alg1_s", "alg1_sort_s", "alg1_loop_s", "lookup_one_gpu_s"} <= set(res)
    assert "placement timings" in err
    assert main([*argv, "--quiet"]) == 0
    assert "placement timings" not in capsys.readouterr().err
