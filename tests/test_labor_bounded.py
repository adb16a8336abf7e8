"""LABOR-0's bounded batch on the GPU path (gnnio/sampling/labor_torch.py, _triton_labor.py;
issue 24 item 3): one host sync per batch with the Triton kernels (run in Triton's interpreter),
``1 + len(fanouts)`` with the torch fallback, and every batch bit-identical to the synced torch
path and to the numba LaborSampler -- both designs, layer dependency on and off, every weights
option; graphs with rows of degree <= k, repeated neighbours (equal r_t: ties only the CSR
position tells apart), isolated nodes and a row far above the fanout (several chunks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LaborSampler
from gnnio.sampling import labor_torch as LT
from gnnio.sampling.gpu import count_syncs
from gnnio.sampling.labor_torch import TorchLaborSampler
from gnnio.sampling.threaded import call_key
from tests.helpers import COUNTING_SPY, random_graph, run_in_triton_interpreter
from tests.test_labor_torch import same_batch


def mixed_graph(seed: int = 0) -> CSRGraph:
    """150 nodes: rows of degree 0..12 with repeated neighbours, node 7 with 300 in-neighbours
    (copies included), nodes 120.. isolated."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(0, 150, 900)]
    dst = [(rng.random(900) ** 3 * 120).astype(np.int64)]  # skewed: low ids many, high few
    src.append(rng.integers(0, 150, 300))
    dst.append(np.full(300, 7))
    rep = rng.integers(0, 150, 40)  # each twice into rows 10..49: indistinguishable ties
    src += [rep, rep]
    dst += [np.arange(10, 50), np.arange(10, 50)]
    return CSRGraph.from_edges(np.concatenate(src), np.concatenate(dst), 150, dedup=False)


GRAPHS = [
    (lambda: mixed_graph(0), [5, 3]),
    (lambda: random_graph(200, 6000, 2), [6, 4, 2]),
    (lambda: _int64(random_graph(60, 50, 3)), [3, 2]),  # mostly d <= k, many isolated
]


def _int64(g: CSRGraph) -> CSRGraph:
    """The graph with int64 ``indices`` (gnnio's own graphs hold int32 ones)."""
    return CSRGraph(g.indptr, np.asarray(g.indices, dtype=np.int64))


OPTIONS = [
    ("fixed", False, "ht"),
    ("poisson", False, "ht_mean"),
    ("fixed", True, "none"),
    ("poisson", True, "ht"),
]


def _batches(make, fanouts, design, ld, weights, keys=(0, 1)):
    """``(numba batch, synced torch batch, bounded batch, syncs of the bounded one)``."""
    g = make()
    seeds = np.random.default_rng(len(fanouts)).permutation(g.num_nodes)[:40]
    opts = {"design": design, "layer_dependency": ld, "weights": weights}
    cpu = LaborSampler(g, fanouts, seed=5, **opts)
    tch = TorchLaborSampler(*g.to_torch(), fanouts, **opts)
    ref = TorchLaborSampler(*g.to_torch(), fanouts, **opts)
    for e in keys:
        key = call_key(5, epoch_seed=e)
        with count_syncs() as c:
            mb = tch.sample(torch.from_numpy(seeds), key)
        yield cpu.sample(seeds, epoch_seed=e), ref._sample_synced(seeds, key), mb, c.count
    loc, first = tch._take()
    assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())


@pytest.mark.parametrize("design,ld,weights", OPTIONS)
@pytest.mark.parametrize("graph", range(len(GRAPHS)))
def test_torch_fallback_batches_equal_numba_and_the_synced_path(graph, design, ld, weights):
    """Without Triton (the CPU here): the bounded batch with the torch hop, ``1 + L`` syncs."""
    make, fanouts = GRAPHS[graph]
    for a, b, mb, syncs in _batches(make, fanouts, design, ld, weights):
        same_batch(a, mb)
        same_batch(b, mb)
        assert mb.meta["sampler"] == "labor"
        for blk in mb.blocks:  # the CSR pointer is the edges' own
            want = torch._convert_indices_from_coo_to_csr(blk.edge_index[1], blk.num_dst)
            assert torch.equal(blk.ptr, want)
        assert syncs == 1 + len(fanouts), syncs


