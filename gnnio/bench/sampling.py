"""``gnnio bench sampling DIR``: throughput of a neighbour sampler (uniform node-wise by default).

What is measured. The first ``--batches`` batches of epoch 0 of a seeded random order over the
training split (every node when there is none) are fixed; one pass samples all of them with
``--sampler``: ``uniform`` (:class:`gnnio.sampling.UniformSampler`, GraphSAGE), ``labor``
(:class:`gnnio.sampling.LaborSampler`, LABOR-0; ``--importance-sampling I``: LABOR-I, on
``--device cuda`` with :mod:`gnnio.sampling.labor_importance_torch`, not replayed) -- both with
``--fanouts``, ``fanouts[0]`` = the
seeds' hop -- or ``ladies`` (:class:`gnnio.sampling.LadiesSampler`, ``--layer-size`` nodes per hop,
as many hops as ``--fanouts`` has values; ``--prune-threshold A,B``: the uniform one with HyDRA's
threshold pruning, :class:`gnnio.sampling.PrunedUniformSampler`; ``--locality-scale S``: Song & Jiang's
:class:`gnnio.sampling.LocalitySampler`, B the top ``--gpu-cache-fraction`` of nodes by wrpr, with
``ladies`` their :class:`gnnio.sampling.LocalityLadiesSampler`), batch ``i`` with ``epoch_seed=i`` so every pass samples
the same subgraphs. After ``--warmup`` untimed
passes (JIT load, page faults of the topology), ``--passes`` passes are timed and the median is
reported:

* ``ms_per_batch``: median pass time / batches;
* ``edges_per_batch``: sampled edges per batch, all blocks together (DGL/PyG count the same way);
* ``edges_per_s``, ``seeds_per_s``: edges and seeds of a pass / median pass time;
* ``input_nodes_per_batch``: distinct input nodes per batch (the feature rows a batch gathers),
  and ``feature_bytes_per_batch`` = that times the bytes of one feature row;
* ``cpu_ms_per_batch``: median CPU time of the whole process (all threads) per batch, a check on
  ``ms_per_batch`` when the machine is shared (busy other processes inflate wall time, not this).
* ``checksum``: BLAKE2b-128 of every batch's seeds, input nodes, edge indices and edge weights
  (dtype, shape and bytes, batch after batch), from one more untimed pass. Sampling is counter-based
  (a batch depends only on ``--seed``, the batch index and its seeds), so ``--threads 1`` and
  ``--threads 2`` -- and ``--device cpu`` and ``--device cuda`` for ``uniform`` and ``labor`` --
  give the same checksum (``ladies`` and ``labor --importance-sampling I``: the same batches,
  but on CUDA their weights may differ from the CPU's in the last float bits, so the checksum
  may too; :mod:`gnnio.sampling.ladies_torch`, :mod:`gnnio.sampling.labor_importance_torch`);
* ``checksum_ids``: the same without the edge weights (ids and edges only).

The whole pass is timed: seed checks, sampling, relabelling to local ids, building the blocks.
Nothing is gathered (see ``gnnio bench gather``) and nothing is copied to a GPU unless
``--device cuda`` (topology on the GPU; timing includes ``torch.cuda.synchronize``; ``ladies``
there is :mod:`gnnio.sampling.ladies_torch`).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..utils.progress import bar
from ..utils.torch_threads import set_torch_threads
from . import KINDS
from ._timing import median, time_passes

HELP = KINDS["sampling"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument(
        "--fanouts",
        default="15,10,5",
        help="neighbours per hop, hop 1 (the seeds') first; -1 = all",
    )
    p.add_argument(
        "--sampler",
        default="uniform",
        choices=["uniform", "labor", "ladies"],
        help="uniform (node-wise), labor (LABOR-0) or ladies (layer-wise, --layer-size per hop)",
    )
    p.add_argument(
        "--importance-sampling", type=int, default=None, metavar="I",
        help="--sampler labor: LABOR-I, I fixed-point steps on per-node importances (0 = LABOR-0, "
        "the default; --device cuda too)",
    )  # fmt: skip
    p.add_argument(
        "--layer-size", type=int, default=None, metavar="K",
        help="--sampler ladies: nodes per layer (default: 8192)",
    )  # fmt: skip
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per mini-batch")
    p.add_argument("--batches", type=int, default=50, help="mini-batches sampled per pass")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of the sampler (and torch)")
    p.add_argument("--passes", type=int, default=5, help="timed passes (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes first")
    p.add_argument("--seed", type=int, default=0, help="seed of the seed order and the sampler")
    p.add_argument(
        "--device",
        default="cpu",
        help="'cpu' (numba kernels), 'cuda' (cuda:N; topology on the GPU) or 'auto' (as gnnio "
        "train: cuda when a GPU is present, else cpu)",
    )
    p.add_argument(
        "--graph-in",
        default=None,
        choices=["gpu", "host"],
        help="--device cuda: the topology in GPU memory, or read zero-copy from pinned host "
        "memory (UVA sampling) (default: gpu)",
    )
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="--device cuda, uniform (--prune-threshold, --locality-scale included) or labor "
        "(LABOR-0: not with --importance-sampling) sampler: replay each batch as a CUDA graph "
        "(gnnio.sampling.gpu_graphed; the same batches)",
    )
    p.add_argument(
        "--prune-threshold", metavar="ALPHA,BETA", nargs="?", const="1,1", default=None,
        help="--sampler uniform with HyDRA threshold pruning (PrunedUniformSampler, as gnnio "
        "train's option; --device cuda too; flag alone: 1,1)",
    )  # fmt: skip
    p.add_argument(
        "--locality-scale", type=float, default=None, metavar="S",
        help="--sampler uniform|ladies: Song & Jiang's locality-aware sampler (LocalitySampler or "
        "LocalityLadiesSampler, as gnnio train's option) with scale S (1e-200 to 1e200), B = the "
        "top --gpu-cache-fraction of nodes by wrpr; --device cuda too (pruned with --prune-threshold)",
    )  # fmt: skip
    p.add_argument(
        "--gpu-cache-fraction", type=float, default=None, metavar="F",
        help="--locality-scale: the fraction of nodes in B (default 0.1)",
    )  # fmt: skip
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


def _check(args) -> list[int]:
    from ..sampling import parse_fanouts

    for name in ("batch_size", "batches", "threads", "passes"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
    try:
        fanouts = parse_fanouts(args.fanouts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    from ..cli import refuse_without_effect
    from ..train import check_device

    dev = check_device(args.device)  # as gnnio train's --device: auto = cuda when present
    args.device = str(dev)
    if getattr(args, "cuda_graph", False) and (
        dev.type != "cuda" or getattr(args, "sampler", "uniform") not in ("uniform", "labor")
    ):
        raise UsageError("--cuda-graph: the uniform or labor sampler on --device cuda only")
    refuse_without_effect([  # (the other samplers and the CPU read neither)
        ("--layer-size", getattr(args, "layer_size", None),
         getattr(args, "sampler", "uniform") == "ladies", "--sampler ladies"),
        ("--graph-in", getattr(args, "graph_in", None), dev.type == "cuda", "--device cuda"),
        ("--importance-sampling", getattr(args, "importance_sampling", None),
         getattr(args, "sampler", "uniform") == "labor", "--sampler labor"),
    ])  # fmt: skip
    imp = getattr(args, "importance_sampling", None)
    if imp is not None and imp < 0:
        raise UsageError(f"--importance-sampling: must be >= 0, got {imp}")
    if imp and getattr(args, "cuda_graph", False):
        raise UsageError(
            "--cuda-graph: LABOR-i (--importance-sampling > 0) is not replayed as "
            "CUDA graphs (each fixed-point step reads its early-stop test back)"
        )
    if getattr(args, "layer_size", None) is not None and args.layer_size < 1:
        raise UsageError(f"--layer-size must be >= 1, got {args.layer_size}")
    if _prune(args) is not None and getattr(args, "sampler", "uniform") != "uniform":
        raise UsageError(f"--prune-threshold: works with --sampler uniform, not {args.sampler}")
    las = getattr(args, "locality_scale", None)
    frac = getattr(args, "gpu_cache_fraction", None)
    if las is None and frac is not None:
        raise UsageError("--gpu-cache-fraction: only with --locality-scale (the set B)")
    if las is not None:
        from ..sampling.adaptive import MAX_SCALE

        args.gpu_cache_fraction = 0.1 if frac is None else frac
        if getattr(args, "sampler", "uniform") not in ("uniform", "ladies"):
            raise UsageError(
                f"--locality-scale: works with --sampler uniform or ladies, not {args.sampler}"
            )
        if not (1 / MAX_SCALE <= las <= MAX_SCALE):  # (Eq. 8's sums finite: adaptive.py)
            raise UsageError(f"--locality-scale: must be a number in [1e-200, 1e200], got {las}")
        if not 0 < args.gpu_cache_fraction <= 1:
            raise UsageError(
                f"--gpu-cache-fraction: must be in (0, 1], got {args.gpu_cache_fraction}"
            )
    return fanouts


def _hot_ids(args, ds, fanouts) -> np.ndarray:
    """``--locality-scale``'s set B: the top ``--gpu-cache-fraction`` of nodes by wrpr."""
    from ..features.tiers.tiered import hot_rows_for_fraction
    from ..preprocess.hotness import compute_score
    from ..preprocess.reorder import order_by_score

    score = compute_score("wrpr", ds, fanouts=fanouts, batch_size=args.batch_size,
                          progress=not args.no_progress)  # fmt: skip
    return np.sort(
        order_by_score(score)[: hot_rows_for_fraction(args.gpu_cache_fraction, ds.num_nodes)]
    )


