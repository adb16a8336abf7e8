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
* ``compute``: forward + loss + backward + optimizer step in the training loop (on a GPU the device
  time between CUDA events recorded around each step on the training stream, read once per
  epoch: no device-wide synchronisation, which would also wait for the loader's copies and so
  cancel the overlap it measures; :class:`gnnio.train.timing.ComputeTimer`).
* ``wait``: time the training loop was blocked waiting for the next batch (the part of data loading
  the pipeline did not hide).
* ``epoch_time_s``: the training pass only; evaluation time is reported separately (``eval_s``).
* ``hidden_fraction``: how much of the loading work (sample + gather + transfer) was hidden behind
  compute, ``1 - wait / (sample + gather + transfer)`` clipped to ``[0, 1]``.

The loss and accuracy of the pass are summed on the device and read once per epoch, so the loop
queues steps without waiting for each.

Evaluation: ``eval="sampled"`` (default) runs the model on sampled neighbourhoods of the valid and
test seeds with the training fanouts — cost proportional to the number of evaluated seeds, so it
stays cheap on graphs with 10^8+ edges, at the price of a (small) sampling noise in the accuracy.
``eval="full"`` runs exact layer-wise full-neighbour inference over all nodes (``O(E * layers)``
work and ``2 * N * hidden`` floats of host memory per evaluation); use it on small graphs or for
final numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..errors import DatasetError, GnnioError
from ..features.base import BatchCount
from ..graph.dataset import Dataset, load
from ..utils.heap import apply_heap
from ..utils.outputs import AtomicLog, write_atomic
from ..utils.progress import bar
from ..utils.rss import rss_bytes
from ..utils.triton_kernels import kernels_report, reset_kernel_record
from .build import build_training, train_step
from .checkpoint import make_state, open_checkpoints, resume_progress, stateful_stores
from .config import TrainConfig, check_device
from .config_dist import check_split_sizes
from .evaluate import evaluate_full, evaluate_sampled
from .gpu_plan import apply_layout_plan
from .graphed import graph_report
from .setup_disk import disk_epoch, disk_mark, disk_summary
from .summary import (
    hidden_fraction,
    loading_share,
    order_info,
    sampling_info,
    simulation_facts,
    stage_seconds,
    summarize,
)
from .timing import ComputeTimer

__all__ = ["train"]


def _counter_diff(after: dict, before: dict) -> dict[str, dict[str, int]]:
    return {
        kind: {t: int(after[kind].get(t, 0)) - int(before[kind].get(t, 0)) for t in after[kind]}
        for kind in ("rows", "bytes")
    }


def _write_json_atomic(path: Path, obj: Any) -> None:
    text = (json.dumps(obj, indent=2) + "\n").encode()
    write_atomic(path, lambda f: f.write(text), "--summary")


class LocalRun:
    """How :func:`train` builds and reports a run: one process. :class:`gnnio.distributed.train.DistRun`
    overrides these hooks for several ranks (its store, seed slices, DDP model, reduced
    evaluation and per-rank summary), so the loop itself is written once."""

    rank = 0
    world_size = 1
    is_main = True

    def build_store(self, ds, cfg: TrainConfig, device: torch.device):
        from .setup import build_store, hot_score, needs_score

        score = hot_score(ds, cfg, cfg.progress) if needs_score(ds, cfg) else None
        return build_store(ds, cfg, device, score=score)

    def build_labels(self, ds, cfg: TrainConfig):
        """The labels the loaders index by global id: the dataset's ``[N]`` array (a rank holds
        only its seeds': :meth:`gnnio.distributed.train.DistRun.build_labels`)."""
        return torch.from_numpy(np.asarray(ds.labels, dtype=np.int64))

    def build_order(self, ds, cfg: TrainConfig, seeds, labels, batch_size: int, seed: int):
        from .setup import build_order

        return build_order(ds, cfg, seeds, labels, batch_size, seed)

    def build_sampler(self, ds, cfg: TrainConfig, fanouts, setup):
        """The training sampler and its Algorithm 2 controller (or None)."""
        from .setup import build_sampler

        return build_sampler(ds, cfg, fanouts, setup)

    def build_eval_sampler(self, ds, cfg: TrainConfig, fanouts):
        """The evaluation sampler: uniform with ``fanouts``, seed ``cfg.seed + 1``, whatever
        ``cfg.sampler`` (LADIES, which reads only the number of fanouts, is evaluated with their
        values)."""
        from ..sampling import UniformSampler

        return UniformSampler(ds.graph, fanouts, seed=cfg.seed + 1, num_threads=cfg.threads)

    def eval_order(self, seeds, batch_size: int, seed: int):
        """The order of an evaluation split (None = :func:`make_node_loader`'s default)."""
        return None

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def evaluate(self, model, loaders: dict, epoch: int, bars: bool = False) -> dict[str, float]:
        return {k: evaluate_sampled(model, ld, epoch, f"eval {k}" if bars else None)
                for k, ld in loaders.items()}  # fmt: skip

    def epoch_record(self, rec: dict[str, Any], setup) -> None:
        """Add run-specific fields to an epoch record (called on every rank)."""

    def mean_over_ranks(self, value: float) -> float:
        return value

    def finish(self, summary: dict[str, Any], setup, model) -> dict[str, Any]:
        return summary

    def all_gather_object(self, obj) -> list:
        """Every rank's ``obj``, by rank (one process: ``[obj]``)."""
        return [obj]

    def state_dict(self) -> dict[str, Any]:
        """The run's own counters a checkpoint carries (several ranks: :class:`DistRun`'s)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Undo :meth:`state_dict` (at ``--resume``)."""


