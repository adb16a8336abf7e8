"""The GPU sampler's Triton hop kernel (:mod:`gnnio.sampling._triton_hop`), run on CPU tensors in
Triton's interpreter (``TRITON_INTERPRET=1``, which must be set before Triton is imported: a
subprocess). Its batches must be the CPU kernels' edge for edge, as the torch path's are; the
real GPU runs the same check in the ``gpu`` tests."""

from __future__ import annotations

import pytest

from tests.helpers import run_in_triton_interpreter

pytest.importorskip("triton")

SCRIPT = r"""
import os
import numpy as np, torch
from gnnio.sampling import UniformSampler, _triton_hop
from gnnio.sampling.gpu import TorchUniformSampler, sample_hop_torch
from gnnio.utils.triton_kernels import triton_available
from gnnio.sampling.threaded import call_key
from tests.helpers import random_graph, shared_neighbourhood_graph

assert triton_available(torch.device("cpu"), "sample_hop")
calls = []
real = _triton_hop.sample_hop_triton
_triton_hop.sample_hop_triton = lambda *a, **k: calls.append(a[3]) or real(*a, **k)
rng = np.random.default_rng(0)
g = random_graph(2000, 30000, seed=3)
h = shared_neighbourhood_graph(200, 3000)  # rows far above the fanout (hashed Floyd on the CPU)
cases = [(g, [15, 10, 5], 120), (g, [1, 2], 200), (g, [3, -1], 100), (g, [0, 4], 100),
         (h, [40, 3], 100), (h, [7], 200)]
for graph, fanouts, size in cases:
    ip, ix = graph.to_torch()
    cpu = UniformSampler(graph, fanouts, seed=9, num_threads=2)
    tor = TorchUniformSampler(ip, ix.to(torch.int32), fanouts)
    n = graph.num_nodes
    for i in range(1):
        seeds = rng.choice(n, min(size, n), replace=False).astype(np.int64)
        e = (7 << 32) + i
        a = tor.sample(torch.from_numpy(seeds), call_key(9, epoch_seed=e))
        b = cpu.sample(seeds, e)
        assert torch.equal(a.input_nodes, b.input_nodes), fanouts
        for x, y in zip(a.blocks, b.blocks, strict=True):
            assert torch.equal(x.edge_index, y.edge_index), fanouts
assert sorted(set(calls)) == [1, 2, 3, 4, 5, 7, 10, 15, 40], sorted(set(calls))
# keys with the top bit set, and the hop alone against the exact torch draws
ip, ix = g.to_torch()
dst = torch.from_numpy(rng.choice(2000, 200, replace=False))
for key in (5, (1 << 64) - 3, 1 << 63):
    total = int(torch.clamp(ip[dst + 1] - ip[dst], max=12).sum())
    s64 = key - (1 << 64) if key >= 1 << 63 else key
    src, row = real(ip, ix, dst, 12, key, total)
    os.environ["GNNIO_TRITON"] = "0"  # the torch ops, drawn step by step
    want_src, want_row, _ = sample_hop_torch(ip, ix, dst, 12, s64, total, exact=True)
    del os.environ["GNNIO_TRITON"]
    assert torch.equal(src, want_src) and torch.equal(row, want_row), key
print("ok")
"""


def test_triton_hop_equals_the_cpu_kernels():
    run_in_triton_interpreter(SCRIPT)


