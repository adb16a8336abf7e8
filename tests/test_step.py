"""The lean training step (issue 24): today's results kept, no host syncs on the step, the
`gnnio bench step` report, the sync counter, and a GPU user's defaults (`--device auto`, the
layout planned from free GPU memory)."""

from __future__ import annotations

import json

import pytest
import torch

from gnnio.importers.synthetic import prepare_synthetic
from gnnio.train import TrainConfig, train
from gnnio.train.build import build_training, train_step
from gnnio.train.gpu_plan import apply_layout_plan, plan_layout, resolve_device
from gnnio.train.loop import LocalRun
from gnnio.utils.syncs import OpCounter

GiB = 2**30

#: ``loss_history`` of 3 epochs on the `easy` graph below, per model, recorded with the code before
#: the lean step (commit 9c7f3b9: aggregation by torch.sparse.mm after a sortedness check and a
#: bincount, Adam's per-parameter loop), threads 1 and 2 alike.
BEFORE = {
    "sage": [1.4050502643585205, 1.1423340950012206, 0.9640867069562277],
    "gcn": [1.4505544799168906, 1.227525225321452, 1.0529198511441549],
    "gat": [1.3614516537984211, 1.2524223645528159, 1.1634038855234783],
    "gin": [1.2439339567820231, 0.9613671576182048, 0.8002321893374125],
}