def _prune(args) -> tuple[float, float] | None:
    """``--prune-threshold``'s ``(alpha, beta)``, checked as gnnio train checks it, or None."""
    text = getattr(args, "prune_threshold", None)
    if text is None:
        return None
    from ..sampling import prune_thresholds

    try:
        prune = tuple(float(v) for v in str(text).split(","))
        if len(prune) != 2 or not any(v > 0 for v in prune) or max(prune) > 1e9:
            raise ValueError
        prune_thresholds(1.0, [1], prune)  # finite and >= 0
    except ValueError:
        raise UsageError(
            f"--prune-threshold: needs ALPHA,BETA >= 0, not both 0, at most 1e9, got '{text}'"
        ) from None
    return prune


def make_sampler(kind: str, graph, fanouts, layer_size: int, seed: int, threads: int, device,
                 graph_in: str = "gpu", cuda_graph: bool = False, prune=None, las=None,
                 importance_sampling: int = 0):  # fmt: skip
    """The sampler ``--sampler`` names (see module docstring); ``prune``: HyDRA's; ``las``:
    ``(hot ids, scale)`` of a :class:`~gnnio.sampling.LocalitySampler` (``ladies``: of a
    :class:`~gnnio.sampling.LocalityLadiesSampler`); ``importance_sampling``:
    LABOR-i's."""
    from ..sampling import (
        LaborSampler,
        LadiesSampler,
        LocalityLadiesSampler,
        LocalitySampler,
        PrunedUniformSampler,
        UniformSampler,
    )

    gpu: dict[str, Any] = {"graph_in": graph_in} if torch.device(device).type == "cuda" else {}
    if cuda_graph:
        gpu["cuda_graph"] = True
    if kind == "labor":
        return LaborSampler(graph, fanouts, seed=seed, num_threads=threads, device=device,
                            importance_sampling=importance_sampling, **gpu)  # fmt: skip
    if kind == "ladies" and las is not None:
        return LocalityLadiesSampler(graph, [int(layer_size)] * len(fanouts), hot_ids=las[0],
                                     scale=las[1], seed=seed, device=device,
                                     graph_in=graph_in)  # fmt: skip
    if kind == "ladies":
        return LadiesSampler(graph, [int(layer_size)] * len(fanouts), seed=seed, device=device,
                             graph_in=graph_in)  # fmt: skip
    if las is not None:
        return LocalitySampler(graph, fanouts, hot_ids=las[0], scale=las[1], seed=seed,
                               num_threads=threads, prune=prune, device=device, **gpu)  # fmt: skip
    if prune is not None:
        return PrunedUniformSampler(graph, fanouts, prune=prune, seed=seed, num_threads=threads,
                                    device=device, **gpu)  # fmt: skip
    return UniformSampler(graph, fanouts, seed=seed, num_threads=threads, device=device, **gpu)


