"""Rules of the GPU sampler's Triton kernels (gnnio/sampling/_triton_hop.py, _triton_relabel.py)
that the batch-level tests do not pin down, found by a mutation-testing pass: the bounded hop
writes nothing at or past its ``total``; the relabelling numbers a hop's sources exactly as a
plain first-appearance loop does, whatever junk its buffers hold past the real edges and rows.
Each check runs in Triton's interpreter (``TRITON_INTERPRET=1``: a fresh Python), one subprocess
per module, against an independent reference (the numba kernels, or a Python loop)."""

from __future__ import annotations

import pytest

from tests.helpers import run_in_triton_interpreter

pytest.importorskip("triton")

HOP = r"""
import numpy as np, torch
from gnnio.sampling import _kernels
from gnnio.sampling._triton_hop import sample_hop_triton
from tests.helpers import random_graph

g = random_graph(300, 4000, seed=1)
ip, ix = g.to_torch()
ipn, ixn = np.asarray(g.indptr), np.asarray(g.indices)
dstn = np.arange(0, 300, 7, dtype=np.int64)
dst = torch.from_numpy(dstn)
fanout, key = 5, 12345
offs, rws = _kernels.count_rows(ipn, dstn, fanout)
want = np.empty((2, int(offs[-1])), dtype=np.int64)
_kernels.sample_rows(ixn, dstn, rws, np.uint64(key), offs, 0, len(dstn), want)

# the bounded form with a bound below the rows' sum: the prefix below `total` is the CPU's, and
# nothing at or past it is written (the buffers are views of longer ones, filled with -7)
total = int(offs[-1]) // 2
big_src = torch.full((int(offs[-1]) + 64,), -7, dtype=torch.int64)
big_row = torch.full_like(big_src, -7)
cnt = torch.tensor([len(dstn)])
src, row = sample_hop_triton(ip, ix, dst, fanout, key, total, cnt, torch.from_numpy(offs[:-1]),
                             out=(big_src[:total], big_row[:total]))
assert np.array_equal(big_src[:total].numpy(), want[0, :total])
assert np.array_equal(big_row[:total].numpy(), want[1, :total])
assert bool((big_src[total:] == -7).all()) and bool((big_row[total:] == -7).all())

# HyDRA's pruning with a threshold below the fanout, the offsets the kernel's own (no row_off):
# a cut row keeps its whole window of theta, so a row's share is min(deg, theta, fanout)
from gnnio.sampling import _las_kernels as K

fanout, theta = 6, 4
offs, rws = np.empty(len(dstn) + 1, np.int64), np.empty((4, len(dstn)), np.int64)
K.count_rows(ipn, dstn, fanout, theta, False, np.zeros(1, np.int64), np.zeros(0, np.int32), offs,
             rws)
e = int(offs[-1])
want = np.empty((2, e), np.int64)
K.sample_rows(ixn, dstn, 0, len(dstn), offs, rws, np.uint64(key), fanout, theta, 1.0, False,
              np.zeros(0, np.int32), K.W_NONE, want[0], want[1], np.empty(0, np.float32))
src, row = sample_hop_triton(ip, ix, dst, fanout, key, e, theta=theta)
assert np.array_equal(src.numpy(), want[0]) and np.array_equal(row.numpy(), want[1])
print("ok")
"""


def test_bounded_hop_writes_the_cpu_prefix_and_nothing_past_its_total():
    """The bounded hop kernel writes the CPU kernels' edges below ``total`` and nothing past it;
    a pruned hop with a threshold below the fanout equals the CPU kernels."""
    run_in_triton_interpreter(HOP)


