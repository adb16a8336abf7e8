"""LABOR-0's torch path (gnnio/sampling/labor_torch.py), run on CPU tensors: the same batches as
the numba kernels bit for bit (ids, order, weights), the per-edge inclusion probability
min(1, k/deg) (a z-test that rejects a biased variant of the same torch code), block contract,
errors; on a CUDA device (gpu-marked) LaborSampler(device="cuda") equals the CPU sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LaborSampler
from gnnio.sampling.labor_torch import TorchLaborSampler, labor_hop_torch
from gnnio.sampling.threaded import call_key

from .helpers import random_graph
from .test_labor import (
    BATCHES,
    K,
    check_blocks,
    edge_counts,
    edge_pi,
    inclusion_z,
    overlapping_rows_graph,
)


def same_batch(a, b) -> None:
    assert torch.equal(a.input_nodes, b.input_nodes)
    assert a.meta["hop_nodes"] == b.meta["hop_nodes"]
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert torch.equal(x.edge_index, y.edge_index)
        assert (x.edge_weight is None) == (y.edge_weight is None)
        if x.edge_weight is not None:
            assert x.edge_weight.dtype == y.edge_weight.dtype == torch.float32
            assert torch.equal(x.edge_weight, y.edge_weight)


class _Keyed:
    """A TorchLaborSampler called as the CPU sampler is: ``sample(seeds, epoch_seed=e)`` with the
    call key of ``(seed, epoch_seed)``."""

    def __init__(self, sampler: TorchLaborSampler, seed: int):
        self.s, self.seed = sampler, seed

    def sample(self, seeds, epoch_seed: int):
        return self.s.sample(seeds, call_key(self.seed, epoch_seed=epoch_seed))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(5, 120),
    m=st.integers(0, 900),
    gseed=st.integers(0, 10_000),
    fanouts=st.lists(st.integers(-1, 7), min_size=1, max_size=3),
    design=st.sampled_from(["fixed", "poisson"]),
    ld=st.booleans(),
    weights=st.sampled_from(["ht", "ht_mean", "none"]),
)
# a fanout of -1 (all neighbours: weight 1, or 1 / d), in every run (random draws missed it)
@example(n=50, m=400, gseed=3, fanouts=[-1, 3], design="fixed", ld=False, weights="ht")
@example(n=50, m=400, gseed=3, fanouts=[2, -1], design="poisson", ld=True, weights="ht_mean")
def test_torch_path_equals_the_numba_kernels(n, m, gseed, fanouts, design, ld, weights):
    """Random graphs (repeated neighbours and self-loops included), every option: identical
    batches, and the torch batch satisfies the block contract."""
    g = random_graph(n, m, gseed)
    seeds = np.random.default_rng(gseed).permutation(n)[: max(1, n // 3)]
    opts = {"design": design, "layer_dependency": ld, "weights": weights}
    cpu = LaborSampler(g, fanouts, seed=gseed, **opts)
    tch = TorchLaborSampler(*g.to_torch(), fanouts, **opts)
    for e in (0, 1):
        a = cpu.sample(torch.from_numpy(seeds), epoch_seed=e)
        b = tch.sample(torch.from_numpy(seeds), call_key(gseed, epoch_seed=e))
        same_batch(a, b)
        assert b.meta["sampler"] == "labor"
    check_blocks(b, g, seeds)


def test_torch_path_equals_numba_on_a_skewed_graph_with_three_hops():
    """A power-law-ish graph (hub rows far above the fanout), 3 hops, 300 seeds: identical."""
    rng = np.random.default_rng(3)
    n = 4000
    src = (rng.pareto(1.2, 60000) * 20).astype(np.int64) % n
    g = CSRGraph.from_edges(src, rng.integers(0, n, 60000), n)
    seeds = rng.permutation(n)[:300]
    for design in ("fixed", "poisson"):
        a = LaborSampler(g, [15, 10, 5], seed=9, design=design).sample(seeds, epoch_seed=4)
        b = TorchLaborSampler(*g.to_torch(), [15, 10, 5], design=design).sample(
            seeds, call_key(9, epoch_seed=4)
        )
        same_batch(a, b)


@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_torch_edge_inclusion_probability_is_min_one_k_over_deg(design):
    """The z-test of tests/test_labor.py on the torch path: all |z| < 5, mean z^2 near 1."""
    g = overlapping_rows_graph()
    seeds = np.arange(40, 100)
    s = _Keyed(TorchLaborSampler(*g.to_torch(), [K], design=design), seed=1)
    counts = edge_counts(s, g, seeds, BATCHES)
    pi = edge_pi(g, K)
    z = inclusion_z(counts, BATCHES, pi)
    assert np.abs(z).max() < 5 and 0.7 < (z**2).mean() < 1.4, (np.abs(z).max(), (z**2).mean())
    assert (counts[pi == 1] == BATCHES).all()


@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_torch_inclusion_test_rejects_a_biased_variant(design):
    """The same torch hop drawing k + 1 neighbours where the weights assume k: the z-test fails."""
    g = overlapping_rows_graph()
    ip, ix = g.to_torch()
    seeds = torch.arange(40, 100)
    n = g.num_nodes
    graph_keys = np.repeat(np.arange(n), np.diff(ip.numpy())) * n + ix.numpy()
    counts = np.zeros(graph_keys.size, dtype=np.int64)
    for b in range(BATCHES):
        rkey = call_key(1, epoch_seed=b) ^ 0x1AB0_0000_0000_0001
        src, row = labor_hop_torch(ip, ix, seeds, K + 1, rkey, poisson=design == "poisson")
        keys = seeds[row].numpy() * n + src.numpy()
        counts += np.bincount(np.searchsorted(graph_keys, keys), minlength=counts.size)
    z = inclusion_z(counts, BATCHES, edge_pi(g, K))
    assert np.abs(z).max() > 5


def test_torch_errors_and_empty_seeds():
    g = random_graph(50, 300, seed=0)
    s = TorchLaborSampler(*g.to_torch(), [3, 2])
    with pytest.raises(ValueError, match="more than once"):
        s.sample([1, 1], key=0)
    with pytest.raises(ValueError, match="node id 3 appears more than once"):  # the smallest
        s.sample([9, 7, 3, 8, 9, 3], key=0)
    from gnnio.utils.syncs import OpCounter

    with OpCounter() as c:  # the checks read back once, by ``.tolist()`` (unseen on the CPU)
        s._check_seeds(torch.tensor([5, 2, 9]))
    assert c.syncs == 0, dict(c.sync_ops)  # no bincount, no int(): was 3 syncs on a GPU
    with pytest.raises(ValueError, match="out of range"):
        s.sample([0, 50], key=0)
    with pytest.raises(ValueError, match="integer"):
        s.sample(torch.tensor([0.5]), key=0)
    mb = s.sample(torch.empty(0, dtype=torch.int64), key=0)
    assert mb.meta["hop_nodes"] == [0, 0, 0]
    # the scratch went back clean after the errors: a later batch still equals the CPU one
    same_batch(LaborSampler(g, [3, 2], seed=2).sample([4, 7, 9], epoch_seed=1),
               s.sample([4, 7, 9], call_key(2, epoch_seed=1)))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_labor_on_cuda_equals_cpu(design):  # pragma: no cover - GPU only
    rng = np.random.default_rng(5)
    g = random_graph(3000, 30000, seed=5)
    seeds = rng.permutation(3000)[:200]
    cpu = LaborSampler(g, [10, 5], seed=0, design=design).sample(seeds, epoch_seed=3)
    gpu = LaborSampler(g, [10, 5], seed=0, design=design, device="cuda")
    assert gpu.device.type == "cuda"
    same_batch(cpu, gpu.sample(seeds, epoch_seed=3).to("cpu"))


@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_torch_blocks_carry_their_csr_pointer(design):
    """The torch path (what a GPU samples) hands its blocks' CSR row pointer to the model, so
    aggregation on a GPU does not sort the edges again; the pointer is the edges' own."""
    rng = np.random.default_rng(4)
    g = random_graph(2000, 20000, seed=4)
    seeds = rng.permutation(2000)[:150]
    mb = TorchLaborSampler(*g.to_torch(), [10, 5], design=design).sample(seeds, 123)
    for b in mb.blocks:
        assert b.ptr is not None
        dst = b.edge_index[1]
        assert bool((dst[1:] >= dst[:-1]).all())  # grouped by destination, in order
        assert torch.equal(b.ptr, torch._convert_indices_from_coo_to_csr(dst, b.num_dst))