def train(
    dataset: Dataset | str | os.PathLike,
    config: TrainConfig | None = None,
    run: LocalRun | None = None,
) -> dict[str, Any]:
    """Train ``config.model`` on ``dataset`` (a :class:`Dataset` or a dataset directory).

    Returns the summary dict (also written to ``config.summary``): ``dataset``, ``model``,
    ``config``, ``best_valid_acc``, ``test_acc`` (test accuracy at the best-valid epoch),
    ``best_epoch`` (0-based), ``epochs`` (epochs run), ``epoch_time_s`` (mean training-pass
    seconds), ``eval_time_s`` (mean), ``breakdown_s`` (mean seconds per epoch for ``sample``,
    ``gather``, ``transfer``, ``compute``, ``wait``; see module docstring), ``data_loading_share``
    (gather + transfer over epoch time), ``seeds_per_s``, ``bytes_by_tier`` / ``rows_by_tier``
    (feature bytes / rows gathered per store tier, summed over the *training* passes only, not
    evaluation), ``history`` (per-epoch records, same as the JSONL log), ``loss_history`` (the
    mean training loss of every epoch), ``rss_mb_per_epoch`` (resident memory of the process,
    MiB, after each epoch's training and evaluation), ``device``,
    ``num_parameters``, ``stopped_early``, ``heap`` (one process: ``"kept"`` or ``"system"``
    and why, :func:`gnnio.utils.heap.apply_heap`; ``config.heap="auto"`` keeps freed memory
    in glibc's heaps, process-wide, when the model trains on the CPU).

    ``run`` builds the store, orders and model and reduces the results: :class:`LocalRun` (one
    process, the default) or :class:`gnnio.distributed.train.DistRun` (one rank of several).
    """
    cfg = config or TrainConfig()
    run = run or LocalRun()
    cfg.validate(run.world_size)
    cfg.validate_dist(run.world_size)
    device = check_device(cfg.device)
    ds = dataset if isinstance(dataset, Dataset) else load(dataset)
    ds.require_labels()
    ds.require_eval_splits()
    check_split_sizes(ds, cfg, run.world_size)  # (several ranks: each needs a batch of each)
    num_classes = ds.num_classes
    if num_classes < 2:
        raise DatasetError(f"{ds.path}: needs at least 2 classes to train, has {num_classes}")

    if cfg.device == "auto":
        cfg = dataclasses.replace(cfg, device=str(device))
    build_cfg, plan = apply_layout_plan(ds, cfg, device, run.world_size)  # --device auto|cuda
    if plan.get("planned") and cfg.progress and run.is_main:
        _status(_describe_plan(plan))
    # one process on the CPU: a batch's large tensors reuse the pages the last batch faulted in
    heap = apply_heap(cfg.heap, device.type, cfg.store) if run.world_size == 1 else None
    parts = build_training(ds, build_cfg, run, device)
    setup, store, sampler, adaptive, order = (
        parts.setup,
        parts.store,
        parts.sampler,
        parts.adaptive,
        parts.order,
    )
    train_loader, eval_loaders, model, net, opt = (
        parts.train_loader,
        parts.eval_loaders,
        parts.model,
        parts.net,
        parts.opt,
    )
    labels = parts.labels
    eval_bs = parts.eval_batch_size
    iso = iso_undo = None
    if cfg.isolation == "auto":  # BGL §3.4: profile the stages, give each its threads
        from .isolate import isolate

        iso, iso_undo = isolate(sampler, store, model, order, labels, device)
        if cfg.progress and run.is_main:
            _status(iso.describe())

    reset_kernel_record()
    ckdir, resumed = open_checkpoints(cfg, ds, run)  # --checkpoint-dir / --resume
    prog = resume_progress(resumed, model=model, opt=opt, store=store, sampler=sampler,
                           adaptive=adaptive, run=run)  # fmt: skip
    # --log: rewritten atomically per epoch (a resumed run's lines first); old file kept till then
    log_f = AtomicLog(cfg.log, "--log", prog.history) if cfg.log and run.is_main else None
    ckpt = Path(cfg.checkpoint) if cfg.checkpoint and run.is_main else None
    if ckpt is not None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)

    history: list[dict[str, Any]] = prog.history
    best_valid, best_epoch = prog.best_valid, prog.best_epoch
    stopped_early = prog.stopped and len(history) < cfg.epochs

    def state(epoch: int, batch: int, stopped: bool = False, partial=None) -> dict[str, Any]:
        return make_state(
            ds=ds, cfg=cfg, world_size=run.world_size, epoch=epoch, batch=batch, model=model,
            opt=opt, stores=stateful_stores(store), sampler=sampler, adaptive=adaptive,
            best_valid=best_valid, best_epoch=best_epoch, stopped=stopped, history=history,
            partial=partial, run_state=run.state_dict(),
        )  # fmt: skip

    def save_mid_epoch(epoch: int, done: int, partial: dict[str, Any]) -> None:
        ckdir.save(state(epoch, done, partial=partial))

    on_batch = save_mid_epoch if ckdir is not None and cfg.checkpoint_every else None
    try:
        for epoch in range(prog.epoch, 0 if prog.stopped else cfg.epochs):
            b0, part0 = (prog.batch, prog.partial) if epoch == prog.epoch else (0, None)
            mark = disk_mark(setup) if setup.disk is not None else None
            rec = _train_epoch(net, opt, train_loader, store, epoch, cfg, device, b0, part0,
                               on_batch=on_batch, step=parts.step)  # fmt: skip
            if mark is not None:  # --features-on disk: what the pass read (setup_disk)
                disk_epoch(setup, mark, rec)
            run.epoch_record(rec, setup)
            for t in setup.tiers:
                rec["bytes_by_tier"].setdefault(t, 0)
                rec["rows_by_tier"].setdefault(t, 0)
            if cfg.locality_scale is not None:
                rec["locality_scale"] = float(sampler.scale)
                if adaptive is not None:
                    share, kind = loading_share(rec, cfg, device)
                    share = run.mean_over_ranks(share)  # every rank adapts s the same way
                    rec["loading_share"], rec["loading_share_kind"] = share, kind
                    sampler.scale = adaptive.update(share)  # between epochs: loader is idle

            t0 = time.perf_counter()
            if cfg.eval == "sampled":
                accs = run.evaluate(model, eval_loaders, epoch, cfg.progress and run.is_main)
            else:
                splits = {"valid": ds.valid_idx, "test": ds.test_idx}  # (train() checked both)
                accs = evaluate_full(model, ds, cast(dict[str, np.ndarray], splits), eval_bs,
                                     device, cfg.progress)  # fmt: skip
            rec["eval_s"] = time.perf_counter() - t0
            rec["valid_acc"], rec["test_acc"] = accs["valid"], accs["test"]

            improved = rec["valid_acc"] > best_valid
            if improved:
                best_valid, best_epoch = rec["valid_acc"], epoch
                if ckpt is not None:
                    write_atomic(ckpt, lambda f: torch.save(model.state_dict(), f), "--checkpoint")
            rec["best_valid_acc"] = best_valid
            rec["rss_mb"] = rss_bytes() / 2**20  # after training and evaluation (flat: issue 16)
            history.append(rec)
            if log_f is not None:
                log_f.append(rec)
            if cfg.progress and run.is_main:
                bd = rec["breakdown_s"]
                _status(
                    f"epoch {epoch:3d}  loss {rec['loss']:.4f}  train {rec['train_acc']:.4f}  "
                    f"valid {rec['valid_acc']:.4f}  test {rec['test_acc']:.4f}  "
                    f"{rec['epoch_time_s']:.2f}s (sample {bd['sample']:.2f} gather "
                    f"{bd['gather']:.2f} transfer {bd['transfer']:.2f} compute {bd['compute']:.2f})"
                    f" eval {rec['eval_s']:.2f}s"
                )
            halt = cfg.patience is not None and epoch - best_epoch >= cfg.patience
            if ckdir is not None:
                ckdir.save(state(epoch + 1, 0, stopped=halt))
            if halt:
                stopped_early = epoch < cfg.epochs - 1
                break
    finally:
        if ckdir is not None:
            ckdir.close()
        if iso_undo is not None:
            from .isolate import restore

            restore(iso_undo, sampler, store)

    summary = summarize(ds, cfg, device, model, history, best_epoch, stopped_early, ckpt)
    summary["data_setup"] = setup.info
    if setup.disk is not None:
        summary.update(disk_summary(history, setup))
    summary.update(simulation_facts(device, setup.info))
    summary["isolation"] = dict(iso.threads) if iso is not None else None
    summary["plan"] = plan
    if heap is not None:
        summary["heap"] = heap  # --heap: "kept", or "system" (and why)
    summary["kernels"] = kernels_report()  # which implementation ran (a fallback shows here)
    graphs = graph_report(cfg, parts.step)  # --cuda-graph: batches replayed, eager, why not
    if graphs is not None:
        summary["cuda_graph"] = graphs
    summary["sampler_device"] = str(getattr(sampler, "device", "cpu"))
    summary["sampler_fallback"] = getattr(sampler, "fallback", None)  # (GPU asked, CPU ran)
    if summary["sampler_device"].startswith("cuda"):
        summary["graph_in"] = getattr(sampler, "graph_in", None)
    if iso is not None:
        summary["isolation_profile"] = iso.as_dict()
    if cfg.locality_scale is not None or cfg.prune_threshold is not None:
        summary["sampling"] = sampling_info(sampler, adaptive, history, cfg)
    summary["order"] = order_info(order)
    # this process's resident MiB after each epoch (a resumed run: the epochs before it as
    # recorded by the run that trained them); rank 0's with several ranks
    summary["rss_mb_per_epoch"] = [h.get("rss_mb") for h in history]
    if ckdir is not None:
        summary["checkpoint_dir"] = str(ckdir.path)
        summary["resumed_from"] = prog.resumed_from
    summary = run.finish(summary, setup, model)
    if cfg.summary and run.is_main:
        _write_json_atomic(Path(cfg.summary), summary)
    return summary