def test_poisson_hop_past_its_bound_is_sampled_again_by_the_synced_path(monkeypatch):
    """Rows that share every neighbour keep the same ones, so their counts rise together: with
    no slack (bounds at the fanouts) some batches draw more than the bound. Those are sampled
    again by the synced path (same batch as numba); the others stay bounded. Fails when the
    overflow goes unnoticed (a truncated batch) or is never exercised."""
    from tests.helpers import shared_neighbourhood_graph

    monkeypatch.setattr(LT, "POISSON_SLACK", 1)
    g = shared_neighbourhood_graph(30, 12)
    cpu = LaborSampler(g, [4], seed=1, design="poisson")
    tch = TorchLaborSampler(*g.to_torch(), [4], design="poisson")
    synced = []
    real = tch._sample_synced
    tch._sample_synced = lambda s, k: synced.append(k) or real(s, k)
    seeds = np.arange(12, 42)
    for e in range(12):
        same_batch(cpu.sample(seeds, epoch_seed=e), tch.sample(seeds, call_key(1, epoch_seed=e)))
    assert 0 < len(synced) < 12, synced


INTERP = r"""
import warnings
import torch
warnings.simplefilter("error", RuntimeWarning)  # a kernel that fell back fails the test
from gnnio.utils.triton_kernels import kernels_report
from tests.test_labor_bounded import GRAPHS, OPTIONS, _batches
from tests.test_labor_torch import same_batch

for make, fanouts in GRAPHS:
    for design, ld, weights in OPTIONS:
        for a, b, mb, syncs in _batches(make, fanouts, design, ld, weights, keys=(3,)):
            same_batch(a, mb)
            same_batch(b, mb)
            assert syncs == 1, (design, fanouts, syncs)
import numpy as np
from gnnio.sampling import LaborSampler
from gnnio.sampling.labor_torch import TorchLaborSampler
from gnnio.sampling.threaded import call_key
from tests.test_labor_bounded import mixed_graph

g = mixed_graph(1)  # bad seeds between batches: the error, then the scratch at rest
s = TorchLaborSampler(*g.to_torch(), [4, 3], design="poisson")
for bad, msg in (([5, 9, 5], "more than once"), ([3, 150], "out of range")):
    try:
        s.sample(torch.tensor(bad), 9)
        raise AssertionError(f"accepted {bad}")
    except ValueError as e:
        assert msg in str(e), (bad, e)
seeds = np.arange(0, 150, 3)
want = LaborSampler(g, [4, 3], seed=2, design="poisson").sample(seeds, epoch_seed=1)
same_batch(want, s.sample(torch.from_numpy(seeds), call_key(2, epoch_seed=1)))
rep = kernels_report()
assert rep["labor_hop"] == "triton" and rep["relabel"] == "triton" and rep["fallbacks"] == 0, rep
print("ok")
"""


def test_triton_kernels_batches_equal_numba_with_one_host_sync():
    """The Triton kernels (interpreter): every graph and option above, one sync per batch."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(INTERP)


OPS = (
    COUNTING_SPY
    + r"""
import numpy as np, torch
from gnnio.sampling import _triton_labor, _triton_relabel
from gnnio.sampling.labor_torch import TorchLaborSampler
from gnnio.utils.syncs import OpCounter
from tests.helpers import random_graph


for mod, names in ((_triton_labor, ("_count", "_select")),
                   (_triton_relabel, ("_claim", "_flag", "_commit", "_seeds", "_reset"))):
    for name in names:
        setattr(mod, name, Spy(name, getattr(mod, name)))
