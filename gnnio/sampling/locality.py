"""Locality-aware neighbour sampling with unbiased weights (Song & Jiang §4) and threshold pruning
(HyDRA §III-A3).

**Estimator (Song & Jiang Eq. 1).** A destination ``i`` with in-neighbours ``N(i)`` samples a
subset ``S``; neighbour ``j`` is in ``S`` with probability ``pi_j`` (its *inclusion probability*).
The Horvitz-Thompson sum ``sum_{j in S} x_j / pi_j`` is an unbiased estimate of
``sum_{j in N(i)} x_j`` for any design, whatever the joint law of ``S``: its expectation is
``sum_j P(j in S) x_j / pi_j``. ``Block.edge_weight`` carries these weights (``weights="ht"``:
``1 / pi_j``; ``weights="ht_mean"``: ``1 / (deg(i) pi_j)``, the unbiased estimate of the neighbour
*mean*). How the layers of :mod:`gnnio.train.models` use them:

* GIN sums ``sum_j w_j x_j``: with ``"ht"`` that is the unbiased neighbour sum;
* SAGE with ``edge_weight_norm="sum"`` computes ``sum_j w_j x_j``: with ``"ht_mean"`` that is the
  unbiased neighbour mean (Eq. 1 with ``w_ij = 1 / deg(i)``);
* SAGE with ``edge_weight_norm="mean"`` (the default) computes ``sum_j w_j x_j / sum_j w_j`` (the
  Hajek ratio form): consistent, not exactly unbiased for a small fanout, but it does not blow up
  when a rare neighbour with a large weight is drawn, and it equals the plain mean of the uniform
  sampler when all weights of a row are equal (``s = 1``). Either weight mode gives the same
  result there (the row's ``1 / deg`` cancels);
* GCN and GAT normalise the weights per row as well (see :mod:`gnnio.train.models`).

**Sampling design.** Each row (destination) draws exactly ``k = min(deg, fanout)`` distinct
neighbours -- as many as the uniform sampler -- with inclusion probabilities that follow Eq. 8.
With uniform base probabilities ``k / deg``, multiplying those of the ``a`` neighbours in the
layer's set Q' by ``s`` and renormalising so they still sum to ``k`` gives
``q_in = s k / (a s + deg - a)`` for members and ``q_out = k / (a s + deg - a)`` for the others
(the paper's normalisation factor ``M`` written as a multiplier: Eq. 8 prints ``s q_j / M`` with
``M = sum q / (sum_Q s q + sum_notQ q)``, which only preserves the sum as ``s q_j M``). When this
makes ``q_in > 1`` -- possible for large ``s`` and few members -- no design can reach it, so the
members get ``q_in = 1`` and the others share the rest, ``q_out = (k - a) / (deg - a)``
(:func:`inclusion_probabilities`); the expected count stays ``k``.

The design that reaches these probabilities is **conditional Poisson sampling** of fixed size
``k`` (CPS, the maximum-entropy design with given inclusion probabilities, Hájek 1964): subsets of
size ``k`` have probability proportional to ``prod_j r_j`` with odds ``r_j`` = ``omega`` for members
and 1 otherwise. With two classes the number ``m`` of members drawn follows Fisher's noncentral
hypergeometric law (``P(m) ∝ C(a, m) C(deg - a, k - m) omega^m``, at most ``k + 1`` values); given
``m``, the members and non-members are uniform subsets of their classes. ``omega`` is solved
per row (Newton steps on ``log omega``) so that ``E[m] = a q_in`` to 1e-12 relative, which makes
the inclusion probabilities exactly ``q_in`` and ``q_out``. Why this design:

* fixed size: every row draws exactly ``min(deg, fanout)`` neighbours, as the uniform sampler
  does (Bernoulli/Poisson sampling, the paper's ``xi_j ~ Bernoulli(q_j)``, would only match in
  expectation and make blocks ragged);
* ``s = 1`` (or no member in the row) gives ``omega = 1``: ``m`` is hypergeometric and the sample
  is a uniform ``k``-subset -- *exactly* uniform sampling without replacement, not just the same
  marginals (systematic PPS sampling, the usual fixed-size alternative, gives the right marginals
  but forbids most pairs unless the row is shuffled first at O(deg) cost);
* cost nearly independent of the degree: the sampler precomputes, per layer, the CSR positions
  of each row's Q' members (sorted), so the ``t``-th member is one index and the ``t``-th
  non-member a short sweep or binary search over them; solving ``omega`` costs O(k) per Newton
  step (typically 2-4), and rows shorter than 128 reuse the law solved for the same
  ``(deg, a)`` earlier in the call. Measured on a 2^21-node R-MAT graph (fanouts 15,10,5, shared
  2-core machine): about 3x the CPU time of ``s = 1`` per batch, which itself costs about what
  :class:`UniformSampler` does (it uses the same counter-based streams and Floyd draws).

**LAS sets (§4).** Layers are numbered as in the paper, ``l = 1`` being the *input* layer. gnnio's
blocks run input layer -> output layer, so ``blocks[l - 1]`` is layer ``l``; with
``fanouts[0]`` = hop 1 (the seeds' neighbours, sampled first) hop ``h`` (1-based) fills
``blocks[L - h]``, i.e. **hop h uses Q'_{L - h + 1}**: the last hop (the input layer, whose sources
are the rows gathered from the feature store) favours ``Q'_1 = B``, the hop before it favours
``Q'_2``, the nodes with the most in-neighbours in ``B``, and so on. ``Q'_{l+1}`` is the top
``q_size`` (default ``|B|``; the paper used 8192) nodes by ``v_{l+1} = v_l A``, ``v_1`` the 0/1
indicator of ``B`` and ``A[u, v] = 1`` for an edge ``u -> v`` (u is an in-neighbour of v) **and on
the diagonal**: the paper's ``A`` is Figure 2's GCN graph, whose layers aggregate each node's own
row (its example ``v_2 = [1, 3, 4, 3, 2, 1]`` counts the self-loops), and a gnnio block keeps every
destination among its sources, so a node picked in layer ``l`` is read in every layer below.
``v_{l+1}[v]`` = number of paths ``B -> ... -> v`` of ``l`` steps, each an edge or a stay = how many
B-rows sampling from ``v`` can reach. Only nodes with ``v > 0`` qualify; ties go to the lower id
(:func:`las_sets`). (Every hop's nodes are in
``input_nodes``, so gnnio gathers them all; the deeper sets steer the frontier toward ``B``.)

**Threshold pruning (HyDRA Eq. 4).** ``threshold = ceil(alpha * avg_degree + beta * fanout)``
per hop (``avg_degree`` = edges / nodes of the graph); a row longer than the threshold is cut to
``threshold`` consecutive positions of its CSR neighbour list from a uniformly random start, and
the ``k = min(threshold, fanout)`` neighbours are sampled from that window (with the LAS
probabilities computed inside the window). HyDRA says the window starts at a random point of the
list and has exactly the threshold's length, so it **wraps around** (circular) when it starts
near the end. That choice matters: every neighbour is in the window with the same probability
``threshold / deg``, so the two-stage weight ``1 / (P(j in window) * pi_j^window)`` keeps the
estimator unbiased (it is only the joint law that changes: neighbours far apart in the list are
never drawn together, which raises the variance). For uniform sampling inside the window the
overall inclusion probability is ``k / deg``, the same as without pruning. (A window clipped to
the list, start in ``[0, deg - threshold]``, would include the ends of the list less often and
bias the estimate.) Hops with fanout -1 (all neighbours) are not pruned.

**On the GPU** (``device="cuda"``, :mod:`gnnio.sampling.locality_torch`): the same batches from
the uniform GPU sampler's bounded batch (one host sync) with a Triton kernel for the LAS hops
(:mod:`gnnio.sampling._triton_las`, every row's law of ``m`` solved; its ``exp``/``log`` may
differ from numba's by an ulp, the weights never); the CPU kernels where it cannot run.

**Determinism.** As :class:`gnnio.sampling.UniformSampler`: each row draws from a counter-based
stream keyed by ``(seed, call key, hop, destination global id)``; with ``epoch_seed`` a batch depends
only on ``(seed, epoch_seed, seeds, scale)``, not on threads or earlier calls. Output id spaces are
the uniform sampler's (seeds first, new nodes in first-appearance order, edges grouped by
destination, blocks input layer first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from ..graph.csr import CSRGraph, check_graph
from . import _las_kernels as K
from .adaptive import check_scale
from .base import Block, MiniBatch
from .threaded import ThreadedCPUSampler, check_seeds, hop_key

if TYPE_CHECKING:
    from .locality_torch import TorchLocalitySampler
    from .pruned_torch import TorchPrunedSampler

__all__ = [
    "LocalitySampler",
    "las_sets",
    "prune_thresholds",
    "prune_pair",
    "inclusion_probabilities",
    "WEIGHT_MODES",
]

#: ``weights`` argument: "ht" = 1/pi (sum), "ht_mean" = 1/(deg pi) (mean), "none" = no weights
WEIGHT_MODES = {"ht": K.W_HT, "ht_mean": K.W_HT_MEAN, "none": K.W_NONE}
_PARALLEL_MIN_ROWS = 2048
#: the largest pruning threshold (:func:`prune_thresholds`)
MAX_THRESHOLD = 2**31 - 1


def inclusion_probabilities(num_neighbors: int, num_in_q: int, fanout: int, scale: float):
    """``(q_in, q_out)``: inclusion probabilities of a row's Q' members and non-members.

    Args:
        num_neighbors: the row's degree (or window length under pruning), ``n``.
        num_in_q: how many of them are in Q', ``a``.
        fanout: neighbours drawn, ``k``.
        scale: LAS scale ``s`` in ``[1e-200, 1e200]`` (:data:`~gnnio.sampling.adaptive.MAX_SCALE`).

    Eq. 8 with capping (module docstring); ``a q_in + (n - a) q_out = min(n, k)`` always. When a
    class is empty its probability is reported as ``min(n, k) / n``.
    """
    n, a, k, s = int(num_neighbors), int(num_in_q), int(fanout), float(scale)
    if n < 0 or not 0 <= a <= n:
        raise ValueError(
            f"inclusion_probabilities: need 0 <= num_in_q <= num_neighbors, got {a}, {n}"
        )
    try:  # (the samplers' range: far past it Eq. 8's sums overflow, see adaptive.MAX_SCALE)
        check_scale(s)
    except ValueError as e:
        raise ValueError(f"inclusion_probabilities: {e}") from None
    if n == 0:
        return 0.0, 0.0
    k = n if k < 0 else min(k, n)
    if k == n or a == 0 or a == n or s == 1.0:
        return k / n, k / n
    q_in, q_out = K.cap_probs(np.int64(n), np.int64(a), np.int64(k), s)
    return float(q_in), float(q_out)


def prune_thresholds(
    avg_degree: float, fanouts: Sequence[int], prune: tuple[float, float] | None
) -> list[int]:
    """HyDRA Eq. 4 per hop: ``ceil(alpha * avg_degree + beta * fanout)``; 0 = no pruning (also
    for hops with fanout -1 or 0, which draw all or nothing). ``prune`` = ``(alpha, beta)`` or
    None (or as :func:`prune_pair` takes it). A threshold is capped at :data:`MAX_THRESHOLD`
    (2^31 - 1: longer than any row a sampler meets in practice, so such a hop prunes nothing; the
    kernels take it as 32 bits)."""
    pair = prune_pair(prune)
    if pair is None:
        return [0] * len(fanouts)
    alpha, beta = pair
    if not (math.isfinite(alpha) and math.isfinite(beta)) or alpha < 0 or beta < 0:
        raise ValueError(f"prune: alpha and beta must be finite and >= 0, got {prune!r}")
    out = []
    for f in fanouts:
        if f <= 0:
            out.append(0)
            continue
        t = math.ceil(alpha * float(avg_degree) + beta * f - 1e-9)
        if t < 1:
            raise ValueError(
                f"prune: threshold alpha*avg_degree + beta*fanout = {alpha * avg_degree + beta * f:g}"
                f" for fanout {f}; it must be >= 1"
            )
        out.append(min(int(t), MAX_THRESHOLD))
    return out


def prune_pair(prune) -> tuple[float, float] | None:
    """A sampler's ``prune`` argument as ``(alpha, beta)``: ``True`` is ``(1, 1)``, ``False`` or
    None no pruning."""
    if prune is None or prune is False:
        return None
    if prune is True:
        return (1.0, 1.0)
    try:
        alpha, beta = (float(x) for x in prune)
    except (TypeError, ValueError):  # not a pair of numbers (a bare number, a string, ...)
        raise ValueError(f"prune: expected (alpha, beta), True or None, got {prune!r}") from None
    return alpha, beta


def _as_hot_ids(hot_ids, num_nodes: int) -> np.ndarray:
    """Sorted distinct int64 global ids from an id array or a bool mask of length N."""
    if isinstance(hot_ids, torch.Tensor):
        hot_ids = hot_ids.detach().cpu().numpy()
    arr = np.asarray(hot_ids)
    if arr.ndim != 1:
        raise ValueError(f"hot_ids: need a 1-D array of node ids, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        if arr.shape[0] != num_nodes:
            raise ValueError(f"hot_ids: a bool mask needs length {num_nodes}, got {arr.shape[0]}")
        return np.flatnonzero(arr).astype(np.int64)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"hot_ids: need integer node ids or a bool mask, got dtype {arr.dtype}")
    arr = np.unique(arr.astype(np.int64))
    if arr.size and (arr[0] < 0 or arr[-1] >= num_nodes):
        bad = arr[0] if arr[0] < 0 else arr[-1]
        raise ValueError(f"hot_ids: node id {int(bad)} out of range [0, {num_nodes})")
    return arr


def las_sets(
    graph: CSRGraph, hot_ids, num_layers: int, size: int | None = None
) -> list[np.ndarray]:
    """Song & Jiang's sets ``Q'_1 .. Q'_L`` (index ``l - 1`` holds layer ``l``; layer 1 = input).

    ``Q'_1 = B`` (``hot_ids``); ``Q'_{l+1}`` = the ``size`` (default ``|B|``) nodes with the largest
    ``v_{l+1} = v_l A`` -- ``v_{l+1}[v] = v_l[v] + sum of v_l[u]`` over the in-neighbours ``u != v``
    of ``v``, one pass over the CSR; ``A`` has the self-loops of the paper's (module docstring) --
    among those with ``v_{l+1} > 0``, ties to the lower id. Returns sorted
    int64 global-id arrays. ``v`` is rescaled to max 1 only if it exceeds 1e100 (the ranking is
    unchanged; path counts could overflow on deep, dense graphs).
    """
    check_graph(graph)  # (the row-sum kernel trusts every index)
    indptr = np.ascontiguousarray(np.asarray(graph.indptr), dtype=np.int64)
    indices = np.asarray(graph.indices)
    n = int(indptr.shape[0]) - 1
    b = _as_hot_ids(hot_ids, n)
    if num_layers < 1:
        raise ValueError(f"las_sets: num_layers must be >= 1, got {num_layers}")
    size = b.size if size is None else int(size)
    if size < 0:
        raise ValueError(f"las_sets: size must be >= 0, got {size}")
    out = [b]
    v = np.zeros(n, dtype=np.float64)
    v[b] = 1.0
    nxt = np.empty(n, dtype=np.float64)
    for _ in range(1, num_layers):
        K.row_sums(indptr, indices, v, nxt)
        top = float(nxt.max()) if n else 0.0
        if top > 1e100:  # (path counts stay exact integers, so ties stay ties, below 2^53)
            nxt /= top
        pos = np.flatnonzero(nxt > 0)
        if pos.size > size:
            order = np.argsort(-nxt[pos], kind="stable")  # pos ascending -> ties to lower id
            pos = np.sort(pos[order[:size]])
        out.append(pos.astype(np.int64))
        v, nxt = nxt, v
    return out


class LocalitySampler(ThreadedCPUSampler):
    """Locality-aware node-wise neighbour sampler with HT weights (see module docstring).

    Args:
        graph: CSR of in-neighbours (NumPy arrays, memmaps or CPU tensors).
        fanouts: neighbours per node for hop 1, 2, ... (``fanouts[0]`` = the seeds' hop; -1 = all).
        hot_ids: the set ``B`` of GPU-resident nodes (global ids, or a bool mask ``[N]``); None =
            no locality (then ``scale`` has no effect: plain uniform sampling with weights,
            optionally pruned).
        scale: the factor ``s`` of Eq. 8 (1 = uniform; 1e-200 to 1e200); settable through ``.scale``
            (e.g. by :class:`gnnio.sampling.AdaptiveScale` between epochs).
        seed: base random seed.
        num_threads: CPU threads per :meth:`sample` call (None = ``min(8, NUMBA_NUM_THREADS)``);
            results do not depend on it.
        prune: HyDRA threshold pruning ``(alpha, beta)`` (``True`` = ``(1, 1)``), or None.
        q_size: ``|Q'_l|`` for ``l >= 2`` (default ``|B|``; Song & Jiang used 8192).
        weights: ``"ht"`` (``1 / pi``, default), ``"ht_mean"`` (``1 / (deg pi)``) or ``"none"``.
        device, graph_in: ``"cuda"`` samples on that GPU (module docstring), the CSR placed as
            :class:`~gnnio.sampling.UniformSampler` places it (with ``graph_in="host"`` the
            member index below stays in pinned host memory too); None: the CPU.
        cuda_graph: on a GPU, replay each batch as a CUDA graph (:mod:`.gpu_graphed`, the
            scale read from the graph's input buffer; the same batches).

    Memory: per layer whose ``Q'`` is non-empty, ``8 (N + 1)`` bytes of row pointers plus 4 bytes
    per edge whose source is in ``Q'_l``; the per-call scratch is an int ``[N]`` id map, as in the
    uniform sampler. Building the sets costs ``L - 1`` passes over the edges and a sort of ``N``
    values, before training.

    Attributes:
        q_sets: ``Q'_1 .. Q'_L`` (sorted global ids; index ``l - 1`` = layer ``l``), or None.
        thresholds: pruning threshold per hop (``fanouts`` order; 0 = not pruned).
    """

    _thread_prefix = "gnnio-las"
    _pins: list  # (set by the borrowed UniformSampler._device_topology)

    def __init__(
        self,
        graph: CSRGraph,
        fanouts: Sequence[int],
        hot_ids=None,
        scale: float = 1.0,
        seed: int = 0,
        num_threads: int | None = None,
        prune: tuple[float, float] | bool | None = None,
        q_size: int | None = None,
        weights: str = "ht",
        device: str | torch.device | None = None,
        graph_in: str = "gpu",
        cuda_graph: bool = False,
    ):
        self._torch: TorchLocalitySampler | TorchPrunedSampler | None = None
        self._init_threads(fanouts, seed, num_threads)
        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights: choose from {', '.join(WEIGHT_MODES)}, got {weights!r}")
        self.weights = weights
        self._wmode = WEIGHT_MODES[weights]
        self._init_csr(graph)
        num_edges = int(self.indptr[-1]) if self.num_nodes >= 0 else 0
        self.avg_degree = num_edges / self.num_nodes if self.num_nodes > 0 else 0.0
        self.prune = prune_pair(prune)
        self.thresholds = prune_thresholds(self.avg_degree, self.fanouts, self.prune)
        self.scale = scale
        L = len(self.fanouts)
        self.q_sets: list[np.ndarray] | None = None
        self._q: list[tuple[np.ndarray, np.ndarray] | None] = [None] * L  # by layer l - 1
        if hot_ids is not None:
            g = CSRGraph._trusted(self.indptr, self.indices)
            self.q_sets = las_sets(g, hot_ids, L, size=q_size)
            for layer, qs in enumerate(self.q_sets):
                if qs.size:
                    self._q[layer] = self._member_index(qs)
        if device is not None:
            self._to_device(graph, device, graph_in, cuda_graph)

    def _to_device(self, graph: CSRGraph, device, graph_in: str, cuda_graph: bool) -> None:
        """Sample on ``device`` where it is a GPU (:class:`~gnnio.sampling.locality_torch.
        TorchLocalitySampler`, the CSR placed as the uniform sampler places it)."""
        from .uniform import UniformSampler

        topo = UniformSampler._device_topology(self, graph, device, graph_in)  # type: ignore[arg-type]  # borrowed: sets graph_in and _pins on this sampler too
        if topo is None:
            return
        from .locality_torch import TorchLocalitySampler

        L = len(self.fanouts)
        index = [self._q[L - 1 - h] for h in range(L)]  # hop h uses Q'_{L-h}
        if graph_in == "host":  # UVA: the member index (about the CSR's size, one per
            index = [self._pinned_index(q, topo[0].device) for q in index]  # layer) stays too
        self._torch = TorchLocalitySampler(*topo, self.fanouts, self.thresholds, self.weights,
                                           index, self._sample_key, cuda_graph=cuda_graph)  # fmt: skip

    def _pinned_index(self, q, device):
        """A layer's ``(qptr, qpos)`` as CUDA views of its pinned host arrays, as UVA sampling
        reads the CSR (:func:`gnnio.sampling.gpu.pinned_csr`; kept alive in ``_pins``)."""
        if q is None or len(q[1]) == 0:
            return q
        from .gpu import pinned_csr

        qptr, qpos, pins = pinned_csr(torch.from_numpy(q[0]), torch.from_numpy(q[1]), device)
        self._pins += pins
        return qptr, qpos

    def _member_index(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mask = np.zeros(self.num_nodes, dtype=np.uint8)
        mask[ids] = 1
        qptr = np.empty(self.num_nodes + 1, dtype=np.int64)
        K.member_counts(self.indptr, self.indices, mask, qptr)
        maxdeg = int(np.diff(self.indptr).max()) if self.num_nodes else 0
        qpos = np.empty(int(qptr[-1]), dtype=np.int32 if maxdeg < 2**31 else np.int64)
        K.member_fill(self.indptr, self.indices, mask, qptr, qpos)
        return qptr, qpos

    # -- settings ------------------------------------------------------------------------------

    @property
    def scale(self) -> float:
        """The LAS factor ``s`` (> 0; 1 = uniform). Read once per :meth:`sample` call."""
        return self._scale

    @scale.setter
    def scale(self, value: float) -> None:
        self._scale = check_scale(value)  # (in [1e-200, 1e200]: Eq. 8's sums stay finite)

    @property
    def device(self) -> torch.device:
        return self._torch.device if self._torch is not None else torch.device("cpu")

    def layer_of_hop(self, hop: int) -> int:
        """Song & Jiang's layer number ``l`` (1 = input layer) of hop ``hop`` (0-based index into
        ``fanouts``): ``L - hop``. Its block is ``blocks[l - 1]``, its set ``q_sets[l - 1]``."""
        return len(self.fanouts) - int(hop)

    # -- sampling ------------------------------------------------------------------------------

    def sample(self, seeds, epoch_seed: int | None = None) -> MiniBatch:
        """Sample the ``len(fanouts)``-hop neighbourhood of ``seeds``.

        Args:
            seeds: ``[B]`` distinct int64 global node ids (tensor or array).
            epoch_seed: optional call key; the batch then depends only on
                ``(seed, epoch_seed, seeds, scale)``.

        Returns:
            A :class:`MiniBatch` as :class:`UniformSampler` returns it, with ``edge_weight``
            (float32 ``[E]``) on every block unless ``weights="none"``; ``meta["hop_nodes"]`` as
            there, ``meta["scale"]`` the ``s`` used.

        Raises:
            ValueError: seeds not 1-D integers, out of ``[0, num_nodes)``, or repeated.
        """
        key = self._next_key(epoch_seed)
        if self._torch is not None:  # (PrunedUniformSampler, whose is not LAS, overrides sample)
            return cast("TorchLocalitySampler", self._torch).sample(seeds, key, self._scale)
        return self._sample_key(seeds, key, self._scale)

    def _sample_key(self, seeds, key: int, s: float) -> MiniBatch:
        """The CPU kernels' batch of call key ``key`` and scale ``s``."""
        seeds = check_seeds(seeds, self.num_nodes)
        loc = self._take_loc()
        dup = K.insert_seeds(seeds, loc)
        if dup >= 0:
            self._give_loc(loc)
            raise ValueError(
                f"seeds: node id {int(seeds[dup])} appears more than once; seeds must be distinct"
            )
        L = len(self.fanouts)
        hop_nodes = [int(seeds.shape[0])]
        blocks_rev: list[Block] = []
        nodes = seeds
        # (if anything below raises, ``loc`` is dropped instead of going back to the pool)
        for h, fanout in enumerate(self.fanouts):
            q = self._q[L - 1 - h]
            edges, w = self._sample_hop(nodes, h, key, fanout, s, q)
            base = hop_nodes[-1]
            new = np.empty(edges.shape[1], dtype=np.int64)
            cnt = int(K.relabel(edges[0], loc, base, new))
            nodes = np.concatenate((nodes, new[:cnt]))
            hop_nodes.append(int(nodes.shape[0]))
            blocks_rev.append(
                Block(
                    edge_index=torch.from_numpy(edges),
                    num_src=hop_nodes[-1],
                    num_dst=hop_nodes[-2],
                    edge_weight=None if w is None else torch.from_numpy(w),
                )
            )
        K.reset_nodes(nodes, loc)  # loc back to all -1, touching only the batch's nodes
        self._give_loc(loc)
        return MiniBatch(
            seeds=torch.from_numpy(seeds),
            input_nodes=torch.from_numpy(nodes),
            blocks=blocks_rev[::-1],
            meta={"hop_nodes": hop_nodes, "scale": s},
        )

    def _sample_hop(self, nodes: np.ndarray, h: int, key: int, fanout: int, s: float, q):
        """One hop: ``(edges [2, E] (global src ids, local dst ids), weights or None)``."""
        n_rows = int(nodes.shape[0])
        hkey = np.uint64(hop_key(key, h))
        theta = np.int64(self.thresholds[h])
        fo = np.int64(fanout)
        use_q = q is not None and s != 1.0
        qptr, qpos = q if q is not None else (np.zeros(1, np.int64), np.zeros(0, np.int32))
        want_w = self._wmode != K.W_NONE
        offs = np.empty(n_rows + 1, dtype=np.int64)
        rows = np.empty((4, n_rows), dtype=np.int64)
        e = int(K.count_rows(self.indptr, nodes, fo, theta, use_q, qptr, qpos, offs, rows)[0])
        edges = np.empty((2, e), dtype=np.int64)
        w = np.empty(e if want_w else 0, dtype=np.float32)
        nparts = self.num_threads if n_rows >= _PARALLEL_MIN_ROWS else 1
        # parts of about equal cost (sampled edges + one per row)
        cost = offs + np.arange(n_rows + 1)
        targets = [cost[-1] * p // nparts for p in range(1, nparts)]
        bounds = [0, *np.searchsorted(cost, targets).tolist(), n_rows]

        def task(p: int) -> None:
            K.sample_rows(
                self.indices, nodes, bounds[p], bounds[p + 1], offs, rows, hkey, fo, theta, s,
                use_q, qpos, self._wmode, edges[0], edges[1], w,
            )  # fmt: skip

        self._run_split(task, [(p,) for p in range(nparts)])
        return edges, (w if want_w else None)

    def _take_loc(self) -> np.ndarray:
        with self._lock:
            if self._scratch:
                return self._scratch.pop()
        return np.full(self.num_nodes, -1, dtype=self._loc_dtype)

    def _give_loc(self, loc: np.ndarray) -> None:
        with self._lock:
            self._scratch.append(loc)
