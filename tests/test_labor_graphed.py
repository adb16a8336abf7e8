"""LABOR-0's bounded batch replayed as a CUDA graph (gnnio/sampling/gpu_graphed.py with
labor_torch.labor_hop; issue 24): the LABOR kernels read each hop's key from the static device
buffer, so one capture serves every batch of a size. On the CPU the same launches run eagerly
(``capture=False``) in Triton's interpreter and must give the synced torch path's and the numba
LaborSampler's batches -- both designs, layer dependency on and off; the capture itself is a
``gpu`` test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import COUNTING_SPY, random_graph, run_in_triton_interpreter
from tests.test_labor_torch import same_batch

GRAPHED = (
    COUNTING_SPY
    + r"""
state["on"] = False  # count the graphed sampler's launches only (not the references')
import warnings
import numpy as np, torch
warnings.simplefilter("error", RuntimeWarning)  # a kernel that fell back fails the test
from gnnio.sampling import LaborSampler, _triton_labor, gpu_graphed
from gnnio.sampling import labor_torch as LT
from gnnio.sampling.labor_torch import TorchLaborSampler
from gnnio.sampling.threaded import call_key
from tests.helpers import shared_neighbourhood_graph
from tests.test_labor_bounded import GRAPHS
from tests.test_labor_torch import same_batch


for name in ("_count", "_select"):
    setattr(_triton_labor, name, Spy(name, getattr(_triton_labor, name)))
eager = []
real_bounded = LT.sample_bounded
LT.sample_bounded = lambda *a, **k: eager.append(1) or real_bounded(*a, **k)


def check(a, w, seeds):
    same_batch(w, a)
    assert torch.equal(a.seeds, torch.as_tensor(seeds, dtype=torch.int64))
    for x, y in zip(a.blocks, w.blocks, strict=True):
        assert torch.equal(x.ptr, y.ptr)


gpu_graphed.reset_graphed_report()
for make, fanouts in GRAPHS[:2]:
    g = make()
    rng = np.random.default_rng(len(fanouts))
    for design in ("fixed", "poisson"):
        for ld in (False, True):
            opts = {"design": design, "layer_dependency": ld, "weights": "ht"}
            cpu = LaborSampler(g, fanouts, seed=5, **opts)
            s = TorchLaborSampler(*g.to_torch(), fanouts, cuda_graph=True, **opts)
            ref = TorchLaborSampler(*g.to_torch(), fanouts, **opts)
            for e, b in enumerate([40, 17, 40]):  # a size again: its buffers, a new key
                seeds = rng.permutation(g.num_nodes)[:b]
                key = call_key(5, epoch_seed=e)
                state["on"] = True
                a = s.sample(torch.from_numpy(seeds), key)
                state["on"] = False
                check(a, cpu.sample(seeds, epoch_seed=e), seeds)
                check(a, ref._sample_synced(torch.from_numpy(seeds), key), seeds)
            loc, first = s._take()
            assert bool((loc == -1).all()), (design, ld)
            assert bool((first == torch.iinfo(torch.int64).max).all()), (design, ld)
# every LABOR launch read its key from the static buffer; no batch took the eager bounded path
assert keyed[("_select", True)] == launches["_select"] > 0, keyed
assert keyed[("_count", True)] == launches["_count"] > 0, keyed
assert not eager, len(eager)
rep = gpu_graphed.graphed_report()
assert rep["eager"] == 2 * 4 * 3 and rep["captured"] == 0 and rep["failed"] is None, rep

# bad seeds: the error, then the scratch at rest and the next batch right
s = TorchLaborSampler(*GRAPHS[0][0]().to_torch(), [4, 3], design="poisson", cuda_graph=True)
for bad, msg in (([5, 9, 5], "more than once"), ([3, 150], "out of range")):
    try:
        s.sample(torch.tensor(bad), 9)
        raise AssertionError(f"accepted {bad}")
    except ValueError as err:
        assert msg in str(err), (bad, err)
seeds = np.arange(0, 150, 3)
want = LaborSampler(GRAPHS[0][0](), [4, 3], seed=2, design="poisson").sample(seeds, epoch_seed=1)
check(s.sample(torch.from_numpy(seeds), call_key(2, epoch_seed=1)), want, seeds)

