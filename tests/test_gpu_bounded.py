"""The GPU sampler's one-sync batch (gnnio/sampling/gpu_bounded.py, issue 24 item 3), on CPU
tensors: the same batches as the synced path (today's, ``len(fanouts) + 1`` syncs), at most 2 host
syncs per batch, bad seeds refused, and its Triton relabelling (in Triton's interpreter, a
subprocess) equal to the torch ops and falling back to them with one warning."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.graph import CSRGraph
from gnnio.sampling import gpu_bounded
from gnnio.sampling.gpu import TorchUniformSampler, count_syncs
from gnnio.utils.syncs import OpCounter
from tests.helpers import run_in_triton_interpreter


def _graph(n: int, m: int, seed: int) -> CSRGraph:
    rng = np.random.default_rng(seed)
    return CSRGraph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n)


def _same(a, b) -> None:
    assert torch.equal(a.input_nodes, b.input_nodes)
    assert a.meta["hop_nodes"] == b.meta["hop_nodes"]
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert torch.equal(x.edge_index, y.edge_index)
        assert torch.equal(x.ptr, y.ptr)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    m=st.integers(0, 400),
    fanouts=st.lists(st.integers(0, 7), min_size=1, max_size=3),
    frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
    key=st.integers(0, 2**64 - 1),
)
def test_bounded_batch_equals_the_synced_one(n, m, fanouts, frac, seed, key):
    """Random graphs (empty ones, isolated nodes, multi-edges), fanouts and seed sets: the
    one-sync batch is today's batch, node for node and edge for edge."""
    g = _graph(n, m, seed)
    s = TorchUniformSampler(*g.to_torch(), fanouts)
    seeds = torch.from_numpy(np.random.default_rng(seed).permutation(n)[: int(frac * n)])
    a = gpu_bounded.sample_bounded(s, seeds, key)
    assert a is not None  # (the fast draws never reject on rows this short)
    _same(a, s._sample_synced(seeds, key))
    loc, first = s._take()  # the scratch is back at rest: every loc -1, every first the sentinel
    assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())


def test_sample_takes_the_bounded_path_with_at_most_two_host_syncs(monkeypatch):
    """Every fanout >= 0: ``sample`` is the bounded batch, and it reads the device at most twice
    (once, at its end). Fails when an ``.item()``, ``nonzero`` or boolean mask comes back."""
    g = _graph(3000, 40000, 0)
    s = TorchUniformSampler(*g.to_torch(), [15, 10, 5])
    seeds = torch.from_numpy(np.random.default_rng(0).permutation(3000)[:256])
    s.sample(seeds, key=0)  # warm: the scratch tensors exist
    want = s._sample_synced(seeds, 1)

    def no_synced(*a, **k):
        raise AssertionError("the synced path ran")

    monkeypatch.setattr(s, "_sample_synced", no_synced)
    with count_syncs() as c, OpCounter() as oc:
        mb = s.sample(seeds, key=1)
    assert c.count <= 2 and oc.syncs <= 2, (c.ops, oc.sync_ops)
    assert c.count == 1, c.ops  # the end's .tolist() (OpCounter does not see it on the CPU)
    _same(mb, want)


@pytest.mark.parametrize("fanouts, slots", [([3, -1], None), ([3, 2], 20)])
def test_fanout_minus_one_and_huge_bounds_keep_the_synced_path(monkeypatch, fanouts, slots):
    if slots is not None:  # edge bounds 120 and 320 against a limit of 20
        monkeypatch.setattr(gpu_bounded, "MAX_EDGE_SLOTS", slots)
    g = _graph(200, 1500, 1)
    s = TorchUniformSampler(*g.to_torch(), fanouts)
    seeds = torch.arange(0, 200, 5)
    with count_syncs() as c:
        mb = s.sample(seeds, key=4)
    assert 1 < c.count <= 3, c.ops
    _same(mb, s._sample_synced(seeds, 4))


