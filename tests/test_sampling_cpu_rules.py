"""Exact rules of the CPU samplers that the statistical tests do not pin down (mutation-testing pass).

Each test uses a tiny hand-built graph and checks an invariant or a reference that follows from
the module docstrings (block layout, distinct draws, per-hop streams, pooled-scratch hygiene).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import FrontierSampler, UniformSampler
from gnnio.sampling.ladies import LadiesSampler
from gnnio.sampling.locality import LocalitySampler


def _graph(in_nbrs: dict[int, list[int]], n: int) -> CSRGraph:
    """CSR of in-neighbours from ``{dst: [src, ...]}``."""
    src = [s for d, ss in in_nbrs.items() for s in ss]
    dst = [d for d, ss in in_nbrs.items() for _ in ss]
    return CSRGraph.from_edges(np.array(src, np.int64), np.array(dst, np.int64), n)


def _random_graph(n: int = 120, m: int = 1500, seed: int = 0) -> CSRGraph:
    rng = np.random.default_rng(seed)
    return CSRGraph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n)


def _in_nbrs(g: CSRGraph, v: int) -> set[int]:
    ip, ix = np.asarray(g.indptr), np.asarray(g.indices)
    return set(ix[ip[v] : ip[v + 1]].tolist())


def test_uniform_block_ptr_is_the_destination_csr_pointer():
    """``Block.ptr`` has ``num_dst + 1`` entries and delimits each destination's edges."""
    g = _random_graph()
    mb = UniformSampler(g, [4, 3], seed=1, num_threads=1).sample(torch.arange(10), epoch_seed=2)
    for blk in mb.blocks:
        counts = torch.bincount(blk.edge_index[1], minlength=blk.num_dst)
        want = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        assert blk.ptr is not None and torch.equal(blk.ptr, want)


def test_uniform_large_fanout_rows_are_distinct_in_neighbours():
    """Rows with fanout > 32 (the hashed Floyd path) draw ``fanout`` distinct in-neighbours."""
    n = 130
    g = _graph({0: list(range(1, 100)), 1: list(range(2, 71)), 2: list(range(3, 130))}, n)
    s = UniformSampler(g, [40], seed=4, num_threads=1)
    for ep in range(30):
        mb = s.sample(torch.tensor([0, 1, 2]), epoch_seed=ep)
        (blk,) = mb.blocks
        gsrc = mb.input_nodes[blk.edge_index[0]]
        for r in range(3):
            row = gsrc[blk.edge_index[1] == r].tolist()
            assert len(row) == 40 and len(set(row)) == 40
            assert set(row) <= _in_nbrs(g, r)


def test_frontier_replace_reaches_every_neighbour():
    """With ``replace=True`` each draw is uniform over all ``deg`` positions (none left out)."""
    g = _graph({0: [1, 2, 3], 4: [5, 6]}, 7)
    mb = FrontierSampler(g, [60], seed=0, replace=True).sample(torch.tensor([0, 4]), epoch_seed=1)
    gsrc = mb.input_nodes[mb.blocks[0].edge_index[0]]
    dst = mb.blocks[0].edge_index[1]
    assert set(gsrc[dst == 0].tolist()) == {1, 2, 3}  # P(miss one) < 3 (2/3)^60
    assert set(gsrc[dst == 1].tolist()) == {5, 6}


@pytest.mark.parametrize(
    "make",
    [
        lambda g: FrontierSampler(g, [3, 2], seed=2),
        lambda g: UniformSampler(g, [3, 2], seed=2, num_threads=1),
        lambda g: LocalitySampler(g, [3, 2], seed=2, num_threads=1),
        lambda g: LadiesSampler(g, [5, 5], seed=2),
    ],
    ids=["frontier", "uniform", "locality", "ladies"],
)
def test_a_refused_duplicate_seed_leaves_the_pooled_map_clean(make):
    """After a repeated-seed ValueError the next call equals a fresh sampler's (no stale ids)."""
    g = _random_graph()
    s = make(g)
    with pytest.raises(ValueError, match="more than once"):
        s.sample(torch.tensor([5, 7, 9, 5]), epoch_seed=0)
    seeds = torch.tensor([7, 9, 11])
    got, want = s.sample(seeds, epoch_seed=3), make(g).sample(seeds, epoch_seed=3)
    assert torch.equal(got.input_nodes, want.input_nodes)
    for a, b in zip(got.blocks, want.blocks):
        assert torch.equal(a.edge_index, b.edge_index)


