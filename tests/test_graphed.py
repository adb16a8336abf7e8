"""The padded training step that ``--cuda-graph`` captures (gnnio.train.graphed), checked on the
CPU: the batches copied into fixed-size buffers and padded train the model as the eager step does
(losses and parameters to float rounding), larger batches and a failed capture fall back to the
eager step, and the option's rules."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch

import gnnio
from gnnio.errors import UsageError
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.train import TrainConfig, train
from gnnio.train.build import build_training, train_step
from gnnio.train.graphed import GraphedStep
from gnnio.train.loop import LocalRun


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "small"
    prepare_synthetic(out, num_nodes=1200, avg_degree=8, feat_dim=16, num_classes=4, seed=1,
                      split=(0.6, 0.2, 0.2), progress=False)  # fmt: skip
    return out


def _cfg(**kw) -> TrainConfig:
    base = dict(fanouts=(5, 4), batch_size=64, epochs=1, hidden=16, lr=0.01, dropout=0.0,
                progress=False, seed=0)  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def _batches(path, cfg, n):
    parts = build_training(gnnio.load(path), cfg, LocalRun(), torch.device("cpu"))
    it = iter(parts.train_loader.epoch(0))
    out = []
    for _ in range(n):
        b = next(it)
        b.x = b.x.clone()
        out.append(b)
    it.close()
    return parts, out


@pytest.mark.parametrize(
    "kw",
    [{"model": "sage"}, {"model": "gin"}, {"model": "gcn"}, {"model": "gat"},
     {"model": "sage", "sampler": "labor"}, {"model": "gat", "sampler": "labor"},
     {"model": "gcn", "sampler": "labor"}],
)  # fmt: skip
def test_the_padded_step_trains_as_the_eager_step(small, kw):
    """Same start, same batches: after the eager warmup, every padded batch gives the eager
    step's loss and logits, and the parameters stay equal (float rounding: dense products over
    more rows). Fails when a padded row leaks into a real one (padding edges into a real row, a
    padding label that is not ignored, a pointer that gives a real row the padding edges)."""
    cfg = _cfg(**kw)
    parts, batches = _batches(small, cfg, 8)
    assert any(b.blocks[0].edge_weight is not None for b in batches) == (
        kw.get("sampler") == "labor"
    )
    net2, opt2 = copy.deepcopy(parts.net), None
    opt2 = type(parts.opt)(net2.parameters(), **{k: v for k, v in parts.opt.defaults.items()
                                                 if k in ("lr", "weight_decay", "fused", "foreach")})  # fmt: skip
    step = GraphedStep("cpu", warmup=2, capture=False)
    for i, b in enumerate(batches):
        lg, loss = step(parts.net, parts.opt, b)
        lg2, loss2 = train_step(net2, opt2, b)
        assert lg.shape == lg2.shape
        assert loss.item() == pytest.approx(loss2.item(), rel=1e-5, abs=1e-6), i
        torch.testing.assert_close(lg, lg2, rtol=1e-4, atol=1e-5)
    for p, q in zip(parts.net.parameters(), net2.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    rep = step.report()
    assert rep["graphed"] == 6 and rep["eager"] == 2 and rep["failed"] is None
    rows, edges = rep["rows"], rep["edges"]
    assert all(r % 256 == 0 for r in rows + edges) and rows == sorted(rows, reverse=True)
    # the buffers really were padded: fewer real rows and edges than the capacities
    b = batches[-1]
    assert b.blocks[-1].num_dst < rows[-1] and b.blocks[0].num_edges < edges[0]


def test_a_padded_batch_of_unlabelled_seeds_only_steps_with_loss_0(small):
    """As ``train_step``: a batch whose seeds are all unlabelled (a train split may hold some)
    gets loss 0 and leaves the parameters as they were (SGD), where the mean over no labelled
    seed was NaN and stopped the run as diverging; the next labelled batch trains as before."""
    cfg = _cfg()
    parts, batches = _batches(small, cfg, 4)
    net = parts.net
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    step = GraphedStep("cpu", warmup=2, capture=False)
    for b in batches[:3]:
        step(net, opt, b)
    b = batches[3]
    b.labels = torch.full_like(b.labels, -1)
    before = [p.detach().clone() for p in net.parameters()]
    _, loss = step(net, opt, b)
    assert step.report()["graphed"] == 2  # (the padded step, not the eager one)
    assert loss.item() == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    # the loop's sums from the graph: loss x labelled seeds, correct, labelled seeds (the
    # epoch's denominators, gnnio.train.loop), here none labelled; and a labelled batch's
    assert [float(v) for v in step.sums()] == [0.0, 0.0, 0.0]
    b = batches[2]
    b.labels[::2] = -1
    _, loss = step(net, opt, b)
    total, _, lab = step.sums()
    assert int(lab) == int((b.labels >= 0).sum()) and float(total) == float(loss) * int(lab)


@pytest.mark.parametrize(
    "kw",
    [{"model": "sage"}, {"model": "gin"}, {"model": "gcn"}, {"model": "gat"},
     {"model": "sage", "sampler": "labor"}],
)  # fmt: skip
def test_the_captured_step_reads_nothing_on_the_host(small, monkeypatch, kw):
    """What the graph captures -- forward with dropout, loss, backward, Adam, the loop's sums --
    must not read a device value on the host: inside a capture that is an error (the capture
    fails and the run trains eagerly), found on a GPU only. Counted here on the CPU at the
    dispatcher (backward included) with the GPU's aggregation kernels (``GNNIO_SPMM=torch``).
    Fails with an ``.item()`` in the aggregation's backward (checked)."""
    from gnnio.utils.syncs import OpCounter

    parts, batches = _batches(small, _cfg(dropout=0.5, **kw), 3)
    monkeypatch.setenv("GNNIO_SPMM", "torch")
    step = GraphedStep("cpu", warmup=2, capture=False)
    for b in batches[:2]:
        step(parts.net, parts.opt, b)
    step._size()
    step._load(batches[2])
    with OpCounter() as c:
        step._body(parts.net, parts.opt)
    assert c.ops > 50 and c.syncs == 0, dict(c.sync_ops)


