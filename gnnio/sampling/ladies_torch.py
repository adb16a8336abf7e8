"""LADIES with vectorized torch ops, for topology held on a GPU (``LadiesSampler(device="cuda")``).

The same sampler as :class:`~gnnio.sampling.ladies.LadiesSampler`'s numba kernels
(:mod:`gnnio.sampling._ladies_kernels`): the same candidates in the same first-appearance order,
the same inclusion probabilities ``pi_j = min(1, c p_j)``, the same ``u_j`` (SplitMix64 of
``(hop key, j)`` in int64 torch ops, :func:`gnnio.sampling.gpu_hop.mix64_torch`), the same kept
nodes and local ids, the same block edges in the same order (rows in order, CSR order within a
row) with the same weights. Nothing here is CUDA-specific; the tests run it on CPU tensors, where
a batch equals the numba one bit for bit.

One hop, with ``D`` the summed degree of the rows (every node of the batch so far):

1. every neighbour position of every row (a segmented ``arange``, ``[D]``); a position is a
   candidate's when its node is not a row (``loc < 0``);
2. ``p_j``: the positions stable-sorted by node id (rows' positions last), each id's run summed
   by ``torch.segment_reduce`` (lengths at the run starts, zero elsewhere) -- a segmented sum, no
   float ``index_add_`` / ``scatter_add_`` (atomics: not the same bits run to run on a GPU);
   the candidates then sorted by their first position: first-appearance order, as the kernel;
3. ``c``, exactly: ``p`` sorted in decreasing order, suffix sums ``R_m``; the capped set is the
   top ``m*`` for the first ``m`` with ``(K - m) p_(m) < R_m`` (the first that stays below 1 at
   ``c_m = (K - m) / R_m``; ``c_m`` grows with ``m`` up to there, so that ``m`` is the fixed point
   the kernel's iteration reaches), then ``c = (K - m*) / rest`` with ``rest`` the sum of the
   uncapped ``p`` in candidate order (a cumulative sum, as the kernel's loop adds them); where
   ``m* = K`` (the others' ``p`` below an ulp: ``c = 0``) the capped get 1, as the kernel's;
4. keep ``j`` iff ``pi_j >= 1`` or ``u_j < pi_j``; the kept ones numbered in candidate order
   (a cumulative sum), written into ``loc`` (scatter of int64, the masked ones to a dummy slot);
5. the block: every position whose node now has a local id, with weight ``1 / pi_j`` (rows 1),
   or ``1 / (d_i pi_j)``.

The locality-aware LADIES (:class:`~gnnio.sampling.ladies_locality.LocalityLadiesSampler`) adds
Eq. 8 to step 2: the rows' neighbour positions that hold a member of the layer's Q' are marked
from the node-wise locality sampler's member index (:func:`member_positions`, device ops, no
sync), and a member candidate's ``p_j`` is multiplied by ``s`` before step 3, as the kernel does.

**Bits on a GPU.** On CPU tensors ``segment_reduce`` and ``cumsum`` add in sequence, as the
kernel's loops do, so ``p``, ``c`` and ``pi`` are the kernel's bits. On CUDA both are
deterministic (no atomics: the same bits run to run) but add in a tree / scan order, so ``p`` and
``c`` may differ from the CPU's in the last bits: the weights agree within float rounding, and a
node's fate differs only when its ``u_j`` falls within an ulp of ``pi_j`` (about ``1e-16`` per
candidate). The gpu-marked test compares CUDA batches with the numba ones.

Host synchronisations: one for the seeds (range, repeats and hop 1's ``D``), then one per hop that
has neighbours to read (how many nodes it kept, its block's edges, the next hop's ``D``):
``len(layer_sizes) + 1`` per batch at most (``count_syncs`` holds the tests to it). Cost per hop:
two sorts of ``D`` entries and one of the candidates (``O(D log D)``; the kernel is ``O(D)``).
Scratch: :class:`~gnnio.sampling.gpu.TorchUniformSampler`'s two ``int64 [N + 1]`` maps (``loc``;
``first`` holds each candidate's slot during a hop), reset by touching only the batch's entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..utils.triton_kernels import kernel_ran
from .base import Block, MiniBatch, dst_ptr
from .gpu import TorchUniformSampler
from .gpu_hop import (
    _GAMMA,
    _SENTINEL,
    _repeat_rows,
    _s64,
    _srl,
    mix64_torch,
)
from .threaded import hop_key

__all__ = ["TorchLadiesSampler", "layer_pi_torch", "member_positions", "solve_budget_torch"]

_DOMAIN_LADIES = 0x1AD1_E500_0000_0001  # = gnnio.sampling.ladies._DOMAIN_LADIES
_INV_2_53 = 1.0 / 9007199254740992.0
_BUDGET_CAP = 1 << 62  # (a budget past it is "every candidate" for any graph that fits a tensor)


def solve_budget_torch(p: torch.Tensor, nc: torch.Tensor, budget: int) -> torch.Tensor:
    """``pi = min(1, c p)`` over the first ``nc`` (a device scalar) entries of ``p`` (float64,
    the others ignored; every real ``p > 0``), ``sum pi = min(budget, nc)`` (module docstring,
    step 3). The entries past ``nc`` get 1. No host sync."""
    n, dev = int(p.shape[0]), p.device
    ar = torch.arange(n, device=dev)
    valid = ar < nc
    pv = torch.where(valid, p, 0.0)
    target = torch.clamp(nc, max=min(int(budget), _BUDGET_CAP))
    srt, order = torch.sort(pv, descending=True, stable=True)
    suffix = torch.flip(torch.cumsum(torch.flip(srt, (0,)), 0), (0,))  # R_m
    m = ar.to(torch.float64)
    below = ((target - m) * srt < suffix) | (ar >= nc)
    mstar = torch.where(below, ar, n).min()  # the first True (there is one: m = target)
    capped = torch.empty(n, dtype=torch.bool, device=dev)
    capped.scatter_(0, order, ar < mstar)
    rest = torch.cumsum(torch.where(capped, 0.0, pv), 0)[-1]  # in candidate order, as the kernel
    c = (target - mstar).to(torch.float64) / rest
    pi = torch.clamp(c * pv, max=1.0)
    pi = torch.where(capped & (mstar >= target), 1.0, pi)  # (c = 0: the kernel's capped set, 1)
    return torch.where(valid & (target < nc), pi, 1.0)


def member_positions(q, nodes, deg, total: int) -> torch.Tensor:
    """Which of the rows' ``total`` neighbour positions (rows in order, CSR order within a row)
    hold a member of a layer's set Q', read from its member index ``q = (qptr, qpos)`` -- the
    uniform locality-aware sampler's (:meth:`~gnnio.sampling.locality.LocalitySampler.
    _member_index`: row ``v``'s member offsets ``qpos[qptr[v]:qptr[v + 1]]``, ``qpos`` not
    empty). Bool ``[total]``, no host sync: the members (at most ``total``) are spread over their
    rows as the positions are, and their positions marked."""
    qptr, qpos = q
    ar = torch.arange(total, device=nodes.device)
    qs = qptr[nodes]
    cnt = qptr[nodes + 1] - qs  # members per row, <= its degree
    mrow = _repeat_rows(cnt, total)  # (past the members: the last row, masked out below)
    idx = torch.clamp(qs[mrow] + ar - (torch.cumsum(cnt, 0) - cnt)[mrow], max=qpos.shape[0] - 1)
    pos = (torch.cumsum(deg, 0) - deg)[mrow] + qpos[idx]
    out = torch.zeros(total + 1, dtype=torch.bool, device=nodes.device)
    out.index_fill_(0, torch.where(ar < cnt.sum(), pos, total), True)
    return out[:total]


def layer_pi_torch(indptr, indices, nodes, total: int, loc, budget: int, q=None, scale=1.0):
    """Steps 1-3 of a hop (module docstring) from the rows ``nodes`` (``loc >= 0`` exactly for
    them; ``loc`` has the dummy last slot) whose degrees sum to ``total > 0``: ``(t, row, deg,
    cand, valid, pi)`` -- every neighbour position's node and row, the rows' degrees, the
    candidates in first-appearance order (``[total]``, the first ``valid.sum()`` real, the others
    the dummy id ``N``) and their inclusion probabilities (float64, 1 past the real ones). The
    numba kernels' :func:`~gnnio.sampling.ladies.layer_probabilities`, bit for bit on the CPU.
    With a member index ``q`` (:func:`member_positions`), Song & Jiang's Eq. 8: the ``p_j`` of
    the members of Q' times ``scale`` before the budget solve, as the kernel multiplies them."""
    dev, n = nodes.device, int(loc.shape[0]) - 1
    start = indptr[nodes]
    deg = indptr[nodes + 1] - start
    row = _repeat_rows(deg, total)
    ar = torch.arange(total, device=dev)
    t = indices[start[row] + ar - (torch.cumsum(deg, 0) - deg)[row]].to(torch.int64)
    # 2. candidates grouped by id (rows' positions sort last, on key n), p_j per run
    ks, perm = torch.sort(torch.where(loc[t] < 0, t, n), stable=True)
    prev = torch.cat((ks.new_full((1,), -1), ks[:-1]))
    change = ks != prev
    is_start = change & (ks < n)
    bound = torch.where(change, ar, total)  # the next run (or the rows' block) starts there
    nxt = torch.cat((bound[1:], bound.new_full((1,), total)))
    nxt = torch.flip(torch.cummin(torch.flip(nxt, (0,)), 0).values, (0,))
    dd = deg.to(torch.float64) + 1.0
    contrib = (1.0 / (dd * dd))[row[perm]]  # the kernel's 1 / ((d + 1) (d + 1)) per row
    lengths = torch.where(is_start, nxt - ar, 0)
    psum = torch.segment_reduce(contrib, "sum", lengths=lengths, unsafe=True)
    cand_order = torch.sort(torch.where(is_start, perm, total)).indices  # first appearance
    nc = is_start.sum()
    valid = ar < nc
    cand = torch.where(valid, ks[cand_order], n)  # (n: the dummy slot)
    p = psum[cand_order]
    if q is not None:  # a candidate's member flag: its first position's (ids sorted by perm)
        p = torch.where(member_positions(q, nodes, deg, total)[perm[cand_order]], p * scale, p)
    pi = solve_budget_torch(p, nc, budget)
    return t, row, deg, cand, valid, pi


class TorchLadiesSampler(TorchUniformSampler):
    """LADIES over torch CSR tensors (any device; meant for CUDA), the numba
    :class:`~gnnio.sampling.ladies.LadiesSampler`'s batches (module docstring: bit for bit on CPU
    tensors, within float rounding of the weights on CUDA).

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` (int32 or int64) -- CSR of in-neighbours on
            the sampling device (or UVA views of pinned host memory).
        layer_sizes: ``K`` per hop, hop 1 (the seeds') first.
        weights: ``"ht"``, ``"ht_mean"`` or ``"none"`` (see :mod:`gnnio.sampling.ladies`).
        member_index: the locality-aware LADIES (:class:`~gnnio.sampling.ladies_locality.
            LocalityLadiesSampler`): per hop (``layer_sizes`` order) the ``(qptr, qpos)`` of its
            layer's Q' (:func:`member_positions`), or None where that set is empty; uploaded
            here, once (tensors already on the device, e.g. UVA views, kept as they are).

    :meth:`sample` takes the 64-bit call key; :class:`~gnnio.sampling.ladies.LadiesSampler` derives
    it from its seed and call counter / ``epoch_seed``. Thread-safe (the scratch pool of
    :class:`~gnnio.sampling.gpu.TorchUniformSampler`).
    """

    def __init__(self, indptr, indices, layer_sizes: Sequence[int], weights: str = "ht",
                 member_index: Sequence | None = None):  # fmt: skip
        super().__init__(indptr, indices, [-1] * len(layer_sizes))
        self.layer_sizes = [int(k) for k in layer_sizes]
        self.weights = weights
        dev = self.device
        self._q = [  # (a set whose members have no out-edges: no row has a member)
            None if q is None or len(q[1]) == 0 else tuple(torch.as_tensor(x).to(dev) for x in q)
            for q in (member_index or [None] * len(self.layer_sizes))
        ]

    def sample(self, seeds, key: int, scale: float = 1.0) -> MiniBatch:
        """Sample ``len(layer_sizes)`` LADIES layers below ``seeds`` (distinct global ids) with the
        random stream of ``key`` and Eq. 8's ``scale`` on the member index's sets (1: LADIES);
        the batch as the numba sampler's (``meta["sampler"] = "ladies"``)."""
        s = float(scale)
        kernel_ran("ladies_hop", "torch")  # (the summary's kernels: which implementation ran)
        seeds, total, loc, first = self._start_batch(seeds)
        nodes, hop_nodes, blocks_rev = seeds, [int(seeds.shape[0])], []
        for h, budget in enumerate(self.layer_sizes):
            hkey = _s64(hop_key(key, h) ^ _DOMAIN_LADIES)
            q = self._q[h] if s != 1.0 else None  # (s = 1: LADIES, the same p_j bits)
            new, edges, w, extra = self._hop(nodes, total, loc, first, budget, hkey, hop_nodes[-1],
                                             q, s)  # fmt: skip
            total += extra
            nodes = torch.cat((nodes, new)) if new.numel() else nodes
            hop_nodes.append(hop_nodes[-1] + int(new.shape[0]))
            blocks_rev.append(Block(edges, num_src=hop_nodes[-1], num_dst=hop_nodes[-2],
                                    edge_weight=w, ptr=dst_ptr(edges, hop_nodes[-2])))  # fmt: skip
        loc.index_fill_(0, nodes, -1)
        loc[-1:].fill_(-1)  # (the dummy slot of masked writes)
        self._give(loc, first)
        return MiniBatch(seeds=seeds, input_nodes=nodes, blocks=blocks_rev[::-1],
                         meta={"hop_nodes": hop_nodes, "sampler": "ladies"})  # fmt: skip

    def _hop(self, nodes, total: int, loc, first, budget: int, hkey: int, base: int, q=None,
             scale: float = 1.0):  # fmt: skip
        """One hop (module docstring) from the rows ``nodes`` whose degrees sum to ``total``
        (Eq. 8 with the member index ``q`` and ``scale``): ``(new nodes, edge_index [2, E],
        weights or None, summed degree of the new nodes)``."""
        dev, ip, n = nodes.device, self.indptr, self.num_nodes
        wmode = self.weights
        if total == 0:  # no neighbours to read: no candidates, no edges, no sync
            empty = torch.empty(0, dtype=torch.int64, device=dev)
            w = None if wmode == "none" else torch.empty(0, dtype=torch.float32, device=dev)
            return empty, torch.empty((2, 0), dtype=torch.int64, device=dev), w, 0
        t, row, deg, cand, valid, pi = layer_pi_torch(ip, self.indices, nodes, total, loc, budget,
                                                      q, scale)  # fmt: skip
        ar = torch.arange(total, device=dev)
        # 4. Poisson draws with the kernel's u_j; kept ones numbered in candidate order
        u = _srl(mix64_torch(hkey + (cand + 1) * _GAMMA), 11).to(torch.float64) * _INV_2_53
        keep = valid & ((pi >= 1.0) | (u < pi))
        self._mark("sample")
        rank = torch.cumsum(keep, 0) - 1
        loc.scatter_(0, torch.where(keep, cand, n), base + rank)
        first.scatter_(0, cand, ar)  # candidate slots (the dummy slot takes the masked ones)
        kept_deg = torch.where(keep, ip[torch.clamp(cand + 1, max=n)] - ip[cand.clamp(max=n)], 0)
        # 5. the block: positions whose node has a local id now
        src = loc[t]
        ok = src >= 0
        cnt, e, extra = torch.stack([keep.sum(), ok.sum(), kept_deg.sum()]).tolist()  # the sync
        self._mark("relabel")
        new = torch.zeros(total + 1, dtype=torch.int64, device=dev)
        new.scatter_(0, torch.where(keep, rank, total), cand)
        pos = torch.where(ok, torch.cumsum(ok, 0) - 1, e)
        edges = torch.zeros((2, e + 1), dtype=torch.int64, device=dev)
        edges[0].scatter_(0, pos, src)
        edges[1].scatter_(0, pos, row)
        w = None
        if wmode != "none":
            slot = first[t]
            x = 1.0 / torch.cat((pi, pi.new_ones(1)))[torch.clamp(slot, max=total)]
            if wmode == "ht_mean":
                x = x / deg[row].to(torch.float64)
            w = torch.zeros(e + 1, dtype=torch.float32, device=dev)
            w.scatter_(0, pos, x.to(torch.float32))
            w = w[:e]
        first.scatter_(0, cand, _SENTINEL)
        first[-1:].fill_(_SENTINEL)
        return new[:cnt], edges[:, :e], w, extra
