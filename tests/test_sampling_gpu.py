"""The GPU sampler's host synchronisations (issue 15, fault 9), counted on CPU tensors.

Every torch call that reads a device value on the host (``int(t)``, ``bool(t)``, ``.item()``,
``.tolist()``, ``nonzero``, boolean-mask indexing, ...) is a host sync on a GPU. The sampler may
make ``len(fanouts) + 1`` of them per batch: one for the seeds and one per hop.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.graph import CSRGraph
from gnnio.sampling.gpu import TorchUniformSampler, count_syncs, sample_hop_torch


def test_count_syncs_sees_the_usual_culprits():
    t = torch.arange(6)
    with count_syncs() as c:
        int(t.sum())
        bool((t > 2).any())
        torch.nonzero(t)
        t[t > 2]
        t.tolist()
        t + 1  # not a sync
        t[torch.tensor([1, 2])]  # integer indexing: not a sync
    assert c.count == 5, c.ops


@pytest.mark.parametrize("fanouts", [[15, 10, 5], [4, -1], [0, 3], [25]])
def test_host_syncs_per_batch_are_one_per_hop_plus_one(fanouts):
    rng = np.random.default_rng(0)
    n = 3000
    g = CSRGraph.from_edges(rng.integers(0, n, 40000), rng.integers(0, n, 40000), n)
    s = TorchUniformSampler(*g.to_torch(), fanouts)
    seeds = torch.from_numpy(rng.permutation(n)[:256])
    s.sample(seeds, key=0)  # warm: the scratch tensors exist
    with count_syncs() as c:
        mb = s.sample(seeds, key=1)
    assert c.count <= len(fanouts) + 1, c.ops
    assert mb.meta["hop_nodes"][0] == 256


def test_hop_with_known_total_makes_no_sync():
    rng = np.random.default_rng(1)
    g = CSRGraph.from_edges(rng.integers(0, 200, 2000), rng.integers(0, 200, 2000), 200)
    ip, ix = g.to_torch()
    dst = torch.arange(200)
    total = int(torch.clamp(ip[1:] - ip[:-1], max=4).sum())
    with count_syncs() as c:
        src, row = sample_hop_torch(ip, ix, dst, 4, torch.Generator().manual_seed(0), total)
    assert c.count == 0, c.ops
    assert src.shape[0] == row.shape[0] == total