def test_ladies_hops_draw_with_their_own_variates():
    """Hop 2 of LADIES redraws ``u_j`` (hop-keyed): an empty hop 1 does not force an empty hop 2."""
    # seed 0 with 4 leaf in-neighbours: each hop offers the same 4 candidates, pi = 1/4 each
    g = _graph({0: [1, 2, 3, 4]}, 5)
    s = LadiesSampler(g, [1, 1], seed=0)
    empty_then_not = 0
    for ep in range(200):
        h = s.sample(torch.tensor([0]), epoch_seed=ep).meta["hop_nodes"]
        empty_then_not += h[1] == 1 and h[2] > 1
    # independent hops: P = (3/4)^4 (1 - (3/4)^4) ~ 0.22 per call; shared variates give 0
    assert empty_then_not >= 15


def test_locality_without_hot_set_draws_the_uniform_samplers_batch():
    """With no hot set LocalitySampler shares UniformSampler's per-hop streams: same batches."""
    g = _random_graph(n=200, m=3000)
    seeds = torch.arange(40)
    a = UniformSampler(g, [5, 3], seed=3, num_threads=1).sample(seeds, epoch_seed=9)
    b = LocalitySampler(g, [5, 3], seed=3, num_threads=1).sample(seeds, epoch_seed=9)
    assert torch.equal(a.input_nodes, b.input_nodes)
    for x, y in zip(a.blocks, b.blocks):
        assert torch.equal(x.edge_index, y.edge_index)


def test_a_pruned_window_taken_whole_wraps_inside_the_row():
    """A circular pruning window taken whole (threshold <= fanout) holds only the row's neighbours."""
    g = _graph({0: list(range(1, 11)), 1: [11, 12, 13]}, 14)
    # threshold = ceil(0 * avg_degree + 0.5 * 8) = 4 <= fanout 8: every row keeps its window
    s = LocalitySampler(g, [8], seed=0, num_threads=1, prune=(0.0, 0.5))
    for ep in range(40):
        mb = s.sample(torch.tensor([0]), epoch_seed=ep)
        row = mb.input_nodes[mb.blocks[0].edge_index[0]].tolist()
        assert len(row) == 4 and len(set(row)) == 4 and set(row) <= set(range(1, 11))


def test_eq8_caps_the_non_members_when_a_small_scale_overflows_them():
    """For ``s < 1`` with ``k / (a s + n - a) > 1`` the non-members are capped at 1 and the
    members share the rest: ``q_in = (k - (n - a)) / a``."""
    from gnnio.sampling.locality import inclusion_probabilities

    # n = 10, a = 8 members, k = 5, s = 0.01: c = 5 / 2.08 > 1, so q_out = 1, q_in = 3 / 8
    assert inclusion_probabilities(10, 8, 5, 0.01) == pytest.approx((0.375, 1.0))
    for n, a, k, s in [(6, 5, 3, 0.1), (12, 9, 7, 0.5), (20, 19, 4, 0.001)]:
        q_in, q_out = inclusion_probabilities(n, a, k, s)
        assert 0.0 <= q_in <= 1.0 and 0.0 <= q_out <= 1.0
        assert a * q_in + (n - a) * q_out == pytest.approx(k)


def test_poisson_rows_that_disagree_with_their_count_are_refused_not_read():
    """LABOR-0's sample kernel refuses ``offs`` counted under another call key (a row that keeps
    more or fewer neighbours than counted) with a ValueError, instead of writing into the next
    row's slots or relabelling unwritten ones (which read memory at random)."""
    from gnnio.sampling import _labor_kernels as LK

    rng = np.random.default_rng(3)
    n, d, fanout = 64, 40, 8
    indptr = np.arange(0, (n + 1) * d, d, dtype=np.int64)
    indices = rng.integers(0, n, size=n * d).astype(np.int64)
    nodes = np.arange(n, dtype=np.int64)

    def run(count_key, sample_key):
        rows = np.empty((2, n), dtype=np.int64)
        offs = np.empty(n + 1, dtype=np.int64)
        e = LK.count_part(indptr, indices, nodes, 0, n, fanout, np.uint64(count_key), True,
                          rows, offs)  # fmt: skip
        src = np.full(e + 64, -5, dtype=np.int64)
        loc = np.full(n, -1, dtype=np.int64)
        new = np.empty(e + 64, dtype=np.int64)
        seen = np.zeros(1, dtype=np.uint8)
        return LK.sample_part(indices, n, rows, offs, fanout, np.uint64(sample_key), True, src,
                              loc, 0, seen, True, 0, new)  # fmt: skip

    assert run(11, 11) > 0  # (the same key: sampled and relabelled)
    for other in (12, 13, 14):
        with pytest.raises(ValueError, match="count_part"):
            run(11, other)


