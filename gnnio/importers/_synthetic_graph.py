"""The graph of ``gnnio prepare synthetic``: noisy R-MAT pairs plus a backbone, planted classes by
rewiring, symmetrised and deduplicated to an exact pair count, randomly relabelled (steps 1-5 of
:mod:`gnnio.importers.synthetic`, whose docstring describes the model; it checks the arguments
with :func:`check_args`). Vectorised numpy over chunks of pairs; everything is drawn from the
graph stream of the seed, so the graph does not depend on the feature or split arguments.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import UsageError
from ..graph.csr import index_dtype
from ..utils.progress import bar

__all__ = ["check_args", "draw_pairs", "finish_info", "generate"]

_CHUNK_PAIRS = 1 << 22  # R-MAT pairs generated per vectorised step
_MAX_ROUNDS = 40


def check_args(
    num_nodes,
    avg_degree,
    feat_dim,
    num_classes,
    seed,
    split,
    homophily,
    feature_noise,
    rmat,
    rmat_noise,
    backbone_degree,
) -> None:
    """One-line UsageError for the first argument of ``gnnio prepare synthetic`` out of range."""

    def is_int(x) -> bool:
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

    if not is_int(num_nodes) or not 2 <= num_nodes < 2**31:
        raise UsageError(f"--num-nodes must be an integer in [2, 2^31), got {num_nodes!r}")
    if not is_int(num_classes) or not 2 <= num_classes <= num_nodes:
        raise UsageError(
            f"--num-classes must be an integer in [2, num_nodes={num_nodes}], got {num_classes!r}"
        )
    if not is_int(seed) or seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {seed!r}")
    if feat_dim is not None and (not is_int(feat_dim) or feat_dim < 1):
        raise UsageError(f"--feat-dim must be a positive integer, got {feat_dim!r}")
    try:
        avg = float(avg_degree)
    except (TypeError, ValueError):
        avg = float("nan")
    if not (0 < avg <= num_nodes - 1):
        raise UsageError(
            f"--avg-degree must be in (0, num_nodes-1 = {num_nodes - 1}], got {avg_degree!r}"
        )
    if not (0.0 <= float(homophily) <= 1.0):
        raise UsageError(f"--homophily must be in [0, 1], got {homophily!r}")
    if feature_noise is not None and not (0.0 <= float(feature_noise) < float("inf")):
        raise UsageError(f"--feature-noise must be a finite number >= 0, got {feature_noise!r}")
    if split is not None:
        if len(split) != 3 or any(not (0.0 <= float(s) <= 1.0) for s in split):
            raise UsageError(f"--split needs three fractions in [0, 1], got {list(split)}")
        if sum(float(s) for s in split) > 1.0 + 1e-9:
            raise UsageError(f"--split fractions must sum to at most 1, got {list(split)}")
    if len(rmat) != 4 or any(not (float(p) > 0) for p in rmat) or abs(sum(rmat) - 1) > 1e-6:
        raise UsageError(f"rmat must be four positive probabilities summing to 1, got {rmat!r}")
    a, b, c, d = (float(p) for p in rmat)
    if not is_int(backbone_degree) or backbone_degree < 0:
        raise UsageError(
            f"--backbone-degree must be a non-negative integer, got {backbone_degree!r}"
        )
    lim = min(b, c, (a + d) / 2)
    if not (0.0 <= float(rmat_noise) <= lim):
        raise UsageError(
            f"rmat_noise must be in [0, {lim:g}] for rmat={rmat!r}, got {rmat_noise!r}"
        )


def _level_probs(rng: np.random.Generator, scale: int, rmat, noise: float) -> np.ndarray:
    """Per-level quadrant probabilities ``[scale, 4]`` (noisy SKG perturbation, sums kept at 1)."""
    a, b, c, d = (float(p) for p in rmat)
    mu = rng.uniform(-noise, noise, size=scale) if noise > 0 else np.zeros(scale)
    probs = np.stack([a - 2 * mu * a / (a + d), b + mu, c + mu, d - 2 * mu * d / (a + d)], axis=1)
    return probs / probs.sum(axis=1, keepdims=True)


def _rmat_pairs(
    rng: np.random.Generator, m: int, probs: np.ndarray, dtype
) -> tuple[np.ndarray, np.ndarray]:
    """``m`` R-MAT pairs ``(u, v)`` in ``[0, 2^scale)`` (generation ids), one uniform per level."""
    u = np.zeros(m, dtype=dtype)
    v = np.zeros(m, dtype=dtype)
    for a, b, c, _ in probs:
        r = rng.random(m, dtype=np.float32)
        t1 = r >= np.float32(a)
        t2 = r >= np.float32(a + b)
        t3 = r >= np.float32(a + b + c)
        # quadrants (u bit, v bit): [0,a) -> 00, [a,a+b) -> 01, [a+b,a+b+c) -> 10, rest -> 11
        u <<= 1
        u |= t2
        v <<= 1
        t1 ^= t2
        t1 ^= t3
        v |= t1
    return u, v


def _rmat_endpoints(
    rng: np.random.Generator, m: int, n: int, probs: np.ndarray, dtype
) -> np.ndarray:
    """``m`` draws from the R-MAT marginal of the second endpoint, restricted to ``[0, n)``."""
    p1 = (probs[:, 1] + probs[:, 3]).astype(np.float32)  # P(v bit = 1) per level
    out: list[np.ndarray] = [np.empty(0, dtype=dtype)]
    have = 0
    while have < m:
        k = max(1024, int((m - have) * 1.3))
        v = np.zeros(k, dtype=dtype)
        for p in p1:
            v <<= 1
            v |= rng.random(k, dtype=np.float32) < p
        v = v[v < n]
        out.append(v)
        have += v.size
    return np.concatenate(out)[:m]


def _rewire(
    rng: np.random.Generator,
    u: np.ndarray,
    v: np.ndarray,
    cls: np.ndarray,
    num_classes: int,
    share: float,
) -> None:
    """Give a random ``share`` of the pairs a same-class second endpoint, in place on ``v``.

    The second endpoints ("stubs") of the chosen pairs are permuted among them, matched by class:
    within class ``c`` the k-th chosen pair whose first endpoint is in ``c`` takes the k-th chosen
    stub in ``c``. Pairs are i.i.d., so this matching is random; node degrees are unchanged.
    """
    if share <= 0 or u.size == 0:
        return
    sel = np.flatnonzero(rng.random(u.size, dtype=np.float32) < np.float32(share))
    if sel.size == 0:
        return
    cu = cls[u[sel]]
    stubs = v[sel]
    cv = cls[stubs]
    ou = np.argsort(cu, kind="stable")
    ov = np.argsort(cv, kind="stable")
    nu = np.bincount(cu, minlength=num_classes)
    nv = np.bincount(cv, minlength=num_classes)
    su = np.cumsum(nu) - nu
    sv = np.cumsum(nv) - nv
    cu_sorted = cu[ou]
    rank = np.arange(sel.size) - su[cu_sorted]
    ok = rank < nv[cu_sorted]
    v[sel[ou[ok]]] = stubs[ov[sv[cu_sorted[ok]] + rank[ok]]]


def _pair_keys(u: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """Canonical int64 keys ``min * n + max`` of the pairs without self-loops, sorted and unique."""
    keep = u != v
    u, v = u[keep], v[keep]
    lo = np.minimum(u, v).astype(np.int64)
    hi = np.maximum(u, v).astype(np.int64)
    del u, v, keep
    lo *= n
    lo += hi
    del hi
    lo.sort()
    return _unique_sorted(lo)


def _unique_sorted(keys: np.ndarray) -> np.ndarray:
    if keys.size < 2:
        return keys
    mask = np.empty(keys.size, dtype=np.bool_)
    mask[0] = True
    np.not_equal(keys[1:], keys[:-1], out=mask[1:])
    return keys[mask]


def _merge_new(keys: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of two sorted unique key arrays (linear merge via ``np.insert``) and the keys of
    ``new`` that were not in ``keys``."""
    if keys.size == 0:
        return new, new
    pos = np.searchsorted(keys, new)
    fresh = keys[np.minimum(pos, keys.size - 1)] != new
    new = new[fresh]
    return np.insert(keys, pos[fresh], new), new


