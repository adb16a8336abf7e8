"""LABOR-0: layer-neighbour sampling (Balın & Çatalyürek, "Layer-Neighbor Sampling -- Defusing
Neighborhood Explosion in GNNs", NeurIPS 2023).

**Idea.** Node-wise sampling (GraphSAGE, :class:`~gnnio.sampling.UniformSampler`) draws each
destination's neighbours independently, so two destinations that share a neighbour ``t`` rarely
both pick it and a batch touches many distinct nodes (neighbourhood explosion). LABOR draws *one*
uniform variate ``r_t`` per candidate source vertex ``t``, shared by every destination of the
batch in that hop: destination ``s`` with in-degree ``d_s`` keeps ``t`` when ``r_t`` is small for
``s``, so destinations with common neighbours keep the *same* ones. From a single destination's
point of view nothing changes -- neighbour ``t`` is kept with probability ``min(1, k / d_s)``, as
in node-wise sampling with fanout ``k`` -- so the per-destination estimator keeps its variance, but
the batch needs far fewer distinct input nodes (feature rows).

**Designs** (``design=``; kernels in :mod:`gnnio.sampling._labor_kernels`):

* ``"fixed"`` (default): each destination keeps the ``k`` neighbours with the smallest ``r_t``
  -- the paper's Appendix A.3 "sequential Poisson" variant, the one GraphBolt's
  ``LayerNeighborSampler`` ships. For LABOR-0 (all ``pi_t`` equal) the ``k`` smallest of ``d``
  i.i.d. uniforms form a uniform ``k``-subset, so every row is *exactly* uniform sampling without
  replacement (marginal ``k / d``, every ``k``-subset equally likely) and has exactly
  ``min(d, k)`` edges, like :class:`~gnnio.sampling.UniformSampler`: a drop-in replacement.
* ``"poisson"``: keep ``t`` iff ``r_t < k / d_s`` -- the paper's §3 Poisson sampling. Same
  marginals; the row's count is random with mean ``min(d, k)``.

Exactness of the fixed design assumes rows without repeated neighbours (gnnio's importers and
:meth:`~gnnio.graph.csr.CSRGraph.from_edges` deduplicate edges); a repeated neighbour has one
``r_t`` for all its copies. The Poisson design is exact on any graph.

**Weights.** The inclusion probability of edge ``t -> s`` is ``pi = min(1, k / d_s)`` in both
designs (``k < 0``: 1), so the Horvitz-Thompson weights ``Block.edge_weight`` are
``weights="ht"``: ``1 / pi = max(1, d_s / k)`` (unbiased neighbour *sum*), ``"ht_mean"``:
``1 / (d_s pi) = 1 / min(d_s, k)`` (unbiased neighbour *mean*; the paper's estimator
``1/d_s sum_t A_ts M_t / pi_ts``), or ``"none"``. They are equal within a row, so SAGE's default
self-normalised mean (:mod:`gnnio.train.models`) is the plain mean of the kept neighbours either
way; GCN's ``(x_i + sum w x) / (1 + sum w)`` with ``"ht"`` is exactly unbiased for the fixed
design (``sum w = d``, so the denominator is the full ``1 + d``) and a ratio (consistent, not
unbiased) for ``"poisson"``, whose row size is random.

**Layers.** With ``layer_dependency=False`` (default, as DGL's) every hop draws fresh ``r_t``;
``True`` reuses hop 1's ``r_t`` in every hop (the paper's layer-dependent variant: fewer distinct
nodes again, more correlation between layers; the price: a hop after the first reads rows that
were picked with the same ``r_t``, so its weights are no longer Horvitz-Thompson given its rows --
measured on a 120-node power-law graph, LABOR-0's estimates for the rows added by hop 1 were biased
(the seeds' rows stay unbiased, ``c_s = k / d_s`` does not depend on the rows), and with LABOR-i,
whose ``c_s pi_t`` do depend on them, the seeds' rows too, by up to 19 %; the default
``False`` is unbiased in every hop). Hops, blocks, id spaces, threads and determinism
are those of :class:`~gnnio.sampling.UniformSampler` (this class reuses its parallel
count / sample / merge / write pipeline and only swaps the per-row kernels): every hop samples for
all nodes so far, seeds first, new nodes in first-appearance order, and with ``epoch_seed`` a batch
depends only on ``(seed, epoch_seed, seeds)``, not on the thread count.

**Devices.** NumPy arrays or CPU tensors use the numba kernels; ``device="cuda"`` (or a graph
whose tensors are on a GPU) uses the vectorized torch path of :mod:`gnnio.sampling.labor_torch`,
which returns the same batches bit for bit.

**LABOR-i** (``importance_sampling=i > 0``; :mod:`gnnio.sampling._labor_importance`): edge
``t -> s`` kept iff ``r_t <= c_s pi_t`` with importances ``pi_t`` from ``i`` fixed-point steps
(``pi_t <- max_s c_s pi_t``, then each ``c_s`` solved again so that
``sum_t 1 / min(1, c_s pi_t) = d_s^2 / k``: the paper's target, every row's estimator keeps
neighbour sampling's variance and more than ``k`` neighbours in expectation; see that module).
Always the Poisson design (``design`` defaults to it; ``"fixed"`` is refused: keeping the ``k``
smallest ``r_t / pi_t`` has no exact inclusion probabilities to weight by). Weights per *edge*:
``"ht"`` ``1 / min(1, c_s pi_t)``, ``"ht_mean"`` ``1 / (d_s min(1, c_s pi_t))``, so within a row
they differ and SAGE's self-normalised mean becomes a ratio estimator (as DGL's, which rescales
them to mean 1 per row). Each hop's iteration runs serially on the calling thread before the
parts sample (``O((i + 1) D)`` for ``D`` neighbour positions, plus an int64 ``[num_nodes]`` map per
concurrent caller). With ``device="cuda"`` (or CUDA tensors) it samples on the GPU with the
vectorized torch ops of :mod:`gnnio.sampling.labor_importance_torch` (the same batches; a host
read per fixed-point step; no CUDA-graph replay). ``i = 0`` is LABOR-0, unchanged.

The steps stop early once one lowers the hop's expected distinct sources by under ``1e-4`` (DGL's
test), so a large ``i`` is LABOR-* (DGL's negative value, refused here);
``meta["importance_steps"]`` has the steps each hop took.

**Not built** (issue 19): GraphBolt's
``replace=True`` (sampling with replacement) and ``batch_dependency`` (variates shared across
consecutive batches, arXiv:2310.12403; its default ``1`` is gnnio's behaviour: every batch draws
fresh ``r_t``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from ..graph.csr import CSRGraph
from ..utils.triton_kernels import kernel_ran
from . import _labor_importance as LI
from . import _labor_kernels as LK
from .base import MiniBatch
from .threaded import _hop_key
from .uniform import UniformSampler, _PartBuffers

__all__ = ["LaborSampler", "LABOR_DESIGNS", "labor_weights"]

#: ``design`` argument of :class:`LaborSampler`
LABOR_DESIGNS = ("fixed", "poisson")
_WEIGHTS = ("ht", "ht_mean", "none")
_DOMAIN_LABOR = 0x1AB0_0000_0000_0001  # keeps r_t apart from the uniform sampler's row streams


def labor_weights(degrees: np.ndarray, fanout: int, weights: str = "ht") -> np.ndarray:
    """Per-destination edge weight of LABOR-0 (module docstring) for destinations of in-degree
    ``degrees`` (float32): ``"ht"`` ``1 / min(1, k / d)``, ``"ht_mean"`` ``1 / min(d, k)``
    (``fanout < 0``: ``1`` and ``1 / d``; rows without neighbours get 1)."""
    d = np.asarray(degrees, dtype=np.float64)
    k = d if fanout < 0 else np.minimum(d, float(fanout))
    safe_k = np.maximum(k, 1.0)
    if weights == "ht":
        w = np.where(k > 0, np.maximum(d, 1.0) / safe_k, 1.0)
    elif weights == "ht_mean":
        w = 1.0 / safe_k
    else:
        raise ValueError(f"weights: choose from ht, ht_mean (or none), got {weights!r}")
    return w.astype(np.float32)


class LaborSampler(UniformSampler):
    """LABOR-0 neighbour sampler (see module docstring).

    Args:
        graph: CSR of in-neighbours (NumPy arrays, memmaps, CPU or CUDA tensors).
        fanouts: neighbours per destination for hop 1, 2, ... (``fanouts[0]`` = the seeds' hop;
            -1 = all), as :class:`~gnnio.sampling.UniformSampler`.
        seed: base random seed.
        num_threads: CPU threads per :meth:`sample` call (None = ``min(8, NUMBA_NUM_THREADS)``);
            results do not depend on it.
        design: ``"fixed"`` (exactly ``min(d, k)`` neighbours per row) or ``"poisson"``; None
            (default): ``"fixed"``, or ``"poisson"`` with ``importance_sampling > 0``.
        layer_dependency: reuse hop 1's ``r_t`` in every hop.
        weights: ``"ht"`` (default), ``"ht_mean"`` or ``"none"`` (``Block.edge_weight``).
        device: ``"cuda"`` (or a CUDA device): sample there with
            :class:`~gnnio.sampling.labor_torch.TorchLaborSampler`; None = the device of the
            graph's arrays.
        graph_in: where a GPU sampler's topology lives: ``"gpu"`` (copied to it) or ``"host"``
            (UVA sampling, as :class:`~gnnio.sampling.UniformSampler`'s).
        cuda_graph: a GPU sampler replays each batch as a CUDA graph
            (:mod:`gnnio.sampling.gpu_graphed`; the same batches; ignored on the CPU).
        importance_sampling: ``i`` of LABOR-i, fixed-point steps on ``pi_t`` per hop (module
            docstring; DGL's name); 0 (default) = LABOR-0. ``i > 0`` on a GPU:
            :class:`~gnnio.sampling.labor_importance_torch.TorchLaborImportanceSampler`
            (``cuda_graph`` ignored: its steps read the device back).

    Memory and thread safety: as :class:`~gnnio.sampling.UniformSampler`.
    """

    _thread_prefix = "gnnio-labor"

    def __init__(
        self,
        graph: CSRGraph,
        fanouts: Sequence[int],
        seed: int = 0,
        num_threads: int | None = None,
        design: str | None = None,
        layer_dependency: bool = False,
        weights: str = "ht",
        device: str | torch.device | None = None,
        graph_in: str = "gpu",
        cuda_graph: bool = False,
        importance_sampling: int = 0,
    ):
        i = importance_sampling
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise ValueError(f"importance_sampling: must be an integer >= 0, got {i!r}")
        self.importance_sampling = int(i)
        if design is None:
            design = "poisson" if i > 0 else "fixed"
        elif i > 0 and design != "poisson":
            raise ValueError(f"importance_sampling > 0: needs design='poisson', got {design!r}")
        if design not in LABOR_DESIGNS:
            raise ValueError(f"design: choose from {', '.join(LABOR_DESIGNS)}, got {design!r}")
        if weights not in _WEIGHTS:
            raise ValueError(f"weights: choose from {', '.join(_WEIGHTS)}, got {weights!r}")
        self._init_threads(fanouts, seed, num_threads)
        self._torch = None
        self.design = design
        self.layer_dependency = bool(layer_dependency)
        self.weights = weights
        self._tls = threading.local()
        self._cmaps: list[np.ndarray] = []
        topo = self._device_topology(graph, device, graph_in)
        if topo is not None and i > 0:
            from .labor_importance_torch import TorchLaborImportanceSampler

            self._torch = TorchLaborImportanceSampler(*topo, self.fanouts, min(int(i), 1 << 62),
                                                      layer_dependency, weights)  # fmt: skip
            self.num_nodes = self._torch.num_nodes
            return
        if topo is not None:
            from .labor_torch import TorchLaborSampler

            self._torch = TorchLaborSampler(*topo, self.fanouts, design, layer_dependency, weights,
                                            cuda_graph=cuda_graph)  # fmt: skip
            self.num_nodes = self._torch.num_nodes
            return
        self._init_csr(graph)

    def _hop_context(self, nodes, fo, hkey):
        """LABOR-i: the hop's inclusion probabilities (:func:`~gnnio.sampling._labor_importance.
        hop_probabilities`), also kept for the weights; None for LABOR-0."""
        if self.importance_sampling == 0:
            return None
        rkey = np.uint64(int(hkey) ^ _DOMAIN_LABOR)
        with self._lock:
            cmap = self._cmaps.pop() if self._cmaps else None
        if cmap is None:
            cmap = np.full(self.num_nodes, -1, dtype=np.int64)
        iters = min(
            self.importance_sampling, 1 << 62
        )  # (an int64 for numba; converged long before)
        ctx = LI.hop_probabilities(self.indptr, self.indices, nodes, fo, iters, rkey, cmap)
        with self._lock:
            self._cmaps.append(cmap)  # (all -1 again)
        self._tls.hops.append(ctx)
        return ctx

    def _sample_part(
        self, nodes, lo, hi, fo, hkey, b: _PartBuffers, loc, off, seen, first: bool, base: int,
        ctx=None,
    ) -> tuple[int, int]:  # fmt: skip
        if ctx is not None:  # LABOR-i: the kept edges were decided by _hop_context
            pos, _p, keep, counts, _steps = ctx
            b.ensure_rows(hi - lo)
            e = int(LI.count_part(self.indptr, nodes, lo, hi, counts, b.rows, b.offs))
            b.ensure_edges(e)
            cnt = LI.sample_part(self.indices, lo, hi - lo, b.rows, b.offs, pos, keep, b.src, loc,
                                 off, seen, first, base, b.new)  # fmt: skip
            return e, int(cnt)
        rkey = np.uint64(int(hkey) ^ _DOMAIN_LABOR)
        poisson = self.design == "poisson"
        b.ensure_rows(hi - lo)
        e = int(
            LK.count_part(self.indptr, self.indices, nodes, lo, hi, fo, rkey, poisson, b.rows,
                          b.offs)
        )  # fmt: skip
        b.ensure_edges(e)
        cnt = LK.sample_part(
            self.indices, hi - lo, b.rows, b.offs, fo, rkey, poisson, b.src, loc, off, seen, first,
            base, b.new,
        )  # fmt: skip
        return e, int(cnt)

    def sample(self, seeds: torch.Tensor | np.ndarray, epoch_seed: int | None = None) -> MiniBatch:
        """Sample the ``len(fanouts)``-hop LABOR neighbourhood of ``seeds``.

        Returns a :class:`MiniBatch` as :meth:`UniformSampler.sample` does, with float32
        ``edge_weight`` on every block unless ``weights="none"``; ``meta["sampler"] = "labor"``
        (LABOR-i: ``meta["importance_steps"]``, the fixed-point steps per hop, seeds' hop first).

        Raises:
            ValueError: seeds not 1-D integers, out of ``[0, num_nodes)``, or repeated.
        """
        if self.importance_sampling > 0 and self._torch is None:  # (the summary's kernels; the
            kernel_ran("labor_i_hop", "numba")  # torch paths and LABOR-0's hop record their own)
        self._tls.hops = []
        mb = super().sample(seeds, epoch_seed=epoch_seed)
        hops, self._tls.hops = self._tls.hops, []
        mb.meta["sampler"] = "labor"
        if self.importance_sampling > 0 and self._torch is None:  # (whatever the weights)
            mb.meta["importance_steps"] = [int(ctx[4]) for ctx in hops]
        if self.weights == "none" or self._torch is not None:  # (the torch path weights them)
            return mb
        if self.importance_sampling > 0:
            for h, (pos, p, keep, _counts, _steps) in enumerate(hops):
                blk = mb.blocks[len(hops) - 1 - h]
                w = LI.kept_weights(pos, p, keep, self.weights == "ht_mean")
                assert w.shape[0] == blk.edge_index.shape[1]
                blk.edge_weight = torch.from_numpy(w)
            return mb
        inp = mb.input_nodes.numpy()
        L = len(self.fanouts)
        for h, fanout in enumerate(self.fanouts):
            blk = mb.blocks[L - 1 - h]
            dst_nodes = inp[: blk.num_dst]
            deg = self.indptr[dst_nodes + 1] - self.indptr[dst_nodes]
            w_row = labor_weights(deg, fanout, self.weights)
            blk.edge_weight = torch.from_numpy(w_row[blk.edge_index[1].numpy()])
        return mb

    def _hkey(self, key: int, h: int) -> np.uint64:
        return _hop_key(key, 0 if self.layer_dependency else h)
