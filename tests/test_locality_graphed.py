"""Song & Jiang's locality-aware sampler replayed as a CUDA graph (gnnio/sampling/gpu_graphed.py
with locality_torch.las_hop; issue 24): the LAS kernel reads each hop's key *and the scale s*
from the graph's static input buffer, so one capture serves every batch of a size whatever key
and scale (Algorithm 2 changes s between epochs); ``s = 1`` batches draw uniformly, through a
graph of their own. On the CPU the same launches run eagerly (``capture=False``) in Triton's
interpreter and must give the eager LAS GPU path's and the numba LocalitySampler's batches;
a simulated graph (:data:`FAKE_GRAPH`: every Triton launch of the capture repeated with its
recorded arguments, as a CUDA graph repeats its pointers and scalars) shows that a replay
samples the key and scale uploaded for it; the real capture is a ``gpu`` test whose body also
runs here on the simulated graph."""

from __future__ import annotations

import contextlib
import threading
import warnings

import numpy as np
import pytest
import torch

from gnnio.sampling import LocalitySampler, gpu_graphed
from gnnio.sampling.threaded import call_key
from gnnio.utils import triton_kernels
from tests.helpers import COUNTING_SPY, random_graph, run_in_triton_interpreter
from tests.test_labor_bounded import mixed_graph
from tests.test_locality_gpu import HOT, SEEDS, pair
from tests.test_pruned_gpu import _check

#: a script's start (Triton's interpreter): torch.cuda.CUDAGraph, gnnio's capture and
#: ``sample_graphed(capture=True)`` faked on the CPU. The capture runs the batch's launches and
#: records every Triton launch (kernel, grid, arguments); a replay runs the launches again with
#: each Triton launch's *recorded* arguments -- the capture's pointers and scalars, as a CUDA
#: graph replays them -- so a key, scale or buffer baked into the capture shows as a wrong batch.
FAKE_GRAPH = r"""
import contextlib
import torch
from gnnio.sampling import _triton_hop, _triton_las, _triton_relabel, gpu_graphed

_MODE = {"graph": None, "replay": None}


class Frozen:
    def __init__(self, name, real):
        self.name, self.real = name, real

    def __getitem__(self, grid):
        def run(*a, **k):
            g, r = _MODE["graph"], _MODE["replay"]
            if g is not None:
                g.launches.append((self.name, grid, a, k))
            if r is not None:  # the capture's launch, whatever this batch's Python passed
                name, grid0, a0, k0 = r.launches[r.at]
                r.at += 1
                assert name == self.name, (name, self.name)
                return self.real[grid0](*a0, **k0)
            return self.real[grid](*a, **k)

        return run


for mod, names in ((_triton_hop, ["_hop"]), (_triton_las, ["_las"]),
                   (_triton_relabel, ["_claim", "_flag", "_commit", "_seeds", "_reset"])):
    for name in names:
        setattr(mod, name, Frozen(name, getattr(mod, name)))


class FakeGraph:
    def __init__(self):
        self.launches, self.run, self.at = [], None, 0

    def replay(self):
        _MODE["replay"], self.at = self, 0
        try:
            self.run()
        finally:
            _MODE["replay"] = None
        assert self.at == len(self.launches), (self.at, len(self.launches))


@contextlib.contextmanager
def fake_capture(g, dev):
    _MODE["graph"] = g
    try:
        yield
    finally:
        _MODE["graph"] = None


_launch = gpu_graphed.launch


def recording_launch(*a, **k):
    if _MODE["graph"] is not None:
        _MODE["graph"].run = lambda: _launch(*a, **k)
    return _launch(*a, **k)


_sample_graphed = gpu_graphed.sample_graphed
torch.cuda.CUDAGraph = FakeGraph
gpu_graphed.capture_graph = fake_capture
gpu_graphed.launch = recording_launch
gpu_graphed.sample_graphed = lambda *a, **k: _sample_graphed(*a, **{**k, "capture": True})
"""

#: the scales of a run's batches (Algorithm 2's changes between epochs, compressed): a capture
#: at s = 8, replays at 2, 0.5 (non-members capped) and 1000 (members capped), and s = 1's
#: uniform batches -- a graph of their own -- in between
SCALES = (8.0, 8.0, 2.0, 1.0, 1.0, 0.5, 1000.0)


def graph_counts(scales=SCALES) -> dict:
    """``graphed_report()["by_sampler"]`` of one buffer set that samples batches of one size at
    ``scales`` with captures on: per kind of hop the first batch eager, the second captured
    (and replayed), the rest replayed."""
    out = {}
    for name, n in (("locality", sum(s != 1.0 for s in scales)),
                    ("uniform", sum(s == 1.0 for s in scales))):  # fmt: skip
        if n:
            out[name] = {"eager": 1, "captured": int(n > 1), "replayed": n - 1}
    return out


