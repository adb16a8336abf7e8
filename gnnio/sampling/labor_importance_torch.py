"""LABOR-i with vectorized torch ops, for topology held on a GPU
(``LaborSampler(importance_sampling=i, device="cuda")``).

The same sampler as the numba kernels of :mod:`gnnio.sampling._labor_importance` (read its
docstring for the method): per hop, the same distinct sources in the same first-appearance order,
the same ``i`` fixed-point steps ``pi_t <- pi_t max_s c_s`` (then rescaled to max 1) with the same
early stop, every ``c_s`` solved by the same saturated-set iteration, the same ``r_t``
(:func:`gnnio.sampling.labor_torch.vertex_rank_torch`), kept edges, local ids, block edge order and
weights, and the same ``meta["importance_steps"]``. Nothing here is CUDA-specific; the tests run it
on CPU tensors, where a batch equals the numba one bit for bit.

One hop, with ``D`` the summed degree of the rows (every node of the batch so far, seeds first):

1. every neighbour position (a segmented ``arange``, ``[D]``, rows in order, CSR order within a
   row) and its source ``t``; the distinct sources numbered in first-appearance order: each one's
   first position by an integer ``scatter_reduce(amin)`` into the ``first`` map, a ``cumsum`` of
   the first positions (no sort);
2. ``c_s`` for every row at once (:func:`solve_rows`): rows taken whole ``(k / d) / min pi`` (a
   segment min); the others run the kernel's saturated-set rounds side by side -- per round the
   saturated count, ``sum 1 / pi`` outside the set and the largest unsaturated ``pi`` per row by
   ``torch.segment_reduce`` over the CSR-ordered positions (no float ``index_add_`` /
   ``scatter_add_``: atomics change the bits run to run on a GPU), ``c = rest / (d^2/k - |J|)``
   taken where ``rest > 0``, a row done once ``c * top < 1`` or after ``d + 1`` rounds, as the
   kernel's loop;
3. per step: ``max_s c_s`` per source by ``scatter_reduce(amax)`` (max is order-free, so
   deterministic), the expected distinct sources ``sum_t min(1, acc_t pi_t)`` by a ``cumsum`` in
   first-appearance order (the kernel's loop order), the early-stop test, ``pi`` updated and
   rescaled, the ``c_s`` solved again;
4. ``p = min(1, c_s pi_t)`` (1 for rows taken whole), keep iff ``r_t < p`` (the kernel's 53-bit
   comparison); the kept sources relabelled in first-appearance order; weights ``1 / p`` or
   ``1 / (d p)`` in float32.

**Host synchronisations.** One for the seeds (range, repeats and hop 1's ``D``); per hop one
early-stop test per step after the first (the first step never stops: nothing to compare with),
``min(steps, i - 1)``, and one at the hop's end (kept edges, new nodes, the next hop's ``D``):
``1 + sum_h (1 + min(steps_h, i - 1))`` per batch, hops with no neighbour to read none
(``count_syncs`` holds the tests to it). The saturated-set solve reads nothing back: it runs
``rounds`` rounds (:data:`ROUNDS` at first) and folds "a row still unsolved" into a device flag
that the hop's end reads with its counts; where that flag is set (a row whose set grew ``rounds``
times or more), the hop is computed again with the rounds repeated until every row is done (a
read per round), the same batch, and the sampler runs as many rounds from then on (hub graphs
need 4 or 5: one batch computes a hop twice, the next ones rarely).

**Bits on a GPU.** On CPU tensors ``segment_reduce`` and ``cumsum`` add in sequence, as the
kernel's loops do, so ``c``, ``pi`` and ``p`` are the kernel's bits. On CUDA both are deterministic
(the same bits run to run) but add in a tree / scan order, so ``c`` and the expected count may
differ from the CPU's in the last bits: the weights agree within float rounding, an edge's fate
differs only where ``r_t`` falls within an ulp of ``p``, and a step count only where a relative
change sits within rounding of ``1e-4``. Cost per hop ``O((i + 1) R D)`` for ``R`` rounds per solve
(the kernel: ``O((i + 1) D)`` plus its rounds, usually one), no sort.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..utils.triton_kernels import kernel_ran
from .base import Block, MiniBatch, dst_ptr
from .gpu import TorchUniformSampler
from .gpu_hop import _SENTINEL, _repeat_rows, _srl
from .labor_torch import labor_keys, vertex_rank_torch

__all__ = [
    "ROUNDS",
    "TorchLaborImportanceSampler",
    "expected_sources",
    "hop_probabilities_torch",
    "solve_rows",
]

_EPS = 1e-4  # = gnnio.sampling._labor_importance._EPS (DGL's convergence test)
_INV_2_53 = 1.0 / 9007199254740992.0
#: saturated-set rounds per solve at first ("a row still unsolved" is read at the hop's end)
ROUNDS = 3


def _seg(v: torch.Tensor, how: str, lengths: torch.Tensor) -> torch.Tensor:
    """Per row (``lengths``: the rows' degrees) ``how`` of ``v`` over its CSR-ordered positions:
    deterministic, in sequence on the CPU."""
    return torch.segment_reduce(v, how, lengths=lengths, unsafe=True)


def solve_rows(x, row, deg, fanout: int, rounds: int | None):
    """Every row's ``c`` for the importances ``x = pi_t`` per position (float64 ``[D]``; rows
    ``row``, degrees ``deg``; module docstring, step 2): rows taken whole
    ``(max(k, d) / d) / min pi``, rows without neighbours (or ``fanout = 0``) 0, the others the
    kernel's :func:`~gnnio.sampling._labor_importance.solve_c`, bit for bit on the CPU. ``rounds``
    saturated-set rounds (None: until every row is done, a read per round). Returns ``(c,
    unsolved, ran)``: float64 ``[n]``, a device bool (True where a row needed more rounds) and the
    rounds run."""
    dev = x.device
    dfl = deg.to(torch.float64)
    if fanout == 0:
        return torch.zeros_like(dfl), torch.zeros((), dtype=torch.bool, device=dev), 0
    full = (deg <= fanout) if fanout > 0 else torch.ones_like(deg, dtype=torch.bool)
    whole = torch.clamp(deg, min=fanout).to(torch.float64) / dfl / _seg(x, "min", deg)
    c = torch.where(full & (deg > 0), whole, 0.0)
    act = (deg > 0) & ~full
    if fanout < 0:  # every row taken whole: no rounds
        return c, act.any(), 0
    inv = 1.0 / x
    target = dfl * (dfl / fanout)
    rnd = torch.zeros_like(deg)
    done = 0
    while rounds is None or done < rounds:
        if rounds is None and not act.any().tolist():  # (the careful solve: a read per round)
            break
        sat = c[row] * x >= 1.0
        j = _seg(sat.to(torch.float64), "sum", deg)
        rest = _seg(torch.where(sat, 0.0, inv), "sum", deg)  # (+0.0 for a saturated one: exact)
        top = _seg(torch.where(sat, 0.0, x), "max", deg)
        cn = rest / (target - j)
        upd = act & (rest > 0.0)
        c = torch.where(upd, cn, c)
        rnd += 1
        act = upd & ~(cn * top < 1.0) & (rnd < deg + 1)
        done += 1
    return c, act.any(), done


def expected_sources(acc: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """``sum_t min(1, acc_t pi_t)`` in slot (first-appearance) order, as a device scalar: a
    ``cumsum``, which adds in sequence on the CPU as the kernel's loop does (``sum`` adds
    pairwise: other last bits, and the early stop compares them)."""
    return torch.cumsum(torch.clamp(acc * pi, max=1.0), 0)[-1]


def hop_probabilities_torch(t, row, deg, first, fanout: int, iters: int, rounds: int | None):
    """Steps 1-4's probabilities of one hop with ``D > 0`` positions (sources ``t``, rows ``row``,
    rows' degrees ``deg``; ``first`` the ``[N + 1]`` all-sentinel map, all-sentinel again on
    return): ``(p, steps, unsolved, ran)`` -- the inclusion probability per position (float64),
    the steps taken, the device flag of :func:`solve_rows` over every solve (where it is set, the
    hop is to be computed again with ``rounds=None``) and the most rounds a solve ran."""
    total, dev = int(t.shape[0]), t.device
    ar = torch.arange(total, device=dev)
    first.scatter_reduce_(0, t, ar, reduce="amin")
    fpos = first[t]
    first.index_fill_(0, t, _SENTINEL)
    cid = (torch.cumsum(fpos == ar, 0) - 1)[fpos]  # the source's first-appearance slot
    pi = torch.ones(total, dtype=torch.float64, device=dev)  # (slots past the sources': acc 0)
    c, bad, ran = solve_rows(pi[cid], row, deg, fanout, rounds)
    prev = None
    steps = 0
    for _ in range(iters if fanout != 0 else 0):  # (a fanout of 0 keeps nothing: no steps)
        acc = torch.zeros(total, dtype=torch.float64, device=dev)
        acc.scatter_reduce_(0, cid, c[row], reduce="amax")
        expect = expected_sources(acc, pi)
        if prev is not None and (expect >= (1.0 - _EPS) * prev).tolist():  # the step's one read
            break
        prev = expect
        steps += 1
        pi = pi * acc
        top = pi.max()
        pi = torch.where(top > 0.0, pi / top, pi)
        c, more, r = solve_rows(pi[cid], row, deg, fanout, rounds)
        bad, ran = bad | more, max(ran, r)
    full = (deg <= fanout) if fanout >= 0 else torch.ones_like(deg, dtype=torch.bool)
    p = torch.where(full[row], 1.0, torch.clamp(c[row] * pi[cid], max=1.0))
    return p, steps, bad, ran


class TorchLaborImportanceSampler(TorchUniformSampler):
    """LABOR-i over torch CSR tensors (any device; meant for CUDA), the numba
    :class:`~gnnio.sampling.labor.LaborSampler` with ``importance_sampling=iters``'s batches
    (module docstring: bit for bit on CPU tensors, within float rounding of the weights on CUDA).

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` (int32 or int64) -- CSR of in-neighbours on
            the sampling device (or UVA views of pinned host memory).
        fanouts: per hop, ``fanouts[0]`` = the seeds' hop (-1: all neighbours).
        iters: ``i``, the fixed-point steps per hop (at most; the early stop may end them sooner).
        layer_dependency: reuse hop 1's ``r_t``; weights: ``"ht"``, ``"ht_mean"`` or ``"none"``.

    :meth:`sample` takes the 64-bit call key. Thread-safe (the scratch pool of
    :class:`~gnnio.sampling.gpu.TorchUniformSampler`).
    """

    def __init__(self, indptr, indices, fanouts: Sequence[int], iters: int,
                 layer_dependency: bool = False, weights: str = "ht"):  # fmt: skip
        super().__init__(indptr, indices, fanouts)
        self.iters = int(iters)
        self.layer_dependency = bool(layer_dependency)
        self.weights = weights
        self.rounds = ROUNDS  # (raised to what a careful solve needed: fewer hops computed twice)

    def sample(self, seeds, key: int) -> MiniBatch:
        """Sample the ``len(fanouts)``-hop LABOR-i neighbourhood of ``seeds`` (distinct global ids)
        with the random stream of ``key``; the numba sampler's batch, ``meta["sampler"] =
        "labor"`` and ``meta["importance_steps"]`` (the steps per hop, the seeds' hop first)."""
        kernel_ran("labor_i_hop", "torch")  # (the summary's kernels: which implementation ran)
        seeds, total, loc, first = self._start_batch(seeds)
        keys = labor_keys(key, len(self.fanouts), self.layer_dependency)
        nodes, hop_nodes, blocks_rev, steps = seeds, [int(seeds.shape[0])], [], []
        for fanout, rkey in zip(self.fanouts, keys, strict=True):
            new, edges, w, extra, st = self._hop(nodes, total, loc, first, fanout, rkey)
            total += extra
            steps.append(st)
            nodes = torch.cat((nodes, new)) if new.numel() else nodes
            hop_nodes.append(hop_nodes[-1] + int(new.shape[0]))
            blocks_rev.append(Block(edges, num_src=hop_nodes[-1], num_dst=hop_nodes[-2],
                                    edge_weight=w, ptr=dst_ptr(edges, hop_nodes[-2])))  # fmt: skip
        loc.index_fill_(0, nodes, -1)
        self._give(loc, first)
        return MiniBatch(seeds=seeds, input_nodes=nodes, blocks=blocks_rev[::-1],
                         meta={"hop_nodes": hop_nodes, "sampler": "labor",
                               "importance_steps": steps})  # fmt: skip

    def _hop(self, nodes, total: int, loc, first, fanout: int, rkey: int):
        """One hop from the rows ``nodes`` (local ids ``0..n-1`` in ``loc``) whose degrees sum to
        ``total``: ``(new nodes, edge_index [2, E], weights or None, summed degree of the new
        nodes, steps)``."""
        dev, ip, n = nodes.device, self.indptr, self.num_nodes
        if total == 0:  # no neighbours: the kernel's one step on nothing (none for a fanout of 0)
            empty = torch.empty(0, dtype=torch.int64, device=dev)
            w = None if self.weights == "none" else torch.empty(0, dtype=torch.float32, device=dev)
            return empty, torch.empty((2, 0), dtype=torch.int64, device=dev), w, 0, int(fanout != 0)
        start = ip[nodes]
        deg = ip[nodes + 1] - start
        row = _repeat_rows(deg, total)
        ar = torch.arange(total, device=dev)
        t = self.indices[start[row] + ar - (torch.cumsum(deg, 0) - deg)[row]].to(torch.int64)
        rounds: int | None = self.rounds
        while True:  # (twice only where a solve needed more rounds: module docstring)
            p, steps, bad, ran = hop_probabilities_torch(t, row, deg, first, fanout, self.iters,
                                                         rounds)  # fmt: skip
            if rounds is None:
                with self._lock:  # (threads sharing the sampler: the count never falls back)
                    self.rounds = max(self.rounds, ran)
            keep = _srl(vertex_rank_torch(rkey, t), 11).to(torch.float64) * _INV_2_53 < p
            self._mark("sample")
            unknown = keep & (loc[t] < 0)
            first.scatter_reduce_(0, torch.where(unknown, t, n), ar, reduce="amin")
            is_new = unknown & (first[t] == ar)
            first.index_fill_(0, t, _SENTINEL)
            first[-1:].fill_(_SENTINEL)
            new_deg = torch.where(is_new, ip[t + 1] - ip[t], 0)
            e, cnt, extra, unsolved = torch.stack(
                [keep.sum(), is_new.sum(), new_deg.sum(), bad.to(torch.int64)]
            ).tolist()  # the hop's end: one host read
            if not unsolved:
                break
            rounds = None
        self._mark("relabel")
        new = torch.zeros(total + 1, dtype=torch.int64, device=dev)
        new.scatter_(0, torch.where(is_new, torch.cumsum(is_new, 0) - 1, total), t)
        new = new[:cnt]
        loc[new] = int(nodes.shape[0]) + torch.arange(cnt, device=dev)
        pos = torch.where(keep, torch.cumsum(keep, 0) - 1, e)
        edges = torch.zeros((2, e + 1), dtype=torch.int64, device=dev)
        edges[0].scatter_(0, pos, loc[t])
        edges[1].scatter_(0, pos, row)
        w = None
        if self.weights != "none":
            x = p * deg[row].to(torch.float64) if self.weights == "ht_mean" else p
            w = torch.zeros(e + 1, dtype=torch.float32, device=dev)
            w.scatter_(0, pos, (1.0 / x).to(torch.float32))
            w = w[:e]
        return new, edges[:, :e], w, extra, steps
