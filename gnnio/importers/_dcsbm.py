"""The community graph of ``gnnio prepare synthetic --model dcsbm``: a degree-corrected stochastic
block model (Karrer & Newman, 2011) with power-law degrees, power-law community sizes and a mixing
parameter, in the spirit of the LFR benchmark (Lancichinetti, Fortunato & Radicchi, 2008).

The model, in generation ids (nodes of a community are contiguous there), then relabelled at random:

1. **Community sizes.** ``K`` sizes proportional to the quantiles ``(k + 1/2) / K`` of a power law
   with density ``~ s^-size_exponent`` on ``[1, size_ratio]`` (defaults 2.0 and 30: for ``K = 64``
   the largest community holds 11 % of the nodes, the smallest 0.45 %), scaled to sum to ``N``,
   each at least 2 nodes. Quantiles instead of random draws: the size distribution is the same for
   every seed, only the membership changes. Community 0 is the largest.
2. **Degree propensities** ``theta_v``, i.i.d. from a power law with density ``~ t^-degree_exponent``
   (default 2.5), truncated so that the largest expected degree is the structural cutoff
   ``sqrt(N * avg_degree)`` (where two hubs expect at most one edge between them). A node whose
   expected internal degree ``(1 - mixing) * theta_v`` exceeds half its community swaps its
   ``theta`` with a small node of a community large enough for it (as in LFR, hubs only sit in
   communities that can hold their neighbours; ``theta`` beyond the largest community's bound is
   clamped, which only happens on tiny graphs). ``theta`` becomes integer stub counts (stochastic
   rounding), so drawing a node ``~ theta`` within a community is one uniform draw into its stubs.
3. **Backbone.** Every node ``v`` gets one pair ``(v, w)``, ``w`` drawn as the other end of a model
   edge from ``v``'s community (inside it with probability ``1 - mixing``): no node is isolated
   (when ``avg_degree < 2`` there are fewer pairs than nodes; a random subset of nodes gets one).
4. **Model edges.** ``round(mixing * P)`` pairs between communities and the rest inside them,
   ``P = round(N * avg_degree / 2)``. An internal pair takes a uniform stub (so community ``r``
   with probability ``~ kappa_r``, its stub count) and a second stub of the same community. An
   external pair takes communities ``r != s`` with probability ``~ x_r x_s``, where ``x`` solves
   ``x_r (X - x_r) = kappa_r`` (``X = sum x``), so every community sends the share ``mixing`` of its
   stubs outside -- and every node, in expectation: ``E[external degree of v] = mixing * E[deg v]``.
   Self-loops and duplicates are dropped; top-up rounds draw more of each kind until both counts are
   reached, then random surplus pairs are trimmed (one pair per node protected), leaving exactly
   ``P`` unique pairs, of which ``round(mixing * P)`` between communities. Graphs too dense to
   reach this by sampling (tiny communities) fill the missing pairs with the other kind.
5. **Classes from communities.** Each community has a dominant class: with ``K >= C`` communities
   go, largest first, to the class with the fewest nodes so far (classes as balanced as whole
   communities allow); with ``K < C`` community ``r`` holds the classes ``r, r + K, ...`` (uniform
   among them). A node takes its community's class with probability ``class_purity`` (default
   0.8), else a uniform random class; class ids are then permuted at random.
6. **Random relabelling** of node ids, as for R-MAT.

Features and splits are those of the R-MAT generator (:func:`gnnio.importers.synthetic
.generate_features`). All steps are vectorised numpy over chunks of pairs, drawn from the graph
stream of the seed (the first of the three streams the R-MAT generator spawns).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..utils.progress import bar
from ._synthetic_graph import (
    _CHUNK_PAIRS,
    _count_same,
    _merge_new,
    _pair_keys,
    _symmetric_csr,
    _trim,
    _unique_sorted,
)

__all__ = ["DCSBM", "generate_dcsbm", "community_sizes"]

_MAX_ROUNDS = 40
_SWAP_ROUNDS = 64


@dataclass(frozen=True)
class DCSBM:
    """Parameters of the degree-corrected stochastic block model (see the module docstring).

    Attributes:
        communities: ``K``, the number of planted communities (``1 <= K <= N // 2``).
        mixing: ``mu`` in ``[0, 1]``, the share of each node's edges leaving its community (and the
            exact share of the graph's pairs between communities).
        degree_exponent: exponent ``> 1`` of the power-law density of the degree propensities.
        size_exponent: exponent ``> 1`` of the power-law density of the community sizes.
        size_ratio: largest ÷ smallest community size of the underlying power law (``>= 1``).
        class_purity: probability in ``[0, 1]`` that a node's class is its community's class.
    """

    communities: int = 64
    mixing: float = 0.1
    degree_exponent: float = 2.5
    size_exponent: float = 2.0
    size_ratio: float = 30.0
    class_purity: float = 0.8

    def check(self, num_nodes: int) -> None:
        """One-line :class:`UsageError` for parameters this model cannot use."""
        k = self.communities
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise UsageError(f"--communities must be a positive integer, got {k!r}")
        if k > num_nodes // 2:
            raise UsageError(
                f"--communities {k} is too many for {num_nodes} nodes: every community needs at "
                f"least 2 nodes (at most {num_nodes // 2})"
            )
        if not 0.0 <= float(self.mixing) <= 1.0:
            raise UsageError(f"--mixing must be in [0, 1], got {self.mixing!r}")
        if k == 1 and float(self.mixing) > 0:
            raise UsageError("--mixing must be 0 with --communities 1 (no other community)")
        for name, v in (
            ("--degree-exponent", self.degree_exponent),
            ("size_exponent", self.size_exponent),
        ):
            if not 1.0 < float(v) < float("inf"):
                raise UsageError(f"{name} must be a finite number > 1, got {v!r}")
        if not 1.0 <= float(self.size_ratio) < float("inf"):
            raise UsageError(f"size_ratio must be a finite number >= 1, got {self.size_ratio!r}")
        if not 0.0 <= float(self.class_purity) <= 1.0:
            raise UsageError(f"--class-purity must be in [0, 1], got {self.class_purity!r}")


# --------------------------------------------------------------------------- sizes and degrees


def _power_quantiles(q: np.ndarray, exponent: float, ratio: float) -> np.ndarray:
    """Quantile function of the power law with density ``~ x^-exponent`` on ``[1, ratio]``."""
    if ratio <= 1.0:
        return np.ones_like(q)
    a = 1.0 - exponent
    return (1.0 - q * (1.0 - ratio**a)) ** (1.0 / a)


def community_sizes(num_nodes: int, communities: int, exponent: float, ratio: float) -> np.ndarray:
    """``K`` community sizes (int64, descending, each ``>= 2``, summing to ``N``): the power-law
    quantiles ``(k + 1/2) / K`` scaled to ``N``, rounded by largest remainder."""
    n, k = int(num_nodes), int(communities)
    if k < 1 or 2 * k > n:  # (the loop below would never end; DcsbmOptions.check says it first)
        raise ValueError(f"communities: {k} communities of >= 2 nodes do not fit in {n} nodes")
    q = (np.arange(k, dtype=np.float64) + 0.5) / k
    share = _power_quantiles(q, exponent, ratio)[::-1]
    exact = share / share.sum() * n
    sizes = np.maximum(2, np.floor(exact)).astype(np.int64)
    diff = n - int(sizes.sum())
    if diff > 0:  # largest fractional parts get one more
        order = np.argsort(-(exact - np.floor(exact)), kind="stable")
        sizes[order[:diff]] += 1
    while diff < 0:  # the floor of 2 overshot: take from the largest communities
        take = np.flatnonzero(sizes > 2)[:-diff]
        sizes[take] -= 1
        diff += take.size
    return np.sort(sizes)[::-1]


def _pareto_mean(exponent: float, ratio: float) -> float:
    """Mean of the power law with density ``~ t^-exponent`` on ``[1, ratio]``."""
    g, r = float(exponent), float(ratio)
    if r <= 1.0:
        return 1.0
    if abs(g - 2.0) < 1e-9:
        return math.log(r) / (1.0 - 1.0 / r)
    return (g - 1.0) / (g - 2.0) * (1.0 - r ** (2.0 - g)) / (1.0 - r ** (1.0 - g))


def _degree_ratio(exponent: float, mean: float, kmax: float) -> float:
    """The truncation ratio ``R`` at which the power law on ``[1, R]``, scaled to ``mean``, reaches
    ``kmax`` (fixed point of ``R = kmax * pareto_mean(R) / mean``; 1 when ``kmax <= mean``)."""
    r = max(1.0, kmax / mean)
    for _ in range(100):
        nxt = max(1.0, kmax * _pareto_mean(exponent, r) / mean)
        if abs(nxt - r) <= 1e-9 * r:
            break
        r = nxt
    return r


def _fit_hubs(
    rng: np.random.Generator, theta: np.ndarray, cap: np.ndarray, starts: np.ndarray
) -> int:
    """Swap ``theta`` values so that ``theta[v] <= cap[v]`` (in place; ``cap`` is non-increasing
    in the generation id, communities being sorted by size). A violating ``v`` trades with a random
    node ``w`` of a community whose bound it fits, if ``theta[w]`` fits ``v``'s bound. Values above
    the largest bound are clamped to it. Returns the number of clamped values."""
    clamped = int(np.count_nonzero(theta > cap[0]))
    np.minimum(theta, cap[0], out=theta)
    ends = np.r_[starts[1:], theta.size]
    comm_cap = cap[starts]
    for _ in range(_SWAP_ROUNDS):
        bad = np.flatnonzero(theta > cap)
        if bad.size == 0:
            break
        # eligible communities are a prefix 0..L-1; their nodes are generation ids [0, ends[L-1])
        n_ok = np.searchsorted(-comm_cap, -theta[bad], side="right")
        w = rng.integers(0, ends[n_ok - 1])
        ok = (theta[w] <= cap[bad]) & (theta[w] <= cap[w])
        bad, w = bad[ok], w[ok]
        w, first = np.unique(w, return_index=True)  # one swap per partner and round
        bad = bad[first]  # (w is never a violator itself: theta[w] <= cap[w])
        theta[bad], theta[w] = theta[w], theta[bad].copy()
    else:
        bad = np.flatnonzero(theta > cap)
        clamped += int(bad.size)
        theta[bad] = cap[bad]
    return clamped


def _stubs(rng: np.random.Generator, theta: np.ndarray, gen_dtype) -> np.ndarray:
    """Node ids repeated by stochastically rounded ``theta`` (at least 2 per node on average for the
    smallest ``theta``): drawing a uniform stub of a community draws a node ``~ theta``."""
    scale = max(1.0, 2.0 / max(float(theta.min()), 1e-12))
    w = theta * scale
    m = np.floor(w)
    m += rng.random(w.size) < (w - m)
    return np.repeat(np.arange(theta.size, dtype=gen_dtype), m.astype(np.int64))


def _external_weights(kappa: np.ndarray) -> np.ndarray:
    """``x`` with ``x_r (sum(x) - x_r) = kappa_r``: community pair ``(r, s)``, ``r != s``, drawn
    ``~ x_r x_s`` gives each community its share of the external pair ends. Without a solution (one
    community holds half the stubs or more) ``x = kappa`` (the big community gets less)."""
    e = kappa / kappa.sum()
    x = e / math.sqrt(float(e.sum()))
    for _ in range(500):
        nxt = 0.5 * (x + e / np.maximum(x.sum() - x, 1e-12))
        done = np.max(np.abs(nxt - x)) <= 1e-12
        x = nxt
        if done:
            break
    ok = np.all(np.isfinite(x)) and np.max(np.abs(x * (x.sum() - x) - e)) <= 1e-6
    return x if ok else e


# --------------------------------------------------------------------------- pair draws


class _Sampler:
    """Draws model pairs in generation ids from the stub array."""

    def __init__(self, rng, stubs, comm, starts, num_comm):
        self.rng, self.stubs, self.comm = rng, stubs, comm
        first = np.searchsorted(stubs, starts)  # stub ranges of each community
        self.s0 = first.astype(np.int64)
        self.ns = np.diff(np.r_[first, stubs.size]).astype(np.int64)
        x = _external_weights(self.ns.astype(np.float64))
        self.xcum = np.cumsum(x) / x.sum()
        self.k = num_comm

    def in_comm(self, r: np.ndarray) -> np.ndarray:
        """One node ``~ theta`` of each community ``r``."""
        return self.stubs[self.s0[r] + self.rng.integers(0, self.ns[r])]

    def other_comm(self, r: np.ndarray) -> np.ndarray:
        """A community ``s != r`` ``~ x_s`` for each ``r`` (rejection)."""
        s = np.searchsorted(self.xcum, self.rng.random(r.size), side="right")
        np.minimum(s, self.k - 1, out=s)
        for _ in range(32):
            redo = np.flatnonzero(s == r)
            if redo.size == 0:
                return s
            t = np.searchsorted(self.xcum, self.rng.random(redo.size), side="right")
            s[redo] = np.minimum(t, self.k - 1)
        redo = np.flatnonzero(s == r)  # r holds almost all weight: any other community
        s[redo] = (r[redo] + 1 + self.rng.integers(0, self.k - 1, size=redo.size)) % self.k
        return s

    def internal(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        u = self.stubs[self.rng.integers(0, self.stubs.size, size=m)]
        return u, self.in_comm(self.comm[u])

    def external(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        r = np.searchsorted(self.xcum, self.rng.random(m), side="right")
        np.minimum(r, self.k - 1, out=r)
        return self.in_comm(r), self.in_comm(self.other_comm(r))


def _backbone(rng, smp: _Sampler, nodes, comm, starts, sizes, mixing) -> np.ndarray:
    """Sorted unique keys of one pair ``(v, w)`` per node of ``nodes``; ``w != v`` always."""
    r = comm[nodes].astype(np.int64)
    ext = rng.random(nodes.size) < mixing
    other = r.copy()
    if ext.any():
        other[ext] = smp.other_comm(r[ext])
    w = smp.in_comm(other)
    for _ in range(8):  # redraw internal self-loops
        loop = np.flatnonzero(w == nodes)
        if loop.size == 0:
            break
        w[loop] = smp.in_comm(other[loop])
    loop = np.flatnonzero(w == nodes)  # give up: the next node of the community
    v = nodes[loop].astype(np.int64)
    w[loop] = starts[r[loop]] + (v - starts[r[loop]] + 1) % sizes[r[loop]]
    return _pair_keys(nodes, w, comm.size)


def _classes(rng, sizes: np.ndarray, num_classes: int, comm, purity: float) -> np.ndarray:
    """Node classes (generation ids): the community's class with probability ``purity``."""
    k, c, n = sizes.size, int(num_classes), comm.size
    if k >= c:  # largest community first to the class with the fewest nodes (LPT)
        heap = [(0, j) for j in range(c)]
        dom = np.empty(k, dtype=np.int64)
        for r, size in enumerate(sizes.tolist()):
            load, j = heapq.heappop(heap)
            dom[r] = j
            heapq.heappush(heap, (load + size, j))
        base = dom[comm]
    else:
        per = (c - np.arange(k) + k - 1) // k  # classes r, r+K, ... of community r
        r = comm.astype(np.int64)
        base = r + k * rng.integers(0, per[r])
    noise = rng.random(n) >= purity
    base = np.where(noise, rng.integers(0, c, size=n), base)
    return rng.permutation(c)[base].astype(np.int64)


# --------------------------------------------------------------------------- generator


def generate_dcsbm(
    num_nodes: int,
    avg_degree: float,
    num_classes: int,
    seed: int,
    model: DCSBM,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    """The DC-SBM graph on checked arguments (:meth:`DCSBM.check` and the common synthetic checks).

    Returns:
        ``(indptr int64 [N+1], indices [E], labels int64 [N], communities int64 [N], info)``: a
        symmetric CSR of in-neighbours (sorted lists, no duplicates or self-loops) over the final
        node ids, each node's class in ``[0, C)`` and community in ``[0, K)`` (0 = largest), and
        measured figures (``meta.json``'s ``generator``).
    """
    n, k, mu = int(num_nodes), int(model.communities), float(model.mixing)
    graph_ss, _, _ = np.random.SeedSequence(seed).spawn(3)
    rng = np.random.default_rng(graph_ss)
    gen_dtype = np.int32 if n < 2**31 else np.int64
    sizes = community_sizes(n, k, model.size_exponent, model.size_ratio)
    starts = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64)
    comm = np.repeat(np.arange(k, dtype=np.int32 if k < 2**31 else np.int64), sizes)

    target = int(round(n * float(avg_degree) / 2))
    nb = min(n, target)  # backbone pairs
    mean_rest = max((2 * target - nb) / n, 1e-9)
    kmax = min(math.sqrt(2 * target), n - 1)
    ratio = _degree_ratio(model.degree_exponent, mean_rest, kmax)
    theta = _power_quantiles(rng.random(n), model.degree_exponent, ratio)
    theta *= mean_rest / _pareto_mean(model.degree_exponent, ratio)
    cap = np.repeat(np.maximum(1.0, (sizes - 1) / 2 / max(1.0 - mu, 1e-9)), sizes)
    clamped = _fit_hubs(rng, theta, cap, starts)
    del cap
    stubs = _stubs(rng, theta, gen_dtype)
    del theta
    smp = _Sampler(rng, stubs, comm, starts, k)

    want_ext = int(round(mu * target)) if k > 1 else 0
    want_int = target - want_ext
    pb = bar(total=target, desc="synthetic: dcsbm edges", unit="pair", enabled=progress)
    rounds = drawn_total = 0
    try:
        nodes = np.arange(n, dtype=gen_dtype)
        if nb < n:
            nodes = np.sort(rng.choice(nodes, nb, replace=False))
        keys = _backbone(rng, smp, nodes, comm, starts, sizes, mu)
        del nodes
        n_int = _count_same(keys, comm, n)
        pb.update(keys.size)
        need = {"int": max(0, want_int - n_int), "ext": max(0, want_ext - (keys.size - n_int))}
        yld = {"int": 1.0, "ext": 1.0}
        saturated = {"ext"} if k == 1 else set()  # no pair can leave a single community
        while any(need[t] > 0 for t in need) and rounds < _MAX_ROUNDS:
            rounds += 1
            for kind in ("int", "ext"):
                if need[kind] == 0 or kind in saturated:
                    continue
                want = 16 + int(math.ceil(1.05 * need[kind] / max(yld[kind], 1e-3)))
                want = min(want, 64 * need[kind] + 1024)
                draw = smp.internal if kind == "int" else smp.external
                parts = []
                for s in range(0, want, _CHUNK_PAIRS):
                    u, v = draw(min(_CHUNK_PAIRS, want - s))
                    parts.append(_pair_keys(u, v, n))
                    del u, v
                new = np.concatenate(parts) if len(parts) != 1 else parts[0]
                del parts
                if want > _CHUNK_PAIRS:
                    new.sort()
                    new = _unique_sorted(new)
                before = keys.size
                keys, new = _merge_new(keys, new)
                del new
                gained = keys.size - before
                drawn_total += want
                pb.update(min(keys.size, target) - min(before, target))
                yld[kind] = gained / want
                need[kind] = max(0, need[kind] - gained)
                if gained == 0:
                    saturated.add(kind)
            for a, b in (("int", "ext"), ("ext", "int")):  # saturated kind: the other fills in
                if a in saturated and need[a] > 0 and b not in saturated:
                    need[b] += need[a]
                    need[a] = 0
            if len(saturated) == 2:
                break
    finally:
        pb.close()
    n_int = _count_same(keys, comm, n)
    keys, trimmed = _trim(rng, keys, comm, n, target, min(want_int, n_int), keep_protected=True)

    cls = _classes(rng, sizes, num_classes, comm, float(model.class_purity))
    perm = rng.permutation(n)  # generation id g becomes perm[g]
    labels = np.empty(n, dtype=np.int64)
    labels[perm] = cls
    communities = np.empty(n, dtype=np.int64)
    communities[perm] = comm
    lo, hi = np.divmod(keys, n)
    del keys
    pairs = int(lo.size)
    same_class = int(np.count_nonzero(cls[lo] == cls[hi]))
    deg = np.bincount(lo, minlength=n) + np.bincount(hi, minlength=n)
    cross = comm[lo] != comm[hi]
    ext_deg = np.bincount(lo, weights=cross, minlength=n) + np.bincount(hi, cross, minlength=n)
    del cross
    node_mix = float(np.mean(ext_deg[deg > 0] / deg[deg > 0])) if pairs else 0.0
    mixing_measured = float(ext_deg.sum()) / (2 * pairs) if pairs else 0.0
    lo = perm[lo]
    hi = perm[hi]
    del perm, cls, comm, ext_deg
    indptr, indices = _symmetric_csr(lo, hi, n, progress)
    info = {
        "model": "dcsbm",
        "pairs": pairs,
        "target_pairs": target,
        "backbone_pairs": int(nb),
        "pairs_drawn": int(drawn_total),
        "rounds": rounds,
        "trimmed_pairs": int(trimmed),
        "mixing_measured": mixing_measured,
        "mixing_node_mean": node_mix,
        "homophily_measured": same_class / pairs if pairs else 0.0,
        "isolated_nodes": int(np.count_nonzero(deg == 0)),
        "max_degree": int(deg.max()) if n else 0,
        "degree_cutoff": float(kmax),
        "clamped_hubs": clamped,
        "community_size_range": [int(sizes[-1]), int(sizes[0])],
    }
    if k <= 1024:
        info["community_sizes"] = sizes.tolist()
    return indptr, indices, labels, communities, info


# --------------------------------------------------------------------------- CLI glue


def add_arguments(parser) -> None:
    """The ``--model`` choice and the DC-SBM options of ``gnnio prepare synthetic``."""
    d = DCSBM()
    g = parser.add_argument_group("--model dcsbm (degree-corrected stochastic block model)")
    parser.add_argument(
        "--model",
        choices=("rmat", "dcsbm"),
        default="rmat",
        help="graph model: noisy R-MAT (default) or a DC-SBM with planted communities",
    )
    g.add_argument(
        "--communities", type=int, metavar="K", help=f"communities (default {d.communities})"
    )
    g.add_argument(
        "--mixing",
        type=float,
        metavar="MU",
        help=f"share of each node's edges leaving its community (default {d.mixing})",
    )
    g.add_argument(
        "--degree-exponent",
        type=float,
        metavar="G",
        help=f"power-law exponent of the degrees (default {d.degree_exponent})",
    )
    g.add_argument(
        "--class-purity",
        type=float,
        metavar="P",
        help=f"probability that a node's class is its community's (default {d.class_purity})",
    )


_CLI = ("communities", "mixing", "degree_exponent", "class_purity")


def from_args(args) -> DCSBM | None:
    """The :class:`DCSBM` of the command line, or None for ``--model rmat``; a one-line
    :class:`UsageError` for options of the other model."""
    given = {k: getattr(args, k) for k in _CLI if getattr(args, k, None) is not None}
    if args.model == "rmat":
        if given:
            flag = "--" + next(iter(given)).replace("_", "-")
            raise UsageError(f"{flag} applies to --model dcsbm only")
        return None
    for k in ("homophily", "backbone_degree"):
        if getattr(args, k, None) is not None:
            raise UsageError(f"--{k.replace('_', '-')} applies to --model rmat only")
    return DCSBM(**given)
