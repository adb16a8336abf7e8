"""Counter-based sampling (issue 18, part 1): every sampler's batch is a pure function of
(seed, epoch_seed = epoch * 2**32 + batch index, seeds) -- independent of the thread count and of
the batches sampled before -- and the node-wise samplers' picks for a row depend only on
(seed, epoch_seed, hop, node id), not on the other rows of the batch. The torch (GPU) path draws
the CPU kernels' random numbers, so its batches are bit-identical to theirs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.sampling import (
    LaborSampler,
    LadiesSampler,
    LocalityLadiesSampler,
    LocalitySampler,
    PrunedUniformSampler,
    UniformSampler,
)
from gnnio.sampling.gpu import TorchUniformSampler
from gnnio.sampling.threaded import call_key
from tests.helpers import random_graph

N, M = 6000, 90_000
FANOUTS = [15, 10, 5]


@pytest.fixture(scope="module")
def graph():
    return random_graph(N, M, seed=11)


def _make(kind: str, g, threads: int, seed: int = 5):
    hot = np.arange(0, N, 7)
    if kind == "uniform":
        return UniformSampler(g, FANOUTS, seed=seed, num_threads=threads)
    if kind == "labor":
        return LaborSampler(g, FANOUTS, seed=seed, num_threads=threads)
    if kind == "labor_poisson":
        return LaborSampler(g, FANOUTS, seed=seed, num_threads=threads, design="poisson")
    if kind == "locality":
        return LocalitySampler(g, FANOUTS, hot_ids=hot, scale=3.0, seed=seed, num_threads=threads)
    if kind == "pruned":
        return PrunedUniformSampler(g, FANOUTS, seed=seed, num_threads=threads)
    if kind == "ladies":
        return LadiesSampler(g, [500, 500], seed=seed)
    if kind == "ladies_locality":
        return LocalityLadiesSampler(g, [500, 500], hot_ids=hot, scale=2.0, seed=seed)
    raise AssertionError(kind)


def _digest(mb) -> list[np.ndarray]:
    out = [mb.seeds.cpu().numpy(), mb.input_nodes.cpu().numpy()]
    for b in mb.blocks:
        out.append(b.edge_index.cpu().numpy())
        if getattr(b, "edge_weight", None) is not None:
            out.append(b.edge_weight.cpu().numpy())
    return out


def _same(a, b) -> bool:
    da, db = _digest(a), _digest(b)
    return len(da) == len(db) and all(
        x.shape == y.shape and np.array_equal(x, y) for x, y in zip(da, db, strict=True)
    )


def _batches(count: int, size: int = 2500, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.choice(N, size, replace=False).astype(np.int64) for _ in range(count)]


KINDS = ["uniform", "labor", "labor_poisson", "locality", "pruned", "ladies", "ladies_locality"]


@pytest.mark.parametrize("kind", KINDS)
def test_batch_is_a_function_of_seed_epoch_and_index_only(graph, kind):
    """Threads 1, 2, 3; batches sampled in another order and by a fresh sampler: identical."""
    batches = _batches(4)
    keys = [(e << 32) + i for e in (0, 3) for i in range(len(batches))]
    ref = _make(kind, graph, 1)
    want = [ref.sample(batches[k & 0xFF], epoch_seed=k) for k in keys]
    for threads in (2, 3):
        s = _make(kind, graph, threads)
        got = {k: s.sample(batches[k & 0xFF], epoch_seed=k) for k in reversed(keys)}
        assert all(_same(got[k], w) for k, w in zip(keys, want, strict=True)), (kind, threads)
        s.close()
    # a fresh sampler re-samples any one future batch without replaying the earlier ones
    fresh = _make(kind, graph, 2)
    assert _same(fresh.sample(batches[2], epoch_seed=keys[-2]), want[-2])
    # other seed / other epoch: different batches
    other = _make(kind, graph, 2, seed=6)
    assert not _same(other.sample(batches[0], epoch_seed=keys[0]), want[0])
    assert not _same(want[0], want[len(batches)])


def _first_hop_neighbours(mb, node: int) -> list[int]:
    """Global ids of ``node``'s sampled hop-1 neighbours, in sampling order."""
    inp = mb.input_nodes.cpu().numpy()
    pos = int(np.nonzero(mb.seeds.cpu().numpy() == node)[0][0])
    src, dst = mb.blocks[-1].edge_index.cpu().numpy()
    return inp[src[dst == pos]].tolist()


@pytest.mark.parametrize("kind", ["uniform", "labor", "locality", "pruned"])
def test_row_picks_depend_on_the_node_not_on_the_batch(graph, kind):
    """Node-wise samplers: a row's picks are keyed by (seed, call key, hop, node id)."""
    s = _make(kind, graph, 2)
    deg = np.diff(np.asarray(graph.indptr))
    v = int(np.argmax(deg))  # a row where fanout < degree: the picks are random
    a, b = _batches(2, size=3000, seed=9)
    a, b = np.r_[v, a[a != v]], np.r_[b[b != v], v]
    na = _first_hop_neighbours(s.sample(a, epoch_seed=17), v)
    nb = _first_hop_neighbours(s.sample(b, epoch_seed=17), v)
    assert len(na) == FANOUTS[0] or kind == "labor"
    assert na == nb
    assert _first_hop_neighbours(s.sample(a, epoch_seed=18), v) != na


