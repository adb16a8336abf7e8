"""The GPU sampler's host synchronisations (issue 15, fault 9), counted on CPU tensors.

Every torch call that reads a device value on the host (``int(t)``, ``bool(t)``, ``.item()``,
``.tolist()``, ``nonzero``, boolean-mask indexing, ...) is a host sync on a GPU. The sampler may
make 2 of them per batch with every fanout >= 0 (issue 24: one, at the batch's end,
gnnio/sampling/gpu_bounded.py, tested in tests/test_gpu_bounded.py) and ``len(fanouts) + 1``
with fanout -1: one for the seeds and one per hop.
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
        # a Python number assigned by index: on CUDA torch copies it up and waits (2026-11-29:
        # the synced path's relabelling did so twice per hop, unseen here until then)
        t[torch.tensor([1, 2])] = -1
        t[0] = 7
        t[torch.tensor([3])] = torch.tensor(5)  # a value on the tensor's device: not a sync
        t.index_fill_(0, torch.tensor([4]), -1)  # nor index_fill_ / fill_
        t[:1].fill_(0)
        t[4:] = 0  # a slice's: a fill
        t[t > 100] = 0  # a bool mask's: masked_fill_
    assert c.count == 7, c.ops


@pytest.mark.parametrize("fanouts", [[15, 10, 5], [4, -1], [0, 3], [25]])
def test_host_syncs_per_batch(fanouts):
    rng = np.random.default_rng(0)
    n = 3000
    g = CSRGraph.from_edges(rng.integers(0, n, 40000), rng.integers(0, n, 40000), n)
    s = TorchUniformSampler(*g.to_torch(), fanouts)
    seeds = torch.from_numpy(rng.permutation(n)[:256])
    s.sample(seeds, key=0)  # warm: the scratch tensors exist
    with count_syncs() as c:
        mb = s.sample(seeds, key=1)
    assert c.count <= (2 if min(fanouts) >= 0 else len(fanouts) + 1), c.ops
    assert mb.meta["hop_nodes"][0] == 256


def test_hop_with_known_total_makes_no_sync():
    rng = np.random.default_rng(1)
    g = CSRGraph.from_edges(rng.integers(0, 200, 2000), rng.integers(0, 200, 2000), 200)
    ip, ix = g.to_torch()
    dst = torch.arange(200)
    total = int(torch.clamp(ip[1:] - ip[:-1], max=4).sum())
    with count_syncs() as c:
        src, row, _redo = sample_hop_torch(ip, ix, dst, 4, 12345, total, exact=False)
    assert c.count == 0, c.ops
    assert src.shape[0] == row.shape[0] == total


# ---- sampling on the GPU in gnnio train, UVA topology (issue 15) ------------------------------


def test_pinned_csr_views_alias_the_host_csr(monkeypatch):
    """UVA sampling pins the host CSR in place and views it from the GPU: no copy."""
    from gnnio.features.tiers import uva
    from gnnio.sampling.gpu import pinned_csr
    from tests.fake_cuda import (
        FakeCudaRuntime,
        FakeCudaTensor,
        fake_cuda,
        fake_events,
        install_runtime,
    )

    fake_cuda(monkeypatch)
    rt = install_runtime(monkeypatch, FakeCudaRuntime(fake_events(monkeypatch)))
    real_as_tensor = torch.as_tensor

    def as_tensor(obj, *a, **k):
        if isinstance(obj, uva._CudaArrayView):
            return obj.owner.view(torch.uint8).as_subclass(FakeCudaTensor)
        return real_as_tensor(obj, *a, **k)

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    rng = np.random.default_rng(2)
    g = CSRGraph.from_edges(rng.integers(0, 50, 300), rng.integers(0, 50, 300), 50)
    ip, ix = g.to_torch()
    vip, vix, handles = pinned_csr(ip, ix, torch.device("cuda", 0))
    assert vip.device == torch.device("cuda", 0) and vip.data_ptr() == ip.data_ptr()
    assert vix.data_ptr() == ix.data_ptr() and vix.dtype == ix.dtype
    assert torch.equal(vip.as_subclass(torch.Tensor), ip) and vip.shape == ip.shape
    assert len(rt.ranges) == 2 and all(h.registered for h in handles)
    for h in handles:
        h.release()
    assert rt.ranges == []


def test_sampler_placement_and_its_options(monkeypatch):
    from gnnio.errors import UsageError
    from gnnio.features.tiers.tiered import hot_rows_for_fraction
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import sampler_placement
    from tests.fake_cuda import fake_cuda

    with pytest.raises(UsageError, match="--graph-in: only with"):
        TrainConfig(graph_in="host").validate()
    fake_cuda(monkeypatch)
    with pytest.raises(UsageError, match="needs --device cuda"):
        TrainConfig(sampler_device="cuda")._validate_sampler_device()
    TrainConfig(
        device="cuda", sampler_device="cuda", sampler="ladies", locality_scale=2.0
    )._validate_sampler_device()  # (the locality-aware LADIES has a GPU sampler too)
    TrainConfig(device="cuda", sampler_device="cuda", sampler="ladies")._validate_sampler_device()
    TrainConfig(device="cuda", sampler_device="cuda", sampler="labor")._validate_sampler_device()
    rng = np.random.default_rng(3)
    ds = type(
        "DS",
        (),
        {"graph": CSRGraph.from_edges(rng.integers(0, 100, 900), rng.integers(0, 100, 900), 100)},
    )
    csr = ds.graph.indptr.nbytes + ds.graph.indices.nbytes
    cfg = TrainConfig(device="cuda", sampler_device="cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (4 * csr, 8 * csr))
    assert sampler_placement(ds, cfg) == (torch.device("cuda", 0), "gpu")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (4 * csr - 4, 8 * csr))
    assert sampler_placement(ds, cfg) == (torch.device("cuda", 0), "host")
    assert sampler_placement(ds, TrainConfig(sampler_device="cpu", device="cuda")) == (None, "gpu")
    # auto (the default): the GPU sampler when training on CUDA and the CSR fits, else the CPU one
    assert sampler_placement(ds, TrainConfig()) == (None, "gpu")  # --device cpu
    auto = TrainConfig(device="cuda")
    assert auto.sampler_device == "auto"
    assert sampler_placement(ds, auto) == (None, "gpu")  # does not fit: CPU sampler
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (4 * csr, 8 * csr))
    assert sampler_placement(ds, auto) == (torch.device("cuda", 0), "gpu")
    ladies_las = TrainConfig(device="cuda", sampler="ladies", locality_scale=2.0)
    assert sampler_placement(ds, ladies_las) == (None, "gpu")  # (its member index: no room)
    for other in (dict(sampler="labor"), dict(prune_threshold=(1, 1)), dict(sampler="ladies")):
        assert sampler_placement(ds, TrainConfig(device="cuda", **other)) == (
            torch.device("cuda", 0),
            "gpu",
        )
    # the locality-aware sampler's member index counts too: per layer a pointer as long as the
    # CSR's and, at most, the int32 positions of the |B| most frequent neighbours (an upper bound)
    las = TrainConfig(device="cuda", locality_scale=2.0, gpu_cache_fraction=0.5)
    top = np.sort(np.bincount(ds.graph.indices, minlength=100))[-hot_rows_for_fraction(0.5, 100) :]
    mi = 3 * (ds.graph.indptr.nbytes + 4 * int(top.sum()))
    assert sampler_placement(ds, las) == (None, "gpu")  # the CSR alone fits, not with the index
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (4 * (csr + mi) - 4, 8 * csr))
    assert sampler_placement(ds, las) == (None, "gpu")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (4 * (csr + mi), 8 * csr))
    assert sampler_placement(ds, las) == (torch.device("cuda", 0), "gpu")
    # the locality-aware LADIES has a GPU sampler too (B = every node here: all the positions)
    whole = 3 * (ds.graph.indptr.nbytes + 4 * ds.graph.indices.shape[0])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (4 * (csr + whole), 8 * csr))
    assert sampler_placement(ds, ladies_las) == (torch.device("cuda", 0), "gpu")


@pytest.mark.parametrize(
    "opts, want",
    [(dict(sampler_device="auto"), ("cuda", "gpu")), (dict(sampler_device="cuda", graph_in="host"),
     ("cuda", "host")), (dict(sampler_device="cpu"), (None, "gpu"))],
)  # fmt: skip
def test_train_builds_labor_on_the_gpu(monkeypatch, opts, want):
    """``gnnio train --sampler labor --device cuda`` samples LABOR-0 on the GPU (its torch path,
    :mod:`gnnio.sampling.labor_torch`) where the uniform sampler would run there, UVA included;
    ``--sampler-device cpu`` keeps the numba kernels."""
    import gnnio.sampling
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import build_sampler
    from tests.fake_cuda import fake_cuda

    fake_cuda(monkeypatch)
    rng = np.random.default_rng(4)
    graph = CSRGraph.from_edges(rng.integers(0, 100, 900), rng.integers(0, 100, 900), 100)
    ds = type("DS", (), {"graph": graph})
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 30, 1 << 31))
    built = {}

    class Labor:
        def __init__(self, graph, fanouts, **kw):
            built.update(kw)

    monkeypatch.setattr(gnnio.sampling, "LaborSampler", Labor)
    cfg = TrainConfig(device="cuda", sampler="labor", **opts)
    cfg._validate_sampler_device()
    sampler, _ = build_sampler(ds, cfg, [5, 5], None)
    dev = built["device"]
    assert (None if dev is None else dev.type, built["graph_in"]) == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_uva_sampling_equals_gpu_sampling():  # pragma: no cover - GPU only
    from gnnio.sampling import UniformSampler
    from tests.test_sampling import check_batch

    rng = np.random.default_rng(5)
    g = CSRGraph.from_edges(rng.integers(0, 3000, 30000), rng.integers(0, 3000, 30000), 3000)
    seeds = rng.permutation(3000)[:200]
    on_gpu = UniformSampler(g, [10, 5], seed=0, device="cuda", graph_in="gpu")
    on_host = UniformSampler(g, [10, 5], seed=0, device="cuda", graph_in="host")
    assert on_host._torch.indptr.data_ptr() == on_host._pins[0].tensor.data_ptr()  # no copy
    a = on_gpu.sample(seeds, epoch_seed=3).to("cpu")
    b = on_host.sample(seeds, epoch_seed=3).to("cpu")
    check_batch(b, g, seeds, [10, 5])
    assert torch.equal(a.input_nodes, b.input_nodes)
    assert all(torch.equal(x.edge_index, y.edge_index) for x, y in zip(a.blocks, b.blocks))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in, sampler", [("gpu", "uniform"), ("host", "uniform"),
                                               ("gpu", "labor")])  # fmt: skip
def test_training_with_the_gpu_sampler(tmp_path, graph_in, sampler):  # pragma: no cover - GPU only
    from gnnio.importers.synthetic import prepare_synthetic
    from gnnio.train import TrainConfig, train

    path = tmp_path / "d"
    prepare_synthetic(path, num_nodes=1500, avg_degree=8, feat_dim=16, num_classes=4, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    cfg = TrainConfig(device="cuda", sampler_device="cuda", graph_in=graph_in, fanouts=(5, 5),
                      batch_size=128, epochs=3, hidden=32, lr=0.01, progress=False,
                      sampler=sampler)  # fmt: skip
    s = train(path, cfg)
    assert s["sampler_device"].startswith("cuda") and s["graph_in"] == graph_in
    assert s["best_valid_acc"] > 0.6 and s["simulated"] is False
