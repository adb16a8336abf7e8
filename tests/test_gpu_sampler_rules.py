"""The GPU samplers' torch paths (gnnio/sampling/gpu.py, gpu_bounded.py, labor_torch.py) held
to rules their docstrings state and the existing tests left open, on CPU tensors: a batch that
fills its edge bound exactly keeps the one-sync path, the edge-slot limit is inclusive, and the
seed checks of the synced path and of a batch of more seeds than nodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.graph import CSRGraph
from gnnio.sampling import gpu_bounded
from gnnio.sampling.gpu import TorchUniformSampler, count_syncs
from gnnio.sampling.labor_torch import TorchLaborSampler


def _ring(n: int, d: int) -> CSRGraph:
    """Node ``i``'s in-neighbours are ``i + 1 .. i + d`` (mod ``n``): every degree is ``d``."""
    dst = np.repeat(np.arange(n), d)
    src = (dst + np.tile(np.arange(1, d + 1), n)) % n
    return CSRGraph.from_edges(src, dst, n)


def _same(a, b) -> None:
    assert torch.equal(a.input_nodes, b.input_nodes)
    assert a.meta["hop_nodes"] == b.meta["hop_nodes"]
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.ptr, y.ptr)


def test_a_batch_that_fills_its_edge_bound_exactly_reads_the_device_once():
    """Every row of degree >= fanout: hop 0 draws exactly its bound ``R_0 * fanout`` edges,
    which is within the bound, so the batch stays on the one-sync path (not redone)."""
    g = _ring(200, 6)
    s = TorchUniformSampler(*g.to_torch(), [3, 2])
    seeds = torch.arange(0, 200, 9)  # 23 seeds
    rows, edges = gpu_bounded.plan(s, int(seeds.numel()))
    assert edges[0] == seeds.numel() * 3
    s.sample(seeds, 5)  # warm: the scratch and the buffer set exist
    with count_syncs() as c:
        mb = s.sample(seeds, 7)
    assert c.count <= 2, c.ops
    assert mb.blocks[-1].edge_index.shape[1] == edges[0]  # the bound, met exactly
    _same(mb, s._sample_synced(seeds, 7))


@pytest.mark.parametrize("make", ["uniform", "labor"])
@pytest.mark.parametrize("bad", [[0, 30], [-1, 3], [31]])
def test_the_synced_path_refuses_seeds_out_of_range(make, bad):
    """With a fanout of -1 (the synced path) a seed ``< 0`` or ``>= num_nodes`` is a ValueError
    naming it, not an index error or a batch with a node that does not exist."""
    g = _ring(30, 3)
    ip, ix = g.to_torch()
    s = (
        TorchUniformSampler(ip, ix, [-1, 2])
        if make == "uniform"
        else TorchLaborSampler(ip, ix, [-1, 2])
    )
    with pytest.raises(ValueError, match=f"node id {bad[-1] if bad[0] >= 0 else -1} out of range"):
        s.sample(torch.tensor(bad), 3)
    _same(s.sample(torch.tensor([0, 29]), 3), s._sample_synced(torch.tensor([0, 29]), 3))


def test_a_hop_of_exactly_max_edge_slots_is_still_bounded(monkeypatch):
    """``MAX_EDGE_SLOTS`` is the largest edge bound the bounded batch holds: a hop bound equal
    to it is bounded, one slot less sends the batch to the synced path."""
    g = _ring(200, 6)
    s = TorchUniformSampler(*g.to_torch(), [3, 2])
    seeds = torch.arange(0, 200, 9)
    _, edges = gpu_bounded.plan(s, int(seeds.numel()))
    monkeypatch.setattr(gpu_bounded, "MAX_EDGE_SLOTS", max(edges))
    mb = gpu_bounded.sample_bounded(s, seeds, 7)
    assert mb is not None
    _same(mb, s._sample_synced(seeds, 7))
    monkeypatch.setattr(gpu_bounded, "MAX_EDGE_SLOTS", max(edges) - 1)
    assert gpu_bounded.sample_bounded(s, seeds, 7) is None


@pytest.mark.parametrize("make", ["uniform", "labor"])
def test_more_seeds_than_nodes_is_the_repeated_seed_error(make):
    """A batch of more seeds than the graph has nodes (so some repeat) is refused with the
    repeated-seed ValueError: the bounds never shrink below the seeds (``R_{h+1} >= R_h``)."""
    ip, ix = _ring(5, 2).to_torch()
    s = (
        TorchUniformSampler(ip, ix, [2, 1])
        if make == "uniform"
        else TorchLaborSampler(ip, ix, [2, 1])
    )
    with pytest.raises(ValueError, match="node id 0 appears more than once"):
        s.sample(torch.tensor([0, 1, 2, 3, 4, 0, 1]), 3)


@pytest.mark.parametrize("make", ["uniform", "labor"])
@pytest.mark.parametrize("seeds", [[True, False], [0.0, 1.0]])
def test_seeds_that_are_not_integer_ids_are_refused(make, seeds):
    """Boolean or float seeds are a ValueError, not a mask or ids silently cast to 0 and 1."""
    ip, ix = _ring(10, 2).to_torch()
    s = TorchUniformSampler(ip, ix, [2]) if make == "uniform" else TorchLaborSampler(ip, ix, [2])
    with pytest.raises(ValueError, match="need integer node ids"):
        s.sample(torch.tensor(seeds), 1)