g = random_graph(600, 8000, 3)
seeds = torch.from_numpy(np.random.default_rng(3).permutation(600)[:64])
# Before (main at df0e343, TorchLaborSampler's synced batch): 329 (fixed) / 324 (poisson) torch
# ops, count_syncs 10 / 13; after: 45 / 48 ops (the uniform batch's 22, 3 more for Poisson's
# offsets, 23 for the edge weights) and 11 / 14 launches (Poisson: a count kernel per hop).
for design, most_ops, most_launches in (("fixed", 45, 11), ("poisson", 48, 14)):
    s = TorchLaborSampler(*g.to_torch(), [15, 10, 5], design=design)
    s.sample(seeds, 0)  # warm: the scratch and the reused buffers exist
    launches.clear()
    c = state["c"] = OpCounter()
    with c:
        s.sample(seeds, 1)
    state["c"] = None
    n = sum(launches.values())
    assert c.syncs == 0 and c.ops <= most_ops and n <= most_launches, (design, c.ops, launches)
    assert "_claim" not in launches and launches["_select"] == 3, launches  # the kernel claims
print("ok")
"""
)


def test_host_ops_per_batch_as_a_gpu_runs_it():
    """LABOR-0's bounded batch dispatches few torch ops and launches (on a GPU each costs host
    time): held to the counts measured when it was built."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(OPS)


def test_the_labor_kernels_build_for_a_gpu_on_this_machine():
    """The count and select kernels compile to sm_90 cubins here (no GPU needed), with the key
    as arguments and read from device memory (a CUDA graph's, ``KEY_PTR``), and the
    Poisson threshold ``k / d`` is the correctly rounded float64 division (``div.rn.f64``, as
    NumPy's), never fused into an FMA: either would keep other neighbours than the CPU kernel."""
    pytest.importorskip("triton")
    from gnnio.sampling import _triton_labor as TL
    from tests.helpers import compile_for_sm90

    def sig(fn, ptrs: str, ints: str) -> dict:
        types = {k: "*i64" for k in ptrs.split()} | {k: "i32" for k in ints.split()}
        return {a: types.get(a, "constexpr") for a in fn.arg_names}

    sel = "indptr indices dst row_off out_src out_row cnt kp loc first"
    cases = [  # KEY_PTR: the key read from device memory (gpu_graphed), else three int32 args
        *((TL._count, sig(TL._count, "indptr indices dst cnt kout kp", "n fanout k0 k1 k2"),
           {"BLOCK": 16, "CHUNK": 32, "KEY_PTR": kp}, True) for kp in (False, True)),
        *((TL._select, sig(TL._select, sel, "n cap k0 k1 k2"),
           {"fanout": 15, "FP": 16, "BLOCK": 16, "CHUNK": 32, "POISSON": p, "CLAIM": True,
            "KEY_PTR": kp}, p)
          for p in (False, True) for kp in (False, True)),
    ]  # fmt: skip
    for fn, types, const, divides in cases:
        k = compile_for_sm90(fn, types, const)
        ptx = k.asm["ptx"]
        assert ("div.rn.f64" in ptx) == divides and "div.approx" not in ptx, fn.fn.__name__
        assert "fma.rn.f64" not in ptx, fn.fn.__name__  # (a fused product would round apart)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_cuda_labor_batch_syncs_at_most_twice_and_equals_numba(design):  # pragma: no cover
    """On a GPU, CUDA's own sync detector sees at most 2 host syncs in a LABOR-0 batch (the
    end's read; the seeds' copy from a host array may be the second), the hop ran as Triton,
    and the batch is the CPU kernels'."""
    import warnings

    from gnnio.utils.triton_kernels import kernels_report, reset_kernel_record

    g = random_graph(3000, 40000, 0)
    opts = {"design": design, "weights": "ht"}
    cpu = LaborSampler(g, [15, 10, 5], seed=0, num_threads=1, **opts)
    gpu = LaborSampler(g, [15, 10, 5], seed=0, device="cuda", **opts)
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
    rep = kernels_report()
    assert rep.get("labor_hop") == "triton" and rep["fallbacks"] == 0, rep
    same_batch(cpu.sample(seeds, epoch_seed=2), mb.to("cpu"))