@pytest.mark.parametrize("fanouts", [[15, 10, 5], [3, -1], [40, 2], [0, 4]])
def test_torch_path_is_bit_identical_to_the_cpu_kernels(graph, fanouts):
    """The vectorized torch sampler (the CUDA path, run here on CPU tensors) draws the CPU
    kernels' counter-based numbers: same batch, edge for edge."""
    cpu = UniformSampler(graph, fanouts, seed=4, num_threads=2)
    ip, ix = graph.to_torch()
    tor = TorchUniformSampler(ip, ix, fanouts)
    for i, seeds in enumerate(_batches(3, size=1500, seed=2)):
        key = call_key(4, epoch_seed=(1 << 32) + i)
        assert _same(tor.sample(torch.from_numpy(seeds), key), cpu.sample(seeds, (1 << 32) + i))


def test_torch_path_matches_on_high_degree_rows():
    """Rows far above the fanout (Floyd with many candidates) and the hashed Floyd branch
    (fanout > 32) of the CPU kernel."""
    from tests.helpers import shared_neighbourhood_graph

    g = shared_neighbourhood_graph(300, 5000)
    ip, ix = g.to_torch()
    seeds = np.arange(5000, 5300, dtype=np.int64)
    for fo in ([7], [33], [100, 3]):
        cpu = UniformSampler(g, fo, seed=1, num_threads=1)
        tor = TorchUniformSampler(ip, ix, fo)
        assert _same(tor.sample(torch.from_numpy(seeds), call_key(1, epoch_seed=3)),
                     cpu.sample(seeds, 3))  # fmt: skip


def test_rejected_draws_are_redrawn_as_on_the_cpu(monkeypatch):
    """Lemire rejections: bound 2**31 + 1 rejects about half the first attempts. The exact draws
    follow the CPU kernel's ``_bounded`` step for step, the fast ones report the rows to redo."""
    from gnnio.sampling import _kernels
    from gnnio.sampling import gpu_hop as gpu

    n, bound = 64, 2**31 + 1
    rng = np.random.default_rng(0)
    states = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    deg = torch.full((n,), bound, dtype=torch.int64)
    t, bad = gpu._floyd_draws(torch.from_numpy(states), deg, 1, exact=True)
    want = [int(_kernels._bounded(np.uint64(s & (2**64 - 1)), bound)[0]) for s in states.tolist()]
    assert t[:, 0].tolist() == want and int(bad) == 0
    fast, bad = gpu._floyd_draws(torch.from_numpy(states), deg, 1, exact=False)
    wrong = int((fast[:, 0] != t[:, 0]).sum())
    assert 0 < int(bad) and wrong <= int(bad)
    # a hop whose fast draws report a rejection is redrawn: the batch stays the CPU's
    real = gpu._floyd_draws
    monkeypatch.setattr(
        gpu, "_floyd_draws", lambda s, d, f, exact: (real(s, d, f, exact)[0], torch.tensor(1))
    )
    g = random_graph(500, 8000, seed=3)
    ip, ix = g.to_torch()
    seeds = np.arange(0, 500, 3, dtype=np.int64)
    cpu = UniformSampler(g, [5, 3], seed=2, num_threads=1).sample(seeds, epoch_seed=9)
    tor = TorchUniformSampler(ip, ix, [5, 3]).sample(torch.from_numpy(seeds), call_key(2, None, 9))
    assert _same(tor, cpu)


def test_bench_sampling_checksum_does_not_depend_on_threads(tmp_path, capsys):
    """``gnnio bench sampling DIR --threads 1`` and ``--threads 2``: same ``checksum``."""
    import json

    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=3000, num_edges=40_000)
    base = ["bench", "sampling", str(d), "--batch-size", "600", "--batches", "4", "--passes", "1",
            "--warmup", "0", "--json", "--no-progress"]  # fmt: skip
    sums = {}
    for kind in ("uniform", "labor", "ladies"):
        for threads, seed in ((1, 3), (2, 3), (2, 4)):
            assert (
                main([*base, "--sampler", kind, "--threads", str(threads), "--seed", str(seed)])
                == 0
            )
            sums[kind, threads, seed] = json.loads(
                capsys.readouterr().out.strip().splitlines()[-1]
            )["checksum"]
        assert sums[kind, 1, 3] == sums[kind, 2, 3] != sums[kind, 2, 4]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in", ["gpu", "host"])
def test_cuda_sampler_is_bit_identical_to_the_cpu_kernels(graph, graph_in):  # pragma: no cover
    """On a real GPU (CSR on the device, or read zero-copy from pinned host memory) the batches
    equal the CPU kernels', edge for edge, including rows above the hashed-Floyd fanout."""
    for fanouts in (FANOUTS, [40, 3]):
        cpu = UniformSampler(graph, fanouts, seed=4, num_threads=2)
        gpu = UniformSampler(graph, fanouts, seed=4, device="cuda", graph_in=graph_in)
        for i, seeds in enumerate(_batches(3, size=1500, seed=2)):
            e = (1 << 32) + i
            got = gpu.sample(torch.from_numpy(seeds).cuda(), epoch_seed=e)
            assert got.input_nodes.device.type == "cuda"
            assert _same(got, cpu.sample(seeds, e)), (fanouts, i)