# a Poisson hop past its bound (no slack): that batch goes straight to the synced path
LT.POISSON_SLACK = 1
g = shared_neighbourhood_graph(30, 12)
cpu = LaborSampler(g, [4], seed=1, design="poisson")
s = TorchLaborSampler(*g.to_torch(), [4], design="poisson", cuda_graph=True)
synced = []
real = s._sample_synced
s._sample_synced = lambda sd, k: synced.append(k) or real(sd, k)
seeds = np.arange(12, 42)
for e in range(12):
    check(s.sample(torch.from_numpy(seeds), call_key(1, epoch_seed=e)),
          cpu.sample(seeds, epoch_seed=e), seeds)
assert 0 < len(synced) < 12 and not eager, (synced, len(eager))
print("ok")
"""
)


def test_graphed_labor_launches_give_the_synced_and_numba_batches():
    """The graph path's LABOR launches, run eagerly on CPU tensors: the numba sampler's and the
    synced path's batches (both designs, layer dependency on/off, a size again with a new key),
    bad seeds, and a Poisson hop past its bound (sampled by the synced path); every count and
    select launch read its key from the device buffer (a key baked into the launch would replay
    the captured batch's key for every later batch, which this fails on)."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(GRAPHED)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_cuda_graph_replays_the_eager_labor_batches(design):  # pragma: no cover
    """On a GPU: the second LABOR batch of a size is captured, later ones replayed, each equal to
    the eager bounded path's with the same key (weights too), also from a sampling thread."""
    import threading

    from gnnio.sampling import gpu_graphed
    from gnnio.sampling.labor_torch import TorchLaborSampler

    gpu_graphed.reset_graphed_report()
    g = random_graph(20000, 300000, 5)
    ip, ix = (t.cuda() for t in g.to_torch())
    opts = {"design": design, "layer_dependency": design == "poisson", "weights": "ht"}
    s = TorchLaborSampler(ip, ix, [15, 10, 5], cuda_graph=True, **opts)
    ref = TorchLaborSampler(ip, ix, [15, 10, 5], **opts)
    rng = np.random.default_rng(5)
    out = []

    def work() -> None:
        with torch.cuda.stream(torch.cuda.Stream()):
            for i in range(6):
                seeds = torch.from_numpy(rng.permutation(20000)[: 512 if i < 5 else 100])
                out.append((s.sample(seeds, i), ref.sample(seeds, i)))
            torch.cuda.current_stream().synchronize()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert len(out) == 6
    for a, w in out:
        same_batch(w.to("cpu"), a.to("cpu"))
    rep = gpu_graphed.graphed_report()
    assert rep["failed"] is None and rep["captured"] == 1 and rep["replayed"] == 4, rep


def test_cuda_graph_reaches_the_torch_labor_sampler(monkeypatch):
    """``--cuda-graph sampler|all`` -> ``build_sampler`` -> ``LaborSampler(cuda_graph=...)`` ->
    ``TorchLaborSampler.cuda_graph`` (placement faked: its topology on CPU tensors; there the
    eager bounded path samples, the same batches as the numba sampler)."""
    import types

    from gnnio import sampling
    from gnnio.sampling import LaborSampler
    from gnnio.sampling.threaded import call_key
    from gnnio.train import setup

    g = random_graph(300, 3000, 4)
    made = []

    class Fake:
        def __init__(self, *a, **kw):
            made.append(kw)

    monkeypatch.setattr(sampling, "LaborSampler", Fake)
    monkeypatch.setattr(setup, "sampler_placement", lambda ds, cfg: (None, "gpu"))
    ds = types.SimpleNamespace(graph=g)
    for mode, want in (("sampler", True), ("all", True), ("step", False), ("off", False)):
        cfg = types.SimpleNamespace(seed=0, threads=1, sampler="labor", cuda_graph=mode,
                                    prune_threshold=None, locality_scale=None)  # fmt: skip
        setup.build_sampler(ds, cfg, [3, 2], None)
        assert made.pop()["cuda_graph"] is want, mode
    monkeypatch.undo()
    monkeypatch.setattr(LaborSampler, "_device_topology", lambda self, gr, dev, gi: gr.to_torch())
    s = LaborSampler(g, [3, 2], seed=1, design="poisson", cuda_graph=True)
    assert s._torch is not None and s._torch.cuda_graph
    assert not LaborSampler(g, [3, 2], seed=1)._torch.cuda_graph
    monkeypatch.undo()
    seeds = np.arange(0, 300, 7)
    same_batch(LaborSampler(g, [3, 2], seed=1, design="poisson").sample(seeds, epoch_seed=2),
               s._torch.sample(torch.from_numpy(seeds), call_key(1, epoch_seed=2)))  # fmt: skip
