"""Song & Jiang's locality-aware sampler on the GPU (gnnio/sampling/locality_torch.py and
_triton_las.py; issue 24 item 5): every batch equal to the numba LocalitySampler's (nodes, edges,
order, CSR pointer, edge weights, meta) with the same seed, call key and scale -- the Triton kernel
in Triton's interpreter on CPU tensors -- for scales below and above 1 (with capping either way),
pruning on and off, every weight mode, rows with no, some and only Q' members, whole rows and
windows, a hub row drawn 40 of; one host sync per batch; ``scale = 1`` the pruned uniform GPU
sampler's batch; the CPU kernels where the kernel cannot run (no Triton, a failed launch: one
warning); ``gnnio train --locality-scale`` on the GPU sampler under ``--sampler-device
auto|cuda``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from gnnio.sampling import LocalitySampler, inclusion_probabilities
from gnnio.sampling.gpu import count_syncs
from gnnio.sampling.locality_torch import TorchLocalitySampler
from gnnio.sampling.threaded import call_key
from gnnio.utils import triton_kernels
from gnnio.utils.syncs import OpCounter
from tests.helpers import run_in_triton_interpreter
from tests.test_labor_bounded import mixed_graph
from tests.test_pruned_gpu import _check

_G = mixed_graph(0)
#: the set B: every third node of mixed_graph(0) and every in-neighbour of rows 60 and 61 (rows
#: of the last hop whose neighbours are all in B = Q'_1), which are seeds (every hop's rows)
HOT = np.union1d(np.arange(0, 150, 3), _G.indices[_G.indptr[60] : _G.indptr[62]])
SEEDS = np.concatenate([[60, 61], np.setdiff1d(np.random.default_rng(0).permutation(150)[:40],
                                               [60, 61], assume_unique=True)])  # fmt: skip


def pair(fanouts, scale, prune=None, weights="ht", hot=HOT):
    """``(numba LocalitySampler, TorchLocalitySampler on CPU tensors)`` with the same options."""
    g = mixed_graph(0)
    cpu = LocalitySampler(g, fanouts, hot_ids=hot, scale=scale, seed=5, prune=prune,
                          weights=weights)  # fmt: skip
    L = len(fanouts)
    index = [cpu._q[L - 1 - h] for h in range(L)]  # hop h: layer L - h
    tch = TorchLocalitySampler(*g.to_torch(), cpu.fanouts, cpu.thresholds, weights, index,
                               cpu._sample_key)  # fmt: skip
    return cpu, tch


def check_cases(cases, keys=(0, 1), syncs: int | None = 1) -> None:
    """Each ``(fanouts, scale, prune, weights)``: the torch sampler's batches equal the numba
    ones, with ``syncs`` host syncs each (None: not counted; :class:`OpCounter` sees no other:
    no blocking upload, no ``t[i] = v``), and the scratch at rest after."""
    for fanouts, scale, prune, weights in cases:
        cpu, tch = pair(fanouts, scale, prune, weights)
        for e in keys:
            with count_syncs() as c, OpCounter() as d:  # (d: the dispatcher's view, below tolist)
                b = tch.sample(torch.from_numpy(SEEDS), call_key(5, epoch_seed=e), scale)
            _check(cpu.sample(SEEDS, epoch_seed=e), b)
            assert syncs is None or c.count == syncs, (fanouts, scale, c.ops)
            assert syncs is None or d.syncs == 0, (fanouts, scale, d.sync_ops)
        loc, first = tch._take()
        assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())


def test_the_cases_cover_every_kind_of_row():
    """Fanouts 4, 3 over mixed_graph(0) and B: rows drawn whole (k = n), with no Q' member, only
    members (the seeds 60 and 61 in the last hop), and both; Eq. 8 capped at 1 for members
    (s = 1000) and for non-members (s = 0.5); both pruning windows cut rows (thresholds 8, 49)."""
    cpu, _ = pair([4, 3], 8.0)
    ip = np.asarray(cpu.indptr)
    kinds, capped = set(), set()
    for hop, f in ((0, 4), (1, 3)):
        qptr = cpu._q[1 - hop][0]  # hop h: Q'_{L - h}
        for v in range(150):
            n, a = int(ip[v + 1] - ip[v]), int(qptr[v + 1] - qptr[v])
            k = min(n, f)
            kind = "whole" if k == n else "none" if a == 0 else "only" if a == n else "both"
            kinds.add((hop, kind))
            if kind == "both":
                capped |= {s for s in (1000.0, 0.5) if 1.0 in inclusion_probabilities(n, a, f, s)}
            assert kind != "only" or v in (60, 61) and hop == 1
    assert {k for _, k in kinds} == {"whole", "none", "only", "both"}, kinds
    assert capped == {1000.0, 0.5}, capped
    assert pair([4, 3], 8.0, (0.0, 2.0))[0].thresholds == [8, 6]
    assert pair([40, 3], 8.0, (1.0, 1.0))[0].thresholds == [49, 12]
    assert (np.diff(ip) > 49).sum() >= 2


_SCRIPT = """
from tests.test_locality_gpu import check_cases
check_cases({cases})
print("ok")
"""


def test_triton_batches_equal_numba_scales_and_capping():
    """In Triton's interpreter: s = 8 unpruned, s = 0.5 (capped non-members) and s = 1000
    (capped members) in pruning windows, all three weight modes."""
    cases = [([4, 3], 8.0, None, "ht"), ([4, 3], 0.5, (0.0, 2.0), "ht_mean"),
             ([4, 3], 1000.0, (0.0, 2.0), "none")]  # fmt: skip
    run_in_triton_interpreter(_SCRIPT.format(cases=cases))


def test_triton_batches_equal_numba_windows_and_a_hub():
    """Whole windows (fanout above the threshold), a hub cut to 49 and drawn 40 of (Floyd's
    hashed branch on the CPU), a fanout of 12 (laws of m with up to 13 values)."""
    cases = [([6, 2], 2.0, (0.3, 0.0), "ht"), ([40, 3], 8.0, (1.0, 1.0), "ht"),
             ([12, 5], 3.0, None, "ht_mean")]  # fmt: skip
    run_in_triton_interpreter(_SCRIPT.format(cases=cases), timeout=900)


_WIRED = """
import warnings
import numpy as np, torch
from gnnio.sampling import LocalitySampler, UniformSampler
from gnnio.utils.triton_kernels import kernels_report, reset_kernel_record
from tests.test_labor_bounded import mixed_graph
from tests.test_locality_gpu import HOT, SEEDS, _check

