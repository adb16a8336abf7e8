"""LADIES's torch path (gnnio/sampling/ladies_torch.py), run on CPU tensors: the same batches as
the numba kernels bit for bit (ids, blocks, edge order, weights) over random and skewed graphs,
the edge cases (isolated seeds, rows with no candidates, K past the candidates, empty hops, no
seeds, int32 ids), the exact budget solve, the host-sync bound, errors; on a CUDA device
(gpu-marked) LadiesSampler(device="cuda") equals the CPU sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LadiesSampler, layer_probabilities
from gnnio.sampling import _ladies_kernels as LK
from gnnio.sampling.gpu import count_syncs
from gnnio.sampling.ladies_torch import TorchLadiesSampler, layer_pi_torch, solve_budget_torch
from gnnio.sampling.threaded import call_key
from gnnio.utils.syncs import OpCounter

from .helpers import random_graph


def same_batch(a, b, exact_weights: bool = True) -> None:
    assert a.meta["sampler"] == b.meta["sampler"] == "ladies"
    same_blocks(a, b, exact_weights)


def same_blocks(a, b, exact_weights: bool = True) -> None:
    """Two batches' ids, hop sizes and blocks equal (weights exactly or within float rounding)."""
    assert torch.equal(a.input_nodes, b.input_nodes)
    assert torch.equal(a.seeds, b.seeds)
    assert a.meta["hop_nodes"] == b.meta["hop_nodes"]
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert torch.equal(x.edge_index, y.edge_index)
        assert (x.edge_weight is None) == (y.edge_weight is None)
        if x.edge_weight is not None:
            assert y.edge_weight.dtype == torch.float32
            if exact_weights:
                assert torch.equal(x.edge_weight, y.edge_weight)
            else:
                torch.testing.assert_close(x.edge_weight, y.edge_weight, rtol=1e-6, atol=0)


def skewed_graph(n: int, m: int, seed: int) -> CSRGraph:
    """Heavy-tailed sources: a few hubs are neighbours of many rows, so their ``p_j`` is large
    and the budget solve caps them (``pi = 1``); random graphs rarely do."""
    rng = np.random.default_rng(seed)
    src = (rng.pareto(1.0, m) * 3).astype(np.int64) % n
    return CSRGraph.from_edges(src, rng.integers(0, n, m), n)


def both(g: CSRGraph, sizes, seed: int, weights: str, int32: bool = False):
    ip, ix = g.to_torch()
    if int32:
        ix = ix.to(torch.int32)
    cpu = LadiesSampler(g, sizes, seed=seed, weights=weights)
    return cpu, TorchLadiesSampler(ip, ix, sizes, weights=weights)


