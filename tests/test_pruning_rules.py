"""HyDRA threshold pruning (§III-A3, Eq. 4): rules found by a mutation pass over
gnnio/sampling/locality.py (prune_thresholds, _prune_pair), gnnio/sampling/pruned.py,
gnnio/sampling/pruned_torch.py and the circular windows of the CPU and torch kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LocalitySampler, PrunedUniformSampler
from gnnio.sampling.gpu_hop import sample_hop_torch
from gnnio.sampling.locality import prune_thresholds
from gnnio.sampling.pruned_torch import TorchPrunedSampler
from gnnio.sampling.threaded import call_key, hop_key
from tests.test_labor_bounded import mixed_graph

# ---- Eq. 4: threshold = ceil(alpha * avg_degree + beta * fanout) --------------------------------


def test_a_threshold_that_is_an_integer_on_paper_is_not_rounded_up():
    """Eq. 4 where alpha * avg_degree (or beta * fanout) is an integer on paper, 2.2 * 25 = 55,
    gives that integer, not the next one (the float product is 55.00000000000001)."""
    assert 2.2 * 25.0 > 55  # (what a bare ceil would round up to 56)
    assert prune_thresholds(25.0, [5], (2.2, 0.0)) == [55]
    assert prune_thresholds(3.0, [25], (0.0, 2.2)) == [55]
    assert prune_thresholds(25.0, [5], (2.2, 1.0)) == [60]


@pytest.mark.parametrize("bad", [(1.0, -0.5), (-0.5, 1.0), (math.nan, 1.0), (1.0, math.inf)])
def test_negative_or_non_finite_alpha_beta_are_refused(bad):
    """``prune`` needs finite alpha, beta >= 0 (a negative beta or a NaN is a ValueError naming
    them, not a silently shorter window or a bare float error)."""
    with pytest.raises(ValueError, match="finite and >= 0"):
        prune_thresholds(6.5, [10], bad)


def _graph(num_nodes: int, edges: list[tuple[int, int]]) -> CSRGraph:
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*edges, strict=True))
    return CSRGraph.from_edges(src, dst, num_nodes)


def test_prune_true_is_alpha_beta_one_and_false_is_off():
    """``prune=True`` means (alpha, beta) = (1, 1) and ``prune=False`` no pruning (as None)."""
    # 4 nodes, 12 distinct edges: avg degree 3 = |E| / |V|
    g = _graph(4, [(s, d) for d in range(4) for s in range(4) if s != d])
    on = LocalitySampler(g, [5, 2], prune=True)
    assert on.prune == (1.0, 1.0) and on.thresholds == [3 + 5, 3 + 2]
    off = LocalitySampler(g, [5, 2], prune=False)
    assert off.prune is None and off.thresholds == [0, 0]
    assert PrunedUniformSampler(g, [5, 2], prune=False).thresholds == [0, 0]


@pytest.mark.parametrize("bad", [0.5, 2, "ab", (1.0,), (1.0, 2.0, 3.0), (1.0, "x")])
@pytest.mark.parametrize("cls", [LocalitySampler, PrunedUniformSampler])
def test_a_prune_that_is_not_a_pair_is_one_clear_error(cls, bad):
    """``prune`` is ``(alpha, beta)``, True, False or None: anything else is a ValueError naming
    the expected form and the value given (a bare number was "'float' object is not
    iterable", a string "could not convert string to float: 'a'")."""
    g = _graph(3, [(0, 1), (1, 2), (2, 0)])
    with pytest.raises(ValueError, match=r"prune: expected \(alpha, beta\)") as err:
        cls(g, [2], prune=bad)
    assert repr(bad) in str(err.value)


def test_avg_degree_is_edges_over_nodes():
    """Eq. 4's average degree is |E| / |V| of the graph (here 4 / 2 = 2, so 3 * 2 = 6)."""
    g = _graph(2, [(0, 1), (1, 0), (0, 0), (1, 1)])
    s = PrunedUniformSampler(g, [1], prune=(3.0, 0.0))
    assert s.avg_degree == 2.0 and s.thresholds == [6]


# ---- the torch sampler's arguments ---------------------------------------------------------------


def test_torch_pruned_sampler_refuses_negative_thresholds_and_unknown_weights():
    """A negative threshold or an unknown weight mode is a ValueError, not silently 'no pruning'
    or 'ht'."""
    ip, ix = mixed_graph(0).to_torch()
    with pytest.raises(ValueError, match="one >= 0 per hop"):
        TorchPrunedSampler(ip, ix, [4, 3], [8, -1])
    with pytest.raises(ValueError, match="weights"):
        TorchPrunedSampler(ip, ix, [4, 3], [8, 6], weights="hajek")


@pytest.mark.parametrize("weights", ["ht", "ht_mean"])
def test_a_hop_of_every_neighbour_is_never_pruned_nor_reweighted(weights):
    """With fanout -1 every neighbour is taken (pi = 1) even if a threshold is given: the HT weight
    is 1 (``ht``) or 1 / deg (``ht_mean``), not deg / threshold."""
    g = mixed_graph(0)
    ip, ix = g.to_torch()
    seeds = torch.tensor([7, 12, 30, 3])  # the hub (300 in-neighbours) and ordinary rows
    mb = TorchPrunedSampler(ip, ix, [-1], [4], weights).sample(seeds, 11)
    blk = mb.blocks[0]
    deg = (ip[seeds + 1] - ip[seeds]).double()
    dst = blk.edge_index[1]
    assert torch.equal(torch.bincount(dst, minlength=4), deg.long())  # every neighbour
    want = torch.ones_like(deg) if weights == "ht" else 1.0 / deg
    assert torch.equal(blk.edge_weight, want[dst].float())


# ---- circular windows ----------------------------------------------------------------------------


def test_exact_and_fast_window_draws_agree_on_cut_and_uncut_rows():
    """The torch hop's exact (step-by-step) draws equal its fast ones where no draw was rejected,
    on a hop mixing rows cut to a window with rows shorter than the threshold."""
    g = mixed_graph(0)
    ip, ix = g.to_torch()
    dst = torch.arange(0, 120)
    deg = ip[dst + 1] - ip[dst]
    theta = 6
    assert bool((deg > theta).any()) and bool(((deg > 3) & (deg <= theta)).any())
    for e in range(4):
        hk = hop_key(call_key(5, epoch_seed=e), 0)
        fs, fr, redo = sample_hop_torch(ip, ix, dst, 3, hk, exact=False, theta=theta)
        assert int(redo) == 0
        es, er, _ = sample_hop_torch(ip, ix, dst, 3, hk, exact=True, theta=theta)
        assert torch.equal(fs, es) and torch.equal(fr, er)


def _private_neighbour_graph(rows: int, deg: int) -> CSRGraph:
    """Row ``r < rows`` has in-neighbours ``base + r * deg + j`` (``j < deg``, that CSR order),
    shared with no other row; one more row after them so row ``rows - 1`` is not the last."""
    base = rows + 1
    dst = np.repeat(np.arange(rows + 1), deg)
    src = base + np.arange((rows + 1) * deg)
    return CSRGraph.from_edges(src, dst, base + (rows + 1) * deg)


def test_las_non_member_picks_in_a_wrapped_window_stay_in_their_row():
    """With LAS (scale != 1) inside a wrapping window, a non-member picked right after the wrap is
    the row's first neighbour, never the next row's (every sampled edge is the row's own)."""
    rows, deg = 200, 40
    g = _private_neighbour_graph(rows, deg)
    base = rows + 1
    members = base + np.flatnonzero(np.arange((rows + 1) * deg) % 2 == 1)  # odd positions
    s = LocalitySampler(g, [5], hot_ids=members, scale=4.0, seed=3, prune=(0.0, 4.0))
    assert s.thresholds == [20]  # windows of 20 out of 40: about half of them wrap
    seeds = np.arange(rows)
    first_picked = 0
    for e in range(3):
        mb = s.sample(seeds, epoch_seed=e)
        blk = mb.blocks[0]
        src = mb.input_nodes[blk.edge_index[0]].numpy()
        dst = seeds[blk.edge_index[1].numpy()]
        assert ((src - base) // deg == dst).all(), "a sampled neighbour of another row"
        first_picked += int(((src - base) % deg == 0).sum())
    assert first_picked > 5  # (the position right after the wrap is really drawn)