@pytest.mark.parametrize(
    "seeds, message",
    [([3, 7, 3], "node id 3 appears more than once"), ([1, 60, 2], "out of range"),
     ([-2, 1], "out of range"), ([0] * 10, "node id 0 appears more than once")],
)  # fmt: skip
def test_bad_seeds_are_refused_at_the_end_and_leave_the_scratch_clean(seeds, message):
    """Bad seeds are found by the end's one sync; meanwhile nothing reads or writes out of
    bounds (ten copies of one seed on a 10-node graph find more new nodes than the node buffer
    has slots: the writes past it are dropped), and the scratch is clean for the next batch."""
    g = _graph(10, 90, 2) if len(seeds) == 10 else _graph(50, 400, 2)
    s = TorchUniformSampler(*g.to_torch(), [4, 4])
    with pytest.raises(ValueError, match=message):
        s.sample(torch.tensor(seeds), key=1)
    good = torch.tensor([0, 4, 9])
    _same(s.sample(good, key=2), TorchUniformSampler(*g.to_torch(), [4, 4]).sample(good, key=2))


def test_bounds_hold_every_batch():
    rows, edges = gpu_bounded.bounds(1024, [15, 10, 5], 2**21, 33 * 2**20)
    assert rows == [1024, 16384, 180224, 1081344] and edges == [15360, 163840, 901120]
    assert gpu_bounded.bounds(8, [5, 5], 20, 30) == ([8, 20, 20], [30, 30])
    assert gpu_bounded.bounds(3, [0, 2], 10, 50) == ([3, 3, 9], [0, 6])


TRITON = r"""
import warnings
import numpy as np, torch
from hypothesis import given, settings, strategies as st
from gnnio.graph import CSRGraph
from gnnio.sampling import _triton_relabel, gpu_bounded
from gnnio.sampling.gpu import TorchUniformSampler
from gnnio.utils.triton_kernels import kernels_report, reset_kernel_record

calls = []
real = _triton_relabel.relabel_triton
_triton_relabel.relabel_triton = lambda *a, **k: calls.append(1) or real(*a, **k)

@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 40), m=st.integers(0, 300), seed=st.integers(0, 999),
       fanouts=st.lists(st.integers(0, 5), min_size=1, max_size=2), frac=st.floats(0, 1))
def same_as_synced(n, m, seed, fanouts, frac):
    rng = np.random.default_rng(seed)
    g = CSRGraph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n)
    s = TorchUniformSampler(*g.to_torch(), fanouts)
    seeds = torch.from_numpy(rng.permutation(n)[: int(frac * n)])
    a, b = s.sample(seeds, seed), s._sample_synced(seeds, seed)
    assert torch.equal(a.input_nodes, b.input_nodes), (fanouts, seed)
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.ptr, y.ptr)

with warnings.catch_warnings():
    warnings.simplefilter("error")  # no fallback here
    same_as_synced()
assert calls and kernels_report()["relabel"] == "triton", kernels_report()

# the hop kernel's bounded form: rows past `count` draw nothing (here their offsets point at
# the real rows' edges, which they would overwrite)
from gnnio.sampling._triton_hop import sample_hop_triton
rng = np.random.default_rng(1)
g = CSRGraph.from_edges(rng.integers(0, 300, 3000), rng.integers(0, 300, 3000), 300)
ip, ix = g.to_torch()
hub = int(torch.argmax(ip[1:] - ip[:-1]))
dst = torch.tensor([5, 17, 2, hub, hub, hub])
k = torch.clamp(ip[dst[:3] + 1] - ip[dst[:3]], max=4)
e = int(k.sum())
off = torch.cat([torch.cumsum(k, 0) - k, torch.zeros(3, dtype=torch.int64)])
src, row = sample_hop_triton(ip, ix, dst, 4, 77, e + 8, torch.tensor([3]), off)
want_src, want_row = sample_hop_triton(ip, ix, dst[:3], 4, 77, e)
assert torch.equal(src[:e], want_src) and torch.equal(row[:e], want_row)

# a kernel that cannot build (_commit, after the hop kernel's claims wrote `first`): one warning, then
# the torch ops, the same batches, and the report says so
reset_kernel_record()


def broken(*a, **k):
    raise RuntimeError("no PTX for you")
_triton_relabel._commit = type("K", (), {"__getitem__": lambda self, grid: broken})()
rng = np.random.default_rng(1)
g = CSRGraph.from_edges(rng.integers(0, 300, 3000), rng.integers(0, 300, 3000), 300)
s = TorchUniformSampler(*g.to_torch(), [4, 3])
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for key in range(3):
        seeds = torch.from_numpy(rng.permutation(300)[:40])
        a, b = s.sample(seeds, key), s._sample_synced(seeds, key)
        assert torch.equal(a.input_nodes, b.input_nodes)
        assert all(torch.equal(x.edge_index, y.edge_index) for x, y in zip(a.blocks, b.blocks))
mine = [x for x in w if "'relabel'" in str(x.message)]
assert len(mine) == 1 and "no PTX for you" in str(mine[0].message), [str(x.message) for x in w]
rep = kernels_report()
assert rep["relabel"] == "torch" and rep["fallbacks"] == 1 and "relabel" in rep["failed"], rep
print("ok")
"""