def _share_for(fraction_same: float, c: int) -> float:
    """Rewiring share that makes about ``fraction_same`` of new pairs same-class."""
    return min(1.0, max(0.0, (fraction_same - 1.0 / c) / (1.0 - 1.0 / c)))


class _MemoryKeys:
    """The sorted unique pair keys drawn so far, in RAM; a round's chunks are merged at its end.
    (:class:`gnnio.importers._synthetic_bounded.BoundedKeys` keeps the same set within a budget.)"""

    def __init__(self, keys: np.ndarray, cls: np.ndarray):
        self.keys = keys
        self._parts: list[np.ndarray] = []

    @property
    def size(self) -> int:
        return int(self.keys.size)

    def add(self, chunk: np.ndarray) -> None:
        """Add one chunk's sorted unique keys (:func:`_pair_keys`) to the current round."""
        self._parts.append(chunk)

    def end_round(self, cls: np.ndarray, n: int) -> int:
        """Merge the round's keys; returns how many of the new ones are same-class pairs."""
        parts, self._parts = self._parts, []
        new = np.concatenate(parts) if len(parts) != 1 else parts[0]
        if len(parts) > 1:  # several chunks: sort and deduplicate their union
            new.sort()
            new = _unique_sorted(new)
        del parts
        self.keys, new = _merge_new(self.keys, new)
        return _count_same(new, cls, n)


