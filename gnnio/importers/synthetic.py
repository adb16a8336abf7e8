"""Synthetic power-law graphs with planted, learnable classes (``gnnio prepare synthetic``).

The generator, in its own id space ("generation ids") and then relabelled at random:

1. **Noisy R-MAT edges.** Each undirected pair picks one of four quadrants per level of a
   ``2^s x 2^s`` adjacency matrix (``s = ceil(log2 N)``) with probabilities ``(a, b, c, d)``
   (default ``0.57, 0.19, 0.19, 0.05``). As in noisy SKG (Seshadhri, Pinar & Kolda, 2013) each level
   gets its own perturbation ``mu ~ U[-rmat_noise, rmat_noise]``:
   ``a - 2 mu a/(a+d), b + mu, c + mu, d - 2 mu d/(a+d)``, which removes the comb-shaped degree
   distribution of plain R-MAT. Pairs with an endpoint ``>= N`` are rejected.
2. **Backbone.** Plain R-MAT leaves about half the nodes isolated at 2^21 nodes and 16 edges per
   node (and with a one-pair backbone over half the nodes have degree 1). Every node ``v`` therefore
   gets ``backbone_degree`` (default 2) pairs ``(v, w)`` whose other ends ``w`` are drawn from the
   R-MAT endpoint distribution (preferential attachment: hubs stay hubs); R-MAT fills the rest.
3. **Planted classes.** Labels are balanced (``N/C`` per class, at random). A share ``r`` of the
   pairs of each batch is rewired: their second endpoints ("stubs") are permuted among them so that
   each first endpoint gets a stub of its own class. A permutation of stubs keeps every node's
   degree, so the power-law skew survives; ``r = (h - 1/C) / (1 - 1/C)`` gives an edge homophily of
   about ``h`` (pairs left unmatched by class-count fluctuations keep their stub). Duplicates fall
   mostly on same-class hub pairs, so the top-up rounds below adapt ``r`` and the final trim
   restores ``h``.
4. **Symmetrise, drop self-loops, deduplicate.** Rounds of new R-MAT pairs top up the losses until
   there are at least ``round(h * P)`` same-class and ``P - round(h * P)`` cross-class unique pairs,
   ``P = round(N * avg_degree / 2)``; random surplus pairs (between nodes of degree >= 3 first) are
   then dropped, leaving exactly ``P`` pairs, i.e. ``E = 2P ~ N * avg_degree`` directed edges, with
   edge homophily ``h``. Only graphs too dense to reach this by sampling (near-complete tiny graphs)
   are left short.
5. **Random relabelling** of node ids (a seeded permutation) so that ids carry no degree order.
6. **Features** ``x_v = centroid[y_v] + feature_noise * z``, ``z ~ N(0, I_F)``. The ``C``
   centroids are orthonormal directions times sqrt(2) (pairwise distance 2) when ``F >= C``, else
   random directions of norm sqrt(2). Two classes are hence ``1 / feature_noise`` noise standard
   deviations from their decision boundary; the default noise makes features alone clearly weaker
   than features plus neighbours (see ``docs/benchmarks.md``, "Synthetic generator", for measured accuracies).

Everything is seeded: one :class:`numpy.random.SeedSequence` per seed spawns independent streams for
the graph, features and splits, so the graph does not change with ``feat_dim`` or ``split``. All
work is vectorised numpy over chunks; features are written chunk by chunk into the output memmap.

Steps 1-5 (the graph) are :func:`gnnio.importers._synthetic_graph.generate`; this module checks the
arguments, draws features and splits, writes the dataset and holds the CLI glue. ``--model dcsbm``
(:class:`DCSBM`) swaps steps 1-5 for a degree-corrected stochastic block model with planted
communities (:mod:`gnnio.importers._dcsbm`); features and splits stay as above.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
from typing import cast

import numpy as np

from ..errors import UsageError
from ..graph.csr import index_dtype
from ..graph.format import DatasetWriter
from ..graph.output_dir import check_ram
from ..preprocess.chunked import refuse_budget
from ..utils.pages import drop_pages
from ..utils.progress import bar
from . import _dcsbm
from ._dcsbm import DCSBM, generate_dcsbm
from ._synthetic_graph import check_args, generate

__all__ = [
    "HELP",
    "DESCRIPTION",
    "DEFAULT_RMAT",
    "DCSBM",
    "add_arguments",
    "run",
    "generate_graph",
    "generate_dcsbm_graph",
    "generate_features",
    "prepare_synthetic",
]

HELP = "deterministic R-MAT power-law graph with planted, learnable classes"
DESCRIPTION = (
    "Generate a seeded power-law graph (noisy R-MAT plus a few backbone edges per node, "
    "symmetrised, deduplicated, no self-loops, node ids randomly permuted) with balanced classes "
    "planted as homophilous communities, features = class centroid + Gaussian noise, and random "
    "train/valid/test splits. Same arguments and seed give identical files."
)

#: R-MAT quadrant probabilities (a, b, c, d) of the Graph500 / Chakrabarti et al. setting
DEFAULT_RMAT = (0.57, 0.19, 0.19, 0.05)
DEFAULT_NUM_NODES = 1 << 20
DEFAULT_HOMOPHILY = 0.75
DEFAULT_FEATURE_NOISE = 1.0
DEFAULT_RMAT_NOISE = 0.1
DEFAULT_BACKBONE_DEGREE = 2
DEFAULT_SPLIT = (0.10, 0.05, 0.10)

_FEATURE_ROWS = 1 << 16  # feature rows written per step


def generate_graph(
    num_nodes: int,
    avg_degree: float = 16,
    num_classes: int = 16,
    seed: int = 0,
    homophily: float = DEFAULT_HOMOPHILY,
    rmat: tuple[float, float, float, float] = DEFAULT_RMAT,
    rmat_noise: float = DEFAULT_RMAT_NOISE,
    backbone_degree: int = DEFAULT_BACKBONE_DEGREE,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seeded synthetic graph and its labels (see the module docstring for the model).

    Args:
        num_nodes: ``N >= 2``.
        avg_degree: target directed edges per node after symmetrisation: the graph gets
            ``round(N * avg_degree / 2)`` unique undirected pairs, ``E = 2 * pairs`` directed edges.
        num_classes: ``C`` balanced classes.
        seed: non-negative integer; same arguments and seed give identical arrays.
        homophily: target share of edges whose two endpoints share a class (values below ``1/C``
            are reached too: no rewiring, then the trim drops same-class pairs).
        rmat: quadrant probabilities ``(a, b, c, d)``.
        rmat_noise: half-width of the per-level noise on the quadrant probabilities.
        backbone_degree: pairs per node drawn before the R-MAT pairs (0 = plain noisy R-MAT).

    Returns:
        ``(indptr int64 [N+1], indices int32 [E], labels int64 [N])``: a symmetric CSR of
        in-neighbours (neighbour lists sorted, no duplicates, no self-loops) over the final
        (randomly permuted) node ids, and each node's class in ``[0, C)``.
    """
    check_args(
        num_nodes,
        avg_degree,
        None,
        num_classes,
        seed,
        None,
        homophily,
        None,
        rmat,
        rmat_noise,
        backbone_degree,
    )
    indptr, indices, labels, _ = generate(
        num_nodes,
        avg_degree,
        num_classes,
        seed,
        homophily,
        rmat,
        rmat_noise,
        backbone_degree,
        progress,
    )
    return indptr, indices, labels