def test_a_larger_batch_and_a_failed_capture_train_eagerly(small):
    """A batch past the capacities runs the eager step (counted), and the padded ones after it
    still work; asking to capture where it cannot (no CUDA here) warns once, records why and
    trains eagerly with the eager step's results."""
    parts, small_b = _batches(small, _cfg(batch_size=32), 4)
    _, big_b = _batches(small, _cfg(batch_size=128), 1)
    step = GraphedStep("cpu", warmup=2, capture=False, margin=1.0)
    for b in small_b[:3] + big_b + small_b[3:]:
        lg, _ = step(parts.net, parts.opt, b)
        assert lg.shape[0] == b.labels.shape[0]
    assert (step.graphed, step.eager) == (2, 3)
    # a batch whose blocks lack the sampler's pointer (edges maybe in any order) runs eagerly
    b = copy.copy(small_b[3])
    b.blocks = [dataclasses.replace(blk, ptr=None) for blk in b.blocks]
    step(parts.net, parts.opt, b)
    assert (step.graphed, step.eager) == (2, 4)

    net2 = copy.deepcopy(parts.net)
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.01)
    opt1 = torch.optim.Adam(parts.net.parameters(), lr=0.01)
    step = GraphedStep("cpu", warmup=1, capture=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for b in small_b:
            _, loss = step(parts.net, opt1, b)
            _, loss2 = train_step(net2, opt2, b)
            assert loss.item() == loss2.item()
    assert sum("--cuda-graph: capture failed" in str(x.message) for x in w) == 1
    rep = step.report()
    assert rep["failed"] and rep["graphed"] == 0 and rep["eager"] == 4 and not rep["captured"]


def test_the_first_padded_batch_warms_up_then_the_next_is_captured(small, monkeypatch):
    """On a GPU the first batch that fits runs padded, eagerly, on the capture stream (libraries
    make per-stream workspaces at first use, which must not happen inside a capture), the next
    one is captured and replayed, later ones only replayed; each returns its own batch's loss.
    The CUDA parts faked: ``_warm_up`` and ``_capture`` recorded, the graph a stub."""
    parts, batches = _batches(small, _cfg(), 7)
    step = GraphedStep("cpu", warmup=2, capture=False)
    step.capture = True  # (as on CUDA, with the CUDA calls below faked)
    calls = []

    def warm_up(net, opt):
        calls.append("warm")
        opt.zero_grad(set_to_none=True)
        return step._body(net, opt)

    from gnnio.utils.capture import CAPTURE_LOCK

    class Stub:
        def replay(self):
            # under the capture lock: a replay's dropout draws fail beside a capture
            calls.append("replay" if CAPTURE_LOCK.locked() else "replay without the lock")
            parts.opt.zero_grad(set_to_none=True)
            step._out = step._body(parts.net, parts.opt)

    def capture(net, opt):
        calls.append("capture")
        step._graph = Stub()

    monkeypatch.setattr(step, "_warm_up", warm_up)
    monkeypatch.setattr(step, "_capture", capture)
    net2 = copy.deepcopy(parts.net)
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.01)
    for b in batches:
        _, loss = step(parts.net, parts.opt, b)
        _, loss2 = train_step(net2, opt2, b)
        assert loss.item() == pytest.approx(loss2.item(), rel=1e-5)
    assert calls == ["warm", "capture", "replay", "replay", "replay", "replay"], calls
    assert (step.graphed, step.eager) == (4, 3)  # (the warm-up batch ran eagerly)


