"""LABOR-i's torch path (gnnio/sampling/labor_importance_torch.py), run on CPU tensors: the same
batches as the numba kernels bit for bit (ids, blocks, edge order, weights, steps) over random and
hub-heavy graphs, i in {1, 2, large}, fanouts -1, 0 and past the degrees, isolated nodes, int32 and
int64 ids, every weight mode; the host-sync count; a hop whose solve needs more rounds than the
fast path runs; errors; the wiring (LaborSampler, train, bench); on a CUDA device (gpu-marked)
LaborSampler(importance_sampling=i, device="cuda") equals the CPU sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gnnio.sampling.labor_importance_torch as LT
from gnnio.sampling import LaborSampler
from gnnio.sampling import _labor_importance as LI
from gnnio.sampling.gpu import count_syncs
from gnnio.sampling.threaded import call_key
from gnnio.sampling.uniform import UniformSampler
from gnnio.utils.syncs import OpCounter

from .helpers import random_graph, write_tiny_dataset
from .test_labor_importance import power_law_graph
from .test_ladies_torch import same_blocks

LARGE = 10**12  # (LABOR-*: the early stop ends the steps)


def same_batch(a, b, exact_weights: bool = True) -> None:
    assert a.meta["importance_steps"] == b.meta["importance_steps"]
    assert a.meta["sampler"] == b.meta["sampler"] == "labor"
    same_blocks(a, b, exact_weights)


def syncs_bound(mb, imp: int, g=None) -> int:
    """The module docstring's count: the seeds' read, then per hop with neighbours to read (all
    of them without ``g``) one per step after the first and one at its end."""
    steps, hop_nodes = mb.meta["importance_steps"], mb.meta["hop_nodes"]
    if g is not None:
        deg = np.diff(np.asarray(g.indptr))[mb.input_nodes.numpy()]
        steps = [s for h, s in enumerate(steps) if deg[: hop_nodes[h]].sum() > 0]
    return int(hop_nodes[0] > 0) + sum(1 + min(s, imp - 1) for s in steps)


def check_equal(g, fanouts, seeds, seed: int, imp: int, weights="ht", ld=False, int32=False):
    ip, ix = g.to_torch()
    if int32:
        ix = ix.to(torch.int32)
    cpu = LaborSampler(g, fanouts, seed=seed, importance_sampling=imp, weights=weights,
                       layer_dependency=ld)  # fmt: skip
    tch = LT.TorchLaborImportanceSampler(ip, ix, fanouts, min(imp, 1 << 62), ld, weights)
    seeds = np.asarray(seeds, dtype=np.int64)
    for e in (0, 5):
        a = cpu.sample(torch.from_numpy(seeds), epoch_seed=e)
        with count_syncs() as c:
            b = tch.sample(seeds, call_key(seed, epoch_seed=e))
        same_batch(a, b)
        if tch.rounds == LT.ROUNDS:  # (no solve has needed more rounds: no hop computed twice)
            assert c.count == syncs_bound(b, imp, g), c.ops
    return tch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 150),
    m=st.integers(0, 1500),
    gseed=st.integers(0, 10_000),
    fanouts=st.lists(st.sampled_from([-1, 0, 1, 2, 3, 5, 40]), min_size=1, max_size=3),
    hubs=st.booleans(),
    imp=st.sampled_from([1, 2, LARGE]),
    weights=st.sampled_from(["ht", "ht_mean", "none"]),
    ld=st.booleans(),
    int32=st.booleans(),
    frac=st.integers(1, 6),
)
# no edges: every hop empty (one step each, none for a fanout of 0)
@example(n=40, m=0, gseed=1, fanouts=[3, 2], hubs=False, imp=1, weights="ht", ld=False,
         int32=False, frac=3)  # fmt: skip
@example(n=40, m=0, gseed=1, fanouts=[0, 3], hubs=False, imp=2, weights="ht", ld=False,
         int32=False, frac=3)  # fmt: skip
@example(n=300, m=1500, gseed=3, fanouts=[-1, 40, 2], hubs=True, imp=LARGE, weights="ht_mean",
         ld=True, int32=True, frac=6)  # fmt: skip
def test_torch_path_equals_the_numba_kernels(n, m, gseed, fanouts, hubs, imp, weights, ld, int32,
                                             frac):  # fmt: skip
    """Random and hub-heavy graphs (isolated nodes, repeated neighbours, self-loops), every option:
    identical batches and steps, the stated number of host syncs."""
    g = power_law_graph(n, m, gseed) if hubs else random_graph(n, m, gseed)
    seeds = np.random.default_rng(gseed).permutation(n)[: max(1, n // frac)]
    check_equal(g, fanouts, seeds, gseed, imp, weights, ld, int32)


def test_hub_graphs_saturate_and_still_match():
    """Where LABOR-i has work: hubs saturate (``p = 1`` for sampled rows), rows keep more than
    ``k``, the early stop ends LABOR-* after several steps; every batch equal, weights included."""
    saturated, steps = 0, []
    for s in range(6):
        g = power_law_graph(1500, 20000, s)
        seeds = np.random.default_rng(s).permutation(1500)[:150]
        for imp in (1, 2, LARGE):
            tch = check_equal(g, [6, 4], seeds, s, imp)
            mb = tch.sample(seeds, call_key(s, epoch_seed=0))
            w = mb.blocks[-1].edge_weight
            saturated += int((w == 1).sum())
            if imp == LARGE:
                steps += mb.meta["importance_steps"]
    assert saturated > 100 and max(steps) > 3, (saturated, steps)


def test_a_solve_past_the_fast_rounds_computes_the_hop_again(monkeypatch):
    """With one saturated-set round per solve most hub hops leave a row unsolved: the read that
    sees the flag computes the hop again (same batch), the sampler then runs the rounds that
    needed (the next batches: no hop twice, the stated syncs)."""
    monkeypatch.setattr(LT, "ROUNDS", 1)
    g = power_law_graph(1500, 20000, 1)
    seeds = np.random.default_rng(1).permutation(1500)[:150]
    cpu = LaborSampler(g, [6, 4], seed=1, importance_sampling=2)
    tch = LT.TorchLaborImportanceSampler(*g.to_torch(), [6, 4], 2)
    calls = []
    orig = LT.hop_probabilities_torch
    monkeypatch.setattr(LT, "hop_probabilities_torch",
                        lambda *a: calls.append(a[-1]) or orig(*a))  # fmt: skip
    same_batch(cpu.sample(seeds, epoch_seed=0), tch.sample(seeds, call_key(1, epoch_seed=0)))
    assert None in calls and tch.rounds > 1, (calls, tch.rounds)
    calls.clear()
    for e in (1, 2):
        a = cpu.sample(seeds, epoch_seed=e)
        with count_syncs() as c:
            b = tch.sample(seeds, call_key(1, epoch_seed=e))
        same_batch(a, b)
        assert None not in calls and c.count == syncs_bound(b, 2)


def _seg_count(mask: torch.Tensor, deg: np.ndarray) -> torch.Tensor:
    return torch.segment_reduce(mask.to(torch.float64), "sum", lengths=torch.from_numpy(deg))


def test_solve_rows_is_the_kernels_solve():
    """Every row's ``c`` equals :func:`~gnnio.sampling._labor_importance.solve_c` (or the
    whole-row rule) bit for bit, over heavy-tailed importances where most rows saturate."""
    rng = np.random.default_rng(0)
    deg = rng.integers(0, 30, 300)
    pos = np.concatenate([[0], np.cumsum(deg)])
    x = rng.pareto(0.8, int(pos[-1])) + 1e-3
    for k in (1, 4, 12, -1):
        row = torch.from_numpy(np.repeat(np.arange(300), deg))
        c, unsolved, ran = LT.solve_rows(torch.from_numpy(x), row, torch.from_numpy(deg), k, None)
        assert not bool(unsolved) and (k < 0 or ran > 2)
        sat = _seg_count(c[row] * torch.from_numpy(x) >= 1.0, deg)
        assert ran <= int(sat.max()) + 1  # (a round per growth of the set, one to see it stop)
        cid = np.arange(int(pos[-1]))
        want = np.empty(300)
        LI._solve_all(x, cid, pos, deg, k, want)
        assert torch.equal(c, torch.from_numpy(want)), k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 300),
    m=st.integers(1, 4000),
    gseed=st.integers(0, 10_000),
    k=st.sampled_from([-1, 0, 1, 3, 8, 50]),
    imp=st.sampled_from([1, 2, 5, LARGE]),
    hubs=st.booleans(),
)
@example(n=300, m=4000, gseed=1, k=3, imp=LARGE, hubs=True)
def test_hop_probabilities_are_the_kernels_bits(n, m, gseed, k, imp, hubs):
    """One hop's float64 inclusion probabilities per position and its steps equal
    :func:`~gnnio.sampling._labor_importance.hop_probabilities`' bit for bit: the sums in the
    kernel's order (a pairwise sum, or ``pi`` left unscaled, shows here, not in the float32
    weights)."""
    g = power_law_graph(n, m, gseed) if hubs else random_graph(n, m, gseed)
    rows = np.random.default_rng(gseed).permutation(n)[: max(1, n // 3)]
    ip, ix = np.asarray(g.indptr), np.asarray(g.indices)
    cmap = np.full(n, -1, dtype=np.int64)
    iters = min(imp, 1 << 62)
    _pos, want, _keep, _cnt, steps = LI.hop_probabilities(
        ip, ix, rows, k, iters, np.uint64(3), cmap
    )
    tip, tix = g.to_torch()
    nodes = torch.from_numpy(rows)
    deg = tip[nodes + 1] - tip[nodes]
    if int(deg.sum()) == 0:
        return
    row = torch.repeat_interleave(torch.arange(len(rows)), deg)
    t = torch.cat([tix[int(tip[v]) : int(tip[v + 1])] for v in rows]).to(torch.int64)
    first = torch.full((n + 1,), torch.iinfo(torch.int64).max)
    p, got_steps, unsolved, _ran = LT.hop_probabilities_torch(t, row, deg, first, k, iters, None)
    assert got_steps == steps and not bool(unsolved)
    assert torch.equal(p, torch.from_numpy(want))
    assert bool((first == torch.iinfo(torch.int64).max).all())


def test_expected_sources_adds_in_the_kernels_order():
    """The early stop compares the expected count's last bits: it is summed in sequence, as the
    kernel's loop (here values whose ``torch.sum`` differs in the last bits)."""
    rng = np.random.default_rng(0)
    acc = rng.pareto(1.0, 5000) + 1e-3
    pi = rng.random(5000) ** 8  # (many magnitudes: the sum's order shows)
    want = 0.0
    for a, q in zip(acc.tolist(), pi.tolist(), strict=True):
        want += min(1.0, a * q)
    acc_t, pi_t = torch.from_numpy(acc), torch.from_numpy(pi)
    assert float(LT.expected_sources(acc_t, pi_t)) == want
    assert float(torch.clamp(acc_t * pi_t, max=1.0).sum()) != want


