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
hop, not the uniform GPU sampler's one (:mod:`gnnio.sampling.gpu`). That is the synced path
(:meth:`TorchLaborSampler._sample_synced`), which runs for a fanout of -1 and redoes the rare
batch the bounded one cannot hold.

**The bounded batch** (what :meth:`TorchLaborSampler.sample` runs; issue 24 item 3). The synced
path reads the device several
times per hop (the neighbour count to size its arrays, the Poisson design's boolean mask, the
relabelling's count): 10 syncs per batch of 3 hops, 13 with Poisson (counted on the CPU with
``count_syncs``), and on an H200 LABOR-0 sampled at 0.52 of
the uniform GPU sampler's pace. Here a LABOR-0 batch runs through the uniform sampler's bounded
framework (:func:`gnnio.sampling.gpu_bounded.sample_bounded`: buffers sized by bounds from the
fanouts, counts on the device, the relabelling kernels, **one** ``meta.tolist()`` at the end, one
``cat``); only the hop differs (:func:`labor_hop`):

* fixed design: a row keeps ``k = min(d, fanout)`` neighbours, known from its degree as for
  uniform sampling, so the relabelling's ``k`` of the next hop holds; one Triton kernel
  (:mod:`._triton_labor`) writes each row's ``k`` smallest ``r_t`` into the hop's CSR positions;