# -- the shared checks of gnnio/sampling/threaded.py (mutation pass, 2026-11-29) --


def test_fanout_lists_are_refused_at_their_edges():
    from gnnio.sampling.threaded import MAX_FANOUT, check_fanouts, parse_fanouts

    with pytest.raises(ValueError, match="an empty value between commas"):
        parse_fanouts("15,,5")  # not the 2-hop [15, 5]
    assert check_fanouts([MAX_FANOUT, -1, 0]) == [MAX_FANOUT, -1, 0]
    with pytest.raises(ValueError, match="at most"):
        check_fanouts([MAX_FANOUT + 1])
    for text in (b"\x0f\x05", "15"):  # bytes are not read as their byte values, nor digits
        with pytest.raises(TypeError, match="need a list of integers"):
            check_fanouts(text)


def test_seeds_are_a_writeable_1d_array():
    from gnnio.sampling.threaded import check_seeds

    ro = np.arange(5, dtype=np.int64)
    ro.flags.writeable = False  # a slice of a read-only memmap (torch wants writeable arrays)
    got = check_seeds(ro, 10)
    assert got.flags.writeable and got.tolist() == [0, 1, 2, 3, 4]
    g = _random_graph()
    s = UniformSampler(g, [2], seed=1, num_threads=1)
    for scalar in (np.int64(3), torch.tensor(3)):  # one id is not a list of one
        with pytest.raises(ValueError, match="1-D array of node ids"):
            s.sample(scalar)
    for ids in (np.array([True, False]), np.array([1 + 0j]), np.array([1], dtype=object)):
        with pytest.raises(ValueError, match="need integer node ids"):  # not ids 1 and 0
            s.sample(ids)


def test_calls_without_an_epoch_seed_take_counters_0_1_2():
    """The n-th ``sample()`` call without ``epoch_seed`` uses ``call_key(seed, counter=n)``, from
    0: the torch sampler given those keys draws the same batches."""
    from gnnio.sampling.gpu import TorchUniformSampler
    from gnnio.sampling.threaded import call_key

    g = _random_graph()
    cpu = UniformSampler(g, [3, 2], seed=4, num_threads=1)
    tor = TorchUniformSampler(*g.to_torch(), [3, 2])
    seeds = np.arange(0, 120, 7, dtype=np.int64)
    for c in range(3):
        a, b = cpu.sample(seeds), tor.sample(torch.from_numpy(seeds), call_key(4, counter=c))
        assert torch.equal(a.input_nodes.cpu(), b.input_nodes.cpu()), c
    # epoch seeds are read modulo 2^64 (a negative one is its 64-bit pattern, not its size)
    assert call_key(4, epoch_seed=-5) == call_key(4, epoch_seed=2**64 - 5)
    assert call_key(4, epoch_seed=-5) != call_key(4, epoch_seed=5)


def test_a_graph_that_is_not_a_csrgraph_is_checked_once():
    from types import SimpleNamespace

    bad = SimpleNamespace(indptr=np.array([0, 1, 2, 3]), indices=np.array([1, 5, 0]))
    with pytest.raises(ValueError, match="node id 5 is out of range"):
        UniformSampler(bad, [2])  # the kernels would read row 5 of a 3-node graph
    ok = SimpleNamespace(indptr=np.array([0, 1, 2, 3]), indices=np.array([1, 2, 0]))
    mb = UniformSampler(ok, [2], seed=0, num_threads=1).sample(np.array([0]), epoch_seed=1)
    assert mb.input_nodes.tolist() == [0, 1]


def test_close_stops_the_pool_threads_and_a_later_sample_starts_them():
    import threading

    def pool() -> set[threading.Thread]:  # (other tests' samplers may hold threads too)
        return {t for t in threading.enumerate() if t.name.startswith("gnnio-sampler")}

    g = _random_graph(3000, 20000, seed=3)
    s = UniformSampler(g, [2], seed=0, num_threads=2)
    seeds = np.arange(2500, dtype=np.int64)  # >= 2048 rows: the hop is split over 2 threads
    before = pool()
    s.sample(seeds, epoch_seed=0)
    mine = pool() - before
    assert mine
    s.close()
    assert not any(t.is_alive() for t in mine)
    s.sample(seeds, epoch_seed=0)
    assert pool() - before - mine
    s.close()
