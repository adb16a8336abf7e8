"""The split-hop CPU sampler: bit-identical to a serial first-appearance pass for every thread
count, scratch left clean, concurrent callers, and the invariants on graphs with hub nodes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import UniformSampler, _kernels
from gnnio.sampling import uniform as U
from gnnio.sampling.uniform import call_key, hop_key

from .test_sampling import check_batch


def hub_graph(n: int, m: int, seed: int) -> CSRGraph:
    """Heavy-tailed sources: a few hubs appear in many rows, so different parts of a hop keep
    meeting the same unseen nodes (the case the merge has to get right)."""
    rng = np.random.default_rng(seed)
    src = np.minimum((rng.pareto(1.1, m) * 20).astype(np.int64), n - 1)
    src = rng.permutation(n)[src]  # hubs spread over the id space
    dst = rng.integers(0, n, m)
    return CSRGraph.from_edges(src, dst, n)


def serial_reference(graph: CSRGraph, fanouts, seed: int, seeds: np.ndarray, epoch_seed: int):
    """The previous implementation, built from the serial kernels: count all rows, sample them,
    relabel in one first-appearance pass. Returns (input_nodes, [edges per hop])."""
    indptr = np.ascontiguousarray(graph.indptr, dtype=np.int64)
    indices = np.ascontiguousarray(graph.indices)
    key = call_key(seed, epoch_seed=epoch_seed)
    loc = np.full(graph.num_nodes, -1, dtype=np.int32)
    assert _kernels.insert_seeds(seeds, loc) == -1
    nodes, edges_per_hop = seeds, []
    for h, f in enumerate(fanouts):
        offs, rows = _kernels.count_rows(indptr, nodes, np.int64(f))
        edges = np.empty((2, int(offs[-1])), dtype=np.int64)
        hk = np.uint64(hop_key(key, h))
        _kernels.sample_rows(indices, nodes, rows, hk, offs, 0, nodes.shape[0], edges)
        new = _kernels.relabel(edges[0], loc, np.int64(nodes.shape[0]))
        nodes = np.concatenate([nodes, new])
        edges_per_hop.append(edges)
    return nodes, edges_per_hop


def assert_same(mb, ref) -> None:
    nodes, edges = ref
    assert np.array_equal(mb.input_nodes.numpy(), nodes)
    for h, e in enumerate(edges):
        assert np.array_equal(mb.blocks[len(edges) - 1 - h].edge_index.numpy(), e), f"hop {h + 1}"


def assert_scratch_clean(sampler: UniformSampler) -> None:
    for ws in sampler._scratch:
        assert (ws.loc < ws.off).all(), "an entry of the global -> local map is still live"
        for p in range(1, len(ws._seen) + 1):
            assert not ws.seen(p).any(), f"part {p}'s bitmap was not cleared"


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_parallel_hops_match_the_serial_pass_bit_for_bit(threads):
    g = hub_graph(30_000, 300_000, seed=1)
    fanouts = [10, 5, 3]
    s = UniformSampler(g, fanouts, seed=7, num_threads=threads)
    rng = np.random.default_rng(threads)
    for i in range(3):
        seeds = rng.permutation(g.num_nodes)[:2500]  # >= 2048 rows: every hop is split
        mb = s.sample(torch.from_numpy(seeds), epoch_seed=i)
        assert_same(mb, serial_reference(g, fanouts, 7, seeds, i))
        if i == 0:
            check_batch(mb, g, seeds, fanouts)
    assert_scratch_clean(s)
    s.close()


def test_all_neighbours_and_large_fanouts_split():
    g = hub_graph(5_000, 60_000, seed=2)
    seeds = np.random.default_rng(0).permutation(g.num_nodes)[:2100]
    for fanouts in ([-1, 2], [40, 0, 3]):  # -1: every in-neighbour; 40 > 32: hashed Floyd
        s = UniformSampler(g, fanouts, seed=3, num_threads=3)
        assert_same(s.sample(seeds, epoch_seed=5), serial_reference(g, fanouts, 3, seeds, 5))
        assert_scratch_clean(s)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 300),
    m=st.integers(0, 2000),
    gseed=st.integers(0, 10**6),
    fanouts=st.lists(st.sampled_from([-1, 0, 1, 2, 3, 7, 40]), min_size=1, max_size=3),
    nseeds=st.integers(0, 60),
    threads=st.integers(2, 4),
    min_rows=st.sampled_from([1, 2, 5]),
)
def test_hypothesis_split_equals_serial(n, m, gseed, fanouts, nseeds, threads, min_rows):
    """With the split threshold lowered, tiny hops go through every part-boundary case (empty
    parts, single rows, all edges in one part) and must still match the serial pass."""
    g = hub_graph(n, m, gseed) if m else CSRGraph.from_edges(np.zeros(0), np.zeros(0), n)
    seeds = np.random.default_rng(gseed).permutation(n)[: min(nseeds, n)]
    old = U._PARALLEL_MIN_ROWS
    U._PARALLEL_MIN_ROWS = min_rows
    try:
        s = UniformSampler(g, fanouts, seed=gseed % 97, num_threads=threads)
        for e in range(2):  # the second call reuses the pooled scratch
            mb = s.sample(seeds, epoch_seed=e)
            assert_same(mb, serial_reference(g, fanouts, gseed % 97, seeds, e))
        check_batch(mb, g, seeds, fanouts)
        assert_scratch_clean(s)
        s.close()
    finally:
        U._PARALLEL_MIN_ROWS = old


def test_concurrent_callers_with_split_hops():
    g = hub_graph(20_000, 200_000, seed=4)
    fanouts = [8, 4]
    s = UniformSampler(g, fanouts, seed=1, num_threads=2)
    rng = np.random.default_rng(9)
    batches = [rng.permutation(g.num_nodes)[:2200] for _ in range(6)]
    want = [serial_reference(g, fanouts, 1, b, i) for i, b in enumerate(batches)]
    got: dict[int, object] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(k, len(batches), 3):
                got[i] = s.sample(batches[i], epoch_seed=i)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, ref in enumerate(want):
        assert_same(got[i], ref)
    assert_scratch_clean(s)


def test_repeated_seed_leaves_the_pool_clean():
    g = hub_graph(3_000, 20_000, seed=5)
    s = UniformSampler(g, [3, 2], num_threads=2)
    seeds = np.arange(2500)
    s.sample(seeds, epoch_seed=0)
    with pytest.raises(ValueError, match="more than once"):
        s.sample(np.r_[seeds, 7], epoch_seed=1)
    assert_scratch_clean(s)
    assert_same(s.sample(seeds, epoch_seed=2), serial_reference(g, [3, 2], 0, seeds, 2))


def test_map_offsets_wrap_around_with_a_refill():
    """The versioned map is refilled when the next offset could overflow its integer type; the
    batches are the same before, across and after the refill."""
    g = hub_graph(4_000, 40_000, seed=6)
    s = UniformSampler(g, [4, 3], seed=2, num_threads=2)
    seeds = np.random.default_rng(1).permutation(g.num_nodes)[:2300]
    assert_same(s.sample(seeds, epoch_seed=0), serial_reference(g, [4, 3], 2, seeds, 0))
    ws = s._scratch[0]
    ws._limit = ws.off + g.num_nodes + 10  # room for one more call only
    for e in range(1, 4):
        assert_same(s.sample(seeds, epoch_seed=e), serial_reference(g, [4, 3], 2, seeds, e))
        assert ws.off <= ws._limit
    assert ws.off < 2 * g.num_nodes  # it did restart from 0
    assert_scratch_clean(s)