RELABEL = r"""
import numpy as np, torch
from gnnio.sampling._triton_relabel import relabel_triton, reset_triton, seeds_triton
from tests.helpers import random_graph

SENT = torch.iinfo(torch.int64).max
N, L = 60, 3
g = random_graph(N, 400, seed=2)
ipn = np.asarray(g.indptr, dtype=np.int64)
ip = torch.from_numpy(ipn)
deg = lambda v: int(ipn[v + 1] - ipn[v])
rng = np.random.default_rng(4)


def scratch():
    return torch.full((N + 1,), -1), torch.full((N + 1,), SENT)


def reference(nodes, src):
    # first-appearance numbering: a node seen before keeps its id, a new one is appended
    nodes, ids = list(nodes), {v: i for i, v in enumerate(nodes)}
    local = []
    for s in src:
        if s not in ids:
            ids[s] = len(nodes)
            nodes.append(s)
        local.append(ids[s])
    return nodes, local


# the seeds: nodes, loc, the first hop's k, meta (seeds given twice, out of range, count)
loc, first = scratch()
seeds, f0, f1 = [5, 9, 0, 33], 3, 2
big = torch.full((N + 16,), -9)  # the node buffer, a view of a longer one: nothing written past
meta = torch.zeros(3 + 3 * L, dtype=torch.int64)
k0 = torch.full((len(seeds),), -9)
seeds_triton(torch.tensor(seeds), loc, big[:N], k0, meta, ip, N, f0)
assert big[:4].tolist() == seeds and loc[seeds].tolist() == [0, 1, 2, 3]
assert k0.tolist() == [min(deg(v), f0) for v in seeds]
assert meta[:3].tolist() == [0, 0, 4], meta
want = list(seeds)
# per hop (edge buffer, real edges, next hop's rows or None, node cap, claims made by the hop):
# more rows than edges (and than a block of them), fewer rows than nodes (k written for `rows`
# only), a cap the new nodes pass (nodes and loc written below it only)
for h, (E, ecnt, rows, cap, claimed) in enumerate(
    [(30, 22, 300, N, False), (40, 31, 20, N, True), (24, 24, None, None, False)]
):
    # real sources (repeats and numbered nodes among them), then junk past the edge count:
    # ids that appear nowhere else, which no step may claim, flag, number or count
    real = rng.choice(np.r_[want, rng.integers(0, 50, 40)], ecnt).tolist()
    if cap is None:  # eight nodes not numbered yet among the sources, and room for three
        cap = len(want) + 3
        real[:8] = [v for v in range(50) if v not in want][:8]
        rng.shuffle(real)
    junk = [50 + i % 10 for i in range(E - ecnt)]
    src = torch.tensor(real + junk)
    if claimed:  # the hop kernel's claims, made here by hand
        for e, s in enumerate(real):
            if int(loc[s]) < 0:
                first[s] = min(int(first[s]), e)
    local, flag, rank = torch.full((E,), -9), torch.ones(E, dtype=torch.int64), torch.full((E,), 5)
    kbig = torch.full(((rows or 0) + 16,), 77)  # the next hop's k: nothing written past `rows`
    nxt = None if rows is None else (kbig[:rows], rows, f1, ip)
    relabel_triton(src, torch.tensor([ecnt]), loc, first, big[: cap + 1], meta, h, cap,
                   (local, flag, rank), claimed, nxt)
    want, want_local = reference(want, real)
    after, kept = len(want), min(len(want), cap)
    assert local[:ecnt].tolist() == want_local, h
    assert big[:kept].tolist() == want[:kept] and bool((big[cap + 1 :] == -9).all()), h
    assert loc[want[:kept]].tolist() == list(range(kept)) and bool((loc[want[kept:]] == -1).all())
    assert bool((loc[50:N] == -1).all()), h
    assert int(meta[3 + h]) == after and int(meta[3 + L + h]) == ecnt, (h, meta)
    if rows is not None:  # real rows min(deg, fanout), padding rows 0, nothing past `rows`
        assert kbig[:rows].tolist() == [min(deg(want[r]), f1) if r < after else 0
                                        for r in range(rows)]
        assert bool((kbig[rows:] == 77).all()), h
assert after >= cap + 5, (after, cap)  # (the last hop's cap was passed)
# the end's reset as a captured batch runs it: ``n`` the node buffer's bound (the cap, as
# gpu_graphed passes rows[-1]; the buffer holds nothing past it, so a larger n would read unset
# slots and write loc and first at those ids), the count on the device. A count below the bound
# resets that many nodes only; then the batch's own count (past the cap) resets all of them.
reset_triton(big, cap, loc, first, torch.tensor([3]))
assert bool((loc[big[:3]] == -1).all()) and bool((loc[big[3:cap]] >= 0).all()), "count < n"
reset_triton(big, cap, loc, first, meta[2 + L : 3 + L])
first[want[cap:]] = SENT  # (the nodes past the cap: the batch's error path clears them)
assert bool((loc == -1).all()) and bool((first == SENT).all()), "the scratch at rest"

# bad seeds: one given twice (its first copy at index 0), one past the last node, one negative
loc, first = scratch()
nodes, meta = torch.full((9,), -9), torch.zeros(3 + 3 * L, dtype=torch.int64)
k0 = torch.full((5,), -9)
seeds_triton(torch.tensor([7, 8, 7, N, -1]), loc, nodes, k0, meta, ip, N, f0)
assert int(meta[0]) > 0 and int(meta[1]) == 2 and int(meta[2]) == 5, meta
assert nodes[:5].tolist() == [7, 8, 7, 0, 0] and int(loc[N]) == -1
assert k0.tolist() == [min(deg(v), f0) for v in (7, 8, 7, 0, 0)]  # (bad seeds: node 0's)
print("ok")
"""


