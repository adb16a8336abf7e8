"""The summary's ``kernels`` (issue 24 item 7: which implementation ran) names the LADIES hop and
LABOR-i's hop on both paths: ``numba`` on the CPU kernels, ``torch`` on the torch path (the GPU
sampler's code, here on CPU tensors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LaborSampler, LadiesSampler, LocalityLadiesSampler
from gnnio.utils import triton_kernels
from gnnio.utils.triton_kernels import kernels_report
from tests.test_ladies_locality_torch import torch_on_cpu


def _graph() -> CSRGraph:
    rng = np.random.default_rng(0)
    n, m = 300, 3000
    return CSRGraph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n)


SEEDS = torch.arange(0, 40, dtype=torch.int64)


def _make(kind: str, g: CSRGraph):
    if kind == "ladies":
        return LadiesSampler(g, [32, 32], seed=1)
    if kind == "ladloc":
        return LocalityLadiesSampler(g, [32, 32], np.arange(0, 300, 5), scale=4.0, seed=1)
    return LaborSampler(g, [5, 3], seed=1, importance_sampling=2)


@pytest.mark.parametrize("kind", ["ladies", "ladloc", "labor_i"])
@pytest.mark.parametrize("path", ["numba", "torch"])
def test_the_hop_that_ran_is_recorded(kind, path, monkeypatch):
    monkeypatch.setattr(triton_kernels, "_RAN", {})
    g = _graph()
    if path == "torch":
        with torch_on_cpu():
            s = _make(kind, g)
        assert s._torch is not None
    else:
        s = _make(kind, g)
        assert s._torch is None
    s.sample(SEEDS, epoch_seed=0)
    name = "labor_i_hop" if kind == "labor_i" else "ladies_hop"
    rep = kernels_report()
    assert rep[name] == path, rep
    assert rep["fallbacks"] == 0  # (the torch path is these samplers' GPU code, not a fallback)