* Poisson design: a row's count is random (``r_t < k / d``), so a count kernel writes every
  row's ``k`` and a ``cumsum`` makes the offsets before the same kernel writes the kept
  neighbours. A row may keep more than ``fanout``: the edge bounds are taken at
  :data:`POISSON_SLACK` times the fanouts, and a batch whose hop drew more than its bound (the
  count stays on the device; the end's one read sees it) is sampled again by the synced path
  (same batch): a hop of ``R`` rows would need about twice its mean, rare unless the rows share
  most neighbours (then their counts rise and fall together).

With ``cuda_graph`` the bounded batch is replayed as a CUDA graph
(:mod:`gnnio.sampling.gpu_graphed`: each hop's LABOR key in a static device buffer that the
kernels read), the edge weights computed after the replay.

Where Triton cannot build the kernels (one warning, ``kernels["labor_hop"] = "torch"``), the same
writes in torch ops (:func:`labor_hop_bounded_torch`): they read each hop's neighbour count on the
host to size a segmented ``arange``, so a batch syncs ``1 + len(fanouts)`` times, same batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from .base import Block, MiniBatch, dst_ptr
from .gpu import TorchUniformSampler, _relabel
from .gpu_bounded import sample_bounded
from .gpu_hop import _GAMMA, _repeat_rows, _s64, _srl, bad_seeds, mix64_torch
from .threaded import hop_key

__all__ = [
    "POISSON_SLACK",
    "TorchLaborSampler",
    "labor_hop",
    "labor_hop_bounded_torch",
    "labor_hop_torch",
    "vertex_rank_torch",
]

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


#: the Poisson design's edge bounds: this many times the fanouts (a row may keep more than k)
POISSON_SLACK = 2


def labor_hop_bounded_torch(ip, ix, nodes, rows: int, count, cum, fanout: int, rkey: int,
                            poisson: bool, out) -> None:  # fmt: skip
    """The hop's writes of :mod:`._triton_labor` in torch ops: rows ``nodes[:rows]`` (real up to
    ``count``), into ``out = (src, row)`` at the offsets ``cum[:-1]`` (Poisson: ``cum[1:]``
    rewritten first, the rows' counts summed). One host sync (the neighbour count)."""
    src_out, row_out = out
    cap, dev = int(src_out.shape[0]), src_out.device
    g = nodes[:rows]
    start = ip[g]
    deg = torch.where(torch.arange(rows, device=dev) < count, ip[g + 1] - start, 0)
    total = int(deg.sum())  # host sync: the neighbour positions to read
    if poisson:
        cum[1:].zero_()
    if total == 0:
        return
    row = _repeat_rows(deg, total)
    pos = torch.arange(total, device=dev) - (torch.cumsum(deg, 0) - deg)[row]
    t = ix[start[row] + pos].to(torch.int64)
    whole = deg[row] <= fanout
    rank = vertex_rank_torch(rkey, t)
    if poisson:
        frac = _srl(rank, 11).to(torch.float64) * _INV_2_53
        keep = whole | (frac < fanout / deg[row].to(torch.float64))
        cum[1:].index_add_(0, row, keep.to(torch.int64))
        cum[1:].cumsum_(0)
    else:  # grouped by row, increasing r_t within a row (whole rows: CSR order); first k kept
        key = torch.where(whole, _SIGN, rank ^ _SIGN)  # signed order of the flipped bits
        o1 = torch.sort(key, stable=True).indices
        t = t[o1[torch.sort(row[o1], stable=True).indices]]  # (row stays sorted)
        keep = pos < torch.clamp(deg, max=fanout)[row]
    dest = torch.cumsum(keep, 0) - 1
    target = torch.where(keep & (dest < cap), dest, cap)
    for vals, dst in ((t, src_out), (row, row_out)):
        tmp = torch.zeros(cap + 1, dtype=torch.int64, device=dev)
        tmp.scatter_(0, target, vals)
        dst.copy_(tmp[:cap])


def labor_keys(key: int, hops: int, layer_dependency: bool) -> list[int]:
    """Each hop's LABOR key of call ``key``: ``hop_key(key, h) ^ _DOMAIN_LABOR``, hop 0's for
    every hop with ``layer_dependency`` (the same ``r_t`` in every layer)."""
    return [hop_key(key, 0 if layer_dependency else h) ^ _DOMAIN_LABOR for h in range(hops)]


def labor_hop(sampler, buf, h: int, n_rows: int, rkey, loc, first):
    """Hop ``h`` of a LABOR-0 batch for :func:`gnnio.sampling.gpu_bounded.sample_bounded`
    (its ``hop``; the uniform ``_hop``'s signature; ``rkey``: the hop's LABOR key,
    :func:`labor_keys`, or an int64 ``[1]`` device tensor of its bits, as
    :mod:`gnnio.sampling.gpu_graphed` passes it): ``(src, row, claimed)``."""
    fanout, e = sampler.fanouts[h], int(buf.src[h].shape[0])
    ip, ix, dev, poisson = sampler.indptr, sampler.indices, sampler.device, sampler.poisson
    out = (buf.src[h], buf.row[h])
    if e == 0:  # nothing to draw (fanout 0, no rows or no edges): no kernel of either kind
        return out[0], out[1], False
    if triton_available(dev, "labor_hop"):
        try:
            from . import _triton_labor as TL

            if poisson:  # the rows' counts, then their offsets
                TL.count_triton(ip, ix, buf.nodes, buf.count[h], buf.k[h], n_rows, fanout, rkey)
                buf.k[h].cumsum_(0)
            TL.select_triton(ip, ix, buf.nodes, fanout, rkey, buf.count[h], buf.cum[h], out,
                             (loc, first), n_rows, poisson)  # fmt: skip
            kernel_ran("labor_hop", "triton")
            return out[0], out[1], True
        except Exception as err:  # noqa: BLE001 - a Triton that cannot build it: torch ops
            kernel_failed("labor_hop", err, "LABOR-0 sampling with torch ops instead (same "
                          "batches, one host sync per hop more)")  # fmt: skip
    kernel_ran("labor_hop", "torch")
    if isinstance(rkey, torch.Tensor):  # (a kernel that failed while a graph was being prepared)
        rkey = int(rkey.item()) & ((1 << 64) - 1)
    labor_hop_bounded_torch(ip, ix, buf.nodes, n_rows, buf.count[h], buf.cum[h], fanout, rkey,
                            poisson, out)  # fmt: skip
    return out[0], out[1], False


# what gpu_graphed checks before it captures this hop, and its graphs' and report entry's name
labor_hop.triton_kernel = "labor_hop"  # type: ignore[attr-defined]  # a function attribute gpu_graphed reads
labor_hop.graph_name = "labor"  # type: ignore[attr-defined]  # a function attribute gpu_graphed reads


class TorchLaborSampler(TorchUniformSampler):
    """LABOR-0 over torch CSR tensors (any device; meant for CUDA), bit-identical to the numba
    :class:`~gnnio.sampling.labor.LaborSampler` with the same options and call key.

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` -- CSR of in-neighbours on the sampling device.
        fanouts: per hop, ``fanouts[0]`` = the seeds' hop.
        design: ``"fixed"`` or ``"poisson"``; layer_dependency: reuse hop 1's ``r_t``;
        weights: ``"ht"``, ``"ht_mean"`` or ``"none"`` (see :mod:`gnnio.sampling.labor`).
        cuda_graph: replay each bounded batch's launches as a CUDA graph
            (:mod:`.gpu_graphed`; the same batches; the weights are computed after the replay).

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
        cuda_graph: bool = False,
    ):
        super().__init__(indptr, indices, fanouts, cuda_graph=cuda_graph)
        self.poisson = design == "poisson"
        self.layer_dependency = bool(layer_dependency)
        self.weights = weights

    def _check_seeds(self, seeds) -> torch.Tensor:
        """The synced path's seeds: checked, on the device, range and repeats (one host sync)."""
        seeds = self._device_seeds(self._int64_seeds(seeds))
        if seeds.numel():  # range and repeats read back together: one host sync, not three
            srt = torch.sort(seeds).values
            none = torch.iinfo(torch.int64).max
            repeat = torch.where(srt[1:] == srt[:-1], srt[1:], none)
            dup = torch.cat([repeat, srt.new_full((1,), none)]).min()  # smallest repeated id
            lo, hi, dup = torch.stack([srt[0], srt[-1], dup]).tolist()
            if lo < 0 or hi >= self.num_nodes or dup != none:
                raise bad_seeds(seeds, lo, hi, self.num_nodes, dup)
        return seeds

    def sample(self, seeds, key: int) -> MiniBatch:
        """Sample around ``seeds`` (distinct global ids) with the random stream of ``key``: the
        bounded batch (one host sync; module docstring) -- with ``cuda_graph`` a CUDA graph's
        replay (:mod:`.gpu_graphed`) --, else the synced path."""
        slack = POISSON_SLACK if self.poisson else 1
        keys = labor_keys(key, len(self.fanouts), self.layer_dependency)
        seeds = self._int64_seeds(seeds)
        if self.cuda_graph:  # seeds and keys uploaded together, the batch one replay
            from .gpu_graphed import graphable, not_replayed, sample_graphed

            mb = sample_graphed(self, seeds, key, hop=labor_hop, slack=slack, keys=keys)
            if mb is not None:
                return self._weigh(mb)
            if graphable(self, int(seeds.shape[0]), labor_hop, slack) is not None:
                return self._sample_synced(seeds, key)  # a Poisson hop past its bound
            not_replayed(self, "the LABOR-0 sampler", int(seeds.shape[0]))
        seeds = self._device_seeds(seeds)
        mb = sample_bounded(self, seeds, key, hop=labor_hop, slack=slack, keys=keys)
        if mb is None:  # fanout -1, huge bounds, or a Poisson hop past its bound
            return self._sample_synced(seeds, key)
        return self._weigh(mb)

    def _weigh(self, mb: MiniBatch) -> MiniBatch:
        """The blocks' edge weights and ``meta["sampler"]``: :func:`gnnio.sampling.labor.
        labor_weights` of each edge's destination degree ``d`` in float64 ops (``k = min(d,
        fanout)``; ``max(d, 1) / max(k, 1)`` is its ``where(k > 0, max(d, 1) / k, 1)``), no host
        sync, 5 + 6 per hop torch ops (was 16 per hop)."""
        if self.weights != "none":
            nodes, ip = mb.input_nodes, self.indptr
            deg = (ip[nodes + 1] - ip[nodes]).to(torch.float64)
            for f, blk in zip(self.fanouts, reversed(mb.blocks), strict=True):
                d1 = deg[blk.edge_index[1]].clamp_(min=1)
                k1 = d1 if f < 0 else d1.clamp(max=max(f, 1))  # (f = 0: no edges)
                w = d1 / k1 if self.weights == "ht" else 1.0 / k1
                blk.edge_weight = w.to(torch.float32)
        mb.meta["sampler"] = "labor"
        return mb

    def _sample_synced(self, seeds, key: int) -> MiniBatch:
        """The batch with a few host syncs per hop (module docstring)."""
        seeds = self._check_seeds(seeds)
        loc, first = self._take()
        dev, ip = self.device, self.indptr
        b = int(seeds.shape[0])
        loc.index_copy_(0, seeds, torch.arange(b, device=dev))
        parts, hop_nodes, hop_edges = [seeds], [b], []
        dst_nodes = seeds
        for h, fanout in enumerate(self.fanouts):
            rkey = labor_keys(key, h + 1, self.layer_dependency)[h]
            src, dst = labor_hop_torch(ip, self.indices, dst_nodes, fanout, rkey, self.poisson)
            self._mark("sample")
            new, _, _ = _relabel(src, loc, first, hop_nodes[-1], ip, ())
            self._mark("relabel")
            parts.append(new)
            hop_nodes.append(hop_nodes[-1] + int(new.shape[0]))
            hop_edges.append(torch.stack([loc[src], dst]))
            dst_nodes = torch.cat(parts)
        loc.index_fill_(0, dst_nodes, -1)  # (``loc[x] = -1`` copies -1 up from the host, waits)
        self._give(loc, first)
        blocks = []
        for h in range(len(hop_edges) - 1, -1, -1):
            # edges grouped by row in destination order (labor_hop_torch): the CSR pointer, so
            # the model aggregates without sorting them again (on a GPU it always would)
            ei = hop_edges[h]
            blocks.append(Block(ei, num_src=hop_nodes[h + 1], num_dst=hop_nodes[h],
                                ptr=dst_ptr(ei, hop_nodes[h])))  # fmt: skip
        mb = MiniBatch(seeds=seeds, input_nodes=dst_nodes, blocks=blocks,
                       meta={"hop_nodes": hop_nodes})  # fmt: skip
        return self._weigh(mb)