def test_relabel_kernels_number_sources_as_a_first_appearance_loop():
    """The relabelling kernels give a Python first-appearance loop's ids, nodes, counts and next
    hop's ``k``, ignore junk past the real edges, and leave the scratch at rest."""
    run_in_triton_interpreter(RELABEL)


LABOR = r"""
import numpy as np, torch
from gnnio.sampling._triton_labor import count_triton, select_triton
from tests.test_labor_bounded import mixed_graph

M64, GAMMA = (1 << 64) - 1, 0x9E3779B97F4A7C15


def mix64(z):  # SplitMix64's finaliser, in Python ints
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference(ixn, start, d, fanout, rkey, poisson):
    # LABOR-0 (module docstring): the whole short row; else the k smallest (r_t, position) in
    # increasing order, or every t with r_t < k / d in CSR order
    t = [int(x) for x in ixn[start : start + d]]
    rank = [mix64((rkey + (x + 1) * GAMMA) & M64) for x in t]
    if d <= fanout:
        return t
    if poisson:
        return [x for x, r in zip(t, rank) if (r >> 11) * 2.0**-53 < fanout / d]
    return [t[q] for q in sorted(range(d), key=lambda q: (rank[q], q))[:fanout]]


g = mixed_graph(0)  # repeated neighbours (ties), the hub 7 (300 neighbours), isolated nodes
ip, ix = g.to_torch()
ipn, ixn = np.asarray(g.indptr), np.asarray(g.indices)
real = [7, *range(8, 40), 130, 3, 7]  # the hub twice, rows with ties, an isolated row
nodes = torch.tensor(real + [7, 12, 7, 0, 7])  # padding rows (stale ids) past the count
rows, count, fanout = len(nodes), torch.tensor([len(real)]), 4
for rkey, poisson, part in ((123456789, False, 1), (M64 - 987, True, 2), (M64 - 5, False, 2)):
    want = [reference(ixn, int(ipn[v]), int(ipn[v + 1] - ipn[v]), fanout, rkey, poisson)
            for v in real]
    k = [len(w) for w in want] + [0] * (rows - len(real))
    if poisson:  # the counts, padding rows 0
        kt = torch.full((rows,), -5)
        count_triton(ip, ix, nodes, count, kt, rows, fanout, rkey)
        assert kt.tolist() == k, (kt.tolist(), k)
    off = torch.tensor(np.r_[0, np.cumsum(k)])
    flat = [x for w in want for x in w]
    rid = [r for r, w in enumerate(want) for _ in w]
    cap = len(flat) // part  # every edge, or a bound below them: a prefix
    src, row = torch.full((len(flat) + 16,), -7), torch.full((len(flat) + 16,), -7)
    select_triton(ip, ix, nodes, fanout, rkey, count, off, (src[:cap], row[:cap]), None, rows,
                  poisson)
    assert src[:cap].tolist() == flat[:cap] and row[:cap].tolist() == rid[:cap], (rkey, cap)
    assert bool((src[cap:] == -7).all()) and bool((row[cap:] == -7).all()), (rkey, cap)
print("ok")
"""


def test_labor_kernels_equal_a_python_reference_and_stop_at_the_cap():
    """The LABOR-0 kernels keep a Python reference's neighbours (ties by position, Poisson's
    ``r_t < k / d``), count padding rows as 0, and write nothing past the output's end."""
    run_in_triton_interpreter(LABOR)
