"""Per-node hotness scores: predictions of how often a node's feature row is read during training.

Every score is a function ``f(graph, ..., progress=True) -> np.ndarray`` of float64 ``[N]`` indexed
by **global node id**; a larger value means "expected to be accessed more often". Only the ranking
matters to the users of a score (reordering, placement, static caches).

Edge directions. gnnio's CSR lists **in-neighbours**: row ``v`` holds the ``u`` with an edge
``u -> v``, i.e. the nodes ``v`` aggregates from. The sampler reads ``u``'s features when ``u`` is
an in-neighbour of a frontier node. Data Tiering (Min et al.) uses the same orientation: "the green
nodes are sampled while generating the embedding for node A because they have an outgoing edge to
A". So the paper's terms map one to one onto ours:

* paper out-degree of ``u`` (how many nodes aggregate from ``u``) = :meth:`CSRGraph.out_degrees`
  = the number of rows of the CSR that contain ``u``; this is the ``"degree"`` score;
* paper in-degree of ``v`` (how many nodes ``v`` aggregates from) = :meth:`CSRGraph.in_degrees`
  = the row length of ``v``.

Code: every propagation is ``y = M^T x`` over the CSR (:func:`propagate`); the graph scores live
in :mod:`gnnio.preprocess.graph_scores`, ``presample`` in :mod:`gnnio.preprocess.presample`. This
module is the registry (:data:`SCORES`, :func:`compute_score`) and re-exports every score function.

Scores (registry :data:`SCORES`, dispatcher :func:`compute_score`):

``degree`` / ``out_degree``
    paper out-degree (Data Tiering §3.1, first option).
``in_degree``
    row length; a baseline only (it predicts how much a node *reads*, not how often it is read).
``rpr``
    reverse PageRank (Bar-Yossef & Mashiach 2008; Data Tiering §3.1, second option), see
    :func:`reverse_pagerank`.
``wrpr``
    weighted reverse PageRank, Data Tiering Algorithm 1, see :func:`weighted_reverse_pagerank`.
``sj``
    Song & Jiang §3.2 L-hop training-node count by SpMV, see :func:`sj_estimate`.
``sj_fanout``
    the same SpMV with every edge weighted by the sampler's probability of taking it, i.e. the
    expected number of times a node is sampled in one epoch, see :func:`sj_estimate`.
``presample``
    access counts from running the real sampler for some epochs, see :func:`presample_counts`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError, UsageError
from ..utils.counts import top_count
from .graph_scores import (
    DEFAULT_DAMPING,
    degree,
    in_degree,
    out_degree,
    propagate,
    reverse_pagerank,
    sj_estimate,
    weighted_reverse_pagerank,
)
from .presample import presample_counts

__all__ = [
    "DEFAULT_DAMPING",
    "SCORES",
    "TRAIN_SCORES",
    "compute_score",
    "in_degree",
    "out_degree",
    "degree",
    "propagate",
    "reverse_pagerank",
    "weighted_reverse_pagerank",
    "sj_estimate",
    "presample_counts",
    "top_count",
]


# --------------------------------------------------------------------------------------------
# registry


def _train_of(ds) -> np.ndarray:
    if ds.train_idx is None or ds.train_idx.size == 0:
        raise DatasetError(f"{ds.path}: has no train split; this score needs the training nodes")
    return np.asarray(ds.train_idx)


#: score name -> function(dataset, options) -> float64 [N]
SCORES: dict[str, Callable[..., np.ndarray]] = {
    "degree": lambda ds, o: out_degree(ds.graph, progress=o["progress"]),
    "out_degree": lambda ds, o: out_degree(ds.graph, progress=o["progress"]),
    "in_degree": lambda ds, o: in_degree(ds.graph, progress=o["progress"]),
    "rpr": lambda ds, o: reverse_pagerank(
        ds.graph,
        iterations=o.get("rpr_iterations", 20),
        damping=o.get("damping", DEFAULT_DAMPING),
        progress=o["progress"],
    ),
    "wrpr": lambda ds, o: weighted_reverse_pagerank(
        ds.graph,
        _train_of(ds),
        iterations=o.get("wrpr_iterations", 5),
        damping=o.get("damping", DEFAULT_DAMPING),
        progress=o["progress"],
    ),
    "sj": lambda ds, o: sj_estimate(
        ds.graph, _train_of(ds), num_layers=len(o["fanouts"]), progress=o["progress"]
    ),
    "sj_fanout": lambda ds, o: sj_estimate(
        ds.graph, _train_of(ds), fanouts=o["fanouts"], progress=o["progress"]
    ),
    "presample": lambda ds, o: presample_counts(
        ds.graph,
        _train_of(ds),
        fanouts=o["fanouts"],
        batch_size=o["batch_size"],
        epochs=o.get("epochs", 1),
        seed=o.get("seed", 1),
        num_threads=o.get("num_threads"),
        progress=o["progress"],
    ),
}

#: scores that need the training nodes
TRAIN_SCORES = ("wrpr", "sj", "sj_fanout", "presample")


def compute_score(
    name: str,
    dataset: Any,
    fanouts: Sequence[int] = (15, 10, 5),
    batch_size: int = 1024,
    progress: bool = True,
    **options: Any,
) -> np.ndarray:
    """Compute the score ``name`` (a key of :data:`SCORES`) for a dataset.

    Args:
        name: score name.
        dataset: a :class:`gnnio.graph.Dataset` or the path of one.
        fanouts: per-hop fanouts (``sj``: L = len(fanouts); ``sj_fanout``, ``presample``: sampling).
        batch_size: seeds per batch (``presample``).
        progress: progress bars.
        **options: ``damping``, ``rpr_iterations`` (20), ``wrpr_iterations`` (5), and for
            ``presample``: ``epochs`` (1), ``seed`` (1), ``num_threads``.

    Returns:
        float64 ``[N]`` scores by global id (larger = hotter).
    """
    if name not in SCORES:
        raise UsageError(f"score '{name}' is unknown; choose from {', '.join(SCORES)}")
    if isinstance(dataset, (str, os.PathLike, Path)):
        from ..graph.dataset import load

        dataset = load(dataset)
    opts = dict(options)
    opts.update(fanouts=[int(k) for k in fanouts], batch_size=int(batch_size), progress=progress)
    return SCORES[name](dataset, opts)