def _non_finite(epoch: int, batch: int | None, value: float) -> None:
    where = f"epoch {epoch}" + (f", batch {batch}" if batch is not None else "")
    raise GnnioError(
        f"training stopped at {where}: the loss is {value} (non-finite features, or a learning "
        "rate that diverges: try a lower --lr); no model was saved from this epoch"
    )


def _describe_plan(plan: dict) -> str:
    gib = 2**30
    return (
        f"plan: {plan['hot_rows']:,} feature rows ({plan['gpu_feature_bytes'] / gib:.2f} GiB) on the "
        f"GPU ({plan['gpu_cache_fraction']:.1%}), sampler on {plan['sampler_device']}"
        + (f" (CSR in {plan['graph_in']} memory)" if plan["sampler_device"] == "cuda" else "")
        + f"; {plan['reason']}; modeled host->GPU {plan['modeled_load_s']:.2f} s per epoch"
    ) + (f"; locality: {plan['locality']}" if "locality" in plan else "")


def _status(msg: str) -> None:
    """One line on stderr that does not break a running tqdm bar."""
    from tqdm.auto import tqdm

    tqdm.write(msg, file=sys.stderr)


def _train_epoch(
    model,
    opt,
    loader,
    store,
    epoch,
    cfg,
    device,
    start=0,
    partial=None,
    on_batch=None,
    step=train_step,
) -> dict[str, Any]:
    """One training pass; returns the epoch record (loss, train_acc, timings, counters).

    ``start``, ``partial``: a resumed pass begins at batch ``start`` with the sums of the
    batches before it (:mod:`gnnio.train.checkpoint`); ``on_batch(epoch, done, partial)`` is
    called after every batch with those sums (mid-epoch checkpoints)."""
    model.train()
    before = store.counters.snapshot()
    # rows/bytes per tier of the batches trained on; device parts summed there, read at the end
    counted: BatchCount | None = BatchCount()
    # summed on the batches' device, read once after the pass; ``labelled``: the seeds with a
    # label (a train split may hold unlabelled nodes), the loss's and accuracy's denominator
    loss_sum = correct = labelled = None
    seen = batches = 0
    wait = 0.0
    if partial is not None:
        loss_sum = torch.tensor(partial["loss_sum"], dtype=torch.float64, device=device)
        correct = torch.tensor(partial["correct"], dtype=torch.int64, device=device)
        lab0 = partial.get("labelled", partial["seen"])  # (older checkpoints: all seeds, as then)
        labelled = torch.tensor(lab0, dtype=torch.int64, device=device)
        seen, batches, wait = partial["seen"], start, partial["wait"]
        counted = None if partial["counted"] is None else BatchCount(partial["counted"])
    timer = ComputeTimer(device)
    num_batches = loader.order.num_batches if hasattr(loader, "order") else None
    pb = bar(num_batches, f"epoch {epoch}", "batch", enabled=cfg.progress)
    t_start = time.perf_counter()
    it = iter(loader.epoch(epoch, start) if start else loader.epoch(epoch))
    try:
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - t0
            logits, loss = step(model, opt, batch, timer)
            y = batch.labels
            b = int(y.shape[0])
            sums = step.sums() if hasattr(step, "sums") else None  # (--cuda-graph: in the graph)
            if sums is None:
                lab = y >= 0
                batch_labelled = lab.sum()
                batch_loss = loss.double() * batch_labelled  # (the mean over them, x their count)
                batch_correct = ((logits.argmax(dim=1) == y) & lab).sum()
            else:  # static outputs of the graph: the next replay overwrites them, so add only
                batch_loss, batch_correct, batch_labelled = sums
            loss_sum = batch_loss.clone() if loss_sum is None else loss_sum + batch_loss
            correct = batch_correct.clone() if correct is None else correct + batch_correct
            labelled = batch_labelled.clone() if labelled is None else labelled + batch_labelled
            seen += b
            batches += 1
            c = batch.meta.get("counted") if counted is not None else None
            if c is None or counted is None:  # (c is None when counted is)
                counted = None  # a loader that does not count per batch: the epoch's diff below
            else:
                counted.add(c)
            if device.type == "cpu" and not math.isfinite(float(loss)):  # cheap on a CPU
                _non_finite(epoch, batches - 1, float(loss))
            every = cfg.checkpoint_every or 0
            if on_batch and batches % every == 0 and batches < (num_batches or batches + 1):
                on_batch(epoch, batches, {
                    "loss_sum": float(loss_sum), "correct": int(correct), "seen": seen,
                    "labelled": int(labelled),
                    "wait": wait, "counted": None if counted is None else counted.resolve(),
                    "store_mark": batch.meta.get("store_mark")})  # fmt: skip
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
    compute = timer.total_s()
    epoch_time = time.perf_counter() - t_start
    stages = stage_seconds(getattr(loader, "stats", None))
    if loss_sum is not None and not math.isfinite(float(loss_sum)):  # a GPU run: per epoch
        _non_finite(epoch, None, float(loss_sum))
    counters = (
        counted.resolve()
        if counted is not None
        else _counter_diff(store.counters.snapshot(), before)
    )
    breakdown = {**stages, "compute": compute, "wait": wait}
    n_lab = 0 if labelled is None else int(labelled)
    return {
        "epoch": epoch,
        # over the labelled seeds (all of them in most datasets)
        "loss": float(cast(torch.Tensor, loss_sum)) / n_lab if n_lab else 0.0,
        "train_acc": int(cast(torch.Tensor, correct)) / n_lab if n_lab else 0.0,
        "batches": batches,
        "seeds": seen,
        "epoch_time_s": epoch_time,
        "seeds_per_s": seen / epoch_time if epoch_time > 0 else 0.0,
        "breakdown_s": breakdown,
        "hidden_fraction": hidden_fraction(breakdown),
        "bytes_by_tier": counters["bytes"],
        "rows_by_tier": counters["rows"],
    }