#: the GPU test's cases: (graph, fanouts, prune, weights) -- every weight mode, windows on and
#: off, and mixed_graph(0)'s hub drawn 40 of
DEVICE_CASES = [("random", [15, 10, 5], None, "ht"),
                ("random", [15, 10, 5], (1.0, 1.0), "ht_mean"),
                ("random", [15, 10, 5], None, "none"),
                ("mixed", [40, 3], (1.0, 1.0), "ht")]  # fmt: skip


def _sample_scales(dev, ids, out: list) -> None:
    """A sampling thread's batches at :data:`SCALES` (on a GPU on a stream of its own)."""
    cuda = dev.device.type == "cuda"
    with torch.cuda.stream(torch.cuda.Stream()) if cuda else contextlib.nullcontext():
        for e, s in enumerate(SCALES):
            dev.scale = s
            out.append(dev.sample(ids, epoch_seed=e))
        if cuda:
            torch.cuda.current_stream().synchronize()


def replays_equal_numba(graph_in: str = "gpu", cases=DEVICE_CASES, nodes: int = 5000,
                        edges: int = 80000, seeds: int = 512) -> None:  # fmt: skip
    """Each case's LocalitySampler with ``cuda_graph`` samples :data:`SCALES` from a sampling
    thread (on a stream of its own on a GPU): every batch equal to the numba sampler's with the
    same key and scale (weights bit for bit), each kind of hop captured once per case and then
    replayed (:func:`graph_counts`), no capture failure, no kernel fallback, no warning of ours."""
    from gnnio.utils.triton_kernels import kernels_report, reset_kernel_record

    graphs = {"random": random_graph(nodes, edges, seed=5), "mixed": mixed_graph(0)}
    gpu_graphed.reset_graphed_report()
    reset_kernel_record()
    for name, fanouts, prune, weights in cases:
        g = graphs[name]
        n = int(g.indptr.shape[0]) - 1
        hot = HOT if name == "mixed" else np.random.default_rng(1).permutation(n)[: n // 10]
        ids = SEEDS if name == "mixed" else np.random.default_rng(5).permutation(n)[:seeds]
        kw = dict(hot_ids=hot, scale=8.0, seed=0, prune=prune, weights=weights)
        cpu = LocalitySampler(g, fanouts, **kw)
        out: list = []
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            dev = LocalitySampler(g, fanouts, device="cuda", graph_in=graph_in, cuda_graph=True,
                                  **kw)  # fmt: skip
            assert dev._torch is not None and dev._torch.cuda_graph
            t = threading.Thread(target=_sample_scales, args=(dev, ids, out))
            t.start()
            t.join()
        assert len(out) == len(SCALES)
        for e, (s, b) in enumerate(zip(SCALES, out, strict=True)):
            cpu.scale = s
            _check(cpu.sample(ids, epoch_seed=e), b.to("cpu"))
        ours = [str(w.message) for w in said if "locality-aware" in str(w.message)
                or "Triton kernel" in str(w.message) or "cuda-graph" in str(w.message)]  # fmt: skip
        assert not ours, ours
    rep = gpu_graphed.graphed_report()
    want = {k: {c: len(cases) * v for c, v in d.items()} for k, d in graph_counts().items()}
    assert rep["failed"] is None and rep["by_sampler"] == want, rep
    kr = kernels_report()
    assert kr["las_hop"] == "triton" and kr["fallbacks"] == 0, kr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in", ["gpu", "host"])
def test_cuda_graph_replays_the_numba_las_batches(graph_in):  # pragma: no cover - GPU only
    """On a GPU (compiled kernels, a real capture on a sampling thread's stream): every
    batch of :data:`SCALES` -- captured once, replayed with each batch's key and scale --
    equals the numba sampler's (:func:`replays_equal_numba`), UVA sampling too."""
    replays_equal_numba(graph_in)


_DRY = (
    FAKE_GRAPH
    + r"""
from gnnio.sampling import UniformSampler
from tests.test_locality_graphed import DEVICE_CASES, replays_equal_numba

def topology(self, graph, device, graph_in):  # CPU tensors standing in for the device's
    self.graph_in, self._pins = graph_in, []
    return graph.to_torch()

UniformSampler._device_topology = topology
replays_equal_numba("gpu", [DEVICE_CASES[2], DEVICE_CASES[3]], nodes=300, edges=3000, seeds=24)
print("ok")
"""
)


def test_the_gpu_tests_body_runs_on_the_simulated_graph():
    """The gpu-marked test's own body (:func:`replays_equal_numba`: a sampling thread,
    captures, replays at changing scales, the report's counts) in Triton's interpreter on the
    simulated graph (:data:`FAKE_GRAPH`), on a small graph: weights ``none`` with windows, and
    the hub drawn 40 of; so the GPU session spends its minutes on the device, not on a broken
    test."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(_DRY, timeout=900)


_EAGER = (
    COUNTING_SPY
    + r"""
state["on"] = False  # count the graphed sampler's launches only (not the references')
import warnings
import numpy as np, torch
warnings.simplefilter("error", RuntimeWarning)  # a kernel that fell back fails the test
warnings.filterwarnings("ignore", module="triton")  # (NumPy's overflows in the interpreter)
from gnnio.sampling import _triton_las, gpu_graphed
from gnnio.sampling import locality_torch as LT
from gnnio.sampling.locality_torch import TorchLocalitySampler
from gnnio.sampling.threaded import call_key
from tests.test_locality_gpu import SEEDS, pair
from tests.test_locality_graphed import SCALES
from tests.test_pruned_gpu import _check

_triton_las._las = Spy("_las", _triton_las._las)
eager = []
real_bounded = LT.sample_bounded
LT.sample_bounded = lambda *a, **k: (state["on"] and eager.append(1)) or real_bounded(*a, **k)

gpu_graphed.reset_graphed_report()
cases = [([4, 3], None, "ht"), ([4, 3], (0.0, 2.0), "ht_mean"), ([4, 3], (0.0, 2.0), "none")]
scales = [SCALES[i] for i in (0, 2, 3, 5, 6)]  # 8, 2, 1, 0.5, 1000
for fanouts, prune, weights in cases:
    cpu, ref = pair(fanouts, 8.0, prune, weights)
    s = TorchLocalitySampler(ref.indptr, ref.indices, cpu.fanouts, cpu.thresholds, weights,
                             ref._q, cpu._sample_key, cuda_graph=True)
    for e, (sc, b) in enumerate(zip(scales, [42, 17, 42, 42, 17])):
        seeds = torch.from_numpy(SEEDS[:b])
        key = call_key(5, epoch_seed=e)
        cpu.scale = sc
        state["on"] = True
        a = s.sample(seeds, key, sc)
        state["on"] = False
        assert torch.equal(a.seeds, seeds) and a.meta["scale"] == sc
        _check(cpu.sample(SEEDS[:b], epoch_seed=e), a)
        if e < 2 or weights == "none":  # (the eager LAS GPU path: the same batch)
            _check(ref.sample(seeds, key, sc), a)
    loc, first = s._take()
    assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())