def fixed_batches(seeds: np.ndarray, batch_size: int, batches: int, seed: int) -> list:
    """The first ``batches`` batches of :class:`gnnio.ordering.shuffle.RandomOrder` (going round epochs
    when there are fewer)."""
    from ..ordering import RandomOrder

    order = RandomOrder(seeds, batch_size, seed=seed)
    out: list[torch.Tensor] = []
    epoch = 0
    while len(out) < batches and order.num_batches:
        for s in order.batches(epoch):
            out.append(s)
            if len(out) == batches:
                break
        epoch += 1
    return out


def batches_checksum(minibatches) -> str:
    """``"blake2b-128:<hex>"`` of the mini-batches' seeds, input nodes, edge indices and edge
    weights (dtype, shape and bytes of each, in order), read on the CPU."""
    return batches_checksums(minibatches)[0]


def batches_checksums(minibatches) -> tuple[str, str]:
    """:func:`batches_checksum` and the same without the edge weights (``checksum_ids``)."""
    h, ids = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
    for mb in minibatches:
        parts = [(mb.seeds, True), (mb.input_nodes, True)]
        for b in mb.blocks:
            parts.append((b.edge_index, True))
            if b.edge_weight is not None:
                parts.append((b.edge_weight, False))
        for t, is_id in parts:
            a = t.detach().cpu().contiguous()
            for x in (h, ids) if is_id else (h,):
                x.update(f"{a.dtype}{tuple(a.shape)}".encode())
                x.update(a.numpy().tobytes())
    return "blake2b-128:" + h.hexdigest(), "blake2b-128:" + ids.hexdigest()


