"""``gnnio bench locality DIR``: host feature traffic of locality-aware sampling against its scale s
(Song & Jiang §4).

What is measured. The GPU set ``B`` is the top ``--gpu-cache-fraction`` of the nodes by
``--score`` (as ``gnnio train --gpu-cache-fraction`` chooses its GPU tier). One
:class:`gnnio.sampling.LocalitySampler` (sets ``Q'_l`` built once from ``B``) samples one epoch of
the training seeds (the seeded random order of epoch 0, its first ``--batches`` batches when
given) at every scale in ``--scales``; batch ``i`` uses ``epoch_seed=i`` at every scale, so rows
without a Q' member draw the same neighbours and the scales differ only by what LAS changes.
Per batch, the feature rows needed are ``input_nodes``; those not in ``B`` are host reads.

Reported per scale (keys of the JSON object are the scales as strings, ``"1"``, ``"2"``, ...):

* ``host_bytes`` / ``gpu_bytes``: feature bytes of rows outside / inside ``B`` over the sampled
  batches (rows times ``feat_dim * itemsize``) -- counted, exact, device-independent;
* ``host_share``: ``host_bytes / (host_bytes + gpu_bytes)``;
* ``edges_per_batch``, ``input_nodes_per_batch``: sampled edges (all blocks) and rows per batch;
* ``nbr_entries_per_batch``: neighbour-list entries the sampler reads per batch, summed over
  the hops: ``deg(v)`` per destination row ``v``, or ``min(deg(v), threshold)`` under
  ``--prune`` -- what HyDRA's threshold pruning cuts (the list a remote sampler would fetch);
  counted;
* ``modeled_host_s``: ``host_bytes / host_bw`` with the default PCIe 3.0 bandwidth of
  :mod:`gnnio.placement.topology` -- **modeled**, not measured;
* ``sample_s``: measured wall seconds of sampling the batches (CPU; shared machines inflate it).

``--sampler ladies --layer-size K`` measures Song & Jiang's own setting instead: layer-wise LADIES
with Eq. 8 on each layer's distribution (:class:`gnnio.sampling.LocalityLadiesSampler`, ``K``
nodes expected per layer, as many layers as ``--fanouts`` has values; no ``--prune``).

``monotone`` says whether host bytes never rise as the scale grows. Nothing is gathered: the bytes
depend only on which rows are needed, which the sampler decides.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import UsageError
from . import KINDS

HELP = KINDS["locality"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument(
        "--scales", default="1,2,4,8", help="comma-separated LAS scales s (1e-200 to 1e200)"
    )
    p.add_argument("--gpu-cache-fraction", type=float, default=0.1,
                   help="fraction of the nodes in the GPU set B (top by --score)")  # fmt: skip
    p.add_argument(
        "--score", default="wrpr", help="hotness score choosing B (gnnio.preprocess.hotness)"
    )
    p.add_argument("--fanouts", default="15,10,5", help="neighbours per hop, hop 1 first")
    p.add_argument("--sampler", default="uniform", choices=["uniform", "ladies"],
                   help="node-wise LAS (uniform) or layer-wise locality-aware LADIES")  # fmt: skip
    p.add_argument("--layer-size", type=int, default=None, metavar="K",
                   help="--sampler ladies: nodes per layer (default: 8192, Song & Jiang's)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per mini-batch")
    p.add_argument("--batches", type=int, default=None,
                   help="sample only the first N batches of the epoch (default: all)")  # fmt: skip
    p.add_argument("--prune", default=None, metavar="ALPHA,BETA",
                   help="also apply HyDRA threshold pruning, e.g. 1,1")  # fmt: skip
    p.add_argument("--q-size", type=int, default=None, help="|Q'_l| for l >= 2 (default |B|)")
    p.add_argument("--threads", type=int, default=2, help="sampler threads")
    p.add_argument("--seed", type=int, default=0, help="seed of the order and the sampler")
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


def _scales(text: str) -> list[float]:
    from ..sampling.adaptive import MAX_SCALE

    try:
        vals = [float(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--scales: expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not (1 / MAX_SCALE <= v <= MAX_SCALE) for v in vals):  # (adaptive.py)
        raise UsageError(f"--scales: each must be a number in [1e-200, 1e200], got {text!r}")
    return vals


def _key(s: float) -> str:
    return f"{s:g}"


def _prune(text: str | None) -> tuple[float, float] | None:
    if text is None or str(text).lower() in ("", "none", "off"):
        return None
    parts = str(text).split(",")
    try:
        alpha, beta = (float(t) for t in parts)
    except ValueError:
        raise UsageError(f"--prune: expected ALPHA,BETA (e.g. 1,1), got {text!r}") from None
    return alpha, beta


def traffic_table(res: dict) -> str:
    """The per-scale numbers as an aligned text table."""
    head = f"{'s':>6} {'host MB':>12} {'gpu MB':>12} {'host share':>10} {'edges/batch':>12} "
    head += f"{'rows/batch':>11} {'nbr/batch':>11} {'host s (modeled)':>17} {'sample s':>9}"
    lines = [head]
    for k in res["host_bytes"]:
        lines.append(
            f"{k:>6} {res['host_bytes'][k] / 1e6:12.2f} {res['gpu_bytes'][k] / 1e6:12.2f} "
            f"{res['host_share'][k]:10.4f} {res['edges_per_batch'][k]:12.1f} "
            f"{res['input_nodes_per_batch'][k]:11.1f} {res['nbr_entries_per_batch'][k]:11.1f} "
            f"{res['modeled_host_s'][k]:17.4f} "
            f"{res['sample_s'][k]:9.2f}"
        )
    return "\n".join(lines)


def run(args) -> dict:
    import gnnio

    from ..features.tiers.tiered import hot_rows_for_fraction
    from ..ordering import RandomOrder
    from ..placement.topology import DEFAULT_HOST_BW
    from ..preprocess.hotness import SCORES, compute_score
    from ..preprocess.reorder import order_by_score
    from ..sampling import LocalityLadiesSampler, LocalitySampler, parse_fanouts
    from ..utils.progress import bar

    scales = _scales(args.scales)
    try:
        fanouts = parse_fanouts(args.fanouts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.score not in SCORES:
        raise UsageError(f"--score: '{args.score}' is unknown; choose from {', '.join(SCORES)}")
    for name in ("batch_size", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.batches is not None and args.batches < 1:
        raise UsageError(f"--batches must be >= 1, got {args.batches}")
    if args.q_size is not None and args.q_size < 0:
        raise UsageError(f"--q-size must be >= 0, got {args.q_size}")
    try:
        n_hot_frac = float(args.gpu_cache_fraction)
        if not 0 <= n_hot_frac <= 1:
            raise ValueError
    except ValueError:
        raise UsageError(
            f"--gpu-cache-fraction: must be in [0, 1], got {args.gpu_cache_fraction}"
        ) from None
    prune = _prune(args.prune)
    kind = getattr(args, "sampler", "uniform")
    given = getattr(args, "layer_size", None)
    if given is not None and kind != "ladies":  # (would be ignored: the node-wise sampler's)
        raise UsageError("--layer-size: has no effect without --sampler ladies")
    layer_size = 8192 if given is None else int(given)
    if kind == "ladies" and prune is not None:
        raise UsageError("--prune: works with --sampler uniform, not ladies")
    if layer_size < 1:
        raise UsageError(f"--layer-size must be >= 1, got {layer_size}")
    progress = not args.no_progress

    ds = gnnio.load(args.dataset)
    if ds.train_idx is None or ds.train_idx.size == 0:
        raise UsageError(f"{args.dataset}: has no train split; the bench samples its seeds")
    n = ds.num_nodes
    score = compute_score(
        args.score, ds, fanouts=fanouts, batch_size=args.batch_size, progress=progress
    )
    hot = np.sort(order_by_score(score)[: hot_rows_for_fraction(n_hot_frac, n)])
    hot_mask = np.zeros(n, dtype=bool)
    hot_mask[hot] = True
    row_bytes = int(ds.feat_dim) * int(np.dtype(ds.features.dtype).itemsize)

    t0 = time.perf_counter()
    try:
        sampler: LocalityLadiesSampler | LocalitySampler
        if kind == "ladies":
            sampler = LocalityLadiesSampler(
                ds.graph, [layer_size] * len(fanouts), hot_ids=hot, seed=args.seed,
                q_size=args.q_size, weights="none",
            )  # fmt: skip
            thresholds = [0] * len(fanouts)
        else:
            sampler = LocalitySampler(
                ds.graph, fanouts, hot_ids=hot, seed=args.seed, num_threads=args.threads,
                prune=prune, q_size=args.q_size, weights="none",
            )  # fmt: skip
            thresholds = [int(t) for t in sampler.thresholds]
    except ValueError as e:
        raise UsageError(str(e)) from None
    setup_s = time.perf_counter() - t0
    order = RandomOrder(np.asarray(ds.train_idx, dtype=np.int64), args.batch_size, seed=args.seed)
    batches = list(order.batches(0))
    per_epoch = len(batches)
    if args.batches is not None:
        batches = batches[: args.batches]
    nb = len(batches)

    if batches:  # warm-up (JIT load, page faults of the topology), untimed
        sampler.sample(batches[0], epoch_seed=0)
    res: dict = {k: {} for k in ("host_bytes", "gpu_bytes", "host_share", "edges_per_batch",
                                 "input_nodes_per_batch", "nbr_entries_per_batch",
                                 "modeled_host_s", "sample_s")}  # fmt: skip
    deg = np.diff(np.asarray(ds.graph.indptr, dtype=np.int64))
    thr = thresholds
    pb = bar(len(scales) * nb, "LAS epochs", "batch", enabled=progress)
    try:
        for s in scales:
            sampler.scale = s
            host = gpu = edges = rows = nbr = 0
            t_s = 0.0
            for i, seeds in enumerate(batches):
                t1 = time.perf_counter()
                mb = sampler.sample(seeds, epoch_seed=i)
                t_s += time.perf_counter() - t1
                inp = mb.input_nodes.numpy()
                g = int(np.count_nonzero(hot_mask[inp]))
                gpu += g
                host += inp.shape[0] - g
                rows += inp.shape[0]
                edges += mb.num_sampled_edges
                hop_nodes = mb.meta["hop_nodes"]
                for h, t in enumerate(thr):  # hop h reads the lists of its hop_nodes[h] rows
                    d = deg[inp[: hop_nodes[h]]]
                    nbr += int((np.minimum(d, t) if t > 0 else d).sum())
                pb.update(1)
            k = _key(s)
            res["host_bytes"][k] = host * row_bytes
            res["gpu_bytes"][k] = gpu * row_bytes
            res["host_share"][k] = round(host / rows, 6) if rows else 0.0
            res["edges_per_batch"][k] = round(edges / nb, 1) if nb else 0.0
            res["input_nodes_per_batch"][k] = round(rows / nb, 1) if nb else 0.0
            res["nbr_entries_per_batch"][k] = round(nbr / nb, 1) if nb else 0.0
            res["modeled_host_s"][k] = round(host * row_bytes / DEFAULT_HOST_BW, 6)
            res["sample_s"][k] = round(t_s, 4)
    finally:
        pb.close()
        sampler.close()
    ordered = [res["host_bytes"][_key(s)] for s in sorted(scales)]
    result = {
        "dataset": ds.name,
        "num_nodes": n,
        "num_edges": ds.num_edges,
        "sampler": kind,
        "layer_size": layer_size if kind == "ladies" else None,
        "fanouts": fanouts,
        "batch_size": args.batch_size,
        "batches": nb,
        "batches_per_epoch": per_epoch,
        "epoch_fraction": round(nb / per_epoch, 6) if per_epoch else 0.0,
        "score": args.score,
        "gpu_cache_fraction": n_hot_frac,
        "hot_rows": int(hot.size),
        "row_bytes": row_bytes,
        "prune": list(prune) if prune else None,
        "thresholds": thresholds,
        "q_sizes": [int(q.size) for q in sampler.q_sets or []],
        "setup_s": round(setup_s, 3),
        "scales": [_key(s) for s in scales],
        **res,
        "monotone": all(a >= b for a, b in zip(ordered, ordered[1:])),
        "host_bw": DEFAULT_HOST_BW,
        "bytes_scope": "feature rows of the sampled batches' input_nodes (counted); "
        "modeled_host_s = host_bytes / host_bw (modeled)",
    }
    if not getattr(args, "json", False):  # --json: stdout is the one JSON object
        print(traffic_table(result))
    return result
