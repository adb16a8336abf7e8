"""The GPU samplers whose decisions read float sums keep the CPU's ids when those sums' last bits
change, as they do on CUDA.

LADIES (:mod:`gnnio.sampling.ladies_torch`; the locality-aware one too) and LABOR-i
(:mod:`gnnio.sampling.labor_importance_torch`) decide which nodes a batch keeps from
``torch.segment_reduce(..., "sum")`` and float ``torch.cumsum`` results. On CPU tensors both add
in sequence (the numba kernels' bits); on CUDA ``segment_reduce`` is cub's segmented reduction
(a tree per segment) and ``cumsum`` a parallel scan, so the sums may differ in their last bits.
gpu-check (:mod:`gnnio.bench.gpu_check_sampling`) still expects the CPU's ids and edges
(``*_checksum_ids_equal``): a decision may only flip where a uniform variate falls within
rounding of its probability. These tests take the torch paths on CPU tensors with every such sum
moved by a few ulps (sums of whole numbers, exact in any order, are left alone) and hold their
ids, edges and LABOR-i's step counts to the numba kernels', the weights within float rounding --
what the gpu-marked tests check on a real GPU (``test_*_on_cuda_equals_cpu``). A decision that
read the sums' exact bits (an equality where a margin is meant) fails here without a GPU.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

import gnnio.sampling.labor_importance_torch as LT
from gnnio.sampling import LaborSampler, LadiesSampler, LocalityLadiesSampler
from gnnio.sampling.ladies_torch import TorchLadiesSampler
from gnnio.sampling.threaded import call_key

from .helpers import random_graph
from .test_labor_importance import power_law_graph
from .test_labor_importance_torch import same_batch as same_labor_batch
from .test_ladies_locality_torch import torch_on_cpu
from .test_ladies_torch import same_batch as same_ladies_batch
from .test_ladies_torch import skewed_graph

ULPS = 4  # each perturbed sum moves by up to this many units in its last place, either way


@contextmanager
def perturbed_sums(seed: int = 0):
    """Every float ``torch.segment_reduce(..., "sum")`` and ``torch.cumsum`` result inside the
    block moved by ``k`` ulps, ``k`` drawn in ``[-ULPS, ULPS]`` per entry (seeded); whole-number
    results are kept (exact in any order). Yields a list of how many entries each call moved."""
    gen = torch.Generator().manual_seed(seed)
    seg, cumsum = torch.segment_reduce, torch.cumsum
    moved: list[int] = []

    def noise(x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point() or x.numel() == 0:
            return x
        k = torch.randint(-ULPS, ULPS + 1, x.shape, generator=gen).to(x.dtype)
        k = torch.where(x == torch.round(x), 0.0, k)
        y = x * (1.0 + k * torch.finfo(x.dtype).eps)
        moved.append(int((y != x).sum()))
        return y

    def seg_p(data, reduce, *args, **kw):
        out = seg(data, reduce, *args, **kw)
        return noise(out) if reduce == "sum" else out

    def cumsum_p(x, *args, **kw):
        return noise(cumsum(x, *args, **kw))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "segment_reduce", seg_p)
        mp.setattr(torch, "cumsum", cumsum_p)
        yield moved


GRAPHS = {  # (uniform sources; heavy-tailed ones whose hubs the budget solve caps)
    "random": lambda: random_graph(1500, 15000, seed=5),
    "skewed": lambda: skewed_graph(1500, 15000, 6),
    "power_law": lambda: power_law_graph(1500, 20000, 6),
}


def _seeds(n: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n)[:k]


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_ladies_ids_ignore_the_sums_last_bits(graph):
    g = GRAPHS[graph]()
    cpu = LadiesSampler(g, [128, 128], seed=0)
    tch = TorchLadiesSampler(*g.to_torch(), [128, 128])
    for e in range(4):
        seeds = _seeds(g.num_nodes, 100, e)
        with perturbed_sums(e) as moved:
            b = tch.sample(seeds, call_key(0, epoch_seed=e))
        assert sum(moved) > 0  # (the perturbation reached the solve)
        same_ladies_batch(cpu.sample(torch.from_numpy(seeds), epoch_seed=e), b,
                          exact_weights=False)  # fmt: skip


@pytest.mark.parametrize("graph", ["random", "skewed"])
def test_locality_ladies_ids_ignore_the_sums_last_bits(graph):
    g = GRAPHS[graph]()
    hot = np.arange(0, g.num_nodes, 10)
    cpu = LocalityLadiesSampler(g, [128, 128], hot, scale=4.0)
    with torch_on_cpu():
        tch = LocalityLadiesSampler(g, [128, 128], hot, scale=4.0)
    assert tch._torch is not None
    for e in range(3):
        seeds = _seeds(g.num_nodes, 100, e)
        with perturbed_sums(e) as moved:
            b = tch.sample(seeds, epoch_seed=e)
        assert sum(moved) > 0
        same_ladies_batch(cpu.sample(torch.from_numpy(seeds), epoch_seed=e), b,
                          exact_weights=False)  # fmt: skip


@pytest.mark.parametrize("imp", [1, 3, 10**12])
@pytest.mark.parametrize("graph", ["random", "power_law"])
def test_labor_i_ids_and_steps_ignore_the_sums_last_bits(graph, imp):
    """LABOR-i's early stop compares a scan's sum with a margin of 1e-4 (DGL's): the steps taken
    are the CPU's too (``10**12``: until that stop, LABOR-*)."""
    g = GRAPHS[graph]()
    cpu = LaborSampler(g, [10, 5], seed=0, importance_sampling=imp)
    tch = LT.TorchLaborImportanceSampler(*g.to_torch(), [10, 5], min(imp, 1 << 62))
    for e in range(3):
        seeds = _seeds(g.num_nodes, 100, e)
        with perturbed_sums(e) as moved:
            b = tch.sample(seeds, call_key(0, epoch_seed=e))
        assert sum(moved) > 0
        same_labor_batch(cpu.sample(torch.from_numpy(seeds), epoch_seed=e), b,
                         exact_weights=False)  # fmt: skip


def test_the_perturbation_moves_sums_and_leaves_whole_numbers():
    seg, cumsum = torch.segment_reduce, torch.cumsum
    x = torch.tensor([0.1, 0.2, 0.3, 0.7], dtype=torch.float64)
    lengths = torch.tensor([2, 2])
    with perturbed_sums(1) as moved:
        s = torch.segment_reduce(x, "sum", lengths=lengths)
        c = torch.cumsum(x, 0)
        whole = torch.cumsum(torch.ones(5, dtype=torch.float64), 0)
        ints = torch.cumsum(torch.arange(4), 0)
    assert sum(moved) > 0
    assert torch.allclose(s, torch.tensor([0.3, 1.0], dtype=torch.float64), rtol=1e-15)
    assert torch.allclose(c, torch.cumsum(x, 0), rtol=1e-15)
    assert torch.equal(whole, torch.arange(1, 6, dtype=torch.float64))
    assert torch.equal(ints, torch.tensor([0, 1, 3, 6]))
    assert torch.segment_reduce is seg and torch.cumsum is cumsum  # (put back after the block)