def draw_pairs(
    num_nodes: int,
    avg_degree: float,
    num_classes: int,
    seed: int,
    homophily: float,
    rmat,
    rmat_noise: float,
    backbone_degree: int,
    progress: bool,
    make_keys=_MemoryKeys,
) -> tuple:
    """Steps 1-4 up to the trim: ``(keys, rng, cls, target, want_same, info)``, where ``keys``
    is ``make_keys(first_keys, classes)`` after the top-up rounds (it holds every unique pair key
    ``lo * n + hi`` in generation ids) and ``rng`` the graph stream, ready for the trim."""
    n, c, h = int(num_nodes), int(num_classes), float(homophily)
    graph_ss, _, _ = np.random.SeedSequence(seed).spawn(3)
    rng = np.random.default_rng(graph_ss)
    scale = max(1, math.ceil(math.log2(n)))
    gen_dtype = np.int32 if scale < 31 else np.int64
    probs = _level_probs(rng, scale, rmat, rmat_noise)
    # balanced classes in generation ids (int16 when possible: radix argsort in _rewire)
    cls = rng.permutation(np.arange(n, dtype=np.int64) % c)
    cls = cls.astype(np.int16 if c <= np.iinfo(np.int16).max else np.int64)

    target = int(round(n * float(avg_degree) / 2))  # undirected pairs
    want_same = int(round(h * target))
    want_cross = target - want_same
    same = 0
    generated = 0
    rounds = 0
    pb = bar(total=target, desc="synthetic: edges", unit="pair", enabled=progress)
    try:
        # round 0: the backbone, backbone_degree pairs (v, w) per node v (fewer when the graph is
        # sparser than that), w drawn from the R-MAT endpoint distribution
        nb = min(n * backbone_degree, target)
        first = np.tile(np.arange(n, dtype=gen_dtype), backbone_degree)
        if nb < first.size:
            first = np.sort(rng.choice(first, nb, replace=False))
        stubs = _rmat_endpoints(rng, nb, n, probs, gen_dtype)
        _rewire(rng, first, stubs, cls, c, _share_for(h, c))
        keys = make_keys(_pair_keys(first, stubs, n), cls)
        del first, stubs
        same = _count_same(keys.keys, cls, n)
        pb.update(keys.size)
        share = _share_for(h, c)
        want = 64 + int(math.ceil(max(0, target - keys.size) * 1.06))
        # top-up rounds until there are enough same-class and cross-class pairs for the target
        while (same < want_same or keys.size - same < want_cross) and rounds < _MAX_ROUNDS:
            rounds += 1
            before, same_before = keys.size, same
            drawn = 0
            for s in range(0, want, _CHUNK_PAIRS):
                m = min(_CHUNK_PAIRS, want - s)
                u, v = _rmat_pairs(rng, m, probs, gen_dtype)
                ok = (u < n) & (v < n)
                u, v = u[ok], v[ok]
                _rewire(rng, u, v, cls, c, share)
                keys.add(_pair_keys(u, v, n))
                drawn += m
                del u, v, ok
            generated += drawn
            same += keys.end_round(cls, n)
            pb.update(min(keys.size, target) - min(before, target))
            gained = keys.size - before
            if gained == 0:
                break  # saturated (near-complete tiny graph)
            # next round: the missing pairs of each kind, scaled by this round's yield
            need_same = max(0, want_same - same)
            need_cross = max(0, want_cross - (keys.size - same))
            need = need_same + need_cross
            if need == 0:
                break
            share = _share_for(need_same / need, c)
            y_same = (same - same_before) / drawn
            y_cross = (gained - (same - same_before)) / drawn
            want = 16 + int(
                math.ceil(
                    1.05 * max(need_same / max(y_same, 1e-3), need_cross / max(y_cross, 1e-3))
                    if rounds < 3
                    else 1.05 * need / (gained / drawn)
                )
            )
            want = min(want, 64 * need + 1024)
    finally:
        pb.close()
    info = {
        "target_pairs": target,
        "backbone_pairs": int(nb),
        "rmat_pairs_drawn": int(generated),
        "rounds": rounds,
        "scale": scale,
        "level_probs": np.round(probs, 6).tolist(),
    }
    return keys, rng, cls, target, want_same, info


