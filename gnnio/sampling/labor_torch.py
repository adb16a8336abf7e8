"""LABOR-0 with vectorized torch ops, for topology held on a GPU (``LaborSampler(device="cuda")``).

The same sampler as :class:`~gnnio.sampling.labor.LaborSampler`'s numba kernels
(:mod:`gnnio.sampling._labor_kernels`), bit for bit: the same per-vertex variate
``r_t = splitmix64(rkey + (t + 1) * GAMMA)`` (computed in int64 torch ops, whose products wrap as
uint64 ones do: :func:`gnnio.sampling.gpu.mix64_torch`), the same kept neighbours in the same order
(fixed design: each row's ``k`` smallest ``r_t`` in increasing ``r_t``, ties kept in CSR order;
``poisson``: ``r_t < k / d`` in CSR order), the same first-appearance numbering and weights. So a
batch equals the CPU sampler's with the same seed and call key on any device, which is how it is
tested (on CPU tensors; nothing here is CUDA-specific).

Per hop, with ``D`` the summed degree of the destination rows:

1. every neighbour position of every row, as a segmented ``arange`` (``[D]``), and its ``r_t``;
2. fixed design: a stable sort of the positions by ``r_t`` (as unsigned: the sign bit flipped),
   then a stable sort by row, so each row's neighbours come in increasing ``r_t``; the first
   ``min(d, k)`` of each row are kept (rows with ``d <= k`` sort on a constant and keep all, in
   CSR order). ``poisson``: a mask ``(r_t >> 11) * 2^-53 < k / d``, the kernel's comparison;
3. the kept sources are relabelled in first-appearance order
   (:func:`gnnio.sampling.gpu._relabel`).

Cost ``O(D log D)`` per hop (two sorts; the CPU kernel is ``O(D)`` with an insertion list of
``k``); like the CPU kernel it reads every neighbour of every row. Host synchronisations: the
seeds' checks, and per hop ``D``, the kept count (Poisson) and the relabelling's count -- a few per
hop, not the uniform GPU sampler's one (:mod:`gnnio.sampling.gpu`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Block, MiniBatch, dst_ptr
from .gpu import TorchUniformSampler, _relabel
from .gpu_hop import _GAMMA, _repeat_rows, _s64, _srl, mix64_torch
from .threaded import hop_key

__all__ = ["TorchLaborSampler", "labor_hop_torch", "vertex_rank_torch"]

_DOMAIN_LABOR = 0x1AB0_0000_0000_0001  # = gnnio.sampling.labor._DOMAIN_LABOR
_SIGN = _s64(1 << 63)
_INV_2_53 = 1.0 / 9007199254740992.0


def vertex_rank_torch(rkey: int, t: torch.Tensor) -> torch.Tensor:
    """``r_t`` of :func:`gnnio.sampling._labor_kernels.vertex_rank` as int64 bits."""
    return mix64_torch(_s64(rkey) + (t.to(torch.int64) + 1) * _GAMMA)


def labor_hop_torch(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    dst_nodes: torch.Tensor,
    fanout: int,
    rkey: int,
    poisson: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LABOR-0 hop on any device (see the module docstring).

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` -- CSR of in-neighbours.
        dst_nodes: int64 global ids of the destination rows.
        fanout: ``k`` (``-1`` = all neighbours).
        rkey: the hop's LABOR key (``hop_key(...) ^ _DOMAIN_LABOR``, a 64-bit int).
        poisson: the paper's Poisson design instead of the fixed-size one.

    Returns:
        ``(src, dst)``: int64 global ids of the kept neighbours and the position in ``dst_nodes``
        of their row, grouped by row in ``dst_nodes`` order, in the CPU kernel's order.
    """
    dev = dst_nodes.device
    start = indptr[dst_nodes]
    deg = indptr[dst_nodes + 1] - start
    total = int(deg.sum())  # host sync: the neighbour positions to read
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return empty, empty
    row = _repeat_rows(deg, total)
    off = torch.cumsum(deg, 0) - deg
    pos = torch.arange(total, device=dev) - off[row]
    t = indices[start[row] + pos].to(torch.int64)
    if fanout < 0:
        return t, row
    d_e = deg[row]
    whole = d_e <= fanout
    rank = vertex_rank_torch(rkey, t)
    if poisson:
        frac = _srl(rank, 11).to(torch.float64) * _INV_2_53
        p = fanout / d_e.to(torch.float64)
        keep = whole | (frac < p)
        return t[keep], row[keep]  # (boolean indexing: a host sync)
    key = torch.where(whole, _SIGN, rank ^ _SIGN)  # signed order of the flipped bits = unsigned
    o1 = torch.sort(key, stable=True).indices
    o2 = torch.sort(row[o1], stable=True).indices
    order = o1[o2]  # grouped by row (ascending), increasing r_t within a row
    k = torch.clamp(deg, max=fanout)
    keep = pos < k[row]  # ``row`` is already sorted, so position j of row r is entry off[r] + j
    sel = order[keep]
    return t[sel], row[sel]