g = mixed_graph(0)
# the GPU placement, with CPU tensors standing in for the device's
UniformSampler._device_topology = lambda self, graph, device, graph_in: graph.to_torch()
cpu = LocalitySampler(g, [4, 3], hot_ids=HOT, scale=8.0, seed=5, prune=(0.0, 2.0))
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    dev = LocalitySampler(g, [4, 3], hot_ids=HOT, scale=8.0, seed=5, prune=(0.0, 2.0),
                          device="cuda", cuda_graph=True)
assert dev._torch is not None and dev._torch.cuda_graph  # (replayed: tests/test_locality_graphed.py)
assert not any("CUDA graph" in str(w.message) for w in said), [str(w.message) for w in said]
for e, s in enumerate((8.0, 2.0, 1.0)):  # Algorithm 2's changes of s reach the GPU sampler
    cpu.scale = dev.scale = s
    reset_kernel_record()
    b = dev.sample(SEEDS, epoch_seed=e)
    _check(cpu.sample(SEEDS, epoch_seed=e), b)
    assert b.meta["scale"] == s
    rep = kernels_report()
    assert ("las_hop" in rep) == (s != 1.0) and rep.get("las_hop", "triton") == "triton", rep
# a fanout of -1 (no bounded batch): the synced path on the device, the LAS kernel's hops
cpu = LocalitySampler(g, [4, -1], hot_ids=HOT, scale=8.0, seed=5)
dev = LocalitySampler(g, [4, -1], hot_ids=HOT, scale=8.0, seed=5, device="cuda")
reset_kernel_record()
_check(cpu.sample(SEEDS, epoch_seed=4), dev.sample(SEEDS, epoch_seed=4))
assert kernels_report()["las_hop"] == "triton"
print("ok")
"""


def test_locality_sampler_samples_on_the_device_and_follows_its_scale():
    """``LocalitySampler(device=..., cuda_graph=True)`` builds the GPU sampler (here on CPU
    tensors, in Triton's interpreter) with the graphed path on (no warning), and each call
    samples with the scale set then (s = 1: the pruned uniform hops, no LAS kernel); a fanout
    of -1: the synced path's LAS hops."""
    run_in_triton_interpreter(_WIRED)


_WHOLE = """
import torch
from gnnio.sampling.gpu import count_syncs
from gnnio.sampling.threaded import call_key
from tests.test_locality_gpu import SEEDS, check_cases, pair

cases = [([4, -1], 8.0, None, "ht"), ([-1, 3], 0.5, (0.0, 2.0), "ht_mean"),
         ([-1, 3], 1000.0, None, "none")]
check_cases(cases, syncs=None)
cpu, tch = pair([4, -1], 8.0)
with count_syncs() as c:
    tch.sample(torch.from_numpy(SEEDS), call_key(5, epoch_seed=0), 8.0)
assert c.count == 3, c.ops  # the synced path's len(fanouts) + 1
print("ok")
"""


def test_a_fanout_of_minus_one_samples_on_the_device():
    """A fanout of -1 (every neighbour; no bounded batch): the uniform GPU sampler's synced path
    with the LAS kernel's hops, in Triton's interpreter -- the numba batches (a -1 hop before
    and after a LAS hop, windows, every weight mode, capping both ways) with ``len(fanouts) +
    1`` host syncs, the scratch at rest after."""
    run_in_triton_interpreter(_WHOLE, timeout=900)


def test_scale_one_is_the_pruned_uniform_batch_with_one_sync():
    """Without Triton (the CPU here): ``s = 1`` samples as the pruned uniform GPU sampler (torch
    hops, bounded batch), equal to the numba LocalitySampler's with ``s = 1``."""
    check_cases([([4, 3], 1.0, None, "ht"), ([4, 3], 1.0, (0.0, 2.0), "ht_mean")])


def test_without_triton_the_cpu_kernels_sample(monkeypatch):
    """No Triton for the LAS kernel: the CPU kernels' batch, copied to the device, recorded as
    ``las_hop: numba``, with the grouped edges' CSR pointer; so is a fanout of -1."""
    monkeypatch.setattr(triton_kernels, "_RAN", {})
    check_cases([([4, 3], 8.0, (0.0, 2.0), "ht"), ([4, -1], 8.0, None, "ht")], syncs=None)
    assert triton_kernels.kernels_report()["las_hop"] == "numba"


def test_a_failed_kernel_warns_once_and_the_cpu_samples(monkeypatch):
    """A LAS kernel that cannot build or launch: one warning naming the error, that batch and
    the next ones from the CPU kernels (the same batches)."""
    from gnnio.sampling import _triton_las, locality_torch

    monkeypatch.setattr(triton_kernels, "_FAILED", {})
    monkeypatch.setattr(triton_kernels, "_RAN", {})
    # Triton for the LAS kernel only, until it fails (the relabelling: torch ops)
    monkeypatch.setattr(locality_torch, "triton_available",
                        lambda dev, kernel: kernel not in triton_kernels._FAILED)  # fmt: skip
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise RuntimeError("no PTX for you")

    monkeypatch.setattr(_triton_las, "sample_las_triton", broken)
    cpu, tch = pair([4, 3], 8.0, (0.0, 2.0))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for e in range(3):
            b = tch.sample(torch.from_numpy(SEEDS), call_key(5, epoch_seed=e), 8.0)
            _check(cpu.sample(SEEDS, epoch_seed=e), b)
    msgs = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "las_hop" in msgs[0] and "no PTX for you" in msgs[0], msgs
    assert len(calls) == 1  # tried once
    assert triton_kernels.kernels_report()["las_hop"] == "numba"


def test_cpu_batches_warn_once_per_reason(monkeypatch):
    """Batches the CPU kernels sample without a failed kernel are no silent slow path either:
    no Triton for the LAS kernel is one warning per sampler naming the reason, however many
    batches follow (same batches); so with a fanout of -1."""
    from gnnio.sampling import locality_torch

    monkeypatch.setattr(triton_kernels, "_FAILED", {})
    for fanouts, available, reason in (([4, 3], False, "cannot run here"),
                                       ([4, -1], False, "cannot run here")):  # fmt: skip
        monkeypatch.setattr(locality_torch, "triton_available", lambda dev, k, a=available: a)
        cpu, tch = pair(fanouts, 8.0)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for e in range(3):
                b = tch.sample(torch.from_numpy(SEEDS), call_key(5, epoch_seed=e), 8.0)
                _check(cpu.sample(SEEDS, epoch_seed=e), b)
        msgs = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)]
        assert len(msgs) == 1 and reason in msgs[0] and "CPU kernels" in msgs[0], msgs


