"""Building a training run and its step: what :func:`gnnio.train.train` and ``gnnio bench step``
share, so the benchmark times exactly the store, sampler, loader, model, optimizer and step that
``gnnio train`` uses.

The step (:func:`train_step`) reads nothing back to the host: the loss and accuracy are summed on
the device by the loop and read once per epoch. The optimizer is torch's fused Adam (one kernel for
all parameters, CPU and CUDA) where available (:func:`make_optimizer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..pipeline.loader import BufferRing
from ..utils.warnings_at import warn
from .config import TrainConfig
from .evaluate import make_node_loader
from .models import BlockGNN, build_model
from .setup import has_gpu_sampler
from .step import train_step

__all__ = ["TrainingParts", "build_training", "make_optimizer", "train_step"]


@dataclass
class TrainingParts:
    """What :func:`build_training` made: everything a training pass needs."""

    setup: Any
    store: Any
    sampler: Any
    adaptive: Any
    order: Any
    labels: Any  # [N] int64 tensor, or a rank's SeedLabels (labels[seeds] alike)
    train_loader: Any
    eval_loaders: dict
    model: BlockGNN
    net: torch.nn.Module
    opt: torch.optim.Optimizer
    eval_batch_size: int
    #: ``step(net, opt, batch, timer=None)``: :func:`train_step`, or with ``cuda_graph`` a
    #: :class:`~gnnio.train.graphed.GraphedStep` (its ``report()`` goes in the summary)
    step: Any = train_step


def build_training(ds, cfg: TrainConfig, run, device: torch.device) -> TrainingParts:
    """The store, sampler, seed order, loaders, model and optimizer of a run, as :func:`train`
    builds them (``gnnio bench step`` builds the same through this)."""
    torch.manual_seed(cfg.seed)
    fanouts = [int(f) for f in cfg.fanouts]
    eval_bs = cfg.eval_bs

    setup = run.build_store(ds, cfg, device)
    store = setup.store
    sampler, adaptive = run.build_sampler(ds, cfg, fanouts, setup)
    labels = run.build_labels(ds, cfg)  # [N], or a rank's seeds' (SeedLabels)
    order = run.build_order(ds, cfg, ds.train_idx, labels, cfg.batch_size, cfg.seed)
    # one ring of gather buffers for the training and the evaluation loaders (they run in turn:
    # the loop closes an epoch before evaluating), not three rings' memory (pinned on a GPU)
    ring = BufferRing(cfg.prefetch + 2)
    train_loader = make_node_loader(
        sampler,
        store,
        ds.train_idx,
        labels,
        cfg.batch_size,
        cfg.seed,
        device,
        cfg.prefetch,
        order=order,
        stall_timeout=cfg.stall_timeout,
        ring=ring,
    )
    eval_loaders = {}
    if cfg.eval == "sampled":
        eval_sampler = run.build_eval_sampler(ds, cfg, fanouts)
        ev = setup.eval_store
        if (ev.dim, ev.dtype) != (store.dim, store.dtype):  # (rows of another shape: own ring)
            ring = BufferRing(cfg.prefetch + 2)
        for name, idx in (("valid", ds.valid_idx), ("test", ds.test_idx)):
            if idx is None:  # (train refuses it before; bench step evaluates nothing)
                continue
            eval_loaders[name] = make_node_loader(
                eval_sampler, setup.eval_store, idx, labels, eval_bs, cfg.seed, device,
                cfg.prefetch, order=run.eval_order(idx, eval_bs, cfg.seed),
                stall_timeout=cfg.stall_timeout, ring=ring,
            )  # fmt: skip

    model = build_model(
        cfg.model,
        ds.feat_dim,
        cfg.hidden,
        ds.num_classes,
        cfg.num_layers,
        dropout=cfg.dropout,
        heads=cfg.heads,
        attn_dropout=cfg.attn_dropout,
        feature_norm=cfg.feature_norm,
        edge_weight_norm=cfg.edge_weight_norm,
    ).to(device)
    model.set_feature_codec(ds.feature_codec)  # compressed rows decoded on `device`
    net = run.wrap_model(model)  # what trains (DDP with ranks); `model` evaluates and is saved
    opt = make_optimizer(model, cfg)
    parts = TrainingParts(setup, store, sampler, adaptive, order, labels, train_loader,
                          eval_loaders, model, net, opt, eval_bs)  # fmt: skip
    from .graphed import GraphedStep, graph_mode

    if graph_mode(cfg, "step"):
        parts.step = GraphedStep(device)
    if graph_mode(cfg, "sampler"):
        from ..sampling.gpu_graphed import reset_graphed_report

        reset_graphed_report()  # this run's batches only
        why = not_graphed(cfg, str(getattr(sampler, "device", "cpu")))
        if why is not None:  # (a GPU sampler replays, or this warns once why not)
            warn(why, RuntimeWarning)
    return parts


def not_graphed(cfg, sampler_device: str) -> str | None:
    """Why ``--cuda-graph sampler|all`` replays nothing with ``cfg``'s sampler on
    ``sampler_device``, or None where it replays: a sampler on the CPU, or LADIES on the GPU (a
    layer's size is random, so each hop reads its sizes back) or LABOR-i on the GPU (each
    fixed-point step reads its early-stop test back)."""
    las = getattr(cfg, "locality_scale", None) is not None
    kind = getattr(cfg, "sampler", "uniform")
    if not sampler_device.startswith("cuda"):
        # (no hint where it would not help: the GPU samplers of LADIES, locality-aware too, and
        # LABOR-i do not replay either)
        labor_i = kind == "labor" and getattr(cfg, "importance_sampling", 0) > 0
        useful = kind != "ladies" and not labor_i and has_gpu_sampler(cfg)
        hint = " (a GPU sampler's are: --sampler-device cuda)" if useful else ""
        kind = {"ladies": "LADIES", "labor": "LABOR-i" if labor_i else "LABOR"}.get(kind, kind)
        kind = f"locality-aware {kind}" if las and kind == "LADIES" else (
            "locality-aware" if las else kind)  # fmt: skip
        return (f"--cuda-graph: the {kind} sampler runs on the CPU here: its batches are not "
                f"replayed as CUDA graphs{hint}")  # fmt: skip
    if kind == "ladies":
        return ("--cuda-graph: the LADIES GPU sampler's batches are not replayed as CUDA graphs "
                "(each hop reads its sizes back); sampled as usual")  # fmt: skip
    if kind == "labor" and getattr(cfg, "importance_sampling", 0) > 0:
        return ("--cuda-graph: the LABOR-i GPU sampler's batches are not replayed as CUDA graphs "
                "(each fixed-point step reads its early-stop test back); sampled as usual")  # fmt: skip
    return None


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam over the model's parameters, as torch's fused kernel (one kernel for all parameters,
    on the CPU and on CUDA) where this torch has it, else its multi-tensor ``foreach`` form.
    Both compute Adam's update as the per-parameter loop does, up to float rounding."""
    params = [p for p in model.parameters() if p.requires_grad]
    kw: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    try:
        return torch.optim.Adam(params, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):  # a device or build without the fused kernel
        return torch.optim.Adam(params, foreach=True, **kw)
