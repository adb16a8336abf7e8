"""Song & Jiang's locality-aware sampler on the GPU (``LocalitySampler(..., device="cuda")``;
issue 24 item 5).

The same batches as :class:`~gnnio.sampling.locality.LocalitySampler`'s numba kernels with the
same seed, call key and scale -- nodes, edges and their order, the blocks' CSR pointers, the edge
weights -- sampled on the GPU through the uniform GPU sampler's bounded batch
(:func:`gnnio.sampling.gpu_bounded.sample_bounded`: buffers sized from the fanouts, the counts on
the device, the relabelling kernels, **one** host sync at the end). Only the hop differs
(:func:`las_hop`):

* ``scale == 1`` (or no hot set): every hop is HyDRA's pruned uniform hop -- the CPU class
  samples those rows with ``use_q=False``, the :class:`~gnnio.sampling.pruned_torch.
  TorchPrunedSampler` draws -- and the weights its formula;
* otherwise a hop whose layer's set Q' is empty is the same pruned uniform hop, and the others
  run :mod:`._triton_las` (the CPU kernel's ``sample_rows`` with ``use_q``; its docstring says
  what is equal: the weights always, nodes and edges unless an ``exp``/``log`` ulp moves a
  member count). The member index (``qptr``/``qpos`` of each layer's Q') is uploaded once, when
  the sampler is built (UVA sampling, ``graph_in="host"``: CUDA views of it in pinned host
  memory, as the CSR); the scale's float64 constants once per scale (a blocking upload of 24
  bytes the first time a scale is used; Algorithm 2 changes it between epochs; a CUDA graph's
  replay reads them from its input buffer instead, below).

Batches the bounded form cannot hold (a fanout of -1, bounds past :data:`~gnnio.sampling.
gpu_bounded.MAX_EDGE_SLOTS`, a uniform hop's rejected fast torch draw) take the uniform GPU
sampler's synced path (``len(fanouts) + 1`` host syncs) with the same LAS kernel on each hop's
real rows (:meth:`TorchLocalitySampler._synced_hop`); a hop of -1 takes every neighbour, as the
CPU kernel does. Where the LAS kernel cannot run -- no Triton (a CPU tensor outside Triton's
interpreter, ``GNNIO_TRITON=0``) or a kernel that fails to build or launch (one warning naming
the error, ``kernels["las_hop"] = "numba"``) -- the batch is sampled by the CPU kernels and
copied to the device: the same batch, the CPU's cost, with one warning per sampler (a failed
kernel's is :func:`~gnnio.utils.triton_kernels.kernel_failed`'s).

With ``cuda_graph`` the bounded batch is replayed as a CUDA graph (:mod:`gnnio.sampling.
gpu_graphed`, :func:`las_hop` its hop): the LAS kernel reads each hop's key and the scale's
constants from the graph's static input buffer, uploaded with the seeds for every batch, so
Algorithm 2's new scale reaches the next replay without a re-capture; its weights go to the
buffer set's per-hop weight buffers (copied out with the batch's arrays, eagerly too). ``s = 1``
batches are the pruned uniform sampler's, replayed through a uniform graph of their own. Where
the batch cannot be replayed (a fanout of -1, huge bounds, a Triton kernel it needs gone) one
warning per sampler says why and the eager path samples.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from ..utils import triton_kernels
from ..utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from ..utils.warnings_at import warn
from .base import MiniBatch, dst_ptr
from .gpu_bounded import _hop as uniform_hop
from .gpu_bounded import sample_bounded
from .pruned_torch import TorchPrunedSampler, pruned_weights

__all__ = ["TorchLocalitySampler", "las_hop"]

_WMODE = {"ht": 0, "ht_mean": 1, "none": 2}  # = _las_kernels.W_HT, W_HT_MEAN, W_NONE
_WHY = {  # why a batch goes to the CPU kernels (TorchLocalitySampler._say)
    "no_triton": "the Triton LAS kernel cannot run here (no Triton, or GNNIO_TRITON=0)",
}


class _KernelFailed(Exception):
    """The LAS kernel failed mid-batch: the batch is sampled on the CPU instead."""


class TorchLocalitySampler(TorchPrunedSampler):
    """Locality-aware sampling over torch CSR tensors (module docstring).

    Args:
        indptr, indices: the CSR of in-neighbours on the sampling device (or pinned host memory
            viewed from it: UVA sampling).
        fanouts, thresholds, weights: as :class:`~gnnio.sampling.pruned_torch.TorchPrunedSampler`.
        member_index: per hop (``fanouts`` order) the ``(qptr, qpos)`` of the hop's layer's Q'
            (NumPy, as :class:`~gnnio.sampling.locality.LocalitySampler` builds them), or None
            where that set is empty; uploaded here, once (tensors already on the device, e.g.
            UVA views of pinned host memory, are kept as they are).
        cpu_sample: ``cpu_sample(seeds, key, scale)`` -> the CPU kernels' batch (the fallback).
        cuda_graph: replay each bounded batch as a CUDA graph (:mod:`.gpu_graphed`; module
            docstring; the same batches).
    """

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        fanouts: Sequence[int],
        thresholds: Sequence[int],
        weights: str,
        member_index: Sequence,
        cpu_sample: Callable[[object, int, float], MiniBatch],
        cuda_graph: bool = False,
    ):
        super().__init__(indptr, indices, fanouts, thresholds, weights, cuda_graph=cuda_graph)
        dev = self.device
        self._q = [  # (a set whose members have no out-edges: no row has a member)
            None if q is None or len(q[1]) == 0 else tuple(torch.as_tensor(x).to(dev) for x in q)
            for q in member_index
        ]
        self._cpu_sample = cpu_sample
        self._consts: dict[float, torch.Tensor] = {}
        self._tls = threading.local()  # this thread's eager batch: the scale's constants
        self._said: set[str] = set()  # the reasons for CPU batches warned about (_say)

    def sample(self, seeds, key: int, scale: float = 1.0) -> MiniBatch:
        """The batch around ``seeds`` with call key ``key`` and LAS scale ``scale``."""
        s = float(scale)
        if s == 1.0 or all(q is None for q in self._q):
            mb = super().sample(seeds, key)  # the pruned uniform sampler's batch
            mb.meta["scale"] = s
            return mb
        if not triton_available(self.device, "las_hop"):
            self._say("no_triton")  # (a kernel that failed has said so: kernel_failed)
            return self._on_cpu(seeds, key, s)
        from ._triton_las import las_const_values, las_consts

        # the hops whose LAS kernel writes the weights (the others: the pruned formula)
        weighted = [q is not None and self.weights != "none" for q in self._q]
        seeds = self._int64_seeds(seeds)
        if self.cuda_graph:  # seeds, hop keys and the scale uploaded together, one replay
            from .gpu_graphed import not_replayed, sample_graphed

            try:
                replayed = sample_graphed(self, seeds, key, hop=las_hop,
                                          extra=las_const_values(s), weighted=weighted)  # fmt: skip
            except _KernelFailed:
                return self._on_cpu(seeds, key, s)
            if replayed is not None:
                return self._weigh_las(replayed, s)
            not_replayed(self, "the locality-aware sampler", int(seeds.numel()))
        if s not in self._consts:
            self._consts[s] = las_consts(s, self.device)
        self._tls.consts = self._consts[s]
        seeds = self._device_seeds(seeds)
        try:
            bounded = sample_bounded(self, seeds, key, hop=las_hop, weighted=weighted)  # one sync
        except _KernelFailed:  # (its scratch is dropped, not pooled: the pool makes another)
            return self._on_cpu(seeds, key, s)
        if bounded is None:  # a fanout of -1, huge bounds, a rejected fast torch draw
            return self._sample_las_synced(seeds, key, s)
        return self._weigh_las(bounded, s)

    def _sample_las_synced(self, seeds: torch.Tensor, key: int, s: float) -> MiniBatch:
        """The batch the bounded form cannot hold (a fanout of -1, bounds past
        :data:`~gnnio.sampling.gpu_bounded.MAX_EDGE_SLOTS`, a rejected fast torch draw): the
        uniform GPU sampler's synced path (``len(fanouts) + 1`` host syncs) with the LAS
        kernel's hops (:meth:`_synced_hop`); a hop of -1 takes every neighbour, as the CPU
        kernel's (``k = n``: no draw, the pruned formula's weight)."""
        tls = self._tls
        tls.w = w = [None] * len(self.fanouts)
        try:
            mb = self._sample_synced(seeds, key)
        except _KernelFailed:
            return self._on_cpu(seeds, key, s)
        finally:
            tls.w = None
        for h, blk in enumerate(reversed(mb.blocks)):
            blk.edge_weight = w[h]  # (None: the pruned formula, or no weights)
        return self._weigh_las(mb, s)

    def _synced_hop(self, h: int, dst_nodes, hk: int, total: int, exact: bool):
        """The synced path's hop ``h`` (:meth:`~gnnio.sampling.gpu.TorchUniformSampler.
        _synced_hop`): the LAS kernel where the hop's Q' is not empty and its fanout >= 1 (its
        rows ``dst_nodes`` all real, their offsets the prefix sums of ``k = min(d, theta,
        fanout)``; weights kept for :meth:`_sample_las_synced`), else the uniform hop."""
        q, fanout, tls = self._q[h], self.fanouts[h], self._tls
        if q is None or fanout < 1 or getattr(tls, "w", None) is None:
            return super()._synced_hop(h, dst_nodes, hk, total, exact)
        dev, ip = self.device, self.indptr
        n = int(dst_nodes.shape[0])
        k = torch.clamp(ip[dst_nodes + 1] - ip[dst_nodes], max=self.k_fanouts[h])
        off = torch.cumsum(k, 0) - k
        src = torch.empty(total, dtype=torch.int64, device=dev)
        row = torch.empty(total, dtype=torch.int64, device=dev)
        w = torch.empty(total, dtype=torch.float32, device=dev)
        cnt = torch.full((1,), n, dtype=torch.int64, device=dev)
        _las_launch(self, dst_nodes, n, cnt, off, hk, h, tls.consts, (src, row, w))
        if self.weights != "none":
            tls.w[h] = w
        return src, row, None

    def _say(self, why: str) -> None:
        """One warning per sampler and reason that batches go to the CPU kernels (no silent
        slow path; issue 24 item 7). Not after the kernel failed: :func:`kernel_failed` warned."""
        if why in self._said or (why == "no_triton" and "las_hop" in triton_kernels._FAILED):
            return
        self._said.add(why)
        warn(f"locality-aware sampling on {self.device}: {_WHY[why]}; those batches "
             "are sampled by the CPU kernels and copied to the device (the same "
             "batches, the CPU's cost)", RuntimeWarning)  # fmt: skip

    def _on_cpu(self, seeds, key: int, s: float) -> MiniBatch:
        """The CPU kernels' batch, on this device."""
        kernel_ran("las_hop", "numba")
        if isinstance(seeds, torch.Tensor):
            seeds = seeds.cpu()
        mb = self._cpu_sample(seeds, key, s).to(self.device)
        for blk in mb.blocks:  # the GPU batch's CSR pointers (the edges are grouped by row)
            if blk.ptr is None:
                blk.ptr = dst_ptr(blk.edge_index, blk.num_dst)
        return mb

    def _weigh_las(self, mb: MiniBatch, s: float) -> MiniBatch:
        """Each block's edge weights: the LAS kernel's where it ran (set by the bounded batch's
        end, :func:`~gnnio.sampling.gpu_bounded.finish`), else the pruned formula."""
        if self.weights != "none":
            nodes, ip = mb.input_nodes, self.indptr
            deg = None
            for h, blk in enumerate(reversed(mb.blocks)):
                if blk.edge_weight is None:
                    if deg is None:
                        deg = (ip[nodes + 1] - ip[nodes]).to(torch.float64)
                    d = deg[blk.edge_index[1]]
                    blk.edge_weight = pruned_weights(d, self.fanouts[h], self.thresholds[h],
                                                     self.weights)  # fmt: skip
        mb.meta["scale"] = s
        return mb


def las_hop(sampler: TorchLocalitySampler, buf, h: int, n_rows: int, hk, loc, first):
    """Hop ``h`` of a LAS batch for :func:`gnnio.sampling.gpu_bounded.sample_bounded` and
    :func:`gnnio.sampling.gpu_graphed.sample_graphed` (their ``hop``; the uniform ``_hop``'s
    signature): the pruned uniform hop where the hop's Q' is empty, else the LAS kernel, its
    weights into the buffer set's (``buf.weights()``, made by the caller). ``hk``: the hop
    key, an int, or an int64 ``[1]`` device tensor of its bits -- a CUDA graph's static input,
    whose scale constants the kernel then reads too (``buf.graph["locality"].extra``).
    Returns ``(src, row, claimed)``."""
    q = sampler._q[h]
    if q is None:
        return uniform_hop(sampler, buf, h, n_rows, hk, loc, first)
    e = int(buf.src[h].shape[0])
    if e == 0:  # nothing to draw (fanout 0, no rows or no edges)
        return buf.src[h], buf.row[h], False
    if isinstance(hk, torch.Tensor):  # a graph's launch: the scale as its buffer holds it
        consts = buf.graph[las_hop.graph_name].extra  # type: ignore[attr-defined]  # a function attribute gpu_graphed reads
    else:
        consts = sampler._tls.consts
    _las_launch(sampler, buf.nodes, n_rows, buf.count[h], buf.cum[h], hk, h, consts,
                (buf.src[h], buf.row[h], buf.weights()[h]))  # fmt: skip
    return buf.src[h], buf.row[h], False


def _las_launch(sampler: TorchLocalitySampler, nodes, rows: int, count, row_off, hk, h: int,
                consts, out) -> None:  # fmt: skip
    """Hop ``h``'s LAS kernel (:func:`._triton_las.sample_las_triton`); where it fails, one
    warning and :class:`_KernelFailed` (the batch goes to the CPU kernels)."""
    q = sampler._q[h]
    assert q is not None  # (a LAS hop: its layer's set)
    try:
        from ._triton_las import sample_las_triton

        sample_las_triton(sampler.indptr, sampler.indices, nodes, rows, count, row_off, hk,
                          sampler.fanouts[h], sampler.thresholds[h], q[0], q[1], consts,
                          _WMODE[sampler.weights], out)  # fmt: skip
    except Exception as err:  # noqa: BLE001 - a Triton that cannot build it: the CPU kernels
        kernel_failed("las_hop", err, "locality-aware sampling on the CPU instead (same batches)")
        raise _KernelFailed from err
    kernel_ran("las_hop", "triton")


def _las_kernels(sampler: TorchLocalitySampler) -> tuple:
    """The Triton kernels a LAS batch launches (:mod:`.gpu_graphed` checks them before it
    captures one): the LAS hop, and the uniform hop where a layer's Q' is empty."""
    return ("las_hop", "sample_hop") if None in sampler._q else ("las_hop",)


# (gpu_graphed: the kernels it checks before it captures this hop; its graphs and report entry)
las_hop.triton_kernel = _las_kernels  # type: ignore[attr-defined]  # a function attribute gpu_graphed reads
las_hop.graph_name = "locality"  # type: ignore[attr-defined]  # a function attribute gpu_graphed reads