def test_uva_keeps_the_member_index_in_pinned_host_memory(monkeypatch):
    """``graph_in="host"`` (UVA sampling: the CSR never copied to the GPU) keeps each layer's
    member index -- ``qptr`` alone is the size of ``indptr`` -- in pinned host memory as well,
    CUDA views of the sampler's own arrays (here: the pinning faked, CPU tensors standing in);
    ``graph_in="gpu"`` uploads it."""
    import gnnio.sampling.gpu
    from gnnio.sampling import UniformSampler

    def topology(self, graph, device, graph_in):
        self.graph_in, self._pins = graph_in, []
        return graph.to_torch()

    pinned = []

    def pin(a, b, device):
        pinned.append((a, b, a.clone(), b.clone()))
        return pinned[-1][2], pinned[-1][3], ["handle"]

    monkeypatch.setattr(UniformSampler, "_device_topology", topology)
    monkeypatch.setattr(gnnio.sampling.gpu, "pinned_csr", pin)
    for graph_in in ("host", "gpu"):
        pinned.clear()
        dev = LocalitySampler(mixed_graph(0), [4, 3], hot_ids=HOT, scale=8.0, seed=5,
                              device="cuda", graph_in=graph_in)  # fmt: skip
        layers = [q for q in dev._q[::-1] if q is not None]  # hop order: Q'_L .. Q'_1
        if graph_in == "gpu":
            assert pinned == [] and dev._pins == []
            continue
        assert len(pinned) == len(layers) == 2 and dev._pins == ["handle"] * 2
        for (a, b, va, vb), q, tq in zip(pinned, layers, dev._torch._q, strict=True):
            assert np.shares_memory(a.numpy(), q[0]) and np.shares_memory(b.numpy(), q[1])
            assert tq[0] is va and tq[1] is vb  # the views, not copies of them


