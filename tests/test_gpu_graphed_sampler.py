"""The GPU sampler's batch as a CUDA graph (:mod:`gnnio.sampling.gpu_graphed`, issue 24): the
batch's launches read their seeds and hop keys from a static device buffer, so one capture
serves every batch of a size. On the CPU the same launches run eagerly (``capture=False``) --
the Triton kernels in Triton's interpreter -- and must give the eager bounded path's batches
(the synced path's, which the other GPU-sampler tests tie to the CPU sampler); the capture
itself is a ``gpu`` test."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from gnnio.sampling import gpu_graphed
from gnnio.sampling.gpu import TorchUniformSampler
from tests.helpers import COUNTING_SPY, random_graph, run_in_triton_interpreter


def _equal(a, b) -> None:
    assert torch.equal(a.seeds.to(torch.int64), b.seeds.to(torch.int64))
    assert torch.equal(a.input_nodes, b.input_nodes)
    assert a.meta["hop_nodes"] == b.meta["hop_nodes"]
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.ptr, y.ptr)


GRAPHED = (
    COUNTING_SPY
    + r"""
state["on"] = False  # count the graphed sampler's launches only (not the reference's)
import numpy as np, torch
from gnnio.sampling import _triton_hop, _triton_relabel, gpu_graphed
from gnnio.sampling.gpu import TorchUniformSampler
from gnnio.utils.syncs import OpCounter
from tests.helpers import random_graph


_triton_hop._hop = Spy("_hop", _triton_hop._hop)
for name in ("_claim", "_flag", "_commit", "_seeds", "_reset"):
    setattr(_triton_relabel, name, Spy(name, getattr(_triton_relabel, name)))

g = random_graph(600, 8000, 3)
rng = np.random.default_rng(3)
for fanouts in ([15, 10, 5], [4, 3]):
    s = TorchUniformSampler(*g.to_torch(), fanouts, cuda_graph=True)
    ref = TorchUniformSampler(*g.to_torch(), fanouts)
    for i, b in enumerate([64, 17, 64, 0, 64, 17, 5, 64]):
        seeds = torch.from_numpy(rng.permutation(600)[:b])
        held = seeds.clone()
        state["on"] = True
        a = s.sample(seeds, 100 + i)
        state["on"] = False
        w = ref._sample_synced(seeds, 100 + i)
        assert torch.equal(a.seeds, w.seeds), i
        assert torch.equal(a.input_nodes, w.input_nodes), (fanouts, i, b)
        for x, y in zip(a.blocks, w.blocks, strict=True):
            assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.ptr, y.ptr), (i, b)
        assert torch.equal(seeds, held)
    for bad, msg in (([5, 9, 5], "more than once"), ([3, 600], "out of range"), ([-1], "range")):
        try:
            s.sample(torch.tensor(bad), 9)
            raise AssertionError(f"accepted {bad}")
        except ValueError as e:
            assert msg in str(e), (bad, e)
    seeds = torch.from_numpy(rng.permutation(600)[:64])
    a, w = s.sample(seeds, 7), ref._sample_synced(seeds, 7)
    assert torch.equal(a.input_nodes, w.input_nodes)
    loc, first = s._take()
    assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())
# every hop read its key from the static buffer, every batch end reset by the device count
assert keyed[("_hop", True)] == launches["_hop"] > 0 and ("_hop", False) not in keyed, keyed
assert keyed[("_reset", True)] > 0, keyed
rep = gpu_graphed.graphed_report()
assert rep["eager"] > 20 and rep["captured"] == 0 and rep["failed"] is None, rep  # a CPU: eager

# host work of one batch (on a GPU the launches are one replay): the upload, then after the
# read the batch's arrays -- everything else is captured
s = TorchUniformSampler(*g.to_torch(), [15, 10, 5], cuda_graph=True)
seeds = torch.from_numpy(rng.permutation(600)[:64])
s.sample(seeds, 0)
c = OpCounter()
with c:
    s.sample(seeds, 1)