def test_no_hidden_data_dependent_ops():
    """Only the counted ``tolist`` reads come back to the host: no ``nonzero``, boolean-mask
    indexing, ``.item()`` or the like (``OpCounter`` sees ATen's syncing ops on the CPU)."""
    g = power_law_graph(1500, 20000, 2)
    s = LT.TorchLaborImportanceSampler(*g.to_torch(), [8, 4, 2], 3)
    seeds = torch.from_numpy(np.random.default_rng(3).permutation(1500)[:64])
    s.sample(seeds, 0)  # (the rounds this graph needs)
    with OpCounter() as c, count_syncs() as cs:
        mb = s.sample(seeds, 1)
    assert c.syncs == 0, dict(c.sync_ops)
    assert cs.ops == ["tolist"] * syncs_bound(mb, 3)


def test_errors_leave_the_scratch_clean():
    g = random_graph(50, 300, 1)
    tch = LT.TorchLaborImportanceSampler(*g.to_torch(), [4], 1)
    for bad, msg in (([1, 1], "appears more than once"), ([0, 50], "out of range"),
                     ([-1], "out of range"), ([[1]], "1-D"), ([0.5], "integer")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            tch.sample(bad, 0)
    loc, first = tch._scratch[-1][:2]
    assert bool((loc == -1).all()) and bool((first == first.max()).all())
    check_equal(g, [4], [0, 1, 2], 0, 1)


def test_labor_sampler_samples_on_the_device_it_is_given(monkeypatch):
    """``LaborSampler(importance_sampling=i)`` over device tensors builds the torch path (here
    CPU tensors standing in for a GPU's) -- no warning, no CPU fallback -- and its batches, keyed
    by ``(seed, epoch_seed)``, are the numba sampler's."""
    g = power_law_graph(seed=3)
    seeds = np.arange(0, 400, 7, dtype=np.int64)
    want = [LaborSampler(g, [4, 3], seed=5, importance_sampling=2).sample(seeds, epoch_seed=e)
            for e in range(2)]  # fmt: skip
    monkeypatch.setattr(UniformSampler, "_device_topology", lambda self, gr, d, gi: gr.to_torch())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = LaborSampler(g, [4, 3], seed=5, importance_sampling=2, device="cuda", cuda_graph=True)
    assert isinstance(s._torch, LT.TorchLaborImportanceSampler) and s._torch.iters == 2
    assert getattr(s, "fallback", None) is None
    for e in range(2):
        same_batch(want[e], s.sample(seeds, epoch_seed=e))


def test_train_places_labor_i_on_the_gpu(monkeypatch):
    """``gnnio train --sampler labor --importance-sampling I --device cuda``: the GPU sampler under
    ``--sampler-device auto|cuda`` (UVA too), the numba kernels with ``cpu``; ``--cuda-graph``
    says its batches are not replayed, and on the CPU gives no ``--sampler-device cuda`` hint."""
    from gnnio.train.build import not_graphed
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import build_sampler, has_gpu_sampler
    from tests.fake_cuda import record_sampler_builds

    built = record_sampler_builds(monkeypatch, "LaborSampler", "fanouts")
    ds = type("DS", (), {"graph": power_law_graph()})
    for opts, want in ((dict(sampler_device="auto"), ("cuda", "gpu")),
                       (dict(sampler_device="cuda", graph_in="host"), ("cuda", "host")),
                       (dict(sampler_device="cpu"), (None, "gpu"))):  # fmt: skip
        cfg = TrainConfig(device="cuda", sampler="labor", importance_sampling=2, **opts)
        cfg.validate()
        assert has_gpu_sampler(cfg)
        build_sampler(ds, cfg, [3, 2], None)
        dev = built["device"]
        assert (None if dev is None else dev.type, built["graph_in"]) == want, built
        assert built["importance_sampling"] == 2
    cfg = TrainConfig(sampler="labor", importance_sampling=2)
    gpu = not_graphed(cfg, "cuda:0")
    assert gpu is not None and "LABOR-i GPU sampler" in gpu and "not replayed" in gpu
    cpu = not_graphed(cfg, "cpu")
    assert cpu is not None and "the LABOR-i sampler runs on the CPU" in cpu
    assert "--sampler-device" not in cpu
    assert not_graphed(TrainConfig(sampler="labor"), "cuda:0") is None  # (LABOR-0 replays)


def test_train_with_the_torch_path_has_the_numba_loss_history(monkeypatch, tmp_path):
    """A whole ``gnnio train --sampler labor --importance-sampling 1`` run with the torch path
    forced onto CPU tensors: the numba run's loss history and accuracy, exactly."""
    from gnnio.train import TrainConfig, train

    d = write_tiny_dataset(tmp_path / "d", num_nodes=120, num_edges=900)
    cfg = TrainConfig(sampler="labor", importance_sampling=1, epochs=2, batch_size=16,
                      fanouts=(4, 3), progress=False)  # fmt: skip
    numba = train(d, cfg)
    built = []
    orig = LaborSampler.__init__

    def forced(self, graph, *a, **kw):
        monkeypatch.setattr(UniformSampler, "_device_topology",
                            lambda s, gr, dv, gi: gr.to_torch())  # fmt: skip
        orig(self, graph, *a, **kw)
        monkeypatch.undo()
        built.append(self._torch)

    monkeypatch.setattr(LaborSampler, "__init__", forced)
    torch_run = train(d, cfg)
    assert built and all(isinstance(t, LT.TorchLaborImportanceSampler) for t in built)
    assert torch_run["loss_history"] == numba["loss_history"]
    assert torch_run["test_acc"] == numba["test_acc"]


def test_bench_refuses_cuda_graph_for_labor_i(tmp_path, capsys, monkeypatch):
    """``bench sampling --sampler labor --importance-sampling 1 --device cuda --cuda-graph``: one
    line saying why (nothing to replay), before anything is loaded."""
    from gnnio.cli.main import main
    from tests.fake_cuda import fake_cuda

    fake_cuda(monkeypatch, count=1)
    d = write_tiny_dataset(tmp_path / "d")
    argv = ["bench", "sampling", str(d), "--sampler", "labor", "--importance-sampling", "1",
            "--cuda-graph", "--device", "cuda", "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LABOR-i (--importance-sampling > 0) is not replayed" in err


def test_gpu_check_compares_labor_i_ids_apart_from_its_weights(tmp_path, monkeypatch):
    """gpu-check's ``sampling`` step runs LABOR-1 on the GPU and the CPU (10 batches): ids and
    edges must match (``checksum_ids``), the weights may differ in the last bits; both
    comparisons and its own edges/s ratio are reported."""
    from gnnio.bench import gpu_check
    from tests.test_gpu_check_rules import _check

    c = _check(tmp_path)
    seen = []

    def gnnio(*argv, limit_s=0):
        dev, li = argv[argv.index("--device") + 1], "--importance-sampling" in argv
        if li:
            seen.append(argv)
        eps = {"cpu": 10.0, "cuda": 40.0}[dev] / (5 if li else 1)
        full = "w-gpu" if li and dev == "cuda" else "w"
        return {"edges_per_s": eps, "checksum": full, "checksum_ids": "ids"}

    monkeypatch.setattr(c, "gnnio", gnnio)
    s = gpu_check.step_sampling(c)
    assert s["labor_i_checksum_ids_equal"] is True and s["labor_i_checksum_equal"] is False
    assert s["labor_i_gpu_over_cpu"] == 4.0 and len(seen) == 2
    assert all(a[a.index("--batches") + 1] == "10" and a.count("--batches") == 1 for a in seen)
    md = tmp_path / "r.md"
    gpu_check.write_markdown({"steps": {"sampling": s}, "goals": {}, "elapsed_s": 1.0}, md)
    assert "LABOR-1: GPU 4.00x the CPU, ids and edges identical: True, weights too: False" in (
        md.read_text()
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in", ["gpu", "host"])
def test_labor_i_on_cuda_equals_cpu(graph_in):  # pragma: no cover - GPU only
    """On CUDA the segment sums and the expected count's scan add in another order (module
    docstring): the same ids, blocks, edge order and steps, weights within float rounding."""
    for s, g in enumerate((random_graph(3000, 30000, seed=5), power_law_graph(3000, 40000, 6))):
        seeds = np.random.default_rng(s).permutation(3000)[:200]
        for imp in (1, 3, LARGE):
            cpu = LaborSampler(g, [10, 5], seed=0, importance_sampling=imp)
            gpu = LaborSampler(g, [10, 5], seed=0, importance_sampling=imp, device="cuda",
                               graph_in=graph_in)  # fmt: skip
            assert gpu.device.type == "cuda"
            for e in (0, 1):
                same_batch(cpu.sample(seeds, epoch_seed=e),
                           gpu.sample(seeds, epoch_seed=e).to("cpu"), exact_weights=False)  # fmt: skip