def test_train_builds_the_locality_sampler_on_the_gpu(monkeypatch):
    """``gnnio train --locality-scale S --device cuda``: the LocalitySampler on the training GPU
    under ``--sampler-device auto|cuda`` (UVA too), the numba kernels with ``cpu``."""
    import gnnio.sampling
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import StoreSetup, build_sampler
    from tests.fake_cuda import fake_cuda

    fake_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 30, 1 << 31))
    built = {}

    class Las:
        def __init__(self, graph, fanouts, **kw):
            built.clear()
            built.update(kw)

    monkeypatch.setattr(gnnio.sampling, "LocalitySampler", Las)

    class Ds:
        graph = mixed_graph(0)

    setup = StoreSetup(store=None, tiers=None, gpu_ids=HOT, info={}, eval_store=None)
    for opts, want in ((dict(sampler_device="auto"), ("cuda", "gpu")),
                       (dict(sampler_device="cuda", graph_in="host"), ("cuda", "host")),
                       (dict(sampler_device="cpu"), (None, "gpu"))):  # fmt: skip
        cfg = TrainConfig(device="cuda", locality_scale=4.0, cuda_graph="sampler", **opts)
        build_sampler(Ds, cfg, [4, 3], setup)
        dev = built["device"]
        assert (None if dev is None else dev.type, built["graph_in"]) == want, built
        assert built["scale"] == 4.0 and built["cuda_graph"] is True
    TrainConfig(device="cuda", sampler_device="cuda", locality_scale=4.0)._validate_sampler_device()
    cfg = TrainConfig(device="cuda", sampler_device="cuda", locality_scale=4.0, sampler="ladies")
    cfg._validate_sampler_device()  # (the locality-aware LADIES has a GPU sampler too)


#: the GPU test's cases: (graph, fanouts, scale, prune, weights) -- every weight mode (a
#: compiled variant each), capping both ways, windows, and mixed_graph(0)'s hub drawn 40 of
#: (FP = 64, Floyd's 40 draws; the CPU's hashed branch); a fanout of -1 (the synced path)
DEVICE_CASES = [("random", [15, 10, 5], 8.0, None, "ht"),
                ("random", [15, 10, 5], 2.0, (1.0, 1.0), "ht_mean"),
                ("random", [15, 10, 5], 0.5, None, "none"),
                ("random", [15, 10, 5], 1000.0, (0.5, 0.0), "ht"),
                ("mixed", [40, 3], 8.0, (1.0, 1.0), "ht"),
                ("random", [10, -1], 8.0, None, "ht")]  # fmt: skip


