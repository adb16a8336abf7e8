"""The locality-aware LADIES's torch path (LocalityLadiesSampler(device=...): LADIES' torch hop,
gnnio/sampling/ladies_torch.py, with Eq. 8 on the members of each layer's Q', tested on the
device through the uniform locality-aware sampler's member index), run on CPU tensors: the same
batches as the numba kernels bit for bit over random and hub-heavy graphs, every scale (s = 1:
LADIES), members absent / all, K past the candidates, empty hops, int32 ids; the scale set
between epochs; LADIES' host syncs; gnnio train builds it on the GPU and a whole run on it
learns what the numba run learns. On a CUDA device (gpu-marked): the CPU's batches."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LadiesSampler, LocalityLadiesSampler
from gnnio.sampling import _ladies_kernels as LK
from gnnio.sampling.gpu import count_syncs
from gnnio.sampling.ladies_torch import member_positions, solve_budget_torch
from gnnio.sampling.locality import LocalitySampler
from gnnio.sampling.uniform import UniformSampler
from gnnio.utils.syncs import OpCounter

from .helpers import random_graph
from .test_ladies_torch import same_batch, skewed_graph

SCALES = [0.5, 1.0, 2.0, 5.0, 1e12]


@contextmanager
def torch_on_cpu(int32: bool = False):
    """Samplers built inside sample with the torch path on CPU tensors (the GPU path's code,
    the CPU's float order): the CSR a GPU sampler would get, here on the CPU."""

    def topo(self, graph, device, graph_in):
        self.graph_in, self._pins = graph_in, []
        if device == "cpu":  # (LadiesSampler's numba CSR, built first)
            return None
        ip, ix = graph.to_torch()
        return ip, ix.to(torch.int32) if int32 else ix

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(UniformSampler, "_device_topology", topo)
        yield


def pair(g, sizes, hot, scale, seed, weights="ht", int32=False, q_size=None):
    kw = dict(scale=scale, seed=seed, weights=weights, q_size=q_size)
    cpu = LocalityLadiesSampler(g, sizes, hot, **kw)
    with torch_on_cpu(int32):
        tch = LocalityLadiesSampler(g, sizes, hot, **kw)
    assert cpu._torch is None and tch._torch is not None
    return cpu, tch


def check_equal(g, sizes, hot, seeds, scale, seed, weights="ht", int32=False, q_size=None):
    cpu, tch = pair(g, sizes, hot, scale, seed, weights, int32, q_size)
    seeds = np.asarray(seeds, dtype=np.int64)
    for e in (0, 5):
        a = cpu.sample(torch.from_numpy(seeds), epoch_seed=e)
        with count_syncs() as c:
            b = tch.sample(seeds, epoch_seed=e)
        same_batch(a, b)
        assert a.meta["scale"] == b.meta["scale"] == scale
        assert c.count <= len(sizes) + 1, c.ops  # LADIES': the seeds' sync + one per hop
    return cpu, tch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 150),
    m=st.integers(0, 1500),
    gseed=st.integers(0, 10_000),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    skewed=st.booleans(),
    weights=st.sampled_from(["ht", "ht_mean", "none"]),
    int32=st.booleans(),
    hot=st.sampled_from(["none", "some", "all"]),
    scale=st.sampled_from(SCALES),
    q_size=st.sampled_from([None, 0, 5]),
)
@example(n=40, m=0, gseed=1, sizes=[5, 5], skewed=False, weights="ht", int32=False, hot="some",
         scale=2.0, q_size=None)  # fmt: skip
@example(n=120, m=1500, gseed=3, sizes=[3, 2], skewed=True, weights="ht_mean", int32=True,
         hot="some", scale=5.0, q_size=None)  # fmt: skip
@example(n=60, m=600, gseed=4, sizes=[50, 50], skewed=False, weights="ht", int32=False,
         hot="all", scale=0.5, q_size=None)  # fmt: skip
