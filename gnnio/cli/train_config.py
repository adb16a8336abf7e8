"""``gnnio train``'s parsed options -> :class:`~gnnio.train.TrainConfig` (also used by
``gnnio bench step``, which takes the same options)."""

from __future__ import annotations

from ..errors import UsageError
from .train_disk import refuse_store_with_disk, store_kind

__all__ = ["config_from_args"]


def _bytes(text: str | None, option: str) -> int | None:
    """A byte count as --memory-budget takes it (``4GiB``, ``8GB``, ``1e9``, or plain bytes)."""
    from ..placement.topology import parse_bytes

    return None if text is None else parse_bytes(text, option)


def _parse_fanouts(text: str) -> tuple[int, ...]:
    from ..sampling import parse_fanouts

    try:
        return tuple(parse_fanouts(text))
    except ValueError as e:
        msg = str(e)
        raise UsageError(msg if msg.startswith("--fanouts") else f"--fanouts: {msg}") from None


def _parse_scale(text: str | None):
    if text is None or text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise UsageError(
            f"--locality-scale: must be a number in [1, 1e200] or 'auto', got '{text}'"
        ) from None


def _parse_prune(text: str | None):
    if text is None:
        return None
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != 2:
        raise UsageError(f"--prune-threshold: needs ALPHA,BETA (e.g. 1,1), got '{text}'")
    return vals


def _or_default(value, field: str):
    """An option's value, or the TrainConfig default where it was not given (its parser default
    is None so that ``gnnio train`` can tell a given option from a default one)."""
    from ..train import TrainConfig

    return getattr(TrainConfig, field) if value is None else value


def config_from_args(args, ranks: int):
    """The :class:`~gnnio.train.TrainConfig` of parsed ``gnnio train`` options."""
    from ..train import TrainConfig
    from ..train.gpu_plan import resolve_device

    refuse_store_with_disk(args)
    cfg = TrainConfig(
        model=args.model,
        fanouts=_parse_fanouts(args.fanouts),
        batch_size=args.batch_size,
        epochs=args.epochs if args.epochs is not None else TrainConfig.epochs,
        lr=args.lr,
        weight_decay=args.weight_decay,
        hidden=args.hidden,
        dropout=args.dropout,
        heads=args.heads if args.heads is not None else TrainConfig.heads,
        feature_norm=args.feature_norm,
        edge_weight_norm=args.edge_weight_norm,
        device=resolve_device(args.device, ranks),
        seed=args.seed,
        eval=args.eval,
        eval_batch_size=args.eval_batch_size,
        patience=args.patience,
        checkpoint=args.checkpoint,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        summary=args.summary,
        log=args.log,
        store=store_kind(args, ranks),
        threads=args.threads,
        heap=getattr(args, "heap", "auto"),
        isolation=args.isolation,
        cuda_graph=getattr(args, "cuda_graph", "off"),
        sampler_device=args.sampler_device,
        graph_in=args.graph_in,
        progress=not args.quiet,
        gpu_cache_fraction=args.gpu_cache_fraction,
        gpu_budget_bytes=_bytes(args.gpu_budget, "--gpu-budget"),
        score=_or_default(args.score, "score"),
        placement=args.placement,
        reader=args.reader if args.reader is not None else 0,
        cache_policy=args.cache_policy,
        cache_size=args.cache_size if args.cache_size is not None else TrainConfig.cache_size,
        cpu_cache_size=args.cpu_cache_size or 0.0,
        host_cache_size=args.host_cache_size,
        lookahead=args.lookahead if args.lookahead is not None else TrainConfig.lookahead,
        order=args.order,
        po_sequences=args.po_sequences,
        sampler=args.sampler,
        layer_size=_or_default(args.layer_size, "layer_size"),
        importance_sampling=_or_default(args.importance_sampling, "importance_sampling"),
        locality_scale=_parse_scale(args.locality_scale),
        locality_max_scale=_or_default(args.locality_max_scale, "locality_max_scale"),
        locality_compute_s=args.locality_compute_s,
        prune_threshold=_parse_prune(args.prune_threshold),
        nproc=args.nproc,
        topology=args.topology,
        dist_timeout=args.dist_timeout,
        stall_timeout=args.stall_timeout,
        placement_strategy=args.placement_strategy,
        buffer=_or_default(args.buffer, "buffer"),
        local_seeds=args.local_seeds,
        partition=args.partition,
        sampling_mode=_or_default(args.sampling_mode, "sampling_mode"),
        reuse=_or_default(args.reuse, "reuse"),
        reuse_level=_or_default(args.reuse_level, "reuse_level"),
    )
    return cfg
