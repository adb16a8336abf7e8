"""The run summary of :func:`gnnio.train.train`: per-epoch records reduced to means and totals,
the data-loading share that drives Algorithm 2, and the facts of the sampler and seed order."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .config import STAGES, TrainConfig

__all__ = [
    "hidden_fraction",
    "loading_share",
    "order_info",
    "sampling_info",
    "simulation_facts",
    "stage_seconds",
    "summarize",
]


def summarize(ds, cfg, device, model, history, best_epoch, stopped_early, ckpt) -> dict[str, Any]:
    """The summary dict of :func:`train` from the per-epoch records."""
    from .models import count_parameters

    n = len(history)
    epoch_time = mean(h["epoch_time_s"] for h in history)
    breakdown = {st: mean(h["breakdown_s"][st] for h in history) for st in STAGES}
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
        "eval_time_s": mean(h["eval_s"] for h in history),
        "breakdown_s": breakdown,
        "data_loading_share": (breakdown["gather"] + breakdown["transfer"]) / epoch_time
        if epoch_time > 0
        else 0.0,
        "wait_share": breakdown["wait"] / epoch_time if epoch_time > 0 else 0.0,
        "hidden_fraction": hidden_fraction(breakdown),
        "seeds_per_s": num_train / epoch_time if epoch_time > 0 else 0.0,
        "batches_per_epoch": history[0]["batches"] if n else 0,
        "bytes_by_tier": bytes_total,
        "rows_by_tier": rows_total,
        "bytes_by_tier_scope": "feature rows gathered during training passes (evaluation excluded)",
        "feat_dtype": ds.feat_dtype,  # the rows every tier stores and moves (issue 25, item 4)
        "feature_codec_bytes": ds.feature_codec.bytes,  # int8 scale + zero point, moved once
        "device": str(device),
        "num_parameters": count_parameters(model),
        "num_train": num_train,
        "checkpoint": str(ckpt) if ckpt is not None else None,
        "loss_history": [h["loss"] for h in history],
        "history": history,
    }


def hidden_fraction(breakdown: dict[str, float]) -> float:
    """How much of the loading work was hidden behind compute: ``1 - wait / (sample + gather +
    transfer)``, clipped to ``[0, 1]``; 1.0 when there was no loading work. 0 = the training loop
    waited as long as loading took (no overlap), 1 = it never waited."""
    load = breakdown["sample"] + breakdown["gather"] + breakdown["transfer"]
    if load <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - breakdown["wait"] / load))


def simulation_facts(device: torch.device, info: dict[str, Any]) -> dict[str, Any]:
    """What of the run was simulated, said plainly: ``simulated`` is True on the CPU and whenever
    a GPU-side structure (GPU tier, placement devices, GPU cache) lived in host memory instead;
    ``simulated_parts`` names them. Bytes per tier are exact either way (they are what a GPU run
    moves); times of simulated parts are CPU times, not GPU times."""
    parts = []
    if device.type != "cuda":
        parts.append("device: training ran on the CPU")
    if info.get("tiering", {}).get("simulated"):
        parts.append("tiering: the GPU tier is held in CPU memory; 'host' rows are not PCIe reads")
    if info.get("placement", {}).get("simulated"):
        parts.append("placement: the placement's GPUs are simulated in CPU memory; 'local' and "
                     "'peer' rows are host reads")  # fmt: skip
    if info.get("cache", {}).get("device", "cpu") == "cpu" and "cache" in info:
        if "cpu_size" in info["cache"]:
            parts.append("cache: the two-level cache's GPU level is simulated in host memory")
        else:
            parts.append("cache: held in host memory (not on a GPU)")
    return {"simulated": bool(parts), "simulated_parts": parts}


def loading_share(rec: dict[str, Any], cfg: TrainConfig, device: torch.device):
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
        bt.get("gpu", 0) + bt.get("local", 0) + bt.get("cache", 0) + bt.get("gpu_cache", 0),
        compute_s=compute,
        peer_bytes=bt.get("peer", 0),
    )
    return share, "modeled"


def sampling_info(sampler, adaptive, history, cfg) -> dict[str, Any]:
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


def order_info(order) -> dict[str, Any]:
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


def mean(values) -> float:
    v = list(values)
    return float(np.mean(v)) if v else 0.0


def stage_seconds(stats) -> dict[str, float]:
    """``{sample, gather, transfer}`` seconds from the loader's last-epoch stats (a
    :class:`gnnio.pipeline.loader.LoaderStats`, or a plain dict keyed by stage name)."""
    out = {}
    for k in ("sample", "gather", "transfer"):
        v: Any
        if stats is None:
            v = 0.0
        elif isinstance(stats, dict):
            v = stats.get(k, stats.get(f"{k}_s", 0.0))
        else:
            v = getattr(stats, f"{k}_s", 0.0)
        out[k] = float(v)
    return out
