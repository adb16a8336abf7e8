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

Within a memory budget (``compute_score(..., memory_budget=BYTES)``, ``gnnio reorder
--memory-budget``; issue 25 item 1): the graph scores walk the memory-mapped CSR in chunks whose
pages are dropped after each (:mod:`gnnio.preprocess.graph_scores`; the same numbers, bit for
bit), next to their per-node arrays. ``presample`` runs the sampler, which reads the CSR at random:
it is not chunked, the whole CSR counts against the budget, and a budget that cannot hold it is
refused with one line before sampling (:func:`score_fixed_bytes`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError, UsageError
from ..utils.counts import top_count
from ..utils.pages import drop_pages
from .budget import chunk_bytes
from .graph_scores import (
    DEFAULT_DAMPING,
    FIXED_BYTES_PER_NODE,
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
    "score_fixed_bytes",
    "score_params",
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
    "degree": lambda ds, o: out_degree(ds.graph, o["progress"], o["chunk"]),
    "out_degree": lambda ds, o: out_degree(ds.graph, o["progress"], o["chunk"]),
    "in_degree": lambda ds, o: in_degree(ds.graph, o["progress"], o["chunk"]),
    "rpr": lambda ds, o: reverse_pagerank(
        ds.graph,
        iterations=o.get("rpr_iterations", 20),
        damping=o.get("damping", DEFAULT_DAMPING),
        progress=o["progress"],
        chunk_bytes=o["chunk"],
    ),
    "wrpr": lambda ds, o: weighted_reverse_pagerank(
        ds.graph,
        _train_of(ds),
        iterations=o.get("wrpr_iterations", 5),
        damping=o.get("damping", DEFAULT_DAMPING),
        progress=o["progress"],
        chunk_bytes=o["chunk"],
    ),
    "sj": lambda ds, o: sj_estimate(
        ds.graph,
        _train_of(ds),
        num_layers=len(o["fanouts"]),
        progress=o["progress"],
        chunk_bytes=o["chunk"],
    ),
    "sj_fanout": lambda ds, o: sj_estimate(
        ds.graph,
        _train_of(ds),
        fanouts=o["fanouts"],
        progress=o["progress"],
        chunk_bytes=o["chunk"],
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

#: scores that read the fanouts (sj: only their number, the layers)
FANOUT_SCORES = ("sj", "sj_fanout", "presample")


def score_params(
    name: str, fanouts: Sequence[int] = (15, 10, 5), batch_size: int = 1024, **options: Any
) -> dict[str, Any]:
    """The parameters the score ``name`` depends on, defaults filled in, as JSON values:
    ``{"name": name}`` plus ``damping`` and ``iterations`` (rpr, wrpr), ``layers`` (sj: its fanouts'
    number), ``fanouts`` (sj_fanout, presample), ``batch_size``, ``epochs`` and ``seed`` (presample).
    Takes :func:`compute_score`'s arguments. ``gnnio reorder`` records this as
    ``meta["reorder_score"]`` and ``gnnio train`` routes the id prefix as the hot set only when its
    own score's parameters are these (the threads and a memory budget do not change a score)."""
    p: dict[str, Any] = {"name": name}
    if name in ("rpr", "wrpr"):
        p["damping"] = float(options.get("damping", DEFAULT_DAMPING))
        p["iterations"] = int(options.get(f"{name}_iterations", 20 if name == "rpr" else 5))
    elif name == "sj":
        p["layers"] = len(fanouts)
    elif name in FANOUT_SCORES:
        p["fanouts"] = [int(k) for k in fanouts]
    if name == "presample":
        p.update(batch_size=int(batch_size), epochs=int(options.get("epochs", 1)))
        p["seed"] = int(options.get("seed", 1))
    return p


def score_fixed_bytes(name: str, graph) -> int:
    """Bytes the score ``name`` holds in RAM on ``graph`` besides its chunks (what a memory budget
    must leave room for): its per-node arrays, and for ``presample`` the whole CSR (module
    docstring)."""
    n = graph.num_nodes + 1
    if name == "presample":  # counts, their float copy, the sampler's per-node maps + the CSR
        csr = graph.indptr.shape[0] * graph.indptr.dtype.itemsize
        return 32 * n + csr + graph.num_edges * graph.indices.dtype.itemsize
    return FIXED_BYTES_PER_NODE[name] * n


def compute_score(
    name: str,
    dataset: Any,
    fanouts: Sequence[int] = (15, 10, 5),
    batch_size: int = 1024,
    progress: bool = True,
    memory_budget: int | None = None,
    **options: Any,
) -> np.ndarray:
    """Compute the score ``name`` (a key of :data:`SCORES`) for a dataset.

    Args:
        name: score name.
        dataset: a :class:`gnnio.graph.Dataset` or the path of one.
        fanouts: per-hop fanouts (``sj``: L = len(fanouts); ``sj_fanout``, ``presample``: sampling).
        batch_size: seeds per batch (``presample``).
        progress: progress bars.
        memory_budget: bytes (module docstring); a budget too small is refused with one line
            before any work.
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
    g = dataset.graph
    fixed = score_fixed_bytes(name, g)
    opts["chunk"] = chunk_bytes(
        memory_budget, fixed, f"the '{name}' score of {g.num_nodes:,} nodes"
    )
    if memory_budget is not None and name == "presample":
        opts["chunk"] = None  # the sampler reads the whole CSR, counted in `fixed`
    score = SCORES[name](dataset, opts)
    if memory_budget is not None:  # the pages its passes left (presample's CSR) are not kept
        drop_pages(g.indices)
        drop_pages(g.indptr)
    return score
