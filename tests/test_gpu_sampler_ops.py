"""The GPU sampler's host work per batch (issue 24 item 3): on a GPU the training loop is paced by
the host, and every torch op or Triton launch the sampler's thread dispatches costs ~10-30 us of it
(H200 run of 2026-11-26). The bounded path (:mod:`gnnio.sampling.gpu_bounded`) is counted here as a
GPU runs it -- Triton kernels in Triton's interpreter, ``OpCounter`` for the torch ops (ops inside a
launch are the interpreter's, not counted), launches counted apart -- and held to a ceiling. Its
buffers are reused from batch to batch: no batch may change because of that."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.sampling.gpu import TorchUniformSampler
from tests.helpers import COUNTING_SPY, random_graph, run_in_triton_interpreter


def _equal(a, b) -> None:
    assert torch.equal(a.input_nodes, b.input_nodes)
    assert a.meta["hop_nodes"] == b.meta["hop_nodes"]
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.ptr, y.ptr)


def _clone(mb):
    return type(mb)(
        seeds=mb.seeds.clone(),
        input_nodes=mb.input_nodes.clone(),
        blocks=[
            type(b)(b.edge_index.clone(), b.num_src, b.num_dst, ptr=b.ptr.clone())
            for b in mb.blocks
        ],  # fmt: skip
        meta=dict(mb.meta),
    )


def test_reused_buffers_change_no_batch_and_no_batch_held_before():
    """One sampler, batches of changing sizes (a new buffer set, then the old one again, an
    empty batch, a bad one between): each is the synced path's batch, a batch held from before
    is unchanged afterwards (the batch's arrays are copies, not views of the reused buffers),
    and the scratch is at rest at the end. Fails when a stale entry of a reused buffer leaks
    into a batch, or a batch's array is a view into one."""
    g = random_graph(400, 5000, 7)
    s = TorchUniformSampler(*g.to_torch(), [6, 4, 3])
    ref = TorchUniformSampler(*g.to_torch(), [6, 4, 3])
    rng = np.random.default_rng(7)
    held = []
    for i, b in enumerate([60, 17, 60, 0, 60, 3, 17]):
        seeds = torch.from_numpy(rng.permutation(400)[:b])
        if i == 4:
            with pytest.raises(ValueError, match="appears more than once"):
                s.sample(torch.cat([seeds, seeds[:1]]), key=i)
        mb = s.sample(seeds, key=i)
        _equal(mb, ref._sample_synced(seeds, i))
        held.append((mb, _clone(mb)))
    for mb, copy in held:
        _equal(mb, copy)
    loc, first, cache = s._take(cache=True)
    assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())
    # reused sets: at most three sizes, a new one dropping the least used (never the full
    # batch's, which sampled most)
    assert 0 < len(cache) <= 3 and 60 in cache


OPS = (
    COUNTING_SPY
    + r"""
import numpy as np, torch
from gnnio.sampling import _triton_hop, _triton_relabel
from gnnio.sampling.gpu import TorchUniformSampler
from gnnio.utils.syncs import OpCounter
from tests.helpers import random_graph


_triton_hop._hop = Spy("_hop", _triton_hop._hop)
for name in ("_claim", "_flag", "_commit", "_seeds", "_reset"):
    setattr(_triton_relabel, name, Spy(name, getattr(_triton_relabel, name)))

g = random_graph(600, 8000, 3)
s = TorchUniformSampler(*g.to_torch(), [15, 10, 5])
rng = np.random.default_rng(3)
seeds = torch.from_numpy(rng.permutation(600)[:64])
s.sample(seeds, 0)  # warm: the scratch and the reused buffers exist
marks = []
launches.clear()
c = state["c"] = OpCounter()
s.phase_hook = lambda phase: marks.append(c.ops)
with c:
    mb = s.sample(seeds, 1)
state["c"] = None
s.phase_hook = None
counted = dict(launches)
n_launch = sum(counted.values())
print("ops", c.ops, "launches", n_launch, counted, "marks", marks)
# Before (main at 6806ef2, this count): 111 torch ops + 15 launches per batch, 18-23 ops per
# hop; after: 22 torch ops + 11 launches (setup 2, each hop 1-2 ops + 3 launches, end 16 ops:
# 10 slices, cat, split, 3 views, and the seeds' and reset's launches). On a GPU, .tolist()
# adds the one copy to the host that the CPU does not dispatch.
assert c.syncs == 0 and c.ops <= 22 and n_launch <= 11, (c.ops, n_launch, counted)
assert "_claim" not in counted  # the hop kernel claims
hop_ops = [b - a for a, b in zip(marks[1::2], marks[2::2])]  # relabel of hop h -> sample of h+1
assert all(x <= 1 for x in hop_ops), marks
want = TorchUniformSampler(*g.to_torch(), [15, 10, 5])._sample_synced(seeds, 1)
assert torch.equal(mb.input_nodes, want.input_nodes)
for x, y in zip(mb.blocks, want.blocks, strict=True):
    assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.ptr, y.ptr)

# the kernels' batches with reused buffers of changing sizes, and bad seeds between: each the
# synced path's batch, the scratch at rest at the end
ref = TorchUniformSampler(*g.to_torch(), [15, 10, 5])
s2 = TorchUniformSampler(*g.to_torch(), [4, 3])
ref2 = TorchUniformSampler(*g.to_torch(), [4, 3])
for i, b in enumerate([30, 7, 30, 0, 7]):
    seeds = torch.from_numpy(rng.permutation(600)[:b])
    for smp, rf in ((s, ref), (s2, ref2)):
        a, w = smp.sample(seeds, i), rf._sample_synced(seeds, i)
        assert torch.equal(a.input_nodes, w.input_nodes), (i, b)
        for x, y in zip(a.blocks, w.blocks, strict=True):
            assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.ptr, y.ptr), (i, b)
for bad, msg in (([5, 9, 5], "more than once"), ([3, 600], "out of range"), ([-1], "range")):
    try:
        s2.sample(torch.tensor(bad), 9)
        raise AssertionError(f"accepted {bad}")
    except ValueError as e:
        assert msg in str(e), (bad, e)
seeds = torch.from_numpy(rng.permutation(600)[:20])
a, w = s2.sample(seeds, 10), ref2._sample_synced(seeds, 10)
assert torch.equal(a.input_nodes, w.input_nodes)
for smp in (s, s2):
    loc, first = smp._take()
    assert bool((loc == -1).all()) and bool((first == torch.iinfo(torch.int64).max).all())
assert launches["_commit"] > counted["_commit"] and launches["_seeds"] > 10, dict(launches)
from gnnio.utils.triton_kernels import kernels_report
rep = kernels_report()
assert rep["hop"] == "triton" and rep["relabel"] == "triton" and rep["fallbacks"] == 0, rep
print("ok")
"""
)