def run(args) -> dict:
    import gnnio

    fanouts = _check(args)
    ds = gnnio.load(args.dataset)
    if ds.train_idx is not None and ds.train_idx.size:
        seeds, seed_set = np.asarray(ds.train_idx, dtype=np.int64), "train_idx"
    else:
        seeds, seed_set = np.arange(ds.num_nodes, dtype=np.int64), "all nodes"
    if seeds.size == 0:
        raise UsageError(f"{args.dataset}: the dataset has no nodes to sample from")
    batches = fixed_batches(seeds, args.batch_size, args.batches, args.seed)
    set_torch_threads(args.threads)  # asked for by --threads (process-wide, this command only)
    kind = getattr(args, "sampler", "uniform")
    layer_size = getattr(args, "layer_size", None) or 8192
    graph_in = getattr(args, "graph_in", None) or "gpu"
    graphed = bool(getattr(args, "cuda_graph", False))
    imp = int(getattr(args, "importance_sampling", None) or 0)
    if graphed:
        from ..sampling.gpu_graphed import reset_graphed_report

        reset_graphed_report()
    scale = getattr(args, "locality_scale", None)
    las = None if scale is None else (_hot_ids(args, ds, fanouts), float(scale))
    sampler = make_sampler(kind, ds.graph, fanouts, layer_size, args.seed, args.threads,
                           args.device, graph_in, cuda_graph=graphed, prune=_prune(args),
                           las=las, importance_sampling=imp)  # fmt: skip
    sync = torch.cuda.synchronize if sampler.device.type == "cuda" else None
    stats = {"edges": 0, "input_nodes": 0, "seeds": 0}
    cpu_s: list[float] = []

    pb = bar(args.warmup + args.passes, "sampling passes", "pass", enabled=not args.no_progress)

    def one_pass() -> None:
        c0 = time.process_time()
        edges = nodes = n_seeds = 0
        for i, s in enumerate(batches):
            mb = sampler.sample(s, epoch_seed=i)
            edges += mb.num_sampled_edges
            nodes += int(mb.input_nodes.shape[0])
            n_seeds += int(s.shape[0])
        stats.update(edges=edges, input_nodes=nodes, seeds=n_seeds)
        cpu_s.append(time.process_time() - c0)
        pb.update(1)

    try:
        times = time_passes(one_pass, warmup=args.warmup, passes=args.passes, sync=sync)
        checksum, checksum_ids = batches_checksums(
            sampler.sample(s, epoch_seed=i) for i, s in enumerate(batches)
        )
    finally:
        pb.close()
        sampler.close()
    t = median(times)
    nb = len(batches)
    row_bytes = ds.feat_dim * np.dtype(ds.features.dtype).itemsize
    return {
        "dataset": ds.name,
        "num_nodes": ds.num_nodes,
        "num_edges": ds.num_edges,
        "seed_set": seed_set,
        "device": str(sampler.device),
        "graph_in": graph_in if sampler.device.type == "cuda" else None,
        "cuda_graph": _graphed_report() if graphed else None,
        "threads": args.threads,
        "sampler": kind,
        "importance_sampling": imp if kind == "labor" else None,
        "sampler_fallback": getattr(sampler, "fallback", None),
        "fanouts": fanouts,
        "prune_thresholds": sampler.thresholds if _prune(args) is not None else None,
        "locality_scale": scale,
        "hot_rows": None if las is None else int(las[0].size),
        "layer_size": layer_size if kind == "ladies" else None,
        "batch_size": args.batch_size,
        "batches": nb,
        "passes": args.passes,
        "ms_per_batch": round(t / nb * 1e3, 4),
        "seeds_per_s": round(stats["seeds"] / t, 1),
        "edges_per_s": round(stats["edges"] / t, 1),
        "edges_per_batch": round(stats["edges"] / nb, 1),
        "input_nodes_per_batch": round(stats["input_nodes"] / nb, 1),
        "feature_bytes_per_batch": round(stats["input_nodes"] / nb * row_bytes, 1),
        "cpu_ms_per_batch": round(median(cpu_s[args.warmup :]) / nb * 1e3, 4),
        "checksum": checksum,
        "checksum_ids": checksum_ids,
        "pass_s": [round(x, 6) for x in times],
    }


def _graphed_report() -> dict:
    from ..sampling.gpu_graphed import graphed_report

    return graphed_report()