# every LAS launch read its key (and so its scale: the same buffer) from the static buffer;
# no batch took the eager bounded path
assert keyed[("_las", True)] == launches["_las"] > 0 and ("_las", False) not in keyed, keyed
assert not eager, len(eager)
rep = gpu_graphed.graphed_report()
assert rep["captured"] == 0 and rep["failed"] is None, rep
assert rep["by_sampler"] == {"locality": {"captured": 0, "replayed": 0, "eager": 12},
                             "uniform": {"captured": 0, "replayed": 0, "eager": 3}}, rep

# bad seeds: the error, then the scratch at rest and the next batch right
cpu, ref = pair([4, 3], 8.0)
s = TorchLocalitySampler(ref.indptr, ref.indices, cpu.fanouts, cpu.thresholds, "ht", ref._q,
                         cpu._sample_key, cuda_graph=True)
for bad, msg in (([5, 9, 5], "more than once"), ([3, 150], "out of range")):
    try:
        s.sample(torch.tensor(bad), 9, 8.0)
        raise AssertionError(f"accepted {bad}")
    except ValueError as err:
        assert msg in str(err), (bad, err)
_check(cpu.sample(SEEDS, epoch_seed=1), s.sample(torch.from_numpy(SEEDS), call_key(5, epoch_seed=1), 8.0))
loc, first = s._take()
assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())
print("ok")
"""
)


def test_graphed_las_launches_give_the_eager_and_numba_batches():
    """The graph path's LAS launches, run eagerly from the static buffers on CPU tensors: the
    numba sampler's and the eager LAS GPU path's batches -- pruning windows on and off, every
    weight mode, scales 8, 2, 1 (uniform hops), 0.5 and 1000 (capping both ways), two batch
    sizes --, bad seeds refused with the scratch at rest after; every LAS launch read its key
    from the device buffer (``KEY_PTR``) and none went through the eager bounded path."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(_EAGER, timeout=900)