def test_host_ops_per_batch_as_a_gpu_runs_it():
    pytest.importorskip("triton")
    run_in_triton_interpreter(OPS)


def test_buffers_go_back_to_the_pool_only_after_the_batch_is_copied_out():
    """The loader's sampling threads share one sampler: a buffer set given back to the pool may
    be written by another thread's batch at once. Here whatever is given back is overwritten at
    once (with values the next batch rewrites), and every batch is still the synced path's.
    Fails when the buffers go back before the batch's arrays are copied out of them."""
    g = random_graph(3000, 40000, 5)
    s = TorchUniformSampler(*g.to_torch(), [10, 5])
    ref = TorchUniformSampler(*g.to_torch(), [10, 5])
    give = s._give

    def give_and_scribble(loc, first, cache=None):
        give(loc, first, cache)
        for buf in (cache or {}).values():  # another thread's batch, as early as it could
            buf.nodes.fill_(0)
            for t in (*buf.local, *buf.row):
                t.fill_(-7)
            for c in buf.cum:
                c[1:].fill_(5)

    s._give = give_and_scribble
    for i in range(4):
        seeds = torch.from_numpy(np.random.default_rng(i).permutation(3000)[: 200 - 50 * i])
        _equal(s.sample(seeds, key=i), ref._sample_synced(seeds, i))


def test_the_kernels_build_for_a_gpu_on_this_machine():
    """Each of the bounded batch's Triton kernels compiles to an sm_90 cubin (H100/H200) here,
    without a GPU (Triton's wheel brings its compiler and ptxas): a kernel the interpreter runs
    but the compiler refuses would fall back to torch ops on every GPU. Fails on such a kernel
    (a tensor used as an ``if`` condition, for instance)."""
    pytest.importorskip("triton")
    from gnnio.sampling import _triton_hop as hop
    from gnnio.sampling import _triton_relabel as rel
    from tests.helpers import compile_for_sm90

    p, i = "*i64", "i32"

    def sig(ptrs: str, ints: str = "n") -> dict:
        return {k: p for k in ptrs.split()} | {k: i for k in ints.split()}

    hop_sig = sig(
        "indptr indices dst row_off out_src out_row cnt kp loc first", "n cap k0 k1 k2 theta"
    )  # theta: HyDRA's pruning window, a runtime int (0 = none)
    hop_const = {"fanout": 15, "FP": 16, "BLOCK": 64, "HAS_CNT": True, "CLAIM": True}
    cases = [
        (hop._hop, hop_sig, hop_const | {"KEY_PTR": False}),
        (hop._hop, hop_sig, hop_const | {"KEY_PTR": True}),  # a CUDA graph's hop
        (rel._claim, sig("src ecnt loc first"), {"BLOCK": 256}),
        (rel._flag, sig("src ecnt loc first flag"), {"BLOCK": 256}),
        (
            rel._commit,
            sig(
                "src ecnt flag rank meta nodes loc first local kn indptr", "hc he n cap rows fanout"
            ),
            {"NEXT": True, "BLOCK": 256},
        ),  # fmt: skip
        (rel._seeds, sig("seeds loc nodes k0 meta indptr", "n N fanout"), {"BLOCK": 256}),
        (rel._reset, sig("nodes loc first cnt"), {"BLOCK": 256, "HAS_CNT": False}),
        (rel._reset, sig("nodes loc first cnt"), {"BLOCK": 256, "HAS_CNT": True}),
    ]
    for fn, types, const in cases:
        compile_for_sm90(fn, {a: types.get(a, "constexpr") for a in fn.arg_names}, const)