def check_equal(g, sizes, seeds, seed: int, weights: str, int32: bool = False) -> None:
    cpu, tch = both(g, sizes, seed, weights, int32)
    seeds = np.asarray(seeds, dtype=np.int64)
    for e in (0, 7):
        a = cpu.sample(torch.from_numpy(seeds), epoch_seed=e)
        with count_syncs() as c:
            b = tch.sample(seeds, call_key(seed, epoch_seed=e))
        same_batch(a, b)
        assert c.count <= len(sizes) + 1, c.ops  # the seeds' sync + one per hop


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 150),
    m=st.integers(0, 1500),
    gseed=st.integers(0, 10_000),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    skewed=st.booleans(),
    weights=st.sampled_from(["ht", "ht_mean", "none"]),
    int32=st.booleans(),
    frac=st.integers(1, 6),
)
@example(n=40, m=0, gseed=1, sizes=[5, 5], skewed=False, weights="ht", int32=False, frac=3)
@example(n=120, m=1500, gseed=3, sizes=[3, 2], skewed=True, weights="ht_mean", int32=True, frac=6)
def test_torch_path_equals_the_numba_kernels(n, m, gseed, sizes, skewed, weights, int32, frac):
    """Random and hub-heavy graphs (repeated neighbours, self-loops, isolated nodes), every weight
    mode, int32 and int64 ids: identical batches, at most ``len(sizes) + 1`` host syncs."""
    g = (skewed_graph if skewed else random_graph)(n, m, gseed)
    seeds = np.random.default_rng(gseed).permutation(n)[: max(1, n // frac)]
    check_equal(g, sizes, seeds, gseed, weights, int32)


def test_hub_graphs_cap_candidates_and_still_match():
    """The case the exact solve is for: candidates with ``c p_j >= 1`` (``pi = 1``) next to
    partial ones, in most hops of these graphs; the batches still match bit for bit."""
    capped = 0
    for s in range(12):
        g = skewed_graph(200, 2000, s)
        _, tch = both(g, [8, 8], s, "ht")
        mb = tch.sample(np.arange(0, 200, 9), call_key(s, epoch_seed=1))
        w = mb.blocks[-1].edge_weight
        capped += int(((w == 1) & (mb.blocks[-1].edge_index[0] >= mb.blocks[-1].num_dst)).any())
        check_equal(g, [8, 8], np.arange(0, 200, 9), s, "ht")
    assert capped >= 6


def test_edge_cases():
    """Isolated seeds (an empty hop: no sync, a block with no edges), rows whose neighbours are
    all rows (no candidates), K past the candidates (every one kept, weight 1), K past int64,
    no seeds at all."""
    # 0, 1 isolated; 2 <- 3 <- 2 (a cycle of rows); 4 <- 5, 6, 7
    g = CSRGraph.from_edges(np.array([3, 2, 5, 6, 7]), np.array([2, 3, 4, 4, 4]), 8)
    _, tch = both(g, [2, 2], 0, "ht")
    with count_syncs() as c:
        mb = tch.sample([0, 1], 5)
    assert c.count == 1 and mb.meta["hop_nodes"] == [2, 2, 2]
    assert all(b.edge_index.shape == (2, 0) and b.edge_weight.shape == (0,) for b in mb.blocks)
    for seeds, sizes in (([2, 3], [1]), ([4], [3]), ([4], [10**30]), ([4, 0], [1, 1]), ([], [2])):
        check_equal(g, sizes, seeds, 1, "ht")
        check_equal(g, sizes, seeds, 1, "ht_mean", int32=True)
    mb = tch.sample([4], 9)  # K = 2 < 3 candidates: some dropped; K = 3 takes all, weight 1
    full = TorchLadiesSampler(*g.to_torch(), [3]).sample([4], 9)
    assert full.meta["hop_nodes"] == [1, 4] and torch.equal(full.blocks[0].edge_weight,
                                                            torch.ones(3))  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    p=st.lists(st.floats(1e-9, 50.0), min_size=1, max_size=60),
    budget=st.integers(1, 80),
    pad=st.integers(0, 5),
)
@example(p=[10.0, 1.0, 1.0, 1.0], budget=2, pad=2)  # one capped: c = 1 / 3 on the rest
@example(p=[1.0, 1.0], budget=2, pad=0)  # K = #candidates: all 1
def test_budget_solve_equals_the_kernel(p, budget, pad):
    """The sort-and-scan solve gives the kernel's fixed point bit for bit on the CPU (entries past
    ``nc`` ignored and 1); ``sum pi = min(K, nc)``."""
    pv = np.asarray(p, dtype=np.float64)
    want = np.empty(len(p))
    LK.solve_budget(pv, len(p), min(budget, len(p)), want)
    padded = torch.cat([torch.from_numpy(pv), torch.full((pad,), 7.0, dtype=torch.float64)])
    got = solve_budget_torch(padded, torch.tensor(len(p)), budget)
    assert torch.equal(got[: len(p)], torch.from_numpy(want))
    assert bool((got[len(p) :] == 1).all())
    assert abs(float(got[: len(p)].sum()) - min(budget, len(p))) < 1e-9 * len(p)


def test_no_hidden_data_dependent_ops():
    """Only the counted ``tolist`` reads come back to the host: no ``nonzero``, boolean-mask
    indexing, ``.item()`` or the like (``OpCounter`` sees ATen's syncing ops on the CPU)."""
    g = random_graph(600, 8000, 3)
    s = TorchLadiesSampler(*g.to_torch(), [64, 64, 64])
    seeds = torch.from_numpy(np.random.default_rng(3).permutation(600)[:64])
    with OpCounter() as c, count_syncs() as cs:
        mb = s.sample(seeds, 1)
    assert c.syncs == 0, dict(c.sync_ops)
    assert cs.ops == ["tolist"] * 4 and mb.meta["hop_nodes"][-1] > 150


def test_errors_and_sampler_wrapper():
    g = random_graph(50, 300, 1)
    tch = TorchLadiesSampler(*g.to_torch(), [4])
    for bad, msg in (([1, 1], "appears more than once"), ([0, 50], "out of range"),
                     ([-1], "out of range"), ([[1]], "1-D"), ([0.5], "integer")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            tch.sample(bad, 0)
    check_equal(g, [4], [0, 1, 2], 0, "ht")  # the scratch came back clean after each error
    cpu = LadiesSampler(g, [4])
    assert cpu._torch is None and cpu.device.type == "cpu"
    wrapped = LadiesSampler(g, [4], seed=2, device="cpu")
    same_batch(wrapped.sample([3, 4], epoch_seed=1), LadiesSampler(g, [4], seed=2).sample(
        [3, 4], epoch_seed=1))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in", ["gpu", "host"])
def test_ladies_on_cuda_equals_cpu(graph_in):  # pragma: no cover - GPU only
    """On CUDA the p_j sums and the c scan add in another order (module docstring): the same ids,
    blocks and edge order, weights within float rounding."""
    for s, g in enumerate((random_graph(3000, 30000, seed=5), skewed_graph(3000, 30000, 6))):
        seeds = np.random.default_rng(s).permutation(3000)[:200]
        cpu = LadiesSampler(g, [256, 256], seed=0).sample(seeds, epoch_seed=3)
        gpu = LadiesSampler(g, [256, 256], seed=0, device="cuda", graph_in=graph_in)
        assert gpu.device.type == "cuda"
        same_batch(cpu, gpu.sample(seeds, epoch_seed=3).to("cpu"), exact_weights=False)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 300),
    m=st.integers(1, 4000),
    gseed=st.integers(0, 10_000),
    k=st.integers(1, 60),
    skewed=st.booleans(),
)
def test_layer_probabilities_are_the_kernels_bits(n, m, gseed, k, skewed):
    """Candidates and ``pi`` (float64) of one hop equal :func:`layer_probabilities`' bit for bit:
    ``p_j`` summed in the kernel's order (a pairwise or prefix-difference sum shows here, not in
    the float32 weights), ``c`` from the uncapped sum in candidate order."""
    g = (skewed_graph if skewed else random_graph)(n, m, gseed)
    rows = np.random.default_rng(gseed).permutation(n)[: max(1, n // 4)]
    want_c, want_pi = layer_probabilities(g, rows, k)
    ip, ix = g.to_torch()
    loc = torch.full((n + 1,), -1, dtype=torch.int64)
    loc[torch.from_numpy(rows)] = torch.arange(len(rows))
    nodes = torch.from_numpy(rows)
    total = int((ip[nodes + 1] - ip[nodes]).sum())
    if total == 0:
        assert len(want_c) == 0
        return
    _, _, _, cand, valid, pi = layer_pi_torch(ip, ix, nodes, total, loc, k)
    nc = int(valid.sum())
    assert torch.equal(cand[:nc], torch.from_numpy(want_c))
    assert torch.equal(pi[:nc], torch.from_numpy(want_pi))


def test_train_builds_ladies_on_the_gpu(monkeypatch):
    """``gnnio train --sampler ladies --device cuda``: LadiesSampler on the training GPU under
    ``--sampler-device auto|cuda`` (UVA too), the numba kernels with ``cpu`` (the locality-aware
    one: tests/test_ladies_locality_torch.py)."""
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import StoreSetup, build_sampler
    from tests.fake_cuda import record_sampler_builds

    built = record_sampler_builds(monkeypatch, "LadiesSampler", "sizes")

    class Ds:
        graph = random_graph(100, 600, 0)

    setup = StoreSetup(store=None, tiers=None, gpu_ids=None, info={}, eval_store=None)
    for opts, want in ((dict(sampler_device="auto"), ("cuda", "gpu")),
                       (dict(sampler_device="cuda", graph_in="host"), ("cuda", "host")),
                       (dict(sampler_device="cpu"), (None, "gpu"))):  # fmt: skip
        cfg = TrainConfig(device="cuda", sampler="ladies", layer_size=7, **opts)
        cfg.validate()
        build_sampler(Ds, cfg, [4, 3], setup)
        dev = built["device"]
        assert (None if dev is None else dev.type, built["graph_in"]) == want, built
        assert built["sizes"] == [7, 7]


def test_bench_checksum_ids_leaves_the_weights_out():
    """``gnnio bench sampling``'s ``checksum_ids`` (what gpu-check compares for LADIES on CUDA)
    changes with an id, not with a weight's last bit; ``checksum`` changes with both."""
    from gnnio.bench.sampling import batches_checksums

    g = random_graph(60, 400, 2)
    _, tch = both(g, [6, 6], 0, "ht")
    mbs = [tch.sample([1, 2, 3], k) for k in range(3)]
    full, ids = batches_checksums(mbs)
    w = mbs[1].blocks[0].edge_weight
    w[0] = torch.nextafter(w[0], torch.tensor(10.0))
    full2, ids2 = batches_checksums(mbs)
    assert ids2 == ids and full2 != full
    mbs[2].input_nodes[-1] += 1
    assert batches_checksums(mbs)[1] != ids


def test_cuda_graph_says_why_ladies_is_not_replayed():
    """``--cuda-graph sampler`` with LADIES: on the GPU its batches are not replayed (sizes read
    back every hop), and says so; on the CPU no hint to move it to the GPU (no replay there
    either); the uniform sampler on the GPU replays (no warning), on the CPU gets the hint."""
    from gnnio.train.build import not_graphed
    from gnnio.train.config import TrainConfig

    gpu = not_graphed(TrainConfig(sampler="ladies"), "cuda:0")
    assert gpu is not None and "LADIES GPU sampler" in gpu
    cpu = not_graphed(TrainConfig(sampler="ladies"), "cpu")
    assert (
        cpu is not None
        and "the LADIES sampler runs on the CPU" in cpu
        and "--sampler-device" not in cpu
    )
    assert not_graphed(TrainConfig(), "cuda:0") is None
    assert "--sampler-device cuda" in (not_graphed(TrainConfig(), "cpu") or "")


def test_budget_solve_stops_at_a_rounding_tie():
    """``p`` where ``c p_j = 1`` exactly for three candidates (three rows of degree 5 share each):
    rounding made the kernel's capped set alternate between 0 and 3 forever (a hung
    ``LadiesSampler.sample``); it stops now, and the torch path agrees bit for bit. In a child
    process, so that a hang fails the test instead of blocking it."""
    import subprocess
    import sys

    code = (
        "import numpy as np, torch\n"
        "from gnnio.sampling import _ladies_kernels as LK\n"
        "from gnnio.sampling.ladies_torch import solve_budget_torch\n"
        "p = np.array([1/18, 1/36, 1/12, 1/36, 1/36, 1/12, 1/36, 1/12])\n"
        "pi = np.empty(8)\n"
        "LK.solve_budget(p, 8, 5, pi)\n"
        "pt = solve_budget_torch(torch.from_numpy(p), torch.tensor(8), 5).numpy()\n"
        "assert np.array_equal(pi, pt), (pi, pt)\n"
        "assert abs(pi.sum() - 5) < 1e-12\n"
    )
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("solve_budget did not return (the capped set cycles)")