def test_triton_relabel_equals_the_synced_path_and_falls_back_once():
    pytest.importorskip("triton")
    run_in_triton_interpreter(TRITON)


def test_bench_step_times_the_relabelling_through_the_phase_hook():
    """``gnnio bench step``'s ``relabel`` part: the sampler marks each hop's relabelling on the
    bench's clock (no module function swapped); the hook is removed afterwards."""
    from gnnio.bench.step import _Clock, _relabel_hook

    inner = TorchUniformSampler(*_graph(300, 3000, 3).to_torch(), [5, 3])
    clock = _Clock(torch.device("cpu"))
    phases: list[str] = []
    real_mark = clock.mark
    clock.mark = lambda name: phases.append(name) or real_mark(name)
    undo = _relabel_hook(type("GpuSampler", (), {"_torch": inner})(), [clock])
    assert _relabel_hook(type("CpuSampler", (), {"_torch": None})(), [clock]) is None
    clock.begin()
    inner.sample(torch.arange(0, 300, 9), 1)
    assert phases == ["sample", "relabel"] * 2 and clock.ms["relabel"] > 0
    undo()
    assert inner.phase_hook is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batch_syncs_at_most_twice_and_equals_the_cpu_sampler():  # pragma: no cover - GPU
    """On a GPU, CUDA's own sync detector (``set_sync_debug_mode``) sees at most 2 host syncs in
    a batch of the GPU sampler (Triton hop and relabelling) with the seeds given as the loader
    gives them (a host array: their copy to the GPU may be the second), and the batch is the
    CPU's."""
    import warnings

    from gnnio.sampling import UniformSampler
    from gnnio.utils.triton_kernels import kernels_report, reset_kernel_record

    g = _graph(3000, 40000, 0)
    cpu = UniformSampler(g, [15, 10, 5], seed=0, num_threads=1)
    gpu = UniformSampler(g, [15, 10, 5], seed=0, device="cuda")
    seeds = np.random.default_rng(0).permutation(3000)[:256]
    reset_kernel_record()
    gpu.sample(seeds, epoch_seed=1)  # warm: the kernels are compiled, the scratch exists
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            mb = gpu.sample(seeds, epoch_seed=2)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [str(x.message) for x in w if "called a synchronizing" in str(x.message)]
    assert len(syncs) <= 2, syncs
    rep = kernels_report()  # before the CPU sampler below records its numba hop
    want = cpu.sample(seeds, epoch_seed=2)
    assert torch.equal(mb.input_nodes.cpu(), want.input_nodes)
    for x, y in zip(mb.blocks, want.blocks, strict=True):
        assert torch.equal(x.edge_index.cpu(), y.edge_index)
    assert rep["hop"] == "triton" and rep["relabel"] == "triton" and rep["fallbacks"] == 0, rep