def test_torch_path_equals_the_numba_kernels(
    n, m, gseed, sizes, skewed, weights, int32, hot, scale, q_size
):
    """Random and hub-heavy graphs, every weight mode, int32 and int64 ids, no / some / every
    node in B, s from 0.5 to 1e12 (members capped at 1): identical batches, at most
    ``len(sizes) + 1`` host syncs."""
    g = (skewed_graph if skewed else random_graph)(n, m, gseed)
    rng = np.random.default_rng(gseed)
    b = {"none": [], "some": rng.permutation(n)[: max(1, n // 5)], "all": np.arange(n)}[hot]
    seeds = rng.permutation(n)[: max(1, n // 6)]
    check_equal(g, sizes, np.asarray(b, dtype=np.int64), seeds, scale, gseed, weights, int32,
                q_size)  # fmt: skip


def test_a_scale_past_the_range_is_refused_and_its_ends_sample():
    """Eq. 8 multiplies the members' weights by s: at s = 1e308 their sum overflowed and every
    layer came out empty (numba; the torch path gave other layers), at 5e-324 the kernel divided
    by zero. Both locality-aware samplers take s in [1e-200, 1e200] (a ValueError past it, when
    set later too); at both ends, every node in B, the layers grow, numba == torch, finite."""
    g = skewed_graph(150, 2000, 3)
    hot, seeds = np.arange(150), np.arange(0, 150, 15)
    for s in (1e308, 1.01e200, 5e-324, 9e-201):
        with pytest.raises(ValueError, match="scale: must be a number in"):
            LocalityLadiesSampler(g, [40, 40, 40], hot, scale=s)
        with pytest.raises(ValueError, match="scale: must be a number in"):
            LocalitySampler(g, [5, 5], hot_ids=hot, scale=s)
    for s in (1e200, 1e-200):
        cpu, tch = check_equal(g, [40, 40, 40], hot, seeds, s, 0)
        for smp in (cpu, tch):
            mb = smp.sample(seeds, epoch_seed=1)
            sizes = mb.meta["hop_nodes"]
            assert all(b > a for a, b in zip(sizes, sizes[1:])), sizes
            assert all(torch.isfinite(b.edge_weight).all() for b in mb.blocks)
            with pytest.raises(ValueError, match="scale"):
                smp.scale = 1e308
            assert smp.scale == s


def test_scale_moves_the_layers_and_one_is_ladies():
    """The scale changes the batches (members gain), s = 1 is LADIES' batch exactly, and a scale
    set between epochs (Algorithm 2) is the one the next batch uses, as the numba sampler's."""
    g = skewed_graph(300, 4000, 2)
    hot = np.arange(0, 300, 4)
    seeds = np.arange(1, 300, 10)
    cpu, tch = pair(g, [30, 30], hot, 1.0, 7)
    with torch_on_cpu():
        plain = LadiesSampler(g, [30, 30], seed=7)
    same_batch(tch.sample(seeds, epoch_seed=2), plain.sample(seeds, epoch_seed=2))
    for s in (4.0, 1e9, 0.5):
        cpu.scale = tch.scale = s
        same_batch(cpu.sample(seeds, epoch_seed=2), tch.sample(seeds, epoch_seed=2))
    _, one = pair(g, [30], hot, 1.0, 7)  # one hop: its layer's set is B
    share = []
    for s in (1.0, 4.0, 1e9, 0.5):
        one.scale = s
        new = [one.sample(seeds, epoch_seed=e).input_nodes[len(seeds) :] for e in range(8)]
        share.append(np.isin(torch.cat(new).numpy(), hot).mean())
    assert share[2] > share[1] > share[0] > share[3]


def test_edge_cases():
    """Isolated seeds (an empty hop: one sync), rows with no candidates, K past the candidates
    (every one kept), a layer whose members have no out-edges (no member index), no seeds."""
    # 0, 1 isolated; 2 <- 3 <- 2; 4 <- 5, 6, 7; 8 has no out-edges and is the only hot node
    g = CSRGraph.from_edges(np.array([3, 2, 5, 6, 7]), np.array([2, 3, 4, 4, 4]), 9)
    _, tch = pair(g, [2, 2], np.array([5]), 3.0, 0)
    with count_syncs() as c:
        mb = tch.sample([0, 1], epoch_seed=5)
    assert c.count == 1 and mb.meta["hop_nodes"] == [2, 2, 2]
    for seeds, sizes in (([2, 3], [1]), ([4], [3]), ([4], [10**30]), ([4, 0], [1, 1]), ([], [2])):
        for hot in ([5], [8], [5, 6, 7], []):
            check_equal(g, sizes, np.array(hot), seeds, 3.0, 1)
            check_equal(g, sizes, np.array(hot), seeds, 0.5, 1, "ht_mean", int32=True)
    _, tch = pair(g, [1], np.array([8]), 3.0, 0)
    assert tch._torch._q == [None]  # (Q' = {8}: no row has it as a neighbour)


def test_members_that_take_the_whole_budget_fill_the_layer():
    """At a huge ``s`` the members' ``s p_j`` swamp the others' sum (below an ulp of it); where
    exactly ``K`` members are candidates the budget solve's capped set reached ``K``, ``c`` fell
    to ``(K - K) / rest = 0`` and every ``pi`` with it: an empty layer (numba at times, the torch
    path always; a hop of this graph at s = 1e200). Now the capped members get 1, the rest 0."""
    p = np.array([1.0, 3e200, 0.5, 2e200])
    want = np.array([0.0, 1.0, 0.0, 1.0])
    pi = np.empty(4)
    LK.solve_budget(p, 4, 2, pi)
    assert np.array_equal(pi, want)
    assert np.array_equal(solve_budget_torch(torch.from_numpy(p), torch.tensor(4), 2), want)
    g = skewed_graph(300, 5000, 1)
    seeds = np.arange(0, 300, 7)
    cpu, tch = check_equal(g, [20, 20], np.arange(0, 300, 3), seeds, 1e200, 1)
    for mb in (cpu.sample(seeds, epoch_seed=0), tch.sample(seeds, epoch_seed=0)):
        assert np.diff(mb.meta["hop_nodes"]).min() >= 15, mb.meta["hop_nodes"]  # (about K)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 80), m=st.integers(0, 800), gseed=st.integers(0, 1000),
       frac=st.integers(1, 5))  # fmt: skip
def test_member_positions_mark_the_members(n, m, gseed, frac):
    """Per neighbour position of the rows: whether its node is in Q', from the member index."""
    g = random_graph(n, m, gseed)
    rng = np.random.default_rng(gseed)
    q = np.sort(rng.permutation(n)[: max(1, n // frac)])
    rows = rng.permutation(n)[: max(1, n // 3)]
    ip = np.asarray(g.indptr)
    nbr = np.concatenate([np.asarray(g.indices)[ip[r] : ip[r + 1]] for r in rows])
    if nbr.size == 0:
        return
    s = LadiesSampler(g, [1])
    qptr, qpos = LocalitySampler._member_index(s, q)  # type: ignore[arg-type]
    if qpos.size == 0:
        assert not np.isin(nbr, q).any()
        return
    nodes = torch.from_numpy(rows)
    deg = torch.from_numpy(ip[rows + 1] - ip[rows])
    got = member_positions((torch.from_numpy(qptr), torch.from_numpy(qpos)), nodes, deg, nbr.size)
    assert np.array_equal(got.numpy(), np.isin(nbr, q))


def test_no_hidden_data_dependent_ops():
    """Eq. 8 adds no host read: only the counted ``tolist`` reads, one per hop and the seeds'."""
    g = random_graph(600, 8000, 3)
    _, tch = pair(g, [64, 64, 64], np.arange(0, 600, 7), 3.0, 1)
    seeds = torch.from_numpy(np.random.default_rng(3).permutation(600)[:64])
    with OpCounter() as c, count_syncs() as cs:
        mb = tch.sample(seeds, epoch_seed=1)
    assert c.syncs == 0, dict(c.sync_ops)
    assert cs.ops == ["tolist"] * 4 and mb.meta["hop_nodes"][-1] > 150


def test_train_builds_it_on_the_gpu(monkeypatch):
    """``gnnio train --sampler ladies --locality-scale S --device cuda``: LocalityLadiesSampler on
    the training GPU under ``--sampler-device auto|cuda`` (UVA too), the numba kernels with
    ``cpu``; ``--sampler-device cuda`` is accepted, the plan counts its member index."""
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import StoreSetup, build_sampler, has_gpu_sampler, member_index_bytes
    from tests.fake_cuda import record_sampler_builds

    built = record_sampler_builds(monkeypatch, "LocalityLadiesSampler", "sizes")

    class Ds:
        graph = random_graph(100, 600, 0)

    setup = StoreSetup(store=None, tiers=None, gpu_ids=np.arange(10), info={}, eval_store=None)
    for opts, want in ((dict(sampler_device="auto"), ("cuda", "gpu")),
                       (dict(sampler_device="cuda", graph_in="host"), ("cuda", "host")),
                       (dict(sampler_device="cpu"), (None, "gpu"))):  # fmt: skip
        cfg = TrainConfig(device="cuda", sampler="ladies", layer_size=7, locality_scale=2.0,
                          gpu_cache_fraction=0.1, **opts)  # fmt: skip
        cfg.validate()
        assert has_gpu_sampler(cfg) and member_index_bytes(Ds, cfg) > 0
        build_sampler(Ds, cfg, [4, 3], setup)
        dev = built["device"]
        assert (None if dev is None else dev.type, built["graph_in"]) == want, built
        assert built["sizes"] == [7, 7] and built["scale"] == 2.0


@pytest.mark.parametrize("scale", [2.0, "auto"])
def test_a_training_run_on_the_torch_path_learns_what_the_numba_run_learns(
    tmp_path, monkeypatch, scale
):
    """``gnnio train --sampler ladies --locality-scale 2|auto`` with the torch path forced onto CPU
    tensors: the numba run's loss history exactly (``auto``: Algorithm 2 doubles the scale
    between epochs, 1, 2, 4: the modeled loading share of 5 % rows on the GPU is over 0.2)."""
    import gnnio.sampling
    from gnnio.importers.synthetic import prepare_synthetic
    from gnnio.train import TrainConfig, train

    d = tmp_path / "syn"
    prepare_synthetic(d, num_nodes=400, avg_degree=6, feat_dim=8, num_classes=3, seed=0,
                      progress=False)  # fmt: skip
    cfg = TrainConfig(sampler="ladies", layer_size=40, locality_scale=scale,
                      gpu_cache_fraction=0.05, fanouts=(3, 3), batch_size=64, epochs=3, hidden=8,
                      progress=False, locality_compute_s=1e-6)  # fmt: skip
    numba = train(d, cfg)
    built = []

    def forced(graph, sizes, **kw):
        with torch_on_cpu():
            built.append(LocalityLadiesSampler(graph, sizes, **kw))
        return built[-1]

    monkeypatch.setattr(gnnio.sampling, "LocalityLadiesSampler", forced)
    on_torch = train(d, cfg)
    assert len(built) == 1 and built[0]._torch is not None
    assert on_torch["loss_history"] == numba["loss_history"]
    scales = [[h["locality_scale"] for h in r["history"]] for r in (numba, on_torch)]
    assert scales[0] == scales[1] == ([2.0] * 3 if scale == 2.0 else [1.0, 2.0, 4.0])
    assert on_torch["test_acc"] == numba["test_acc"]


def test_bench_sampling_takes_it(tmp_path, capsys):
    """``gnnio bench sampling --sampler ladies --locality-scale S`` times the locality-aware
    LADIES (gpu-check runs it on both devices); ``--sampler labor`` is refused in one line."""
    import json

    from gnnio.cli.main import main

    from .helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=80, num_edges=600)
    argv = ["bench", "sampling", str(d), "--fanouts", "3,2", "--batch-size", "8", "--batches",
            "3", "--passes", "1", "--json", "--no-progress", "--locality-scale", "4"]  # fmt: skip
    sums = []
    for extra in ([], ["--locality-scale", "1"]):
        assert main([*argv, "--sampler", "ladies", "--layer-size", "16", *extra]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["sampler"] == "ladies" and out["edges_per_s"] > 0
        sums.append(out["checksum"])
    assert main([*argv, "--sampler", "ladies", "--layer-size", "16"]) == 0
    assert main([*argv[:-2], "--sampler", "ladies", "--layer-size", "16"]) == 0  # LADIES
    outs = [json.loads(x) for x in capsys.readouterr().out.split("\n") if x.startswith("{")]
    assert outs[0]["checksum"] == sums[0] and outs[1]["checksum"] == sums[1] != sums[0]
    assert main([*argv, "--sampler", "labor"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in", ["gpu", "host"])
def test_locality_ladies_on_cuda_equals_cpu(graph_in):  # pragma: no cover - GPU only
    """On CUDA (the member index on the GPU, or pinned with UVA): the CPU's ids, blocks and edge
    order, weights within float rounding (LADIES' sums add in another order there)."""
    for s, g in enumerate((random_graph(3000, 30000, seed=5), skewed_graph(3000, 30000, 6))):
        seeds = np.random.default_rng(s).permutation(3000)[:200]
        hot = np.arange(0, 3000, 10)
        cpu = LocalityLadiesSampler(g, [256, 256], hot, scale=4.0)
        gpu = LocalityLadiesSampler(g, [256, 256], hot, scale=4.0, device="cuda",
                                    graph_in=graph_in)  # fmt: skip
        assert gpu.device.type == "cuda" and gpu._torch is not None
        for scale in (4.0, 1.0, 0.5):
            cpu.scale = gpu.scale = scale
            b = gpu.sample(seeds, epoch_seed=3)
            assert b.input_nodes.device.type == "cuda"
            same_batch(cpu.sample(seeds, epoch_seed=3), b.to("cpu"), exact_weights=False)
