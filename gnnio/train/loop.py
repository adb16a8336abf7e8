"""The training loop: mini-batch training with per-epoch evaluation, timing breakdown and logs.

``train(dataset, TrainConfig(...)) -> dict`` wires the pieces together::

    RandomOrder(train_idx) -> UniformSampler(fanouts) -> feature store gather -> NodeLoader
        -> model (gnnio.train.models) -> Adam step

Every epoch it trains over all training seeds, evaluates accuracy on the valid and test splits, writes
one JSON line to the log, keeps the best model (highest valid accuracy) as a checkpoint and stops
early after ``patience`` epochs without improvement.

Timing (all seconds, wall clock, per epoch):

* ``sample``, ``gather``, ``transfer``: busy time of the loader's stages (``loader.stats``). With
  prefetching they run in background threads and overlap each other and the compute, so they need
  not add up to the epoch time.
* ``compute``: forward + loss + backward + optimizer step in the training loop
  (``torch.cuda.synchronize`` before reading the clock on a GPU).
* ``wait``: time the training loop was blocked waiting for the next batch (the part of data loading
  the pipeline did not hide).
* ``epoch_time_s``: the training pass only; evaluation time is reported separately (``eval_s``).

Evaluation: ``eval="sampled"`` (default) runs the model on sampled neighbourhoods of the valid and
test seeds with the training fanouts — cost proportional to the number of evaluated seeds, so it
stays cheap on graphs with 10^8+ edges, at the price of a (small) sampling noise in the accuracy.
``eval="full"`` runs exact layer-wise full-neighbour inference over all nodes (``O(E * layers)``
work and ``2 * N * hidden`` floats of host memory per evaluation); use it on small graphs or for
final numbers.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DatasetError, UsageError
from ..graph.dataset import Dataset, load
from ..utils.progress import bar
from .models import EDGE_WEIGHT_NORMS, FEATURE_NORMS, MODELS, BlockGNN, build_model

__all__ = [
    "TrainConfig",
    "check_device",
    "evaluate_full",
    "evaluate_sampled",
    "load_checkpoint",
    "make_node_loader",
    "train",
]

EVAL_MODES = ("sampled", "full")
STORE_KINDS = ("memory", "mmap")
STAGES = ("sample", "gather", "transfer", "compute", "wait")


@dataclass
class TrainConfig:
    """Options of :func:`train` (the ``gnnio train`` flags).

    Attributes:
        model: one of ``sage``, ``gcn``, ``gat``, ``gin``.
        fanouts: neighbours sampled per hop, passed to the sampler as given (see
            :class:`gnnio.sampling.UniformSampler` for which hop comes first);
            ``num_layers == len(fanouts)``.
        batch_size: training seeds per mini-batch.
        epochs: maximum number of epochs.
        lr, weight_decay: Adam learning rate and L2 weight decay.
        hidden, dropout, heads, attn_dropout: model sizes (see :func:`gnnio.train.models.build_model`).
        feature_norm: ``"none"`` or ``"row"`` (divide each feature row by its L1 norm).
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` accepted); where the model runs.
        seed: seeds the model init and dropout (``torch.manual_seed``, i.e. torch's global
            generator), the seed order and the sampler (evaluation sampler: ``seed + 1``).
        eval: ``"sampled"`` (default) or ``"full"`` (module docstring says why).
        eval_batch_size: seeds per evaluation batch (sampled) or nodes per chunk (full);
            None = ``max(batch_size, 4096)``.
        patience: stop after this many epochs without a better valid accuracy; None = never.
        checkpoint: path for the best model's ``state_dict`` (``torch.save``); None = not saved.
        summary: path for the summary JSON; None = not written.
        log: path for the JSONL log (one line per epoch); None = not written.
        store: feature store kind, ``"memory"`` (features read into host RAM) or ``"mmap"`` (rows
            read from the memory-mapped file on every gather); either way the loader copies each
            batch's rows to ``device``.
        threads: CPU threads of the sampler and of the feature gather kernel; None = their defaults.
        prefetch: batches the loader prepares ahead.
        progress: show tqdm progress bars (stderr).
        gpu_cache_fraction: None = no tiering; else keep this fraction of the feature rows (the
            hottest by ``score``) in the GPU tier of a
            :class:`~gnnio.features.tiered.TieredFeatureStore` and read the rest from (pinned) host
            memory; simulated GPU tier without CUDA. ``bytes_by_tier`` then has ``gpu`` and
            ``host``.
        gpu_budget_bytes: cap on the GPU tier's bytes (hot rows clamped to fit); None = no cap.
        score: hotness score ranking the rows for tiering and for a static cache (a key of
            :data:`gnnio.preprocess.hotness.SCORES`, default ``wrpr``).
        placement: a placement file from ``gnnio plan --save``: features are read through a
            :class:`~gnnio.features.multidevice.MultiDeviceFeatureStore` as GPU ``reader``
            (tiers ``local``, ``peer``, ``host``). Exclusive with ``gpu_cache_fraction``.
        reader: which GPU of the placement this run trains on (0-based).
        cache_policy: ``none`` or a :class:`~gnnio.features.cache.FeatureCache` policy
            (``static``, ``fifo``, ``lru``, ``lfu``) in front of the store (tier ``cache``).
        cache_size: cache rows as a fraction of the nodes (``0.1`` = 10 %).
        order: training seed order: ``random`` (seeded shuffle each epoch) or ``po`` (BGL's
            proximity-aware order, :class:`~gnnio.ordering.po.ProximityOrder`).
        po_sequences: number of BFS sequences of the ``po`` order; None = chosen from the
            shuffling-error bound.
        locality_scale: None = uniform sampling; a number ``s >= 1`` = Song & Jiang's
            locality-aware sampling (:class:`~gnnio.sampling.LocalitySampler`) with that fixed
            scale; ``"auto"`` = Algorithm 2 adapts ``s`` after every epoch from the data-loading
            share (:class:`~gnnio.sampling.AdaptiveScale`, lt 0.15, ut 0.2, MAXS 8). Needs a
            GPU-resident set: ``gpu_cache_fraction``, ``placement`` or a ``static`` cache.
        locality_max_scale: MAXS of ``auto``.
        locality_compute_s: for ``auto`` without a GPU: the compute seconds per epoch that the
            *modeled* loading share assumes (None = the measured CPU compute time, which makes
            the share small, so Algorithm 2 tends to stop at ``s = 1``).
        prune_threshold: None, or ``(alpha, beta)`` of HyDRA's threshold pruning: a node with more
            than ``alpha * avg_degree + beta * fanout`` neighbours samples from a random contiguous
            window of that length of its neighbour list.
    """

    model: str = "sage"
    fanouts: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    epochs: int = 20
    lr: float = 0.003
    weight_decay: float = 0.0
    hidden: int = 256
    dropout: float = 0.5
    heads: int = 4
    attn_dropout: float = 0.0
    feature_norm: str = "none"
    edge_weight_norm: str = "mean"
    device: str = "cpu"
    seed: int = 0
    eval: str = "sampled"
    eval_batch_size: int | None = None
    patience: int | None = None
    checkpoint: str | None = None
    summary: str | None = None
    log: str | None = None
    store: str = "memory"
    threads: int | None = None
    prefetch: int = 2
    progress: bool = True
    gpu_cache_fraction: float | None = None
    gpu_budget_bytes: int | None = None
    score: str = "wrpr"
    placement: str | None = None
    reader: int = 0
    cache_policy: str = "none"
    cache_size: float = 0.1
    order: str = "random"
    po_sequences: int | None = None
    locality_scale: float | str | None = None
    locality_max_scale: float = 8.0
    locality_compute_s: float | None = None
    prune_threshold: tuple[float, float] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    def validate(self) -> None:
        """Raise :class:`~gnnio.errors.UsageError` (one line, naming the option) on a bad value."""
        if self.model not in MODELS:
            raise UsageError(
                f"--model: unknown model '{self.model}' (choose from {', '.join(MODELS)})"
            )
        from ..sampling.uniform import check_fanouts

        try:
            check_fanouts(self.fanouts)
        except ValueError as e:
            raise UsageError(f"--{e}") from None
        for name in ("batch_size", "epochs", "hidden", "heads", "prefetch"):
            if int(getattr(self, name)) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')}: must be >= 1, got {getattr(self, name)}"
                )
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise UsageError(f"--eval-batch-size: must be >= 1, got {self.eval_batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr: must be a positive number, got {self.lr}")
        if self.weight_decay < 0:
            raise UsageError(f"--weight-decay: must be >= 0, got {self.weight_decay}")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"--dropout: must be in [0, 1), got {self.dropout}")
        if self.eval not in EVAL_MODES:
            raise UsageError(f"--eval: must be one of {', '.join(EVAL_MODES)}, got '{self.eval}'")
        if self.store not in STORE_KINDS:
            raise UsageError(
                f"--store: must be one of {', '.join(STORE_KINDS)}, got '{self.store}'"
            )
        if self.feature_norm not in FEATURE_NORMS:
            raise UsageError(f"--feature-norm: must be one of {', '.join(FEATURE_NORMS)}")
        if self.edge_weight_norm not in EDGE_WEIGHT_NORMS:
            raise UsageError(f"edge_weight_norm: must be one of {', '.join(EDGE_WEIGHT_NORMS)}")
        if self.patience is not None and self.patience < 1:
            raise UsageError(f"--patience: must be >= 1, got {self.patience}")
        if self.seed < 0:
            raise UsageError(f"--seed: must be >= 0, got {self.seed}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--threads: must be >= 1, got {self.threads}")
        self._validate_data_options()
        check_device(self.device)

    def _validate_data_options(self) -> None:
        from ..preprocess.hotness import SCORES
        from .setup import CACHE_POLICIES, ORDERS

        f = self.gpu_cache_fraction
        if f is not None and not (math.isfinite(f) and 0.0 <= f <= 1.0):
            raise UsageError(f"--gpu-cache-fraction: must be in [0, 1], got {f}")
        if self.gpu_budget_bytes is not None and self.gpu_budget_bytes < 0:
            raise UsageError(f"--gpu-budget: must be >= 0 bytes, got {self.gpu_budget_bytes}")
        if self.score not in SCORES:
            raise UsageError(
                f"--score: unknown score '{self.score}' (choose from {', '.join(SCORES)})"
            )
        if self.placement is not None and f is not None:
            raise UsageError("--placement and --gpu-cache-fraction exclude each other; give one")
        if self.reader < 0:
            raise UsageError(f"--reader: must be >= 0, got {self.reader}")
        if self.cache_policy not in CACHE_POLICIES:
            raise UsageError(
                f"--cache-policy: must be one of {', '.join(CACHE_POLICIES)}, "
                f"got '{self.cache_policy}'"
            )
        if not (math.isfinite(self.cache_size) and 0.0 <= self.cache_size <= 1.0):
            raise UsageError(f"--cache-size: must be a fraction in [0, 1], got {self.cache_size}")
        if self.order not in ORDERS:
            raise UsageError(f"--order: must be one of {', '.join(ORDERS)}, got '{self.order}'")
        if self.po_sequences is not None and self.po_sequences < 1:
            raise UsageError(f"--po-sequences: must be >= 1, got {self.po_sequences}")
        ls = self.locality_scale
        if ls is not None and ls != "auto":
            if isinstance(ls, str) or not (math.isfinite(ls) and ls >= 1.0):
                raise UsageError(f"--locality-scale: must be a number >= 1 or 'auto', got {ls!r}")
        if not (math.isfinite(self.locality_max_scale) and self.locality_max_scale >= 1.0):
            raise UsageError(
                f"--locality-max-scale: must be a number >= 1, got {self.locality_max_scale}"
            )
        if self.locality_compute_s is not None and not self.locality_compute_s > 0:
            raise UsageError(
                f"--locality-compute-s: must be > 0 seconds, got {self.locality_compute_s}"
            )
        if ls is not None and (
            self.gpu_cache_fraction is None
            and self.placement is None
            and self.cache_policy != "static"
        ):
            raise UsageError(
                "--locality-scale: needs nodes held on the GPU; add --gpu-cache-fraction F, "
                "--placement FILE or --cache-policy static"
            )
        pt = self.prune_threshold
        if pt is not None:
            if len(pt) != 2 or not all(math.isfinite(float(v)) and float(v) >= 0 for v in pt):
                raise UsageError(
                    f"--prune-threshold: needs ALPHA,BETA (two numbers >= 0), got {pt!r}"
                )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["fanouts"] = list(self.fanouts)
        d["num_layers"] = self.num_layers
        return d


def check_device(device: str) -> torch.device:
    """``torch.device(device)``, or a one-line UsageError if it is malformed or CUDA is missing."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device: unknown device '{device}' (use cpu or cuda)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                "--device cuda: CUDA is not available on this machine (use --device cpu)"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) present"
            )
    elif dev.type != "cpu":
        raise UsageError(f"--device: unsupported device '{device}' (use cpu or cuda)")
    return dev


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _counter_diff(after: dict, before: dict) -> dict[str, dict[str, int]]:
    return {
        kind: {t: int(after[kind].get(t, 0)) - int(before[kind].get(t, 0)) for t in after[kind]}
        for kind in ("rows", "bytes")
    }


def make_node_loader(
    sampler, store, seeds, labels, batch_size, seed, device, prefetch=2, order=None
):
    """A :class:`gnnio.pipeline.loader.NodeLoader` over ``seeds`` (global ids) in ``order`` (a
    :class:`~gnnio.ordering.shuffle.SeedOrder`; None = a seeded random order of ``seeds``)."""
    from ..ordering import RandomOrder
    from ..pipeline.loader import NodeLoader

    if order is None:
        order = RandomOrder(
            torch.from_numpy(np.asarray(seeds, dtype=np.int64)), batch_size, seed=seed
        )
    return NodeLoader(sampler, store, order, labels=labels, device=device, prefetch=prefetch)


@torch.no_grad()
def evaluate_sampled(model: BlockGNN, loader, epoch: int = 0) -> float:
    """Accuracy of ``model`` over every seed of ``loader`` (sampled neighbourhoods); ``epoch``
    selects the loader's epoch, i.e. the seed order and the sampler's random stream, so the same
    ``(loader seeds, epoch)`` gives the same batches again."""
    was = model.training
    model.eval()
    correct = total = 0
    try:
        for batch in loader.epoch(epoch):
            pred = model(batch.x, batch.blocks).argmax(dim=1)
            y = batch.labels
            mask = y >= 0
            correct += int((pred[mask] == y[mask]).sum())
            total += int(mask.sum())
    finally:
        model.train(was)
    return correct / max(total, 1)


def evaluate_full(
    model: BlockGNN,
    ds: Dataset,
    splits: dict[str, np.ndarray],
    chunk: int,
    device: torch.device,
    progress: bool,
) -> dict[str, float]:
    """Accuracy per split from exact layer-wise full-neighbour inference over all nodes."""
    logits = model.inference(
        ds.graph, ds.features, batch_size=chunk, device=device, progress=progress
    )
    pred = logits.argmax(dim=1).numpy()
    labels = np.asarray(ds.labels)
    out = {}
    for name, idx in splits.items():
        idx = np.asarray(idx, dtype=np.int64)
        y = labels[idx]
        m = y >= 0
        out[name] = float((pred[idx][m] == y[m]).mean()) if m.any() else 0.0
    return out


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module) -> torch.nn.Module:
    """Load a checkpoint written by :func:`train` into ``model`` (``weights_only=True``)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model


def _write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def train(
    dataset: Dataset | str | os.PathLike, config: TrainConfig | None = None
) -> dict[str, Any]:
    """Train ``config.model`` on ``dataset`` (a :class:`Dataset` or a dataset directory).

    Returns the summary dict (also written to ``config.summary``): ``dataset``, ``model``,
    ``config``, ``best_valid_acc``, ``test_acc`` (test accuracy at the best-valid epoch),
    ``best_epoch`` (0-based), ``epochs`` (epochs run), ``epoch_time_s`` (mean training-pass
    seconds), ``eval_time_s`` (mean), ``breakdown_s`` (mean seconds per epoch for ``sample``,
    ``gather``, ``transfer``, ``compute``, ``wait``; see module docstring), ``data_loading_share``
    (gather + transfer over epoch time), ``seeds_per_s``, ``bytes_by_tier`` / ``rows_by_tier``
    (feature bytes / rows gathered per store tier, summed over the *training* passes only, not
    evaluation), ``history`` (per-epoch records, same as the JSONL log), ``device``,
    ``num_parameters``, ``stopped_early``.
    """
    from ..sampling import UniformSampler
    from .setup import build_order, build_sampler, build_store

    cfg = config or TrainConfig()
    cfg.validate()
    device = check_device(cfg.device)
    ds = dataset if isinstance(dataset, Dataset) else load(dataset)
    ds.require_labels()
    for split in ("valid_idx", "test_idx"):
        if getattr(ds, split) is None or getattr(ds, split).size == 0:
            raise DatasetError(f"{ds.path}: has no {split.split('_')[0]} split; train needs one")
    num_classes = ds.num_classes
    if num_classes < 2:
        raise DatasetError(f"{ds.path}: needs at least 2 classes to train, has {num_classes}")

    torch.manual_seed(cfg.seed)
    fanouts = [int(f) for f in cfg.fanouts]
    eval_bs = cfg.eval_batch_size or max(cfg.batch_size, 4096)
    labels = torch.from_numpy(np.asarray(ds.labels, dtype=np.int64))

    setup = build_store(ds, cfg, device)
    store = setup.store
    sampler, adaptive = build_sampler(ds, cfg, fanouts, setup)
    order = build_order(ds, cfg, ds.train_idx, labels, cfg.batch_size, cfg.seed)
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
    )
    eval_loaders = {}
    if cfg.eval == "sampled":
        eval_sampler = UniformSampler(ds.graph, fanouts, seed=cfg.seed + 1, num_threads=cfg.threads)
        for name, idx in (("valid", ds.valid_idx), ("test", ds.test_idx)):
            eval_loaders[name] = make_node_loader(
                eval_sampler, setup.eval_store, idx, labels, eval_bs, cfg.seed, device,
                cfg.prefetch,
            )  # fmt: skip

    model = build_model(
        cfg.model,
        ds.feat_dim,
        cfg.hidden,
        num_classes,
        cfg.num_layers,
        dropout=cfg.dropout,
        heads=cfg.heads,
        attn_dropout=cfg.attn_dropout,
        feature_norm=cfg.feature_norm,
        edge_weight_norm=cfg.edge_weight_norm,
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    log_f = None
    if cfg.log:
        Path(cfg.log).parent.mkdir(parents=True, exist_ok=True)
        log_f = open(cfg.log, "w")  # noqa: SIM115 - closed in finally
    ckpt = Path(cfg.checkpoint) if cfg.checkpoint else None
    if ckpt is not None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)

    history: list[dict[str, Any]] = []
    best_valid, best_epoch = -1.0, -1
    stopped_early = False
    try:
        for epoch in range(cfg.epochs):
            rec = _train_epoch(model, opt, train_loader, store, epoch, cfg, device)
            for t in setup.tiers:
                rec["bytes_by_tier"].setdefault(t, 0)
                rec["rows_by_tier"].setdefault(t, 0)
            if cfg.locality_scale is not None:
                rec["locality_scale"] = float(sampler.scale)
                if adaptive is not None:
                    share, kind = _loading_share(rec, cfg, device)
                    rec["loading_share"], rec["loading_share_kind"] = share, kind
                    sampler.scale = adaptive.update(share)  # between epochs: loader is idle

            t0 = time.perf_counter()
            if cfg.eval == "sampled":
                accs = {k: evaluate_sampled(model, ld, epoch) for k, ld in eval_loaders.items()}
            else:
                accs = evaluate_full(
                    model,
                    ds,
                    {"valid": ds.valid_idx, "test": ds.test_idx},
                    eval_bs,
                    device,
                    cfg.progress,
                )
            rec["eval_s"] = time.perf_counter() - t0
            rec["valid_acc"], rec["test_acc"] = accs["valid"], accs["test"]

            improved = rec["valid_acc"] > best_valid
            if improved:
                best_valid, best_epoch = rec["valid_acc"], epoch
                if ckpt is not None:
                    tmp = ckpt.with_name(f".{ckpt.name}.tmp")
                    torch.save(model.state_dict(), tmp)
                    os.replace(tmp, ckpt)
            rec["best_valid_acc"] = best_valid
            history.append(rec)
            if log_f is not None:
                log_f.write(json.dumps(rec) + "\n")
                log_f.flush()
            if cfg.progress:
                bd = rec["breakdown_s"]
                _status(
                    f"epoch {epoch:3d}  loss {rec['loss']:.4f}  train {rec['train_acc']:.4f}  "
                    f"valid {rec['valid_acc']:.4f}  test {rec['test_acc']:.4f}  "
                    f"{rec['epoch_time_s']:.2f}s (sample {bd['sample']:.2f} gather "
                    f"{bd['gather']:.2f} transfer {bd['transfer']:.2f} compute {bd['compute']:.2f})"
                    f" eval {rec['eval_s']:.2f}s"
                )
            if cfg.patience is not None and epoch - best_epoch >= cfg.patience:
                stopped_early = epoch < cfg.epochs - 1
                break
    finally:
        if log_f is not None:
            log_f.close()

    summary = _summarize(ds, cfg, device, model, history, best_epoch, stopped_early, ckpt)
    summary["data_setup"] = setup.info
    if cfg.locality_scale is not None or cfg.prune_threshold is not None:
        summary["sampling"] = _sampling_info(sampler, adaptive, history, cfg)
    summary["order"] = _order_info(order)
    if cfg.summary:
        _write_json_atomic(Path(cfg.summary), summary)
    return summary


def _summarize(ds, cfg, device, model, history, best_epoch, stopped_early, ckpt) -> dict[str, Any]:
    """The summary dict of :func:`train` from the per-epoch records."""
    from .models import count_parameters

    n = len(history)
    epoch_time = _mean(h["epoch_time_s"] for h in history)
    breakdown = {st: _mean(h["breakdown_s"][st] for h in history) for st in STAGES}
    best = history[best_epoch] if best_epoch >= 0 else None
    bytes_total: dict[str, int] = {}
    rows_total: dict[str, int] = {}
    for h in history:
        for t, v in h["bytes_by_tier"].items():
            bytes_total[t] = bytes_total.get(t, 0) + v
        for t, v in h["rows_by_tier"].items():
            rows_total[t] = rows_total.get(t, 0) + v
    num_train = int(ds.train_idx.size)
    return {
        "dataset": ds.name,
        "dataset_path": str(ds.path),
        "model": cfg.model,
        "config": cfg.to_json(),
        "best_valid_acc": best["valid_acc"] if best else -1.0,
        "test_acc": best["test_acc"] if best else 0.0,
        "best_epoch": best_epoch,
        "epochs": n,
        "stopped_early": stopped_early,
        "epoch_time_s": epoch_time,
        "eval_time_s": _mean(h["eval_s"] for h in history),
        "breakdown_s": breakdown,
        "data_loading_share": (breakdown["gather"] + breakdown["transfer"]) / epoch_time
        if epoch_time > 0
        else 0.0,
        "wait_share": breakdown["wait"] / epoch_time if epoch_time > 0 else 0.0,
        "seeds_per_s": num_train / epoch_time if epoch_time > 0 else 0.0,
        "batches_per_epoch": history[0]["batches"] if n else 0,
        "bytes_by_tier": bytes_total,
        "rows_by_tier": rows_total,
        "bytes_by_tier_scope": "feature rows gathered during training passes (evaluation excluded)",
        "device": str(device),
        "num_parameters": count_parameters(model),
        "num_train": num_train,
        "checkpoint": str(ckpt) if ckpt is not None else None,
        "history": history,
    }


def _loading_share(rec: dict[str, Any], cfg: TrainConfig, device: torch.device):
    """The data-loading share that drives Algorithm 2: measured ``(gather + transfer) / epoch`` on
    a GPU, else modeled from the bytes per tier (:func:`gnnio.sampling.modeled_loading_share`)."""
    bd, bt = rec["breakdown_s"], rec["bytes_by_tier"]
    if device.type == "cuda" and cfg.locality_compute_s is None:
        t = rec["epoch_time_s"]
        return ((bd["gather"] + bd["transfer"]) / t if t > 0 else 0.0), "measured"
    from ..sampling import modeled_loading_share

    compute = cfg.locality_compute_s if cfg.locality_compute_s is not None else bd["compute"]
    share = modeled_loading_share(
        bt.get("host", 0),
        bt.get("gpu", 0) + bt.get("local", 0) + bt.get("cache", 0),
        compute_s=compute,
        peer_bytes=bt.get("peer", 0),
    )
    return share, "modeled"


def _sampling_info(sampler, adaptive, history, cfg) -> dict[str, Any]:
    info: dict[str, Any] = {"sampler": type(sampler).__name__}
    if cfg.locality_scale is not None:
        info["locality_scale"] = cfg.locality_scale
        info["scale_per_epoch"] = [h.get("locality_scale") for h in history]
        info["final_scale"] = float(sampler.scale)
        if adaptive is not None:
            info["algorithm2"] = adaptive.history
            info["loading_share_kind"] = history[0].get("loading_share_kind") if history else None
    if cfg.prune_threshold is not None:
        info["prune_threshold"] = list(cfg.prune_threshold)
        info["thresholds"] = [int(t) for t in getattr(sampler, "thresholds", [])]
    return info


def _order_info(order) -> dict[str, Any]:
    """The seed order's facts for the summary (kind; for PO the sequences and the error bound)."""
    info: dict[str, Any] = {"kind": type(order).__name__}
    for k in ("num_sequences", "bound_value", "bound_met"):
        v = getattr(order, k, None)
        if v is not None:
            info[k] = v if not isinstance(v, (np.floating, np.integer)) else v.item()
    errors = getattr(order, "errors", None)
    if errors and getattr(order, "num_sequences", None) in errors:
        info["estimated_error"] = float(errors[order.num_sequences])
    return info


def _mean(values) -> float:
    v = list(values)
    return float(np.mean(v)) if v else 0.0


def _status(msg: str) -> None:
    """One line on stderr that does not break a running tqdm bar."""
    from tqdm.auto import tqdm

    tqdm.write(msg, file=sys.stderr)


def _stage_seconds(stats) -> dict[str, float]:
    """``{sample, gather, transfer}`` seconds from the loader's last-epoch stats (a
    :class:`gnnio.pipeline.loader.LoaderStats`, or a plain dict keyed by stage name)."""
    out = {}
    for k in ("sample", "gather", "transfer"):
        if stats is None:
            v = 0.0
        elif isinstance(stats, dict):
            v = stats.get(k, stats.get(f"{k}_s", 0.0))
        else:
            v = getattr(stats, f"{k}_s", 0.0)
        out[k] = float(v)
    return out


def _train_epoch(model, opt, loader, store, epoch, cfg, device) -> dict[str, Any]:
    """One training pass; returns the epoch record (loss, train_acc, timings, counters)."""
    model.train()
    before = store.counters.snapshot()
    loss_sum = 0.0
    correct = seen = batches = 0
    compute = wait = 0.0
    num_batches = loader.order.num_batches if hasattr(loader, "order") else None
    pb = bar(num_batches, f"epoch {epoch}", "batch", enabled=cfg.progress)
    t_start = time.perf_counter()
    it = iter(loader.epoch(epoch))
    try:
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            wait += t1 - t0
            logits = model(batch.x, batch.blocks)
            y = batch.labels
            loss = F.cross_entropy(logits, y, ignore_index=-1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            _sync(device)
            compute += time.perf_counter() - t1
            b = int(y.shape[0])
            loss_sum += float(loss.detach()) * b
            mask = y >= 0
            correct += int((logits.detach().argmax(dim=1)[mask] == y[mask]).sum())
            seen += b
            batches += 1
            pb.update(1)
            elapsed = time.perf_counter() - t_start
            if elapsed > 0:
                pb.set_postfix(
                    {"batch/s": f"{batches / elapsed:.1f}", "seeds/s": f"{seen / elapsed:,.0f}"},
                    refresh=False,
                )
    finally:
        pb.close()
        if hasattr(it, "close"):
            it.close()  # stops the loader threads if the epoch ended early (error, interrupt)
    epoch_time = time.perf_counter() - t_start
    stages = _stage_seconds(getattr(loader, "stats", None))
    counters = _counter_diff(store.counters.snapshot(), before)
    return {
        "epoch": epoch,
        "loss": loss_sum / max(seen, 1),
        "train_acc": correct / max(seen, 1),
        "batches": batches,
        "seeds": seen,
        "epoch_time_s": epoch_time,
        "seeds_per_s": seen / epoch_time if epoch_time > 0 else 0.0,
        "breakdown_s": {**stages, "compute": compute, "wait": wait},
        "bytes_by_tier": counters["bytes"],
        "rows_by_tier": counters["rows"],
    }
