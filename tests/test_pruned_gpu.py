"""HyDRA's threshold pruning on the GPU sampler (gnnio/sampling/pruned_torch.py, the ``theta`` of
_triton_hop.py and gpu_hop.py; issue 24 item 5): every batch bit-identical to the numba
PrunedUniformSampler's (nodes, edges, order, CSR pointer, edge weights) with the same seed and call
key -- the torch path on CPU tensors, the Triton kernels in Triton's interpreter -- for rows shorter
than, equal to and longer than the threshold, fanouts below and at or above it (the whole window),
a hub row (Floyd's hashed branch on the CPU), isolated nodes, a fanout of -1 (the synced path);
one host sync per bounded batch; the window start's Lemire rejection redrawn as on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import PrunedUniformSampler
from gnnio.sampling.base import dst_ptr
from gnnio.sampling.gpu import count_syncs
from gnnio.sampling.pruned_torch import TorchPrunedSampler
from gnnio.sampling.threaded import call_key
from tests.helpers import run_in_triton_interpreter
from tests.test_labor_bounded import mixed_graph
from tests.test_labor_torch import same_batch

# (fanouts, prune): mixed_graph(0) has 1280 edges over 150 nodes (avg degree 8.53)
CASES = [
    ([4, 3], (0.0, 2.0)),  # thresholds 8, 6: Floyd inside the window
    ([5, 3], (0.0, 1.0)),  # 5, 3: fanout = threshold, the whole window from its start
    ([6, 2], (0.3, 0.0)),  # 3, 3: fanout above the threshold, the whole window
    ([40, 3], (1.0, 1.0)),  # 49, 12: the hub (300 neighbours) cut, 40 draws (hashed on the CPU)
    ([4, -1], (0.0, 2.0)),  # 8, 0: a hop of every neighbour (the synced path, not pruned)
]
WEIGHTS = ["ht", "ht_mean", "none"]


def _batches(fanouts, prune, weights, keys=(0, 1, 2)):
    """``(numba batch, torch batch, host syncs of the torch one)`` per call key."""
    g = mixed_graph(0)
    seeds = np.random.default_rng(len(fanouts)).permutation(g.num_nodes)[:48]
    if 7 not in seeds:
        seeds[0] = 7  # the hub
    cpu = PrunedUniformSampler(g, fanouts, prune=prune, seed=5, weights=weights)
    tch = TorchPrunedSampler(*g.to_torch(), fanouts, cpu.thresholds, weights)
    for e in keys:
        with count_syncs() as c:
            mb = tch.sample(torch.from_numpy(seeds), call_key(5, epoch_seed=e))
        yield cpu.sample(seeds, epoch_seed=e), mb, c.count
    loc, first = tch._take()  # the scratch at rest after the batches
    assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())


def _check(a, b) -> None:
    same_batch(a, b)
    assert a.meta == b.meta, (a.meta, b.meta)
    for blk in b.blocks:  # the CSR pointer is the edges' own
        assert torch.equal(blk.ptr, dst_ptr(blk.edge_index, blk.num_dst))


def test_the_graph_has_rows_below_at_and_above_the_thresholds():
    g = mixed_graph(0)
    deg = np.diff(g.indptr)
    for t in (8, 6, 5, 3, 12):
        assert (deg < t).any() and (deg == t).any() and (deg > t).any(), t
    assert (deg > 49).sum() >= 2  # rows cut by the 40-draw case's threshold
    assert deg[7] >= 300 and (deg == 0).sum() > 10  # the hub, isolated nodes


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_torch_path_batches_equal_numba(case, weights):
    """Without Triton (the CPU here): the bounded batch with the torch hop, one host sync (the
    synced path's ``1 + len(fanouts)`` with a fanout of -1)."""
    fanouts, prune = CASES[case]
    for a, b, syncs in _batches(fanouts, prune, weights):
        _check(a, b)
        assert syncs == (1 if min(fanouts) >= 0 else 1 + len(fanouts)), syncs


def test_the_window_wraps_around_the_row_end():
    """Windows that start near the row's end continue at its start: a cut row's sampled
    neighbours are CSR positions both before and after its start (a clipped window would never
    give a position below the start)."""
    g = mixed_graph(0)
    cpu = PrunedUniformSampler(g, [5], prune=(0.0, 1.0), seed=5)  # threshold 5 = fanout
    tch = TorchPrunedSampler(*g.to_torch(), [5], cpu.thresholds)
    ip, ix = np.asarray(g.indptr), np.asarray(g.indices)
    rows = np.flatnonzero(np.diff(ip) == 9)  # a window of 5 of 9 wraps for 4 starts of 9
    wrapped = 0
    for e in range(4):
        mb = tch.sample(torch.from_numpy(rows), call_key(5, epoch_seed=e))
        _check(cpu.sample(rows, epoch_seed=e), mb)
        src = mb.input_nodes[mb.blocks[0].edge_index[0]].view(-1, 5).numpy()
        for r, picked in zip(rows, src, strict=True):
            nb = list(ix[ip[r] : ip[r + 1]])
            wrapped += nb.index(picked[-1]) < nb.index(picked[0])  # (distinct neighbours here)
    assert wrapped > 0


def test_synced_path_equals_the_bounded_one():
    """The synced path (what a rejected fast draw or huge bounds fall back to) prunes too."""
    g = mixed_graph(0)
    for fanouts, prune in CASES[:4]:
        cpu = PrunedUniformSampler(g, fanouts, prune=prune, seed=5, weights="ht_mean")
        tch = TorchPrunedSampler(*g.to_torch(), fanouts, cpu.thresholds, "ht_mean")
        seeds = torch.arange(0, 150, 2)
        key = call_key(5, epoch_seed=3)
        _check(cpu.sample(seeds, epoch_seed=3), tch._weigh(tch._sample_synced(seeds, key)))


def test_bad_thresholds_and_seeds():
    g = mixed_graph(0)
    ip, ix = g.to_torch()
    with pytest.raises(ValueError, match="one >= 0 per hop"):
        TorchPrunedSampler(ip, ix, [4, 3], [8])
    s = TorchPrunedSampler(ip, ix, [4, 3], [8, 6])
    for bad, msg in (([5, 9, 5], "more than once"), ([3, 150], "out of range")):
        with pytest.raises(ValueError, match=msg):
            s.sample(torch.tensor(bad), 9)


# Lemire's rejection of the window's start: rows of 2**20 + 1 neighbours reject a draw with
# probability (2**20 - 4095) / 2**32 (about 1/4100), so among a few thousand call keys some reject
# the start draw of one of 8 such rows (found here from the draws themselves). The numba kernels
# redraw; so must the Triton kernel and the exact torch draws (the fast ones flag the batch, which
# the synced path then samples step by step). Fails when the start takes the first draw.
HUGE = (1 << 20) + 1
_M = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return z ^ (z >> 31)


def huge_graph() -> CSRGraph:
    """Rows 0..7 of ``HUGE`` neighbours among 64 nodes, the rest isolated."""
    rows = 8
    ip = np.zeros(65, dtype=np.int64)
    ip[1 : rows + 1] = np.arange(1, rows + 1) * HUGE
    ip[rows + 1 :] = rows * HUGE
    ix = np.random.default_rng(0).integers(0, 64, rows * HUGE).astype(np.int32)
    return CSRGraph(ip, ix)


def rejecting_epochs(seed: int, rows: int = 8, tries: int = 6000) -> list[int]:
    """Epoch seeds whose hop-0 window start is rejected at its first draw for some row."""
    from gnnio.sampling.threaded import hop_key

    thr = ((1 << 32) - HUGE) % HUGE
    out = []
    for e in range(tries):
        hk = hop_key(call_key(seed, epoch_seed=e), 0)
        for v in range(rows):
            r = _mix((_mix(hk ^ ((v * _GAMMA) & _M)) + _GAMMA) & _M) >> 32
            if (r * HUGE) & 0xFFFFFFFF < thr:
                out.append(e)
                break
    return out


def test_window_start_rejection_is_redrawn_like_numba():
    g = huge_graph()
    epochs = rejecting_epochs(5)
    assert len(epochs) >= 3, epochs
    cpu = PrunedUniformSampler(g, [3, 2], prune=(0.0, 3.0), seed=5)  # thresholds 9, 6
    tch = TorchPrunedSampler(*g.to_torch(), [3, 2], cpu.thresholds)
    synced = []
    real = tch._sample_synced
    tch._sample_synced = lambda s, k: synced.append(k) or real(s, k)
    seeds = torch.arange(8)
    for e in epochs[:3]:
        _check(cpu.sample(seeds, epoch_seed=e), tch.sample(seeds, call_key(5, epoch_seed=e)))
    assert len(synced) == 3  # the rejecting batches: fast torch draws flagged, drawn again


@pytest.mark.parametrize(
    "opts, want",
    [(dict(sampler_device="auto"), ("cuda", "gpu")), (dict(sampler_device="cuda", graph_in="host"),
     ("cuda", "host")), (dict(sampler_device="cpu"), (None, "gpu"))],
)  # fmt: skip
def test_train_builds_the_pruned_sampler_on_the_gpu(monkeypatch, opts, want):
    """``gnnio train --prune-threshold --device cuda`` samples on the GPU where the uniform
    sampler would (UVA included); ``--sampler-device cpu`` keeps the numba kernels."""
    import gnnio.sampling
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import build_sampler
    from tests.fake_cuda import fake_cuda

    fake_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 30, 1 << 31))
    built = {}

    class Pruned:
        def __init__(self, graph, fanouts, **kw):
            built.update(kw)

    monkeypatch.setattr(gnnio.sampling, "PrunedUniformSampler", Pruned)
    cfg = TrainConfig(device="cuda", prune_threshold=(1.0, 1.0), **opts)
    cfg._validate_sampler_device()
    build_sampler(type("DS", (), {"graph": mixed_graph(0)}), cfg, [5, 5], None)
    dev = built["device"]
    assert (None if dev is None else dev.type, built["graph_in"]) == want
    assert built["prune"] == (1.0, 1.0)