def test_cuda_graph_option(small, capsys):
    """``--cuda-graph``: the step's graph one process only (the sampler's works with ranks);
    a mode it does not know is refused; on the CPU a run trains (the padded step, eagerly) and
    its summary says how many batches were padded."""
    for mode in (True, "all", "step"):
        with pytest.raises(UsageError, match="--cuda-graph: the step's graph is single-process"):
            _cfg(cuda_graph=mode, nproc=2).validate_dist(2)
    _cfg(cuda_graph="sampler", nproc=2).validate_dist(2)
    with pytest.raises(UsageError, match="--cuda-graph: one of off, step, sampler, all"):
        _cfg(cuda_graph="both").validate()
    with pytest.warns(RuntimeWarning) as caught:
        s = train(small, _cfg(cuda_graph=True, epochs=2))
    said = [str(w.message) for w in caught]
    assert any("--cuda-graph: no CUDA device" in m for m in said), said
    assert any("sampler runs on the CPU here" in m for m in said), said  # nothing to replay
    hint = [m for m in said if "sampler runs on the CPU here" in m]
    assert "uniform sampler" in hint[0] and "--sampler-device cuda" in hint[0], hint
    # the locality-aware sampler is replayed on a GPU too: the same hint
    with pytest.warns(RuntimeWarning) as caught:
        train(small, _cfg(cuda_graph="sampler", gpu_cache_fraction=0.1, locality_scale=4.0))
    hint = [str(w.message) for w in caught if "sampler runs on the CPU here" in str(w.message)]
    assert len(hint) == 1 and "locality-aware sampler" in hint[0], hint
    assert "--sampler-device cuda" in hint[0], hint
    eager = train(small, _cfg(epochs=2))
    cg = s["cuda_graph"]
    assert cg["mode"] == "all" and cg["sampler"]["replayed"] == 0  # (a CPU sampler here)
    per_epoch = -(-len(gnnio.load(small).train_idx) // 64)
    assert cg["graphed"] + cg["eager"] == 2 * per_epoch
    assert cg["graphed"] > 0 and cg["failed"] is None
    assert s["loss_history"] == pytest.approx(eager["loss_history"], rel=1e-5)
    # the per-batch sums made inside the (padded) step: the same epoch accuracy
    assert [h["train_acc"] for h in s["history"]] == [h["train_acc"] for h in eager["history"]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model", ["sage", "gin", "gcn", "gat"])
def test_the_captured_step_trains_as_the_eager_step_on_cuda(small, model):  # pragma: no cover
    """On a GPU the step is captured once and replayed: no capture failure, every batch past the
    warmup and the padded warm-up batch replayed (8 = 2 eager + 1 warm-up + 5 replays, as
    test_the_first_padded_batch_warms_up_then_the_next_is_captured counts on the CPU), losses and
    parameters those of the eager step (dropout 0)."""
    cfg = _cfg(model=model, device="cuda")
    parts = build_training(gnnio.load(small), cfg, LocalRun(), torch.device("cuda"))
    it = iter(parts.train_loader.epoch(0))
    batches = [next(it) for _ in range(8)]
    it.close()
    for b in batches:
        b.x = b.x.clone()
    net2 = copy.deepcopy(parts.net)
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.01, fused=True, capturable=True)
    opt1 = torch.optim.Adam(parts.net.parameters(), lr=0.01, fused=True)
    step = GraphedStep("cuda", warmup=2)
    for b in batches:
        _, loss = step(parts.net, opt1, b)
        _, loss2 = train_step(net2, opt2, b)
        assert loss.item() == pytest.approx(loss2.item(), rel=1e-4, abs=1e-5)
    rep = step.report()
    assert rep["failed"] is None and rep["captured"], rep
    assert (rep["graphed"], rep["eager"]) == (5, 3), rep
    for p, q in zip(parts.net.parameters(), net2.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_with_both_graphs_on_cuda(small):  # pragma: no cover
    """``--cuda-graph all`` on a GPU, end to end: the loader's thread captures and replays the
    sampler's graphs while the main thread captures and replays the step (two threads
    capturing, each beside the other's work), neither capture fails, no Triton kernel falls
    back, the loss is the eager run's, and two graphed runs with dropout are bit-identical where
    two eager ones are (the step's dropout drawn inside its graph; the sampler's replays, from
    another thread, must not move the generator)."""
    kw = dict(device="cuda", epochs=1)
    eager = train(small, _cfg(**kw))
    g = train(small, _cfg(cuda_graph="all", **kw))
    cg = g["cuda_graph"]
    assert cg["failed"] is None and cg["captured"] and cg["graphed"] > 0, cg
    s = cg["sampler"]
    assert s["failed"] is None and s["captured"] >= 1 and s["replayed"] > 0, s
    assert g["kernels"]["fallbacks"] == 0, g["kernels"]
    assert g["loss_history"] == pytest.approx(eager["loss_history"], rel=1e-3)
    d1, d2, e1, e2 = (
        train(small, _cfg(cuda_graph=mode, dropout=0.5, **kw))
        for mode in ("all", "all", "off", "off")
    )
    assert d1["cuda_graph"]["failed"] is None and d1["cuda_graph"]["sampler"]["failed"] is None
    # (where eager runs differ too, the GPU's kernels are not deterministic: not the graphs)
    assert d1["loss_history"] == d2["loss_history"] or e1["loss_history"] != e2["loss_history"], (
        d1["loss_history"], d2["loss_history"], e1["loss_history"])  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_after_a_failed_capture_the_thread_and_the_allocator_go_on():  # pragma: no cover
    """What gnnio does after a failed capture -- train or sample eagerly, capture the other
    graph later -- holds only if torch recovers from it. A host read invalidates a capture;
    then the thread is on its own stream again, memory another stream used is reused once
    freed (the loader's record_stream on every batch), and the next capture works. torch before
    pytorch#180395 stayed 'capturing' after such a failure: record_stream'd blocks never freed
    (the GPU fills batch by batch) and the next capture's empty_cache an internal assert. If
    this fails, a failed capture must end the run on this torch, not fall back."""
    from gnnio.utils.capture import capture

    dev = torch.device("cuda")
    x = torch.ones(1024, device=dev)
    before = torch.cuda.current_stream(dev)
    with pytest.raises(Exception):  # noqa: B017, PT011 - torch's error type differs by version
        with capture(torch.cuda.CUDAGraph(), dev):
            (x * 2).sum().item()  # a host read: not allowed while the stream captures
    assert torch.cuda.current_stream(dev) == before
    other = torch.cuda.Stream(dev)
    torch.cuda.synchronize()
    base = torch.cuda.memory_reserved(dev)
    for _ in range(40):
        t = torch.empty(16 << 20, dtype=torch.uint8, device=dev)
        t.record_stream(other)
        del t
        torch.cuda.synchronize()
    assert torch.cuda.memory_reserved(dev) - base <= 128 << 20, torch.cuda.memory_summary(dev)
    g = torch.cuda.CUDAGraph()
    with capture(g, dev):
        y = x * 3
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(x, 3.0))


def test_the_cpu_warning_names_the_sampler_that_runs():
    """``--cuda-graph`` with a sampler on the CPU names it: the locality-aware LADIES was called
    "the locality-aware sampler" (the node-wise one's name)."""
    from types import SimpleNamespace

    from gnnio.train.build import not_graphed

    def said(kind, scale, i=0):
        cfg = SimpleNamespace(sampler=kind, locality_scale=scale, importance_sampling=i)
        return not_graphed(cfg, "cpu")

    assert "the locality-aware LADIES sampler runs on the CPU" in said("ladies", 2.0)
    assert "the LADIES sampler runs on the CPU" in said("ladies", None)
    assert "the locality-aware sampler runs on the CPU" in said("uniform", 2.0)
    assert "the LABOR sampler runs on the CPU" in said("labor", None)
    assert "the LABOR-i sampler runs on the CPU" in said("labor", None, 2)  # (it said "LABOR")
