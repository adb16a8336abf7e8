"""Layer-wise importance sampling: LADIES (Zou et al., "Layer-Dependent Importance Sampling for
Training Deep and Large Graph Convolutional Networks", NeurIPS 2019) -- the sampler Song & Jiang
train with ("layer-wise neighbor sampling [41]", 8192 nodes per layer).

**What a hop does.** Node-wise samplers draw neighbours per destination; LADIES draws one set of
``K`` nodes per *layer*, shared by all its destinations. Hop ``h + 1`` (``h`` = 0 is the seeds'
hop) has as destination rows every node of the batch so far (``input_nodes[:n_h]``, the prefix rule
of :mod:`gnnio.sampling.base`), and:

1. its candidates are the in-neighbours of the rows that are not rows already;
2. candidate ``j`` gets the layer-dependent weight ``p_j ∝ ||P_{S, j}||^2 = sum_{i in S} P_ij^2``,
   the squared column norm of the normalised adjacency restricted to the rows ``S``, with LADIES'
   ``P = D~^-1 (A + I)`` (row-normalised, self-loops; ``P_ij = 1 / (d_i + 1)`` for ``j in N(i)``);
3. ``K`` (``layer_sizes[h]``) candidates are drawn by importance: candidate ``j`` enters with
   probability ``pi_j = min(1, c p_j)``, ``c`` chosen so that ``sum_j pi_j = K`` (Poisson
   sampling, independent ``u_j < pi_j``, so ``E[#new nodes] = K``);
4. the block holds *every* graph edge ``j -> i`` from a row ``i`` to a row or a drawn node, with
   ``Block.edge_weight`` = ``1 / pi_j`` (``weights="ht"``; rows have ``pi = 1``) or
   ``1 / (d_i pi_j)`` (``"ht_mean"``).

Then ``sum_{j in block row i} w_j x_j`` is a Horvitz-Thompson estimate of ``sum_{j in N(i)} x_j``
(resp. of the mean), **exactly unbiased** whatever ``p``: each neighbour enters with known
probability ``pi_j`` and is weighted by ``1 / pi_j``.

**Deviations from the LADIES paper and code, and why.**

* *Which ``P``.* The paper writes ``P`` for GCN's normalised Laplacian without fixing the form;
  its code (and gnnio) use the row-normalised ``D~^-1 (A + I)`` above. DGL's LABOR example
  (dmlc/dgl, ladies_sampler.py) uses ``D^-1 A`` (no self-loop), another distribution again.
* *How ``K`` nodes are drawn.* The paper draws ``K`` i.i.d. nodes from ``p`` (with replacement);
  its code draws ``K`` distinct ones with ``np.random.choice(p=p, replace=False)`` and weights
  them ``1 / p_j``, which are not their inclusion probabilities, then row-normalises (consistent,
  not unbiased). gnnio uses Poisson sampling with capped probabilities -- Song & Jiang's own
  formulation (``xi_j ~ Bernoulli(q_j)``, Eq. 1), whose Eq. 8 rescales exactly these ``q_j`` --
  so the weights are the true ``1 / pi_j``; the price is a random layer size (mean ``K``, standard
  deviation below ``sqrt(K)``). It is Balın & Çatalyürek's "PLADIES" (LABOR paper; DGL's
  ``PoissonLadiesSampler``, whose ``c`` is iterated to a tolerance; here it is exact).
* *No row normalisation in the sampler.* The paper and code row-normalise the sampled ``P S``;
  the blocks carry the raw weights and the model normalises: SAGE's default mean (the Hajek
  ratio ``sum w x / sum w``; ``P_ij`` is constant within a row, so it cancels) is that row
  normalisation, GCN and GAT normalise per row too (their self term is the model's, below);
  SAGE's ``sum`` with ``"ht_mean"`` and GIN's sum are the unbiased Horvitz-Thompson forms.
* *The rows are in every layer.* gnnio's blocks need the destination nodes among the sources
  (prefix rule), so they are loaded anyway; they get ``pi = 1`` and the budget ``K`` goes to new
  nodes only. LADIES' code adds the batch's output nodes to each layer for its self-loops;
  here every row (seeds and earlier layers' nodes) stays, and the self term is the model's (e.g.
  SAGE's root weight), not an edge.
* *Rows are cumulative.* A hop samples for all nodes so far, as every gnnio sampler does, so the
  paper's ``S`` (the layer above) is here the union of all layers above.

Determinism: the kept set of a hop depends only on ``(seed, call key, hop, the rows)`` (``u_j``
from a counter-based hash of ``(hop key, j)``); with ``epoch_seed`` a batch depends only on
``(seed, epoch_seed, seeds)``. The kernels (:mod:`gnnio.sampling._ladies_kernels`) are serial
numba; a hop costs two passes over the rows' neighbour lists. ``device="cuda"`` (or a graph on a
GPU) samples with vectorized torch ops instead (:mod:`gnnio.sampling.ladies_torch`), the same
batches.
:class:`~gnnio.sampling.ladies_locality.LocalityLadiesSampler` adds Song & Jiang's Eq. 8.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..graph.csr import CSRGraph
from ..utils.triton_kernels import kernel_ran
from . import _ladies_kernels as LK
from . import _las_kernels
from .adaptive import check_scale
from .base import Block, MiniBatch
from .threaded import ThreadedCPUSampler, check_seeds, hop_key, int_list
from .uniform import UniformSampler

__all__ = ["LadiesSampler", "check_layer_sizes", "layer_probabilities"]

_WEIGHT_MODES = {"ht": LK.W_HT, "ht_mean": LK.W_HT_MEAN, "none": LK.W_NONE}
_DOMAIN_LADIES = 0x1AD1_E500_0000_0001


def check_layer_sizes(layer_sizes: Sequence[int]) -> list[int]:
    """Validate per-hop layer sizes (each ``>= 1``; at least one hop)."""
    out = int_list(layer_sizes, "layer_sizes")
    if not out:
        raise ValueError("layer_sizes: need at least one hop, got an empty list")
    if any(k < 1 for k in out):
        raise ValueError(f"layer_sizes: each must be >= 1, got {out}")
    return out


def layer_probabilities(
    graph: CSRGraph, rows, layer_size: int, scale: float = 1.0, q_ids=None
) -> tuple[np.ndarray, np.ndarray]:
    """``(candidates, pi)`` of one LADIES hop whose destination rows are ``rows`` (global ids):
    the candidates in first-appearance order and their inclusion probabilities (module docstring;
    with ``q_ids`` and ``scale``, Eq. 8 of Song & Jiang on the weights of the members of
    ``q_ids``). ``pi`` sums to ``min(layer_size, len(candidates))``."""
    indptr = np.ascontiguousarray(np.asarray(graph.indptr), dtype=np.int64)
    indices = np.asarray(graph.indices)
    n = int(indptr.shape[0]) - 1
    rows = check_seeds(rows, n, "rows")
    uniq, counts = np.unique(rows, return_counts=True)
    if (counts > 1).any():  # (a repeated row would count its P_ij^2 twice)
        raise ValueError(f"rows: node id {int(uniq[counts > 1][0])} appears more than once")
    if int(layer_size) < 0:  # (the budget solver would return negative probabilities)
        raise ValueError(f"layer_size: must be >= 0, got {layer_size}")
    loc = np.full(n, -1, dtype=np.int64)
    loc[rows] = np.arange(rows.shape[0])
    cand = np.full(n, -1, dtype=np.int64)
    total = int((indptr[rows + 1] - indptr[rows]).sum())
    cand_ids = np.empty(total, dtype=np.int64)
    p = np.empty(total, dtype=np.float64)
    qmask = np.zeros(n if q_ids is not None else 1, dtype=np.uint8)
    if q_ids is not None:  # (a scale past [1e-200, 1e200]: pi < 0 at -1, sum != K at nan / inf)
        qmask[check_seeds(q_ids, n, "q_ids")] = 1
        scale = check_scale(scale)
    nc = int(
        LK.layer_candidates(
            indptr, indices, rows, loc, cand, qmask, q_ids is not None, float(scale), cand_ids, p
        )
    )
    pi = np.empty(nc, dtype=np.float64)
    LK.solve_budget(p, nc, min(int(layer_size), nc), pi)  # (an int64 for numba: --layer-size 1e20)
    return cand_ids[:nc].copy(), pi


class LadiesSampler(ThreadedCPUSampler):
    """LADIES layer-wise sampler with Horvitz-Thompson weights (see module docstring).

    Args:
        graph: CSR of in-neighbours (NumPy arrays, memmaps, CPU or CUDA tensors).
        layer_sizes: expected new nodes per hop, hop 1 (the seeds') first (Song & Jiang: 8192
            in every layer); the number of hops is ``len(layer_sizes)``.
        seed: base random seed.
        weights: ``"ht"`` (``1 / pi``, default), ``"ht_mean"`` (``1 / (deg pi)``) or ``"none"``.
        device: ``"cuda"`` (or a CUDA device): sample there with
            :class:`~gnnio.sampling.ladies_torch.TorchLadiesSampler` (the same batches); None =
            the device of the graph's arrays.
        graph_in: where a GPU sampler's topology lives: ``"gpu"`` (copied to it) or ``"host"``
            (UVA sampling, as :class:`~gnnio.sampling.UniformSampler`'s).

    Attributes:
        layer_sizes: as given; ``fanouts`` is ``[-1] * len(layer_sizes)`` (a block keeps every
            edge from its rows to the layer's nodes), for code that reads the number of hops.

    Memory: two ``[N]`` maps (global -> local id, global -> candidate; int32 below 2^31 nodes,
    int64 on a GPU), pooled per concurrent caller.
    """

    _thread_prefix = "gnnio-ladies"

    def __init__(
        self,
        graph: CSRGraph,
        layer_sizes: Sequence[int],
        seed: int = 0,
        weights: str = "ht",
        device: str | torch.device | None = None,
        graph_in: str = "gpu",
    ):
        self.layer_sizes = check_layer_sizes(layer_sizes)
        self._init_threads([-1] * len(self.layer_sizes), seed, 1)
        if weights not in _WEIGHT_MODES:
            raise ValueError(f"weights: choose from {', '.join(_WEIGHT_MODES)}, got {weights!r}")
        self.weights = weights
        self._wmode = _WEIGHT_MODES[weights]
        self._no_q = np.zeros(1, dtype=np.uint8)
        self._torch = None
        # (the uniform sampler's choice of device and topology: CUDA tensors, a copy or UVA views)
        topo = UniformSampler._device_topology(self, graph, device, graph_in)  # type: ignore[arg-type]
        if topo is not None:
            from .ladies_torch import TorchLadiesSampler

            self._torch = TorchLadiesSampler(*topo, self.layer_sizes, weights)
            self.num_nodes = self._torch.num_nodes
            return
        self._init_csr(graph)

    @property
    def device(self) -> torch.device:
        return self._torch.device if self._torch is not None else torch.device("cpu")

    @property
    def num_layers(self) -> int:
        return len(self.layer_sizes)

    def _layer_q(self, h: int) -> tuple[np.ndarray, bool, float]:
        """``(qmask, use_q, scale)`` of hop ``h``: no locality set here (see the subclass)."""
        return self._no_q, False, 1.0

    def sample(self, seeds, epoch_seed: int | None = None) -> MiniBatch:
        """Sample ``len(layer_sizes)`` LADIES layers below ``seeds``.

        Args:
            seeds: ``[B]`` distinct int64 global node ids (tensor or array).
            epoch_seed: optional call key; the batch then depends only on
                ``(seed, epoch_seed, seeds)``.

        Returns:
            A :class:`MiniBatch` with the id spaces of :mod:`gnnio.sampling.base` (blocks input
            layer first), float32 ``edge_weight`` unless ``weights="none"``;
            ``meta["hop_nodes"]`` as for the node-wise samplers, ``meta["sampler"] = "ladies"``.

        Raises:
            ValueError: seeds not 1-D integers, out of ``[0, num_nodes)``, or repeated.
        """
        key = self._next_key(epoch_seed)
        if self._torch is not None:
            return self._torch.sample(seeds, key)
        kernel_ran("ladies_hop", "numba")  # (the summary's kernels; the torch path records its own)
        seeds = check_seeds(seeds, self.num_nodes)
        loc, cand = self._take()
        dup = _las_kernels.insert_seeds(seeds, loc)
        if dup >= 0:
            self._give(loc, cand)
            raise ValueError(
                f"seeds: node id {int(seeds[dup])} appears more than once; seeds must be distinct"
            )
        nodes = seeds
        hop_nodes = [int(seeds.shape[0])]
        blocks_rev: list[Block] = []
        # (if anything below raises, the maps are dropped instead of going back to the pool)
        for h, budget in enumerate(self.layer_sizes):
            qmask, use_q, s = self._layer_q(h)
            total = int((self.indptr[nodes + 1] - self.indptr[nodes]).sum())
            cand_ids = np.empty(total, dtype=np.int64)
            p = np.empty(total, dtype=np.float64)
            nc = int(
                LK.layer_candidates(
                    self.indptr, self.indices, nodes, loc, cand, qmask, use_q, s, cand_ids, p
                )
            )
            pi = np.empty(nc, dtype=np.float64)
            LK.solve_budget(p, nc, min(budget, nc), pi)  # (a budget past int64 is "all", too)
            hkey = np.uint64(hop_key(key, h) ^ _DOMAIN_LADIES)
            new = np.empty(nc, dtype=np.int64)
            base = hop_nodes[-1]
            cnt = int(LK.accept(cand_ids, pi, nc, hkey, loc, base, new))
            edges, w = LK.layer_edges(self.indptr, self.indices, nodes, loc, cand, pi, self._wmode)
            LK.reset_candidates(cand_ids, nc, cand)
            nodes = np.concatenate((nodes, new[:cnt]))
            hop_nodes.append(int(nodes.shape[0]))
            blocks_rev.append(
                Block(
                    edge_index=torch.from_numpy(edges),
                    num_src=hop_nodes[-1],
                    num_dst=hop_nodes[-2],
                    edge_weight=None if self._wmode == LK.W_NONE else torch.from_numpy(w),
                )
            )
        _las_kernels.reset_nodes(nodes, loc)
        self._give(loc, cand)
        return MiniBatch(
            seeds=torch.from_numpy(seeds),
            input_nodes=torch.from_numpy(nodes),
            blocks=blocks_rev[::-1],
            meta={"hop_nodes": hop_nodes, "sampler": "ladies"},
        )

    def _take(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self._scratch:
                return self._scratch.pop()
        return (
            np.full(self.num_nodes, -1, dtype=self._loc_dtype),
            np.full(self.num_nodes, -1, dtype=self._loc_dtype),
        )

    def _give(self, loc: np.ndarray, cand: np.ndarray) -> None:
        with self._lock:
            self._scratch.append((loc, cand))