def test_bench_sampling_prune_threshold(tmp_path, capsys):
    """``gnnio bench sampling --prune-threshold`` times the pruned sampler (its thresholds in the
    JSON); a bad value or another sampler is one line and exit 2."""
    import json

    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "d")
    base = ["bench", "sampling", str(d), "--fanouts", "3,2", "--batch-size", "8", "--batches", "2",
            "--passes", "1", "--no-progress", "--json"]  # fmt: skip
    assert main([*base, "--prune-threshold", "0,1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["prune_thresholds"] == [3, 2]
    for extra, msg in ((["--prune-threshold", "0,0"], "not both 0"),
                       (["--prune-threshold", "1e30,1"], "at most 1e9"),  # (was an OverflowError)
                       (["--prune-threshold", "1,1", "--sampler", "labor"], "--sampler uniform")):  # fmt: skip
        assert main([*base, *extra]) == 2
        assert msg in capsys.readouterr().err


INTERP = r"""
import warnings
import numpy as np, torch
warnings.simplefilter("error", RuntimeWarning)  # a kernel that fell back fails the test
from gnnio.sampling import PrunedUniformSampler
from gnnio.sampling import _las_kernels as K
from gnnio.sampling._triton_hop import sample_hop_triton
from gnnio.sampling.gpu_graphed import sample_graphed
from gnnio.sampling.pruned_torch import TorchPrunedSampler
from gnnio.sampling.threaded import call_key, hop_key
from gnnio.utils.triton_kernels import kernels_report
from tests.test_pruned_gpu import CASES, WEIGHTS, _batches, _check, huge_graph, rejecting_epochs
from tests.test_labor_bounded import mixed_graph

for i, (fanouts, prune) in enumerate(CASES):
    for a, b, syncs in _batches(fanouts, prune, WEIGHTS[i % 3], keys=(3, 4)):
        _check(a, b)
        assert syncs == (1 if min(fanouts) >= 0 else 1 + len(fanouts)), (fanouts, syncs)
# the CUDA graph's launches (KEY_PTR: the hop keys read from device memory), run eagerly here
g = mixed_graph(0)
cpu = PrunedUniformSampler(g, [4, 3], prune=(0.0, 2.0), seed=5)
tch = TorchPrunedSampler(*g.to_torch(), [4, 3], cpu.thresholds)
seeds = torch.arange(1, 150, 3)
for e in (0, 1):
    mb = sample_graphed(tch, seeds, call_key(5, epoch_seed=e), capture=False)
    _check(cpu.sample(seeds.numpy(), epoch_seed=e), tch._weigh(mb))
# the window start's rejections, the hop kernel alone against the numba kernels
g = huge_graph()
ip, ix = g.to_torch()
ipn, ixn, dst = np.asarray(g.indptr), np.asarray(g.indices), np.arange(8, dtype=np.int64)
for e in rejecting_epochs(5)[:3]:
    hk = hop_key(call_key(5, epoch_seed=e), 0)
    offs, rows = np.empty(9, np.int64), np.empty((4, 8), np.int64)
    K.count_rows(ipn, dst, 3, 9, False, np.zeros(1, np.int64), np.zeros(0, np.int32), offs, rows)
    src, row, w = np.empty(24, np.int64), np.empty(24, np.int64), np.empty(0, np.float32)
    K.sample_rows(ixn, dst, 0, 8, offs, rows, np.uint64(hk), 3, 9, 1.0, False,
                  np.zeros(0, np.int32), K.W_NONE, src, row, w)
    s, r = sample_hop_triton(ip, ix, torch.from_numpy(dst), 3, hk, 24, theta=9)
    assert np.array_equal(s.numpy(), src) and np.array_equal(r.numpy(), row), e
rep = kernels_report()
assert rep["fallbacks"] == 0 and not rep["failed"], rep  # (torch: the fanout -1 hop's, as ever)
assert "triton" in rep["hop"] and rep["relabel"] == "triton", rep
print("ok")
"""


def test_triton_kernels_batches_equal_numba_with_one_host_sync():
    """The Triton kernels (interpreter): every case above, one sync per bounded batch; the
    graphed launches; the window start's rejections."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(INTERP)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in", ["gpu", "host"])
def test_pruned_sampler_on_cuda_equals_cpu(graph_in):  # pragma: no cover - GPU only
    from tests.helpers import random_graph

    g = random_graph(5000, 80000, seed=5)
    seeds = np.random.default_rng(5).permutation(5000)[:512]
    for prune in ((1.0, 1.0), (0.0, 1.0), (0.5, 0.0)):
        cpu = PrunedUniformSampler(g, [15, 10, 5], prune=prune, seed=0)
        gpu = PrunedUniformSampler(g, [15, 10, 5], prune=prune, seed=0, device="cuda",
                                   graph_in=graph_in)  # fmt: skip
        assert gpu.device.type == "cuda" and gpu.thresholds == cpu.thresholds
        for e in (0, 1):
            a, b = cpu.sample(seeds, epoch_seed=e), gpu.sample(seeds, epoch_seed=e)
            _check(a, b.to("cpu"))
