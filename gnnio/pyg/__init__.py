"""gnnio for PyG users: ``NeighborLoader``-format batches, PyG ``FeatureStore`` / ``GraphStore``
over gnnio, and PyG ``Data`` in and out of gnnio's format. Importing it imports torch_geometric;
nothing else in gnnio imports this package.

* :class:`NeighborLoader` (:mod:`.neighbor_loader`) -- PyG's ``NeighborLoader`` by name and
  signature (``from gnnio.pyg import NeighborLoader`` is the one line a PyG script changes): a
  ``Data``, a store pair, a gnnio dataset or a path as ``data``; every argument implemented, mapped
  or refused (:data:`~gnnio.pyg.arguments.ARGUMENTS`); batches safe to keep, on ``data.x``'s
  device, seeded from torch's generator;
* :class:`PyGLoader` (:mod:`.loader`) -- gnnio's pipelined loader yielding ``Data`` batches with
  ``NeighborLoader``'s fields and order (``x``, ``edge_index``, ``y``, masks, ``n_id``, ``e_id``,
  ``num_sampled_nodes``, ``num_sampled_edges``, ``input_id``, ``batch_size``; the fields are listed
  in :mod:`.batch`), over any gnnio store, sampler and seed order;
* :func:`to_pyg_data` (:mod:`.batch`) -- one gnnio ``MiniBatch`` as such a ``Data``;
* :class:`GnnioFeatureStore`, :class:`GnnioGraphStore` (:mod:`.stores`) -- PyG's remote-backend
  interfaces over gnnio feature stores and gnnio's CSR, for ``data=(feature_store, graph_store)``;
* :func:`from_pyg`, :func:`to_pyg` (:mod:`gnnio.importers.pyg`) -- a PyG ``Data`` to a gnnio
  dataset directory and back (also ``gnnio.from_pyg`` and ``gnnio prepare pyg``).

**Sampling semantics: where gnnio and PyG differ.** Both draw up to ``num_neighbors[h]``
in-neighbours per node at hop ``h + 1``, without replacement, ``-1`` meaning all. They differ in
*which* nodes a hop expands and so in what a layer aggregates:

* PyG (``NeighborLoader`` / pyg-lib): hop ``h + 1`` expands only the nodes *first reached at hop
  h*; a node met again is not sampled again. All edges form one list, hop by hop; layer ``i`` of
  an ``L``-layer model (with ``trim_to_layer``) aggregates over the edges of hops ``1..L-i``, so a
  seed aggregates at every layer over the same hop-1 sample.
* gnnio's samplers (:class:`~gnnio.sampling.UniformSampler`, the locality-aware and pruned ones;
  GraphSAGE's and DGL's semantics): hop ``h + 1`` samples afresh for *every* node reached so far,
  and layer ``i`` has its own block holding hop ``L-i`` only. A seed draws new neighbours for
  every layer; batches are larger (more edges per hop, somewhat more input nodes).

``PyGLoader(expand="new")`` (the default) gives PyG's semantics with gnnio's
:class:`~gnnio.sampling.frontier.FrontierSampler`; ``expand="all"`` (or passing a gnnio sampler)
gives gnnio's, laid out in PyG's format: hop ``h``'s block goes into ``edge_index`` as hop ``h``,
so under ``trim_to_layer`` layer ``i`` aggregates over the *union* of the samples of hops
``1..L-i`` (a node's draws at different hops are independent, so an edge may appear more than
once). Both layouts keep NeighborLoader's invariants: ``n_id`` starts with the seeds in order,
each hop's new nodes follow in order of first appearance, ``edge_index`` holds local ids with the
source in row 0 and the target in row 1, and every target of hop ``h`` is a node reached before
hop ``h``. pyg-lib's random numbers are not reproduced: with ``num_neighbors`` of ``-1`` (or at
least the largest degree) the batches equal ``NeighborLoader``'s field for field.
"""

from ..importers.pyg import from_pyg, to_pyg
from .batch import to_pyg_data
from .loader import PyGLoader
from .neighbor_loader import NeighborLoader
from .stores import GnnioFeatureStore, GnnioGraphStore

__all__ = [
    "GnnioFeatureStore",
    "GnnioGraphStore",
    "NeighborLoader",
    "PyGLoader",
    "from_pyg",
    "to_pyg",
    "to_pyg_data",
]