def equal_on_device(graph_in: str, cases=DEVICE_CASES, nodes=5000, edges=80000, seeds=512,
                    epochs=(0, 1)) -> None:  # fmt: skip
    """Each case's batches on the device equal the numba ones (weights bit for bit), one host
    sync each (``len(fanouts) + 1`` with a fanout of -1), no warning of a CPU batch or a failed
    kernel, ``las_hop`` Triton only."""
    from gnnio.utils.triton_kernels import kernels_report, reset_kernel_record
    from tests.helpers import random_graph

    graphs = {"random": random_graph(nodes, edges, seed=5), "mixed": mixed_graph(0)}
    reset_kernel_record()
    for name, fanouts, scale, prune, weights in cases:
        g = graphs[name]
        n = int(g.indptr.shape[0]) - 1
        hot = HOT if name == "mixed" else np.random.default_rng(1).permutation(n)[: n // 10]
        ids = SEEDS if name == "mixed" else np.random.default_rng(5).permutation(n)[:seeds]
        kw = dict(hot_ids=hot, scale=scale, seed=0, prune=prune, weights=weights)
        cpu = LocalitySampler(g, fanouts, **kw)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            gpu = LocalitySampler(g, fanouts, device="cuda", graph_in=graph_in, **kw)
            assert gpu._torch is not None
            for e in epochs:
                a = cpu.sample(ids, epoch_seed=e)
                with count_syncs() as c:
                    b = gpu.sample(ids, epoch_seed=e)
                _check(a, b.to("cpu"))
                want = 1 if min(fanouts) >= 0 else len(fanouts) + 1  # (-1: the synced path)
                assert c.count == want, (name, fanouts, scale, c.ops)
        ours = [str(w.message) for w in said if "locality-aware" in str(w.message)
                or "Triton kernel" in str(w.message)]  # fmt: skip
        assert not ours, ours  # (a CPU batch or a failed kernel; NumPy's overflows aside)
    rep = kernels_report()
    assert rep["las_hop"] == "triton" and rep["fallbacks"] == 0, rep


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_in", ["gpu", "host"])
def test_locality_sampler_on_cuda_equals_cpu(graph_in):  # pragma: no cover - GPU only
    """On a real GPU (compiled Triton, libdevice exp/log, every program's rows at once):
    :data:`DEVICE_CASES` over a 5000-node graph with fanouts 15,10,5 and mixed_graph(0) equal
    the numba batches (:func:`equal_on_device`); with ``graph_in="host"`` (UVA) the sampler puts
    nothing in device memory, member index included."""
    if graph_in == "host":
        from tests.helpers import random_graph

        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        LocalitySampler(random_graph(5000, 80000, seed=5), [15, 10, 5], device="cuda",
                        graph_in="host", hot_ids=np.arange(0, 5000, 7), scale=8.0)  # fmt: skip
        assert torch.cuda.memory_allocated() == before
    equal_on_device(graph_in)


_DRY = """
import numpy as np
from gnnio.sampling import UniformSampler
from tests.test_locality_gpu import DEVICE_CASES, equal_on_device

# the GPU placement, with CPU tensors standing in for the device's (Triton's interpreter)
def topology(self, graph, device, graph_in):
    self.graph_in, self._pins = graph_in, []
    return graph.to_torch()

UniformSampler._device_topology = topology
equal_on_device("gpu", [c for c in DEVICE_CASES if c[2] in (0.5, 8.0)], nodes=300,
                edges=3000, seeds=24, epochs=(0,))
print("ok")
"""


def test_the_gpu_tests_cases_run_in_the_interpreter():
    """The gpu-marked test's own logic (:func:`equal_on_device`), run here in Triton's
    interpreter on a small graph (one weight mode each way, the hub case), so the GPU session
    spends its minutes on the device, not on a broken test."""
    run_in_triton_interpreter(_DRY, timeout=900)


def test_bench_sampling_takes_a_locality_scale(tmp_path, capsys):
    """``gnnio bench sampling --locality-scale S``: the LocalitySampler with B the top
    ``--gpu-cache-fraction`` of nodes (its batches differ from the uniform ones); a scale <= 0,
    another sampler, a fraction of 0 or one without a scale is one line, exit 2."""
    import json

    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=80, num_edges=600)
    argv = ["bench", "sampling", str(d), "--fanouts", "3,2", "--batch-size", "8", "--batches",
            "3", "--passes", "1", "--json", "--no-progress"]  # fmt: skip
    out = {}
    for extra in ([], ["--locality-scale", "8", "--gpu-cache-fraction", "0.25"]):
        assert main([*argv, *extra]) == 0
        out[len(extra)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    las = out[4]
    assert las["locality_scale"] == 8.0 and las["hot_rows"] == 20 and las["edges_per_s"] > 0
    assert out[0]["locality_scale"] is None and las["checksum"] != out[0]["checksum"]
    for bad, says in ((["--locality-scale", "0"], "[1e-200, 1e200]"),
                      (["--locality-scale", "2", "--sampler", "labor"], "not labor"),
                      (["--locality-scale", "2", "--cuda-graph"], "--cuda-graph"),
                      (["--locality-scale", "2", "--gpu-cache-fraction", "0"], "(0, 1]"),
                      (["--gpu-cache-fraction", "0.2"], "only with")):  # fmt: skip
        assert main([*argv, *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gnnio: error: --") and says in err[0], err


def narrow_offsets(ttir: str) -> list[str]:
    """The ``tt.addptr`` lines of a kernel's TTIR whose offset is 32-bit and not a constant:
    on a graph past 2^31 edges (or Q' members) such an offset wraps on the GPU, where the
    interpreter's NumPy pointers would not show it."""
    import re

    consts = set(re.findall(r"(%[\w.#]+) = arith\.constant", ttir))
    out = []
    for line in ttir.splitlines():
        m = re.search(r"tt\.addptr %[\w.#]+, (%[\w.#]+) : .*, (\S*i32>?)\s", line)
        if m and m.group(1) not in consts:
            out.append(line.strip())
    return out


def test_the_kernel_compiles_for_an_h100_without_one(tmp_path, monkeypatch):
    """The LAS kernel through Triton's whole compiler to an sm_90 cubin (ptxas ships with
    Triton), so what the interpreter accepts and the compiler does not (a loop-carried Python
    int, float64 ops without a lowering) fails here; floating-point contraction is off (no
    ``fma`` beyond the libdevice ``exp``/``log`` ones, which the fused build has more of); and
    every pointer offset is 64-bit (:func:`narrow_offsets`: CSR positions reach ~2^32)."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, compile
    except ImportError as e:  # pragma: no cover - another Triton API
        pytest.skip(f"this Triton has no ahead-of-time API: {e}")
    from pathlib import Path

    if not (Path(triton.__file__).parent / "backends/nvidia/bin/ptxas").exists():
        pytest.skip("this Triton ships no ptxas")  # pragma: no cover
    from gnnio.sampling import _triton_las as M

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    sig = dict(indptr="*i64", indices="*i32", dst="*i64", row_off="*i64", out_src="*i64",
               out_row="*i64", out_w="*fp32", n="i32", cnt="*i64", cap="i32", k0="i32",
               k1="i32", k2="i32", kp="*i64", qptr="*i64", qpos="*i32", consts="*fp64",
               theta="i32", FANOUT="constexpr", FP="constexpr", BLOCK="constexpr",
               WMODE="constexpr", KEY_PTR="constexpr")  # fmt: skip
    fmas = {}
    for fusion in (False, True):  # (the key read from device memory -- a graph's -- and not)
        src = ASTSource(fn=M._las, signature=sig, constexprs=dict(
            FANOUT=5, FP=8, BLOCK=M._BLOCK, WMODE=1, KEY_PTR=not fusion))  # fmt: skip
        k = compile(src, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": fusion})
        assert len(k.asm["cubin"]) > 0
        fmas[fusion] = k.asm["ptx"].count("fma.rn.f64")
        assert narrow_offsets(k.asm["ttir"]) == [], "a 32-bit offset (E, qpos past 2^31)"
    assert fmas[False] < fmas[True], fmas
    seen = {}

    class Spy:  # the launch's options, without launching
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.update(kw)

    monkeypatch.setattr(M, "_las", Spy())
    z = torch.zeros(4, dtype=torch.int64)
    M.sample_las_triton(z, z, z, 2, z, z, 7, 5, 0, z, z, M.las_consts(2.0, "cpu"), 0, (z, z, z))
    assert seen["enable_fp_fusion"] is False and seen["FANOUT"] == 5, seen
    assert seen["KEY_PTR"] is False
    M.sample_las_triton(z, z, z, 2, z, z, z[:1], 5, 0, z, z, M.las_consts(2.0, "cpu"), 0,
                        (z, z, z))  # fmt: skip
    assert seen["KEY_PTR"] is True