# Lemire's rejection (a draw whose low product word falls below 2**32 mod bound is drawn again)
# happens with probability below bound / 2**32 per draw: never on the graphs above. Rows of
# 2**20 + 40 neighbours make it about 1/4096 per draw (2**32 mod (2**20 + c) = 2**20 + c - 4096c),
# so about 4 % of hop keys reject somewhere in 4 rows x 40 draws. The keys are picked by the
# torch path's own rejection count (its fast draws report one), then the kernel must equal the
# CPU kernels (count_rows + sample_rows) on every such key: a kernel that accepts the first draw
# writes another neighbour there.
REJECTION = r"""
import os
import numpy as np, torch
from gnnio.sampling import _kernels
from gnnio.sampling._triton_hop import sample_hop_triton
from gnnio.sampling.gpu import sample_hop_torch

f, rows = 40, 4
deg = (1 << 20) + f
ip = torch.arange(rows + 1, dtype=torch.int64) * deg
ix = torch.randperm(rows * deg, generator=torch.Generator().manual_seed(0)).to(torch.int32)
dst = torch.tensor([2, 0, 3, 1], dtype=torch.int64)
os.environ["GNNIO_TRITON"] = "0"
rejecting, plain = [], []
for key in range(200):
    _, _, redo = sample_hop_torch(ip, ix, dst, f, key, rows * f, exact=False)
    (rejecting if int(redo) else plain).append(key)
del os.environ["GNNIO_TRITON"]
assert len(rejecting) >= 3, rejecting
ipn, ixn, dstn = ip.numpy(), ix.numpy(), dst.numpy()
for key in rejecting + plain[:3]:
    offs, rws = _kernels.count_rows(ipn, dstn, f)
    edges = np.empty((2, int(offs[-1])), dtype=np.int64)
    _kernels.sample_rows(ixn, dstn, rws, np.uint64(key), offs, 0, rows, edges)
    src, row = sample_hop_triton(ip, ix, dst, f, key, rows * f)
    assert np.array_equal(src.numpy(), edges[0]) and np.array_equal(row.numpy(), edges[1]), key
print("ok")
"""


def test_triton_hop_redraws_rejected_draws_like_the_cpu_kernels():
    run_in_triton_interpreter(REJECTION)


# Lemire's threshold itself: a draw whose low word is exactly 2**32 mod bound is kept, one below
# it redrawn. Such a draw is a 2**-32 event (no graph shows it), so the states are crafted by
# inverting SplitMix64 (tests/test_sampler_bias.py), and the kernel's `_lemire` runs on them in
# a probe kernel: value and final state must be the reference's (the state says how many draws).
THRESHOLD = r"""
import numpy as np, torch
import triton
import triton.language as tl
from gnnio.sampling._triton_hop import _lemire
from tests.test_sampler_bias import BOUNDS, lemire_reference, state_with_low

@triton.jit
def probe(state_ptr, bound_ptr, val_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    s = tl.load(state_ptr + offs).to(tl.uint64, bitcast=True)
    b = tl.load(bound_ptr + offs)
    v, s2 = _lemire(s, b, offs < N)
    tl.store(val_ptr + offs, v)
    tl.store(out_ptr + offs, s2.to(tl.int64, bitcast=True))

cases = []
for bound in BOUNDS:
    t = (1 << 32) % bound
    for low in (t, t - 1, 0, bound - 1):
        cases.append((state_with_low(bound, low), bound))
n = 16
assert len(cases) <= n
cases += [cases[0]] * (n - len(cases))
signed = lambda u: u - (1 << 64) if u >= 1 << 63 else u
st = torch.tensor([signed(s) for s, _ in cases], dtype=torch.int64)
bd = torch.tensor([b for _, b in cases], dtype=torch.int64)
val, out = torch.empty_like(st), torch.empty_like(st)
probe[(1,)](st, bd, val, out, N=n)
redrawn = 0
for i, (s, b) in enumerate(cases):
    want_v, want_s = lemire_reference(s, b)
    assert (int(val[i]), int(out[i]) & ((1 << 64) - 1)) == (want_v, want_s), (i, s, b)
    redrawn += want_s != (s + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
assert redrawn >= len(BOUNDS), redrawn  # (each bound's t - 1 draw is rejected)
print("ok")
"""


def test_triton_lemire_keeps_a_draw_on_the_threshold_and_redraws_one_below():
    run_in_triton_interpreter(THRESHOLD)