def finish_info(info: dict, pairs: int, same: int, trimmed: int) -> dict:
    """``meta.json``'s ``generator`` record, in its order, from :func:`draw_pairs`'s ``info``."""
    return {
        "pairs": pairs,
        "target_pairs": info["target_pairs"],
        "backbone_pairs": info["backbone_pairs"],
        "rmat_pairs_drawn": info["rmat_pairs_drawn"],
        "rounds": info["rounds"],
        "trimmed_pairs": int(trimmed),
        "homophily_measured": same / pairs if pairs else 0.0,
        "scale": info["scale"],
        "level_probs": info["level_probs"],
    }


def generate(
    num_nodes: int,
    avg_degree: float,
    num_classes: int,
    seed: int,
    homophily: float,
    rmat,
    rmat_noise: float,
    backbone_degree: int,
    progress: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Steps 1-5 of the generator on checked arguments: ``(indptr, indices, labels, info)``, where
    ``info`` holds measured figures of the graph (recorded as ``meta.json``'s ``generator``)."""
    n = int(num_nodes)
    store, rng, cls, target, want_same, info = draw_pairs(
        num_nodes, avg_degree, num_classes, seed, homophily, rmat, rmat_noise,
        backbone_degree, progress,
    )  # fmt: skip
    keys, trimmed = _trim(rng, store.keys, cls, n, target, want_same)
    del store

    # random relabelling: generation id g becomes perm[g]
    perm = rng.permutation(n)
    labels = np.empty(n, dtype=np.int64)
    labels[perm] = cls
    lo, hi = np.divmod(keys, n)
    del keys
    same = int(np.count_nonzero(cls[lo] == cls[hi]))
    pairs = int(lo.size)
    lo = perm[lo]
    hi = perm[hi]
    del perm, cls
    indptr, indices = _symmetric_csr(lo, hi, n, progress)
    return indptr, indices, labels, finish_info(info, pairs, same, trimmed)


def _count_same(keys: np.ndarray, cls: np.ndarray, n: int) -> int:
    """Number of pairs (keys ``lo * n + hi``) whose endpoints share a class."""
    total = 0
    for s in range(0, keys.size, _CHUNK_PAIRS):
        lo, hi = np.divmod(keys[s : s + _CHUNK_PAIRS], n)
        total += int(np.count_nonzero(cls[lo] == cls[hi]))
    return total


def _trim(
    rng: np.random.Generator,
    keys: np.ndarray,
    cls: np.ndarray,
    n: int,
    target: int,
    want_same: int,
    keep_protected: bool = False,
) -> tuple[np.ndarray, int]:
    """Drop surplus pairs at random so that ``target`` pairs remain, about ``want_same`` of them
    same-class. One pair per node is protected (no node loses its last edge) and pairs whose
    endpoints both have degree >= 3 go first. With ``keep_protected`` the same-class count gives
    way before a protected pair is dropped (no isolated nodes whenever ``target >= n``)."""
    if keys.size <= target:
        return keys, 0
    lo, hi = np.divmod(keys, n)  # keys are sorted, so lo is sorted
    deg = np.bincount(lo, minlength=n) + np.bincount(hi, minlength=n)
    tier = np.where((deg[lo] >= 3) & (deg[hi] >= 3), 0, 1).astype(np.int8)
    first_lo = np.flatnonzero(np.r_[True, lo[1:] != lo[:-1]])  # first pair of each lo value
    last_hi = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_hi, hi, np.arange(hi.size, dtype=np.int64))  # last pair of each hi value
    has_lo = np.zeros(n, dtype=np.bool_)
    has_lo[lo[first_lo]] = True
    tier[first_lo] = 2
    only_hi = last_hi[(last_hi >= 0) & ~has_lo]
    tier[only_hi] = 2
    is_same = cls[lo] == cls[hi]
    del lo, hi, deg, last_hi, has_lo, first_lo, only_hi
    n_same = int(np.count_nonzero(is_same))
    surplus = keys.size - target
    drop_same = min(max(0, n_same - want_same), surplus)
    drop_same = max(drop_same, surplus - (keys.size - n_same))  # when short of cross pairs
    if keep_protected:
        free = tier < 2
        free_same = int(np.count_nonzero(free & is_same))
        drop_same = max(
            min(drop_same, free_same), surplus - int(np.count_nonzero(free)) + free_same
        )
        drop_same = min(max(drop_same, 0), n_same, surplus)
    drops = []
    for kind, k in ((is_same, drop_same), (~is_same, surplus - drop_same)):
        for t in range(3):
            if k == 0:
                break
            pool = np.flatnonzero(kind & (tier == t))
            take = min(k, pool.size)
            drops.append(rng.choice(pool, size=take, replace=False) if take < pool.size else pool)
            k -= take
    return np.delete(keys, np.concatenate(drops)), surplus


def _symmetric_csr(
    lo: np.ndarray, hi: np.ndarray, n: int, progress: bool
) -> tuple[np.ndarray, np.ndarray]:
    """CSR of in-neighbours holding both directions of every pair, neighbour lists sorted.

    Consumes ``lo``/``hi`` (int64 node ids of unique pairs, ``lo != hi``).
    """
    pb = bar(total=3, desc="synthetic: csr", unit="step", enabled=progress)
    try:
        e = 2 * lo.size
        key = np.empty(e, dtype=np.int64)  # dst * n + src for both directions
        np.multiply(hi, n, out=key[: lo.size])
        key[: lo.size] += lo
        np.multiply(lo, n, out=key[lo.size :])
        key[lo.size :] += hi
        del lo, hi
        pb.update()
        key.sort()
        pb.update()
        indptr = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) * n).astype(np.int64)
        indices = np.empty(e, dtype=index_dtype(n))
        step = 1 << 24
        for s in range(0, e, step):
            np.remainder(key[s : s + step], n, out=key[s : s + step])
            indices[s : s + step] = key[s : s + step]
        del key
        pb.update()
    finally:
        pb.close()
    return indptr, indices