def generate_dcsbm_graph(
    num_nodes: int,
    avg_degree: float = 16,
    num_classes: int = 16,
    seed: int = 0,
    model: DCSBM | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    """The seeded DC-SBM graph (:mod:`gnnio.importers._dcsbm`): ``(indptr, indices, labels,
    communities, info)``, the CSR as :func:`generate_graph`'s, communities int64 ``[N]`` in
    ``[0, K)`` and measured figures (e.g. ``mixing_measured``). ``model`` defaults to
    ``DCSBM()``."""
    model = DCSBM() if model is None else model
    check_args(num_nodes, avg_degree, None, num_classes, seed, None, 0.5, None, DEFAULT_RMAT, 0, 0)
    model.check(num_nodes)
    return generate_dcsbm(num_nodes, avg_degree, num_classes, seed, model, progress)


# --------------------------------------------------------------------------- features and splits


def _centroids(rng: np.random.Generator, num_classes: int, feat_dim: int) -> np.ndarray:
    """``[C, F]`` float64 class centroids with pairwise distance 2 (exactly when ``F >= C``)."""
    g = rng.standard_normal((feat_dim, num_classes))
    if feat_dim >= num_classes:
        q, r = np.linalg.qr(g)
        q *= np.sign(np.diag(r))  # unique orthonormal basis for the given draw
        return math.sqrt(2.0) * q.T
    g /= np.linalg.norm(g, axis=0, keepdims=True)
    return math.sqrt(2.0) * g.T


def generate_features(
    labels: np.ndarray,
    feat_dim: int,
    seed: int = 0,
    feature_noise: float = DEFAULT_FEATURE_NOISE,
    out: np.ndarray | None = None,
    progress: bool = False,
    drop: bool = False,
) -> np.ndarray:
    """Features ``centroid[label] + feature_noise * N(0, I)`` as float32 ``[N, feat_dim]``.

    Written in chunks of rows into ``out`` when given (e.g. a writable memmap), else into a new
    array. ``labels`` are the node classes (int, ``[N]``, in ``[0, C)``); ``C = labels.max() + 1``.
    The stream depends only on ``seed`` (not on the graph), and rows are generated in a fixed chunk
    size, so the result is identical for the same ``(labels, feat_dim, seed, feature_noise)``.
    ``drop``: after each chunk, drop the written pages of the mapping ``out`` from this process
    (:func:`gnnio.utils.pages.drop_pages`; they stay in the page cache and reach the file).
    """
    labels = np.asarray(labels)
    n = labels.shape[0]
    c = int(labels.max()) + 1 if n else 1
    if out is None:
        out = np.empty((n, feat_dim), dtype=np.float32)
    elif out.shape != (n, feat_dim) or out.dtype != np.float32:
        raise ValueError(f"out must be float32 [{n}, {feat_dim}], got {out.dtype} {out.shape}")
    _, feat_ss, _ = np.random.SeedSequence(seed).spawn(3)
    rng = np.random.default_rng(feat_ss)
    cent = _centroids(rng, c, feat_dim).astype(np.float32)
    noise = np.float32(feature_noise)
    buf = np.empty((min(_FEATURE_ROWS, max(n, 1)), feat_dim), dtype=np.float32)
    with bar(total=n, desc="synthetic: features", unit="row", enabled=progress) as pb:
        for s in range(0, n, _FEATURE_ROWS):
            k = min(_FEATURE_ROWS, n - s)
            blk = buf[:k]
            rng.standard_normal(dtype=np.float32, out=blk)
            blk *= noise
            blk += cent[labels[s : s + k]]
            out[s : s + k] = blk
            if drop:
                drop_pages(out)
            pb.update(k)
    return out


def _splits(n: int, split, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    _, _, split_ss = np.random.SeedSequence(seed).spawn(3)
    perm = np.random.default_rng(split_ss).permutation(n)
    sizes = [int(round(float(f) * n)) for f in split]
    if sum(sizes) > n:  # rounding at tiny n
        sizes[0] -= sum(sizes) - n
    a, b = sizes[0], sizes[0] + sizes[1]
    return (
        np.sort(perm[:a]).astype(np.int64),
        np.sort(perm[a:b]).astype(np.int64),
        np.sort(perm[b : b + sizes[2]]).astype(np.int64),
    )


# --------------------------------------------------------------------------- dataset writer


def prepare_synthetic(
    out: str | os.PathLike,
    num_nodes: int = DEFAULT_NUM_NODES,
    avg_degree: float = 16,
    feat_dim: int = 128,
    num_classes: int = 16,
    seed: int = 0,
    split: tuple[float, float, float] = DEFAULT_SPLIT,
    homophily: float = DEFAULT_HOMOPHILY,
    feature_noise: float = DEFAULT_FEATURE_NOISE,
    overwrite: bool = False,
    progress: bool = True,
    rmat: tuple[float, float, float, float] = DEFAULT_RMAT,
    rmat_noise: float = DEFAULT_RMAT_NOISE,
    backbone_degree: int = DEFAULT_BACKBONE_DEGREE,
    model: str | DCSBM = "rmat",
    memory_budget: int | None = None,
) -> Path:
    """Generate the synthetic dataset and write it atomically to ``out``; returns ``out``.

    ``model`` is ``"rmat"`` (the default), ``"dcsbm"`` (:class:`DCSBM` defaults) or a
    :class:`DCSBM`; the DC-SBM ignores ``homophily``, ``rmat``, ``rmat_noise`` and
    ``backbone_degree`` and also stores each node's community (array ``communities``, int64).

    Graph and labels as in :func:`generate_graph`, features as in :func:`generate_features`
    (float32 ``[N, feat_dim]``), splits: disjoint random node sets of ``round(f * N)`` nodes for
    ``split = (train, valid, test)`` fractions (sorted ids). Every node is labelled.
    ``meta.json`` records the arguments under ``source`` and measured figures under ``generator``
    (e.g. the achieved homophily).

    ``memory_budget`` (bytes; R-MAT only): generate within it
    (:mod:`gnnio.importers._synthetic_bounded`), the same files bit for bit; a budget too small
    for the graph is a one-line UsageError before anything is written. None: all in RAM.
    """
    split = cast(tuple[float, float, float], tuple(split))
    check_args(
        num_nodes,
        avg_degree,
        feat_dim,
        num_classes,
        seed,
        split,
        homophily,
        feature_noise,
        tuple(rmat),
        rmat_noise,
        backbone_degree,
    )
    if model not in ("rmat", "dcsbm") and not isinstance(model, DCSBM):
        raise UsageError(f"--model must be rmat or dcsbm, got {model!r}")
    dcsbm = DCSBM() if model == "dcsbm" else model if isinstance(model, DCSBM) else None
    if dcsbm is not None:
        dcsbm.check(num_nodes)
        if memory_budget is not None:
            raise UsageError("--memory-budget: --model dcsbm is generated in RAM only (use rmat)")
    out = Path(out)
    size, ram = _output_size(int(num_nodes), float(avg_degree), int(feat_dim), split, dcsbm)
    if memory_budget is not None:
        from ._synthetic_bounded import need_bytes

        ram = need_bytes(int(num_nodes), int(round(int(num_nodes) * float(avg_degree) / 2)))
    with DatasetWriter(out, name="synthetic", overwrite=overwrite, size_hint=size) as w:
        check_ram(ram, f"synthetic graph of {int(num_nodes):,} nodes, average degree {avg_degree}")
        if memory_budget is not None:  # after the disk and RAM checks, before any writing
            refuse_budget(int(memory_budget), ram, f"generate a synthetic graph of "
                          f"{int(num_nodes):,} nodes, average degree {avg_degree}",
                          "the pair keys, the trim, a chunk of pairs and the per-node arrays")  # fmt: skip
        if memory_budget is not None:
            from ._synthetic_bounded import generate_bounded

            labels, info = generate_bounded(
                w, int(memory_budget), num_nodes, avg_degree, num_classes, seed, homophily,
                rmat, rmat_noise, backbone_degree, progress,
            )  # fmt: skip
        elif dcsbm is None:
            indptr, indices, labels, info = generate(
                num_nodes,
                avg_degree,
                num_classes,
                seed,
                homophily,
                rmat,
                rmat_noise,
                backbone_degree,
                progress,
            )
        else:
            indptr, indices, labels, comms, info = generate_dcsbm(
                num_nodes, avg_degree, num_classes, seed, dcsbm, progress
            )
            w.save_array("communities", comms)
            del comms
        if memory_budget is None:
            w.save_array("indptr", indptr)
            w.save_array("indices", indices)
            del indptr, indices
        w.save_array("labels", labels)
        feats = w.create_array("features", (int(num_nodes), int(feat_dim)), np.float32)
        generate_features(labels, int(feat_dim), seed, feature_noise, out=feats,
                          progress=progress, drop=memory_budget is not None)  # fmt: skip
        del feats
        tr, va, te = _splits(int(num_nodes), split, seed)
        w.save_array("train_idx", tr)
        w.save_array("valid_idx", va)
        w.save_array("test_idx", te)
        w.meta["num_classes"] = int(num_classes)
        w.meta["source"] = {
            "importer": "synthetic",
            "num_nodes": int(num_nodes),
            "avg_degree": float(avg_degree),
            "feat_dim": int(feat_dim),
            "num_classes": int(num_classes),
            "seed": int(seed),
            "split": [float(s) for s in split],
            "feature_noise": float(feature_noise),
            "model": "rmat" if dcsbm is None else "dcsbm",
        }
        if dcsbm is None:
            w.meta["source"].update(
                homophily=float(homophily),
                rmat=[float(p) for p in rmat],
                rmat_noise=float(rmat_noise),
                backbone_degree=int(backbone_degree),
            )
        else:
            w.meta["source"].update(dataclasses.asdict(dcsbm))
        w.meta["generator"] = info
    return out


def _output_size(n: int, avg_degree: float, feat_dim: int, split, dcsbm) -> tuple[int, int]:
    """Bytes on disk of the dataset (about) and a lower bound on the memory that generating its
    graph takes: the int64 keys of every directed edge, sorted into the CSR in RAM."""
    edges = 2 * int(round(n * avg_degree / 2))
    per_node = 8 + 8 + 4 * feat_dim + (8 if dcsbm is not None else 0)  # indptr, labels, features
    disk = n * per_node + edges * index_dtype(n).itemsize + int(8 * n * sum(split)) + 65536
    return disk, 8 * edges


# --------------------------------------------------------------------------- CLI glue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-nodes", type=int, default=DEFAULT_NUM_NODES, metavar="N", help="number of nodes"
    )
    parser.add_argument(
        "--avg-degree",
        type=float,
        default=16,
        metavar="D",
        help="directed edges per node after symmetrisation (E = N*D, exact up to rounding)",
    )
    parser.add_argument("--feat-dim", type=int, default=128, metavar="F", help="feature length")
    parser.add_argument(
        "--num-classes", type=int, default=16, metavar="C", help="number of balanced classes"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same files)")
    parser.add_argument(
        "--homophily",
        type=float,
        metavar="H",
        help=f"R-MAT: target share of edges whose endpoints share a class (default {DEFAULT_HOMOPHILY})",
    )
    parser.add_argument(
        "--feature-noise",
        type=float,
        default=DEFAULT_FEATURE_NOISE,
        metavar="S",
        help="std of the Gaussian feature noise; two class centroids are 1/S noise stds from their "
        "decision boundary",
    )
    parser.add_argument(
        "--backbone-degree",
        type=int,
        metavar="K",
        help="R-MAT: pairs per node added before the R-MAT edges (min degree about K, no isolated "
        f"nodes; default {DEFAULT_BACKBONE_DEGREE})",
    )
    parser.add_argument(
        "--split",
        type=float,
        nargs=3,
        default=list(DEFAULT_SPLIT),
        metavar=("TRAIN", "VALID", "TEST"),
        help="fractions of the nodes in the train/valid/test splits, three numbers (default: "
        f"{' '.join(f'{v:g}' for v in DEFAULT_SPLIT)})",
    )
    _dcsbm.add_arguments(parser)


def run(args) -> Path:
    model = _dcsbm.from_args(args)
    budget = getattr(args, "memory_budget", None)
    if model is not None and not getattr(args, "memory_budget_given", False):
        budget = None  # the DC-SBM runs in RAM; only a budget the user named is refused
    return prepare_synthetic(
        args.out,
        num_nodes=args.num_nodes,
        avg_degree=args.avg_degree,
        feat_dim=args.feat_dim,
        num_classes=args.num_classes,
        seed=args.seed,
        split=tuple(args.split),
        homophily=DEFAULT_HOMOPHILY if args.homophily is None else args.homophily,
        feature_noise=args.feature_noise,
        backbone_degree=(
            DEFAULT_BACKBONE_DEGREE if args.backbone_degree is None else args.backbone_degree
        ),
        overwrite=args.overwrite,
        progress=not args.quiet,
        model="rmat" if model is None else model,
        memory_budget=budget,
    )