print("ops", c.ops, "syncs", c.syncs)
assert c.syncs == 0, c.syncs
print("ok")
"""
)


def test_graphed_launches_give_the_eager_batches():
    """The graph path's launches, run eagerly on CPU tensors, give the synced path's batches for
    changing batch sizes, an empty batch and bad seeds; every hop read its key from the device
    buffer (a key baked into the launch would replay one key for every batch: each batch would
    then equal the first one's draws, which this fails on) and the scratch is at rest after."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(GRAPHED)


def test_a_failed_capture_warns_once_and_samples_eagerly(monkeypatch):
    """Where capturing fails (here: no CUDA at all), one warning says so, the report keeps the
    reason, and every batch is still the eager path's."""
    monkeypatch.setattr(gpu_graphed, "_usable", lambda sampler, hop=None: True)
    gpu_graphed.reset_graphed_report()
    g = random_graph(500, 6000, 11)
    s = TorchUniformSampler(*g.to_torch(), [5, 3])
    ref = TorchUniformSampler(*g.to_torch(), [5, 3])
    rng = np.random.default_rng(11)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            seeds = torch.from_numpy(rng.permutation(500)[:40])
            mb = gpu_graphed.sample_graphed(s, seeds, i, capture=True)
            _equal(mb, ref._sample_synced(seeds, i))
    msgs = [str(w.message) for w in caught if "capturing the sampler failed" in str(w.message)]
    assert len(msgs) == 1, [str(w.message) for w in caught]
    rep = gpu_graphed.graphed_report()
    assert rep["failed"] and rep["captured"] == 0 and rep["eager"] == 4, rep
    gpu_graphed.reset_graphed_report()


@pytest.mark.parametrize("kind", ["uniform", "labor"])
def test_a_batch_that_cannot_be_replayed_warns_once(kind):
    """``cuda_graph`` asked for, the batch not graphable (a fanout of -1): one warning per sampler
    says its batches launch eagerly, and they are the eager sampler's (no silent slow path)."""
    from gnnio.sampling.labor_torch import TorchLaborSampler

    cls = TorchUniformSampler if kind == "uniform" else TorchLaborSampler
    g = random_graph(300, 3000, 5)
    s, ref = cls(*g.to_torch(), [-1, 3], cuda_graph=True), cls(*g.to_torch(), [-1, 3])
    rng = np.random.default_rng(5)
    with warnings.catch_warnings(record=True) as caught:  # an empty batch: nothing to replay
        warnings.simplefilter("always")
        _equal(s.sample(torch.arange(0), 0), ref.sample(torch.arange(0), 0))
    assert not [w for w in caught if "CUDA graph" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            seeds = torch.from_numpy(rng.permutation(300)[:30])
            _equal(s.sample(seeds, i), ref.sample(seeds, i))
    msgs = [str(w.message) for w in caught if "not replayed as CUDA graphs" in str(w.message)]
    assert len(msgs) == 1, [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as caught:  # without cuda_graph: nothing to say
        warnings.simplefilter("always")
        ref.sample(torch.arange(30), 9)
    assert not [w for w in caught if "CUDA graph" in str(w.message)]


class _FakeGraph:
    """A CUDA graph on the CPU: the "capture" runs the batch's launches (recorded by
    :func:`_fake_capture`'s wrapper of ``launch``); the first replay after it is that run, later
    replays run the recorded launches again and write their outputs where the capture's are (a
    real replay writes the addresses baked in at capture)."""

    recording = None

    def __init__(self) -> None:
        self.thunk = self.out = None
        self.fresh = True

    def replay(self) -> None:
        if self.fresh:
            self.fresh = False
            return
        for (a, b), (c, d) in zip(self.out, self.thunk(), strict=True):
            a.copy_(c)
            b.copy_(d)


class _FakeStream:
    synced = 0

    def synchronize(self) -> None:
        _FakeStream.synced += 1


class _FakeCaptureStream:
    def __init__(self, graph, stream=None, capture_error_mode="global") -> None:
        self.graph = graph

    def __enter__(self) -> None:
        _FakeGraph.recording = self.graph

    def __exit__(self, *exc) -> None:
        _FakeGraph.recording = None


def _fake_capture(monkeypatch) -> None:
    """gnnio's real :func:`gnnio.utils.capture.capture` (its lock, its thread flag) around
    ``torch.cuda.graph`` / ``CUDAGraph`` / ``Stream`` fakes that run on the CPU."""
    real = gpu_graphed.launch

    def launch(*a, **k):
        out = real(*a, **k)
        if _FakeGraph.recording is not None:
            _FakeGraph.recording.thunk = lambda: real(*a, **k)
            _FakeGraph.recording.out = out
        return out

    monkeypatch.setattr(gpu_graphed, "launch", launch)
    monkeypatch.setattr(gpu_graphed, "_usable", lambda sampler, *a: True)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", _FakeCaptureStream)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(_FakeStream, "synced", 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_the_second_batch_is_captured_and_later_ones_replayed(monkeypatch):
    """The capture path itself, on the CPU with a fake graph: a buffer set's second batch is
    captured through gnnio's capture (its lock taken), later ones replayed, every batch the
    synced path's. Fails when the capture is not entered (``sample_graphed`` once called its
    own ``capture`` argument, a bool: every capture failed) or a replay is not one."""
    from gnnio.utils import capture

    _fake_capture(monkeypatch)
    held = []
    monkeypatch.setattr(_FakeCaptureStream, "__enter__",
                        lambda self: held.append(capture.CAPTURE_LOCK.locked())
                        or setattr(_FakeGraph, "recording", self.graph))  # fmt: skip
    gpu_graphed.reset_graphed_report()
    g = random_graph(500, 6000, 13)
    s = TorchUniformSampler(*g.to_torch(), [5, 3])
    ref = TorchUniformSampler(*g.to_torch(), [5, 3])
    rng = np.random.default_rng(13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "capturing the sampler failed"
        for i in range(5):
            seeds = torch.from_numpy(rng.permutation(500)[:40])
            mb = gpu_graphed.sample_graphed(s, seeds, i, capture=True)
            _equal(mb, ref._sample_synced(seeds, i))
    rep = gpu_graphed.graphed_report()
    counts = {"captured": 1, "replayed": 4, "eager": 1}
    assert rep == {**counts, "failed": None, "by_sampler": {"uniform": counts}}, rep
    assert held == [True]
    assert _FakeStream.synced == 1  # the capture waited for its stream (utils.capture)
    # a replay records its kernels in the run's report, as a launch does (the record may have
    # been reset since the capture: --isolation auto's profiling)
    from gnnio.utils.triton_kernels import kernels_report, reset_kernel_record

    reset_kernel_record()
    gpu_graphed.sample_graphed(s, seeds, 9, capture=True)
    kern = kernels_report()
    assert "triton" in kern.get("hop", "") and "triton" in kern.get("relabel", ""), kern
    gpu_graphed.reset_graphed_report()


def test_a_replayed_batch_is_about_twenty_host_ops(monkeypatch):
    """The host's work of a replayed batch, the replay itself faked as nothing: the upload and
    the batch's arrays cut from one ``cat`` -- 20 torch ops on CPU tensors (gpu_graphed's
    docstring: about 21 with the replay, for 22 ops + 11 launches eagerly), no host read
    dispatched. Fails when a replayed batch runs its launches again (checked by hand)."""
    from gnnio.utils.syncs import OpCounter

    _fake_capture(monkeypatch)
    gpu_graphed.reset_graphed_report()
    g = random_graph(600, 8000, 3)
    s = TorchUniformSampler(*g.to_torch(), [15, 10, 5])
    seeds = torch.from_numpy(np.random.default_rng(3).permutation(600)[:64])
    for i in range(3):  # eager, captured, replayed
        gpu_graphed.sample_graphed(s, seeds, i, capture=True)
    monkeypatch.setattr(_FakeGraph, "replay", lambda self: None)
    with OpCounter() as c:
        gpu_graphed.sample_graphed(s, seeds, 3, capture=True)
    assert gpu_graphed.graphed_report()["replayed"] == 3
    assert c.syncs == 0 and c.ops <= 20, (c.ops, c.syncs)
    gpu_graphed.reset_graphed_report()


def test_a_kernel_failing_inside_a_capture_fails_the_capture_not_the_kernel(monkeypatch):
    """A Triton launch that raises while the stream captures (on a GPU: a launch refused
    there) fails the capture -- one warning, the batch run eagerly -- and is not recorded as a
    Triton kernel that cannot build: no torch fallback captured into the graph, the kernel
    kept for the eager batches, ``kernels`` with no fallback (gpu-check would mark the run
    failed). Fails when ``kernel_failed`` does not re-raise inside a capture."""
    import types

    from gnnio.sampling import gpu_bounded as gb
    from gnnio.utils import capture, triton_kernels

    def seeds(*a):
        if capture.capturing():
            raise RuntimeError("fake: launch refused while the stream captures")
        gb.seeds_torch(*a)

    def relabel(src, ecnt, loc, first, nodes, meta, h, cap, out, claimed, nxt=None):
        return gb.relabel_step_torch(src, ecnt, loc, first, nodes, meta, h, cap, nxt)

    fake = types.SimpleNamespace(seeds_triton=seeds, reset_triton=gb._reset_torch,
                                 relabel_triton=relabel)  # fmt: skip
    monkeypatch.setattr(gb, "_triton", lambda dev, kernel: fake if kernel == "relabel" else None)
    monkeypatch.setattr(triton_kernels, "_FAILED", {})
    _fake_capture(monkeypatch)
    gpu_graphed.reset_graphed_report()
    g = random_graph(500, 6000, 17)
    s = TorchUniformSampler(*g.to_torch(), [5, 3])
    ref = TorchUniformSampler(*g.to_torch(), [5, 3])
    rng = np.random.default_rng(17)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            seeds_ = torch.from_numpy(rng.permutation(500)[:40])
            _equal(gpu_graphed.sample_graphed(s, seeds_, i, capture=True),
                   ref._sample_synced(seeds_, i))  # fmt: skip
    msgs = [str(w.message) for w in caught]
    assert sum("capturing the sampler failed" in m for m in msgs) == 1, msgs
    assert not any("Triton kernel" in m for m in msgs), msgs
    assert triton_kernels.kernels_report()["fallbacks"] == 0
    rep = gpu_graphed.graphed_report()
    assert "launch refused" in rep["failed"] and rep["captured"] == 0 and rep["eager"] == 4, rep
    assert not capture.capturing()
    gpu_graphed.reset_graphed_report()


def test_buffer_sets_keep_the_most_used_sizes():
    """A scratch keeps three buffer sets; a fourth size drops the least used, not the full
    batch's (whose graph would otherwise be captured again after every evaluation)."""
    g = random_graph(300, 3000, 2)
    s = TorchUniformSampler(*g.to_torch(), [3, 2])
    for b in [50, 50, 50, 7, 9, 11, 50, 13]:
        s.sample(torch.arange(b), 0)
    _, _, cache = s._take(cache=True)
    assert len(cache) == 3 and 50 in cache and cache[50].uses == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_the_eager_batches():
    """On a GPU: the second batch of a size is captured, later ones replayed, each equal to the
    eager bounded path's with the same key, also from a sampling thread of its own."""
    import threading

    gpu_graphed.reset_graphed_report()
    g = random_graph(20000, 300000, 5)
    ip, ix = (t.cuda() for t in g.to_torch())
    s = TorchUniformSampler(ip, ix, [15, 10, 5], cuda_graph=True)
    ref = TorchUniformSampler(ip, ix, [15, 10, 5])
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
    for a, w in out:
        _equal(a, w)
    rep = gpu_graphed.graphed_report()
    assert rep["failed"] is None and rep["captured"] == 1 and rep["replayed"] == 4, rep


def test_bench_sampling_cuda_graph_needs_a_gpu_uniform_or_labor_sampler(tmp_path, capsys,
                                                                       monkeypatch):  # fmt: skip
    """``gnnio bench sampling --cuda-graph`` on the CPU, or with LADIES: one line, exit 2; with
    ``--sampler uniform`` or ``labor`` on CUDA the check passes (CUDA faked: only the check)."""
    import argparse

    from gnnio.bench import sampling as bench
    from gnnio.cli.main import main

    from .helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=80, num_edges=600)
    for extra in ([], ["--sampler", "labor"], ["--sampler", "ladies"]):
        rc = main(["bench", "sampling", str(d), "--cuda-graph", "--batches", "2", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        assert "--cuda-graph: the uniform or labor sampler on --device cuda only" in err[0]
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    for kind in ("uniform", "labor"):
        args = p.parse_args([str(d), "--device", "cuda", "--cuda-graph", "--sampler", kind])
        assert bench._check(args) == [15, 10, 5]  # (the default fanouts: accepted)


def test_device_waits_hold_off_while_a_graph_is_captured(monkeypatch):
    """A device-wide wait from another thread breaks a capture underway (whatever its mode):
    gnnio's waits take the capture lock, so one issued while a capture holds it runs after."""
    import threading
    import time

    from gnnio.utils import capture

    events = []
    monkeypatch.setattr(capture.torch.cuda, "synchronize", lambda dev=None: events.append("sync"))
    held = threading.Event()

    def capturing() -> None:
        with capture.CAPTURE_LOCK:
            held.set()
            time.sleep(0.2)
            events.append("capture done")

    t = threading.Thread(target=capturing)
    t.start()
    held.wait()
    capture.device_sync("cuda:0")
    t.join()
    assert events == ["capture done", "sync"]


def test_a_failed_capture_gives_the_thread_its_stream_back(monkeypatch):
    """``torch.cuda.graph`` leaves its capture stream current when ending the capture raises
    (an invalidated capture: ``capture_end`` fails before the stream context is exited). gnnio's
    capture puts the thread's stream back, drops its flag and its lock, so the eager fallback
    and later batches run where they did before. Fails without the ``set_stream`` (checked)."""
    from gnnio.utils import capture

    cur = {"s": "main", "d": 0}

    class Graph:
        def __init__(self, graph, stream=None, capture_error_mode="global") -> None:
            self.stream = stream

        def __enter__(self) -> None:
            cur.update(s=self.stream, d=1)  # (torch.cuda.stream also makes its device current)

        def __exit__(self, *exc) -> None:
            raise RuntimeError(
                "CUDA error: operation failed due to a previous error during capture"
            )

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: "side")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cur["s"])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: cur.update(s=s, d=1))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: cur["d"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: cur.update(d=d))
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    with pytest.raises(RuntimeError, match="during capture"):
        with capture.capture(object(), "cuda:0"):
            assert cur["s"] == "side" and capture.capturing()
    assert cur == {"s": "main", "d": 0}
    assert not capture.capturing() and not capture.CAPTURE_LOCK.locked()


def test_captures_run_on_a_stream_no_loader_stage_uses(monkeypatch):
    """torch hands out its pool of streams in turn (32 per device), so a new
    ``torch.cuda.Stream()`` is, sooner or later, one a loader stage already queues work on:
    a capture there would take that stage's work into the graph. gnnio captures on one
    reserved stream per device, which its loaders' streams skip. Fails when ``new_stream``
    does not skip it, or a capture takes a fresh pool stream (checked)."""
    import itertools

    from gnnio.utils import capture
    from gnnio.utils.streams import CudaStreams

    turn = itertools.count()

    class PoolStream:  # a pool of 4, handed out in turn, as torch's 32
        def __init__(self, device=None) -> None:
            self.id = next(turn) % 4

        def __eq__(self, other) -> bool:
            return isinstance(other, PoolStream) and other.id == self.id

        __hash__ = object.__hash__

        def synchronize(self) -> None:
            synced.append(self)

    used, synced = [], []

    class Graph:
        def __init__(self, graph, stream=None, capture_error_mode="global") -> None:
            used.append(stream)

        def __enter__(self) -> None:
            pass

        def __exit__(self, *exc) -> None:
            pass

    monkeypatch.setattr(capture, "_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", PoolStream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    st = CudaStreams(torch.device("cuda", 0))
    stages = [st.new_stream(f"s{k}") for k in range(10)]  # more than the pool: ids repeat
    reserved = capture.capture_stream("cuda")
    assert reserved is capture.capture_stream(torch.device("cuda", 0))
    assert all(s != reserved for s in stages) and len({s.id for s in stages}) == 3
    for _ in range(3):
        with capture.capture(object(), "cuda:0"):
            pass
    assert len(used) == 3 and all(s is reserved for s in used)
    # each capture waited for its stream before letting go of the lock: the generator's resets
    # in the capture's prologue done before another thread's replay sets them
    assert len(synced) == 3 and all(s is reserved for s in synced)


def test_an_evicted_buffer_set_is_freed_after_the_current_streams_work(monkeypatch):
    """A scratch moves between sampling threads: its buffers may last have been read on another
    thread's stream (which this one waited for). Evicting a set records every tensor it owns on
    the current stream, so the caching allocator hands their memory out only after that
    stream's work. CUDA faked: the sets on the CPU, ``record_stream`` recorded."""
    from gnnio.sampling import gpu_bounded

    real = gpu_bounded._Buffers
    monkeypatch.setattr(gpu_bounded, "_Buffers", lambda rows, edges, dev: real(rows, edges, "cpu"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "the current stream")
    seen = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: seen.append((t, s)))
    cache, dev = {}, torch.device("cuda")
    sets = {}
    for b in (8, 8, 4, 4, 2, 2, 1):  # the fourth size evicts the least used (2 uses each: 8)
        rows, edges = gpu_bounded.bounds(b, [3, 2], 100, 1000)
        sets.setdefault(b, gpu_bounded.buffers(cache, b, rows, edges, dev))
    assert 8 not in cache and len(cache) == 3
    gone = sets[8].tensors()
    assert len(seen) == len(gone) and all(s == "the current stream" for _, s in seen)
    assert all(a is b for (a, _), b in zip(seen, gone, strict=True))