class TorchLaborSampler(TorchUniformSampler):
    """LABOR-0 over torch CSR tensors (any device; meant for CUDA), bit-identical to the numba
    :class:`~gnnio.sampling.labor.LaborSampler` with the same options and call key.

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` -- CSR of in-neighbours on the sampling device.
        fanouts: per hop, ``fanouts[0]`` = the seeds' hop.
        design: ``"fixed"`` or ``"poisson"``; layer_dependency: reuse hop 1's ``r_t``;
        weights: ``"ht"``, ``"ht_mean"`` or ``"none"`` (see :mod:`gnnio.sampling.labor`).

    :meth:`sample` takes the 64-bit call key; :class:`~gnnio.sampling.labor.LaborSampler` derives it
    from its seed and call counter / ``epoch_seed``. Thread-safe: scratch tensors come from
    :class:`~gnnio.sampling.gpu.TorchUniformSampler`'s pool (with the event of their last use).
    """

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        fanouts: Sequence[int],
        design: str = "fixed",
        layer_dependency: bool = False,
        weights: str = "ht",
    ):
        super().__init__(indptr, indices, fanouts)
        self.poisson = design == "poisson"
        self.layer_dependency = bool(layer_dependency)
        self.weights = weights

    def _check_seeds(self, seeds) -> torch.Tensor:
        seeds = torch.as_tensor(seeds, device=self.device)
        if seeds.dim() != 1:
            raise ValueError(f"seeds: need a 1-D array of node ids, got shape {tuple(seeds.shape)}")
        if seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
            raise ValueError(f"seeds: need integer node ids, got dtype {seeds.dtype}")
        seeds = seeds.to(torch.int64)
        if seeds.numel():  # range and repeats read back together: one host sync, not three
            srt = torch.sort(seeds).values
            none = torch.iinfo(torch.int64).max
            repeat = torch.where(srt[1:] == srt[:-1], srt[1:], none)
            dup = torch.cat([repeat, srt.new_full((1,), none)]).min()  # smallest repeated id
            lo, hi, dup = torch.stack([srt[0], srt[-1], dup]).tolist()
            if lo < 0 or hi >= self.num_nodes:
                bad = lo if lo < 0 else hi
                raise ValueError(f"seeds: node id {bad} out of range [0, {self.num_nodes})")
            if dup != none:
                raise ValueError(
                    f"seeds: node id {dup} appears more than once; seeds must be distinct"
                )
        return seeds

    def _edge_weight(self, deg: torch.Tensor, fanout: int) -> torch.Tensor:
        """:func:`gnnio.sampling.labor.labor_weights` in torch (float64 math, float32 out)."""
        d = deg.to(torch.float64)
        k = d if fanout < 0 else torch.clamp(d, max=float(fanout))
        safe_k = torch.clamp(k, min=1.0)
        if self.weights == "ht":
            w = torch.where(k > 0, torch.clamp(d, min=1.0) / safe_k, 1.0)
        else:
            w = 1.0 / safe_k
        return w.to(torch.float32)

    def sample(self, seeds, key: int) -> MiniBatch:
        """Sample around ``seeds`` (distinct global ids) with the random stream of ``key``."""
        seeds = self._check_seeds(seeds)
        loc, first = self._take()
        dev, ip = self.device, self.indptr
        b = int(seeds.shape[0])
        loc[seeds] = torch.arange(b, device=dev)
        parts, hop_nodes, hop_edges = [seeds], [b], []
        dst_nodes = seeds
        for h, fanout in enumerate(self.fanouts):
            rkey = hop_key(key, 0 if self.layer_dependency else h) ^ _DOMAIN_LABOR
            src, dst = labor_hop_torch(ip, self.indices, dst_nodes, fanout, rkey, self.poisson)
            self._mark("sample")
            new, _, _ = _relabel(src, loc, first, hop_nodes[-1], ip, ())
            self._mark("relabel")
            parts.append(new)
            hop_nodes.append(hop_nodes[-1] + int(new.shape[0]))
            hop_edges.append(torch.stack([loc[src], dst]))
            dst_nodes = torch.cat(parts)
        loc[dst_nodes] = -1
        self._give(loc, first)
        blocks = []
        for h in range(len(hop_edges) - 1, -1, -1):
            # edges grouped by row in destination order (labor_hop_torch): the CSR pointer, so
            # the model aggregates without sorting them again (on a GPU it always would)
            ei = hop_edges[h]
            blk = Block(ei, num_src=hop_nodes[h + 1], num_dst=hop_nodes[h],
                        ptr=dst_ptr(ei, hop_nodes[h]))  # fmt: skip
            if self.weights != "none":
                rows = dst_nodes[: hop_nodes[h]]
                w_row = self._edge_weight(ip[rows + 1] - ip[rows], self.fanouts[h])
                blk.edge_weight = w_row[hop_edges[h][1]]
            blocks.append(blk)
        return MiniBatch(seeds=seeds, input_nodes=dst_nodes, blocks=blocks,
                         meta={"hop_nodes": hop_nodes, "sampler": "labor"})  # fmt: skip