@pytest.fixture(scope="module")
def easy(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "easy"
    prepare_synthetic(out, num_nodes=1500, avg_degree=8, feat_dim=16, num_classes=4, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    return out


def _cfg(**kw) -> TrainConfig:
    base = dict(fanouts=(5, 5), batch_size=128, epochs=3, hidden=32, lr=0.01, progress=False)
    base.update(kw)
    return TrainConfig(seed=0, **base)


@pytest.mark.parametrize("model", sorted(BEFORE))
def test_losses_equal_the_recorded_ones_and_every_run_and_thread_count_agrees(easy, model):
    runs = [train(easy, _cfg(model=model, threads=t))["loss_history"] for t in (1, 2, 2)]
    assert runs[0] == runs[1] == runs[2]  # bit-identical across runs and thread counts
    assert runs[0] == pytest.approx(BEFORE[model], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("model", ["sage", "gcn", "gin", "gat"])
def test_the_training_step_and_the_loader_do_not_sync(easy, model):
    """No operation of the step (forward, loss, backward, optimizer) or of the sampler and store
    would make the host wait for a GPU: counted on the CPU with the ops that sync on CUDA.
    GAT is the exception: PyG's GATConv removes existing self-loops with a boolean mask (one
    ``aten.index`` per layer), recorded here so a change either way is seen."""
    parts = build_training(
        __import__("gnnio").load(easy), _cfg(model=model), LocalRun(), torch.device("cpu")
    )
    it = iter(parts.train_loader.epoch(0))
    batch = next(it)
    train_step(parts.net, parts.opt, batch)  # first step: lazy state (Adam's moments)
    with OpCounter() as c:
        train_step(parts.net, parts.opt, batch)
        mb = parts.sampler.sample(batch.seeds, epoch_seed=7)
        parts.store.gather(mb.input_nodes)
    it.close()
    assert c.ops > 20
    assert c.syncs == 0, dict(c.sync_ops)  # GAT too: its self loops need no mask (models.py)


def test_op_counter_sees_the_syncing_operations():
    t = torch.arange(6)
    for fn in (
        lambda: t.sum().item(),
        lambda: bool(t[0] > 0),
        lambda: torch.nonzero(t),
        lambda: t[t > 2],
        lambda: torch.unique(t),
        lambda: torch.bincount(t),
        lambda: torch.repeat_interleave(t, t),
    ):
        with OpCounter() as c:
            fn()
        assert c.syncs >= 1
    with OpCounter() as c:
        torch.repeat_interleave(t, t, output_size=15)
        torch.cumsum(t, 0)
        t.index_select(0, t[:3])
        t.new_zeros(4).index_add_(0, t[:3] % 4, t[:3])
    assert c.syncs == 0 and c.ops >= 4, dict(c.sync_ops)


def test_bench_step_prints_the_issue_keys(easy, capsys):
    from gnnio.cli.main import main

    rc = main(["bench", "step", str(easy), "--device", "cpu", "--batches", "2", "--warmup", "1",
               "--fanouts", "5,5", "--batch-size", "64", "--quiet", "--json"])  # fmt: skip
    assert rc == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("ms_per_batch", "breakdown", "host_syncs_per_batch", "kernel_launches_per_batch",
                "floor_ms", "kernels", "plan"):  # fmt: skip
        assert key in r, key
    parts = ("sample", "relabel", "gather", "transfer", "forward", "backward", "optimizer", "other")
    assert set(r["breakdown"]) == set(parts)
    assert all(v >= 0 for v in r["breakdown"].values())
    assert r["breakdown"]["forward"] > 0 and r["breakdown"]["backward"] > 0
    assert r["ms_per_batch"] > 0 and r["floor_ms"] > 0
    assert r["host_syncs_per_batch"] == 0
    assert r["kernel_launches_per_batch"] is None  # a GPU only
    assert r["cuda_syncs_per_batch"] is None and r["cuda_sync_sites"] is None  # a GPU only
    assert r["kernels"]["spmm"] == "numba" and r["kernels"]["hop"] == "numba"
    assert r["simulated"] is True


def test_summary_records_the_kernels_that_ran(easy, monkeypatch):
    s = train(easy, _cfg(epochs=1))
    assert s["kernels"]["spmm"] == "numba" and s["kernels"]["hop"] == "numba"
    assert s["kernels"]["fallbacks"] == 0
    monkeypatch.setenv("GNNIO_SPMM", "torch")
    s2 = train(easy, _cfg(epochs=1))
    assert s2["kernels"]["spmm"] == "torch"
    assert s2["loss_history"] == pytest.approx(s["loss_history"], rel=1e-5)


# ---- a GPU user's defaults ------------------------------------------------------------------


def test_device_auto_is_cuda_only_with_a_gpu_per_rank(monkeypatch):
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("auto", ranks=4) == "cpu"


def test_plan_layout_fits_everything_then_hot_rows_then_uva():
    n, row = 1_000_000, 2048  # 2 GB of features
    feats, csr = n * row, 8 * (n + 1) + 4 * 16 * n
    big = plan_layout(feats, row, csr, n, free_bytes=80 * GiB)
    assert big["gpu_cache_fraction"] == 1.0 and big["sampler_device"] == "cuda"
    assert big["graph_in"] == "gpu"
    mid = plan_layout(feats, row, csr, n, free_bytes=2 * GiB)  # budget 1 GiB < features
    assert 0 < mid["gpu_cache_fraction"] < 1 and mid["graph_in"] == "gpu"
    assert mid["gpu_feature_bytes"] + mid["gpu_csr_bytes"] <= mid["budget_bytes"]
    huge_csr = plan_layout(feats, row, 40 * csr, n, free_bytes=2 * GiB)
    assert huge_csr["graph_in"] == "host" and huge_csr["sampler_device"] == "cuda"
    assert huge_csr["gpu_csr_bytes"] == 0
    tiny = plan_layout(feats, row, csr, n, free_bytes=GiB)  # nothing beyond the reserve
    assert tiny["gpu_cache_fraction"] == 0.0 and tiny["sampler_device"] == "cpu"


def test_layout_is_planned_only_on_a_gpu_without_layout_options(easy):
    import gnnio

    ds = gnnio.load(easy)
    cfg = _cfg()
    same, plan = apply_layout_plan(ds, cfg, torch.device("cpu"))
    assert same is cfg and plan["planned"] is False
    cuda = torch.device("cuda")
    new, plan = apply_layout_plan(ds, cfg, cuda, free_bytes=80 * GiB)
    assert plan["planned"] and new.gpu_cache_fraction == 1.0 and new.sampler_device == "cuda"
    assert plan["modeled_load_s"] == 0.0  # every row on the GPU
    scratch = 16 * (ds.num_nodes + 1)  # this graph's CSR is larger than its features: UVA
    new, plan = apply_layout_plan(ds, cfg, cuda, free_bytes=GiB + 4 * scratch + 1000)
    assert 0 < new.gpu_cache_fraction < 1 and plan["modeled_load_s"] > 0
    assert new.graph_in == "host" and new.sampler_device == "cuda"
    chosen = _cfg(gpu_cache_fraction=0.1)
    same, plan = apply_layout_plan(ds, chosen, cuda, free_bytes=80 * GiB)
    assert same is chosen and not plan["planned"]
    on_disk = _cfg(store="disk")  # --features-on disk is a layout choice too
    same, plan = apply_layout_plan(ds, on_disk, cuda, free_bytes=80 * GiB)
    assert same is on_disk and not plan["planned"]
    same, plan = apply_layout_plan(ds, cfg, cuda, world_size=2, free_bytes=80 * GiB)
    assert same is cfg and not plan["planned"]


def test_plan_layout_budget_arithmetic():
    """The plan's numbers as the module docstring states them: reserve ``max(1 GiB, free / 4)``;
    everything fits only with the sampler's scratch (16 bytes per node and worker) counted; the
    CSR on the GPU only within a quarter of the budget, the hot rows then filling what the CSR
    and the scratch leave; UVA gives the budget less the scratch to rows; hot rows never exceed
    the rows there are."""
    mib = 2**20
    n, row = 2**20 - 1, 8192
    scratch = 16 * (n + 1)  # 16 MiB
    feats = (n + 1) * row  # 8 GiB: never fits
    free = 8 * GiB  # reserve 2 GiB, budget 6 GiB
    csr = GiB - scratch  # CSR + scratch: 1 GiB, within 6 / 4 GiB
    p = plan_layout(feats, row, csr, n, free_bytes=free)
    assert (p["reserve_bytes"], p["budget_bytes"]) == (2 * GiB, 6 * GiB)
    assert (p["sampler_device"], p["graph_in"]) == ("cuda", "gpu")
    assert p["hot_rows"] == 5 * GiB // row and p["gpu_cache_fraction"] == 5 / 8
    assert (p["gpu_feature_bytes"], p["gpu_csr_bytes"]) == (5 * GiB, csr)
    four = plan_layout(feats, row, csr, n, free_bytes=free, workers=4)  # scratch x 4
    assert four["hot_rows"] == (6 * GiB - csr - 4 * scratch) // row
    # CSR + scratch between a quarter and a half of the budget: UVA, the budget less the scratch
    uva = plan_layout(feats, row, 2 * GiB, n, free_bytes=free)
    assert (uva["sampler_device"], uva["graph_in"], uva["gpu_csr_bytes"]) == ("cuda", "host", 0)
    assert uva["hot_rows"] == (6 * GiB - scratch) // row
    # features + CSR fit, but not with the scratch: the hot-rows case
    tight = plan_layout(5 * GiB, row, GiB - 8 * mib, n, free_bytes=free)
    assert tight["graph_in"] == "gpu" and tight["hot_rows"] < 5 * GiB // row
    assert tight["hot_rows"] == (6 * GiB - (GiB - 8 * mib) - scratch) // row
    assert plan_layout(5 * GiB, row, GiB - 32 * mib, n, free_bytes=free)["gpu_cache_fraction"] == 1
    # the CPU sampler (scratch over a quarter of the budget): hot rows clamped to the rows
    big_n = 2**24
    cpu = plan_layout(4 * big_n, 4, 0, big_n, free_bytes=GiB + 256 * mib)
    assert cpu["sampler_device"] == "cpu" and cpu["budget_bytes"] == 256 * mib
    assert cpu["hot_rows"] == big_n and cpu["gpu_cache_fraction"] == 1.0
    assert plan_layout(0, 0, 0, 10, free_bytes=80 * GiB)["reserve_bytes"] == 20 * GiB


def test_a_batch_of_unlabelled_seeds_only_steps_with_loss_0():
    """A train split may hold unlabelled nodes (label -1; the format asks for one labelled
    node), so a batch may have no labelled seed: its loss is 0 with zero gradients (PyTorch's
    mean over no target is NaN, which stopped training as a diverging loss); with labelled seeds
    it is their mean, as ``F.cross_entropy``'s, bit for bit."""
    from gnnio.sampling.base import Block, MiniBatch
    from gnnio.train.models import build_model

    torch.manual_seed(0)
    net = build_model("sage", 4, 8, 3, num_layers=1, dropout=0.0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    block = Block(torch.tensor([[1, 2, 3], [0, 0, 1]]), num_src=4, num_dst=2)
    x = torch.randn(4, 4)
    before = [p.detach().clone() for p in net.parameters()]
    batch = MiniBatch(torch.arange(2), torch.arange(4), [block], x=x, labels=torch.tensor([-1, -1]))
    _, loss = train_step(net, opt, batch)
    assert loss.item() == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters()))
    y = torch.tensor([2, -1])
    want = torch.nn.functional.cross_entropy(net(x, [block]), y, ignore_index=-1)
    batch = MiniBatch(torch.arange(2), torch.arange(4), [block], x=x, labels=y)
    assert torch.equal(train_step(net, opt, batch)[1], want.detach())


def test_the_optimizer_is_adam_with_the_configured_rate_and_decay():
    """``make_optimizer``: Adam over every trainable parameter (GIN's learnable ``eps`` too)
    with ``--lr`` and ``--weight-decay`` (L2 added to the gradient: with a zero gradient the
    decay alone moves each parameter by about ``lr`` at Adam's first step), as torch's
    per-parameter loop computes it."""
    from gnnio.train.build import make_optimizer
    from gnnio.train.models import build_model

    torch.manual_seed(0)
    net = build_model("gin", 4, 8, 3, num_layers=1)
    start = [p.detach().clone() for p in net.parameters()]
    opt = make_optimizer(net, _cfg(lr=0.01, weight_decay=0.1))
    assert isinstance(opt, torch.optim.Adam)
    assert (opt.defaults["lr"], opt.defaults["weight_decay"]) == (0.01, 0.1)
    assert [p for g in opt.param_groups for p in g["params"]] == list(net.parameters())
    assert any(n.endswith("eps") for n, _ in net.named_parameters())
    ref = [p.clone().requires_grad_() for p in start]
    ref_opt = torch.optim.Adam(ref, lr=0.01, weight_decay=0.1, foreach=False)
    for p in [*net.parameters(), *ref]:
        p.grad = torch.zeros_like(p)
    opt.step()
    ref_opt.step()
    for p, q, s0 in zip(net.parameters(), ref, start):
        torch.testing.assert_close(p.detach(), q.detach())
        nonzero = s0 != 0
        torch.testing.assert_close((s0 - p.detach())[nonzero].abs(),
                                   torch.full_like(s0[nonzero], 0.01), rtol=1e-3, atol=1e-6)  # fmt: skip
