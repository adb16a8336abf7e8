"""The several-process part of ``gnnio train``: the ``--nproc``/``torchrun`` options, starting
the ranks (:func:`launch_ranks`) and one rank's run (:func:`train_rank`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..train.config_dist import DEFAULT_BUFFER

__all__ = ["add_dist_arguments", "launch_ranks", "train_rank"]


def add_dist_arguments(p) -> None:
    g = p.add_argument_group(
        "several GPUs or machines (torch.distributed)",
        "data-parallel training, feature rows sharded across ranks by a placement and fetched "
        "with collectives; also runs unchanged under 'torchrun ... -m gnnio train'",
    )
    g.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="local processes to start (one per GPU with --device cuda; else CPU processes, each "
        "a simulated device, on gloo)",
    )
    g.add_argument(
        "--topology",
        default=None,
        help="NVLink groups of the ranks as 'gnnio plan' takes them (e.g. 2*2); default: one "
        "group per machine",
    )
    g.add_argument(
        "--placement-strategy",
        default=None,
        choices=["alg1", "interleaved", "mod", "rule1", "metis", "naive", "random"],
        help="placement computed at start-up on rank 0 when no --placement FILE is given "
        "(default alg1)",
    )
    g.add_argument(
        "--buffer",
        type=float,
        metavar="B",
        default=None,
        help="feature rows each rank holds, as a fraction of the nodes (--placement-strategy) "
        f"(default: {DEFAULT_BUFFER})",
    )
    g.add_argument(
        "--partition",
        metavar="PDIR",
        default=None,
        help="a 'gnnio partition' directory with one part per rank: each rank holds only its "
        "shard of the topology and samples across ranks",
    )
    g.add_argument(
        "--sampling-mode",
        default=None,
        choices=["dsp", "shared"],
        help="with --partition: request/response to the owner (dsp) or direct reads of the "
        "owner's shard (shared, HyDRA memory sharing; request/response across machines) "
        "(default: dsp)",
    )
    g.add_argument(
        "--local-seeds",
        action="store_true",
        help="each rank trains on its own partition's training nodes (metis/naive/random "
        "placements) instead of a slice of one global shuffle",
    )
    g.add_argument(
        "--reuse",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="HyDRA cross-batch reuse with several ranks: rows fetched for the previous batch "
        "are not fetched again (default: on)",
    )
    g.add_argument(
        "--reuse-level",
        choices=("gpu", "machine"),
        default=None,
        help="gpu: each rank reuses its own previous batch (HyDRA's intra-GPU level); machine: "
        "also the intra-machine level, the ranks of an NVLink group read each host row once "
        "per batch and hand it to the others, or hand over rows held from their previous "
        "batch (default: gpu)",
    )
    g.add_argument(
        "--dist-timeout",
        type=float,
        metavar="SECONDS",
        default=None,
        help="rendezvous and collective timeout; a missing or dead rank ends the run after it "
        "(default 120)",
    )


def launch_ranks(args, cfg, dataset) -> int:
    """``--nproc N`` outside a launcher: start N ranks running this same command line."""
    from ..distributed.launch import launch
    from ..graph.dataset import Dataset, load

    ds = dataset if isinstance(dataset, Dataset) else load(dataset)  # fail here, not N times
    from ..train.config_dist import check_split_sizes

    ds.require_labels()  # no labels or an empty split: refuse now, not once per rank
    ds.require_eval_splits()
    check_split_sizes(ds, cfg, args.nproc)  # a split smaller than the ranks: refuse now
    if cfg.topology is not None:  # a bad --topology or one of another size: likewise
        from ..distributed.context import check_topology

        check_topology(cfg.topology, [0] * args.nproc)
    if cfg.placement is not None:  # a file for another dataset or device count: refuse now
        from ..distributed.train import check_placement_file
        from ..placement import load_placement

        pl = load_placement(cfg.placement)
        check_placement_file(pl, cfg.placement, ds, args.nproc, cfg.local_seeds)
    if cfg.partition is not None:  # likewise a partition for another dataset or rank count
        from ..preprocess.partition import load_partition

        load_partition(cfg.partition, ds, args.nproc)
    from ..train.checkpoint import check_fresh_dir, check_resume_dir
    from ..train.checkpoint_checks import check_checkpoint_dir

    if cfg.resume is not None:  # none there, another world size's, dataset's, model's or
        check_resume_dir(cfg.resume, args.nproc)  # option's: refuse before starting
        _check_resume_binding(cfg.resume, ds, cfg, args.nproc)
    if (cfg.checkpoint_dir or cfg.resume) is not None:  # a file, under one, in use: likewise
        check_checkpoint_dir(cfg.checkpoint_dir or cfg.resume)
    check_fresh_dir(cfg.checkpoint_dir, cfg.resume)  # another run's checkpoints: likewise
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    if args.dir is None:
        argv.append(str(ds.path))  # the built-in dataset, generated once above
        if args.epochs is None:  # ... with its own default epochs, as in one process
            argv += ["--epochs", str(cfg.epochs)]
    launch(args.nproc, args.rank_entry, argv, timeout_s=cfg.dist_timeout)
    return 0


def _check_resume_binding(directory, ds, cfg, world_size: int) -> None:
    """``check_binding`` on rank 0's newest checkpoint at a position every rank holds (what each
    rank's ``load_resume`` reads first), so ``--nproc N`` refuses another dataset, model or
    option before it starts any rank. A file that does not load is left to the ranks."""
    import torch

    from ..train.checkpoint import binding, check_binding, checkpoint_files
    from ..train.checkpoint_checks import check_regular

    d = Path(directory)  # (a directory: check_resume_dir said so)
    held = [
        {(e, b): p for e, b, p in checkpoint_files(d, r, world_size)} for r in range(world_size)
    ]
    common = set(held[0]).intersection(*held[1:])
    if not common:
        return
    p = held[0][max(common)]
    check_regular(p, d)
    try:
        raw = torch.load(p, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001  (damaged: the ranks skip it and say so)
        return
    if isinstance(raw, dict) and isinstance(raw.get("binding"), dict):
        check_binding(str(d), raw, binding(ds, cfg, world_size))


def train_rank(dataset, cfg):
    """One rank of a distributed run (``WORLD_SIZE`` > 1 in the environment): join the group,
    train, and return the summary on rank 0 (None on the others)."""
    from ..distributed.context import init, shutdown
    from ..distributed.train import DistRun
    from ..train import train

    ctx = init(timeout_s=cfg.dist_timeout, device=cfg.device, topology=cfg.topology)
    cfg.progress = cfg.progress and ctx.is_main
    if cfg.threads is None:  # share the cores among this machine's ranks
        import os

        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        env = int(os.environ.get("NUMBA_NUM_THREADS", "0"))
        cfg.threads = env or max(1, (os.cpu_count() or 1) // local)
    # no try/finally: a rank that fails keeps its connections until it has recorded its error
    # and exited; leaving the group first let a peer fail on the closed socket and be reported
    # as the cause before this rank's own error
    s = train(dataset, cfg, run=DistRun(ctx))
    ctx.barrier()
    shutdown()
    return s if ctx.is_main else None
