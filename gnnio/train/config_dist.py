"""What a distributed run refuses (:meth:`gnnio.train.config.TrainConfig.validate_dist`): options
that make no sense with several ranks, each with a one-line :class:`~gnnio.errors.UsageError`
naming the option."""

from __future__ import annotations

import math
import os

from ..errors import UsageError

__all__ = [
    "DEFAULT_BUFFER",
    "DIST_STRATEGIES",
    "MAX_RANKS_PER_CORE",
    "PARTITION_STRATEGIES",
    "check_split_sizes",
    "validate_dist",
]

#: ``--nproc`` starts at most this many local ranks (processes) per CPU core
MAX_RANKS_PER_CORE = 8
#: placements a distributed run can compute at start-up (``--placement-strategy``)
DIST_STRATEGIES = ("alg1", "interleaved", "mod", "rule1", "metis", "naive", "random")
#: feature rows each rank (GPU) holds, a fraction of the nodes: ``--buffer``'s default here and
#: in ``gnnio plan`` (unless its topology sets ``feature_budget_bytes``), so a plan models what
#: the run does
DEFAULT_BUFFER = 0.1
#: the placements that partition the nodes (``--local-seeds`` trains each rank on its part)
PARTITION_STRATEGIES = ("metis", "naive", "random")


def validate_dist(cfg, world_size: int) -> None:
    """Refuse, with one line naming the option, what makes no sense with several ranks."""
    if cfg.nproc < 1:
        raise UsageError(f"--nproc: must be >= 1, got {cfg.nproc}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cfg.nproc > MAX_RANKS_PER_CORE * (cores or 1):  # each local rank is a process
        raise UsageError(
            f"--nproc {cfg.nproc}: more local ranks than {MAX_RANKS_PER_CORE} per CPU core "
            f"({cores} cores here: at most {MAX_RANKS_PER_CORE * (cores or 1)})"
        )
    if cfg.dist_timeout is not None and not cfg.dist_timeout > 0:
        raise UsageError(f"--dist-timeout: must be > 0 seconds, got {cfg.dist_timeout}")
    if not (math.isfinite(cfg.buffer) and 0.0 <= cfg.buffer <= 1.0):
        raise UsageError(f"--buffer: must be a fraction in [0, 1], got {cfg.buffer}")
    if world_size <= 1:
        for name, bad in (
            ("--partition", cfg.partition is not None),
            ("--topology", cfg.topology is not None),
            ("--placement-strategy", cfg.placement_strategy is not None),
            ("--local-seeds", cfg.local_seeds),
        ):
            if bad:
                raise UsageError(f"{name}: needs several ranks (--nproc N or torchrun)")
        return
    if cfg.gpu_cache_fraction is not None or cfg.gpu_budget_bytes is not None:
        raise UsageError(
            "--gpu-cache-fraction/--gpu-budget: single-process options; with several ranks "
            "use --placement-strategy rule1 --buffer F (every rank keeps the top F rows)"
        )
    if cfg.eval == "full":
        raise UsageError("--eval full: single-process only; use --eval sampled with ranks")
    if cfg.isolation != "off":
        raise UsageError("--isolation auto: single-process only for now")
    if cfg.heap != "auto":  # ranks bound their heap for memory (gnnio.utils.heap.limit_heap)
        raise UsageError(f"--heap {cfg.heap}: single-process only (ranks bound their heap)")
    from .graphed import graph_mode

    if graph_mode(cfg, "step"):
        raise UsageError(
            "--cuda-graph: the step's graph is single-process only (DDP's "
            "hooks are not captured); --cuda-graph sampler works with ranks"
        )
    if cfg.placement is not None and cfg.placement_strategy is not None:
        raise UsageError("--placement and --placement-strategy exclude each other; give one")
    if cfg.placement_strategy is not None and cfg.placement_strategy not in DIST_STRATEGIES:
        raise UsageError(
            f"--placement-strategy: unknown '{cfg.placement_strategy}' "
            f"(choose from {', '.join(DIST_STRATEGIES)})"
        )
    if cfg.sampling_mode not in ("dsp", "shared"):
        raise UsageError(f"--sampling-mode: dsp or shared, got '{cfg.sampling_mode}'")
    if cfg.reuse_level not in ("gpu", "machine"):
        raise UsageError(f"--reuse-level: gpu or machine, got '{cfg.reuse_level}'")
    if cfg.partition is not None:
        for name, bad in (
            ("--locality-scale", cfg.locality_scale is not None),
            ("--sampler", getattr(cfg, "sampler", "uniform") not in (None, "uniform")),
        ):
            if bad:
                raise UsageError(
                    f"{name}: not available with --partition (its sampler is uniform, "
                    "optionally pruned)"
                )
    strategy = cfg.placement_strategy or ("alg1" if cfg.placement is None else None)
    if cfg.local_seeds and cfg.partition is None and strategy not in (None, *PARTITION_STRATEGIES):
        raise UsageError(
            f"--local-seeds: placement '{strategy}' has no partition; use "
            f"--placement-strategy {'|'.join(PARTITION_STRATEGIES)}"
        )


def check_split_sizes(ds, cfg, world_size: int) -> None:
    """Every rank walks the same number of batches of each split (equal batches, so that DDP's
    collectives pair up): a split of fewer nodes than ranks, or batches of one seed that do not
    divide among the ranks, cannot. Refused in one line naming the split and its size -- by the
    launcher before any rank starts, and by each rank (torchrun) -- instead of a rank's error
    naming the batch size. ``--local-seeds`` trains each rank on its own part (checked there)."""
    if world_size <= 1:
        return
    from ..ordering.shuffle import equal_batches_shortfall

    splits = [("valid", ds.valid_idx, cfg.eval_bs, "--eval-batch-size"),
              ("test", ds.test_idx, cfg.eval_bs, "--eval-batch-size")]  # fmt: skip
    if not cfg.local_seeds:
        splits.insert(0, ("training", ds.train_idx, cfg.batch_size, "--batch-size"))
    for name, idx, bs, opt in splits:
        n = 0 if idx is None else int(idx.size)
        short = equal_batches_shortfall(n, bs, world_size)
        if short == "fewer":
            raise UsageError(
                f"the {name} split has {n} node{'s' if n > 1 else ''}, fewer than the "
                f"{world_size} ranks: each rank needs a batch of it (at most {n} rank{'s' if n > 1 else ''})"
            )
        if short == "indivisible":
            raise UsageError(
                f"{opt} 1: the {name} split's {n} nodes do not divide among the {world_size} "
                "ranks (each rank needs the same number of batches); use a larger batch size"
            )