_REPLAY = (
    FAKE_GRAPH
    + r"""
import numpy as np, torch
from gnnio.sampling import gpu_graphed
from gnnio.sampling.locality_torch import TorchLocalitySampler
from gnnio.sampling.threaded import call_key
from tests.test_locality_gpu import SEEDS, pair
from tests.test_locality_graphed import SCALES, graph_counts
from tests.test_pruned_gpu import _check

gpu_graphed.reset_graphed_report()
cpu, ref = pair([4, 3], 8.0, (0.0, 2.0), "ht")
s = TorchLocalitySampler(ref.indptr, ref.indices, cpu.fanouts, cpu.thresholds, "ht", ref._q,
                         cpu._sample_key, cuda_graph=True)
for e, sc in enumerate(SCALES):
    cpu.scale = sc
    _check(cpu.sample(SEEDS, epoch_seed=e), s.sample(torch.from_numpy(SEEDS),
                                                     call_key(5, epoch_seed=e), sc))
rep = gpu_graphed.graphed_report()
assert rep["failed"] is None and rep["by_sampler"] == graph_counts(), rep
print("ok")
"""
)


def test_a_replay_samples_its_own_key_and_scale():
    """On the simulated graph (:data:`FAKE_GRAPH`): the LAS batch captured at s = 8 and
    replayed at s = 2, 0.5 and 1000 with new keys, and s = 1's uniform graph between them,
    give the numba batches of each key and scale -- the scale a device-held value the captured
    kernel reads, not the capture's (a replay with the capture's scale or key fails here)."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(_REPLAY, timeout=900)


_CANNOT = r"""
import warnings
import torch
from gnnio.sampling import gpu_graphed
from gnnio.sampling.locality_torch import TorchLocalitySampler
from gnnio.sampling.threaded import call_key
from gnnio.utils.triton_kernels import kernels_report
from tests.test_locality_gpu import SEEDS, pair
from tests.test_pruned_gpu import _check

gpu_graphed.reset_graphed_report()
cpu, ref = pair([4, -1], 8.0)
s = TorchLocalitySampler(ref.indptr, ref.indices, cpu.fanouts, cpu.thresholds, "ht", ref._q,
                         cpu._sample_key, cuda_graph=True)
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    for e in range(3):
        b = s.sample(torch.from_numpy(SEEDS), call_key(5, epoch_seed=e), 8.0)
        _check(cpu.sample(SEEDS, epoch_seed=e), b)
msgs = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)
        and "triton" not in w.filename]  # (NumPy's overflows in the interpreter aside)
assert len(msgs) == 1 and "not replayed as CUDA graphs" in msgs[0], msgs
assert "a fanout of -1" in msgs[0], msgs
rep = gpu_graphed.graphed_report()
assert rep["by_sampler"] == {} and rep["eager"] == 0, rep
assert kernels_report()["las_hop"] == "triton"  # (the synced path, on the device)
print("ok")
"""


def test_where_it_cannot_replay_one_warning_says_why():
    """``cuda_graph`` with a fanout of -1 (no bounded batch to capture): one warning that the
    batches are not replayed and why, however many batches follow; they are sampled on the
    device (the synced path, in Triton's interpreter), every batch the numba one, and the
    report counts none."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(_CANNOT)


def test_a_failed_las_kernel_on_the_graphed_path_warns_once(monkeypatch):
    """The LAS kernel failing while the graph path runs its launches: one warning (the
    kernel's, naming the error), that batch and the next from the CPU kernels (the same
    batches), no second warning that nothing replays."""
    from gnnio.sampling import _triton_las, locality_torch

    monkeypatch.setattr(triton_kernels, "_FAILED", {})
    monkeypatch.setattr(triton_kernels, "_RAN", {})

    def usable(dev, kernel) -> bool:  # (Triton for the LAS and hop kernels, until one fails)
        return kernel in ("las_hop", "sample_hop") and kernel not in triton_kernels._FAILED

    monkeypatch.setattr(locality_torch, "triton_available", usable)
    monkeypatch.setattr(gpu_graphed, "triton_available", lambda dev, kernel: True)
    calls = []

    def broken(*a, **k):
        calls.append(isinstance(a[6], torch.Tensor))  # (the key: the graph's buffer)
        raise RuntimeError("no PTX for you")

    monkeypatch.setattr(_triton_las, "sample_las_triton", broken)
    cpu, ref = pair([4, 3], 8.0, (0.0, 2.0))
    s = locality_torch.TorchLocalitySampler(ref.indptr, ref.indices, cpu.fanouts,
                                            cpu.thresholds, "ht", ref._q, cpu._sample_key,
                                            cuda_graph=True)  # fmt: skip
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for e in range(3):
            b = s.sample(torch.from_numpy(SEEDS), call_key(5, epoch_seed=e), 8.0)
            _check(cpu.sample(SEEDS, epoch_seed=e), b)
    msgs = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "las_hop" in msgs[0] and "no PTX for you" in msgs[0], msgs
    assert calls == [True]  # tried once, on the graph path
    assert triton_kernels.kernels_report()["las_hop"] == "numba"
