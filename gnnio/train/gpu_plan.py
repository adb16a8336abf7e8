"""A GPU user's defaults: ``--device auto`` and the data layout planned from free GPU memory.

``--device auto`` (the CLI's default) trains on CUDA when a GPU is present, else on the CPU.

On a GPU with none of the placement options given (``--gpu-cache-fraction``, ``--placement``,
``--cache-policy``, ``--features-on disk``, ``--sampler-device``/``--graph-in`` left at
``auto``), :func:`plan_layout`
decides where the features and the topology live, from the dataset's sizes and the GPU's free
memory, in this order:

1. A reserve stays free for the model, activations and the allocator:
   ``max(1 GiB, 25 % of free)``; the rest is the *budget*.
2. Everything fits (features + CSR + the GPU sampler's scratch, 16 bytes per node): every row on
   the GPU (a tiered store with all rows hot) and the sampler on the GPU with the CSR there.
3. Else the CSR (+ scratch) fits in a quarter of the budget: the CSR on the GPU, the GPU sampler,
   and the hottest rows (by ``--score``) filling the rest of the budget; the others read zero-copy
   from pinned host memory (Data Tiering).
4. Else UVA sampling (the CSR pinned in host memory, read by the GPU sampler zero-copy) and the
   whole budget for hot rows; if even the scratch does not fit, the CPU sampler.

With ``--locality-scale`` (Song & Jiang) the planned hot rows are the sampler's set ``B``, so
``gnnio train --device cuda --locality-scale S|auto`` needs no layout option (on the CPU, or with
a layout option, B comes from ``--gpu-cache-fraction``, ``--placement`` or ``--cache-policy
static``: :meth:`~gnnio.train.TrainConfig.validate`). The sampler's member index (per layer a
pointer of ``N + 1`` int64 and the neighbours' positions in the layer's set, at most the ``|B|``
largest out-degrees' sum: :func:`~gnnio.train.setup.member_index_bytes`) lives beside the CSR,
so it is planned with it (``gpu_member_index_bytes``), sized at the hot rows of a first plan
without it (an upper bound: counting it can only shrink the hot rows). Where every row fits on
the GPU (or none does) there is no host row to avoid: the sampler samples as ``s = 1`` would, and
the plan's ``locality`` says so.

The plan is in the summary under ``plan``: tier sizes, sampler device, the reason, and
``modeled_load_s``: the host-to-GPU seconds per epoch *modeled* for the cold rows at the PCIe
bandwidth of gnnio's default topology (12 GB/s), with rows per batch measured on two batches of
the training sampler (uniform, LABOR-0 or LADIES; pruning and locality-aware sampling by their
base sampler) and the cold rows' share taken as uniform -- an upper bound, as hot rows are read more
often than cold ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ..placement.topology import DEFAULT_HOST_BW

__all__ = [
    "resolve_device",
    "plan_layout",
    "plans_layout",
    "apply_layout_plan",
    "SCRATCH_BYTES_PER_NODE",
]

GiB = 2**30
#: the GPU sampler's per-node scratch (two int64 maps of N + 1 entries, per sampling worker). Its
#: per-batch buffers, sized by the batch and the fanouts rather than N (~49 MB per set, two sets,
#: at 1024 seeds and fanouts 15,10,5: gpu_bounded), and the step's activations (or a captured
#: step's graph pool, --cuda-graph) come out of the reserve: a quarter of free memory, >= 1 GiB
SCRATCH_BYTES_PER_NODE = 16


def resolve_device(device: str, ranks: int = 1) -> str:
    """``"auto"`` -> ``"cuda"`` when CUDA has a GPU for each local rank, else ``"cpu"``; any other
    value is returned as given."""
    if device != "auto":
        return device
    if torch.cuda.is_available() and torch.cuda.device_count() >= max(1, ranks):
        return "cuda"
    return "cpu"


def plan_layout(
    feat_bytes: int,
    row_bytes: int,
    csr_bytes: int,
    num_nodes: int,
    free_bytes: int,
    workers: int = 1,
) -> dict:
    """The layout of the module docstring for these sizes (bytes) and ``free_bytes`` of GPU
    memory. Returns ``gpu_cache_fraction`` (0..1), ``sampler_device`` (``cuda``/``cpu``),
    ``graph_in`` (``gpu``/``host``), ``budget_bytes``, ``hot_rows``, ``gpu_feature_bytes``,
    ``gpu_csr_bytes`` and ``reason``. (Every sampler has a GPU implementation,
    :func:`~gnnio.train.setup.has_gpu_sampler`, so the plan never keeps one off the GPU for want of
    one.)"""
    reserve = max(GiB, free_bytes // 4)
    budget = max(0, free_bytes - reserve)
    scratch = SCRATCH_BYTES_PER_NODE * (num_nodes + 1) * max(1, workers)
    rows = feat_bytes // row_bytes if row_bytes else num_nodes
    plan: dict[str, Any] = {"free_gpu_bytes": int(free_bytes), "reserve_bytes": int(reserve)}
    plan["budget_bytes"] = int(budget)
    if feat_bytes + csr_bytes + scratch <= budget:
        hot, sampler, graph_in = rows, "cuda", "gpu"
        reason = "features, topology and sampler scratch all fit in the GPU budget"
    elif csr_bytes + scratch <= budget // 4:
        hot = (budget - csr_bytes - scratch) // max(row_bytes, 1)
        sampler, graph_in = "cuda", "gpu"
        reason = (
            "the features do not fit: the topology on the GPU (within a quarter of the budget), "
            "the hottest rows in the rest, the others zero-copy from pinned host memory"
        )
    elif scratch <= budget // 4:
        hot = (budget - scratch) // max(row_bytes, 1)
        sampler, graph_in = "cuda", "host"
        reason = (
            "the topology takes more than a quarter of the budget: UVA sampling (CSR in pinned "
            "host memory), the budget for the hottest rows"
        )
    else:
        hot = budget // max(row_bytes, 1)
        sampler, graph_in = "cpu", "gpu"
        reason = "even the GPU sampler's scratch does not fit: the CPU sampler"
    hot = int(max(0, min(hot, rows)))
    plan.update(
        gpu_cache_fraction=hot / rows if rows else 1.0,
        hot_rows=hot,
        gpu_feature_bytes=int(hot * row_bytes),
        gpu_csr_bytes=int(csr_bytes if (sampler == "cuda" and graph_in == "gpu") else 0),
        sampler_device=sampler,
        graph_in=graph_in,
        reason=reason,
    )
    return plan


def _user_chose_layout(cfg) -> bool:
    return (
        cfg.gpu_cache_fraction is not None
        or cfg.placement is not None
        or cfg.cache_policy != "none"
        or cfg.sampler_device != "auto"
        or cfg.graph_in != "auto"
        or cfg.store == "disk"  # --features-on disk: the SSD tier and its host cache were chosen
    )


def plans_layout(cfg, world_size: int = 1) -> bool:
    """Whether :func:`apply_layout_plan` will plan this run: CUDA (``--device auto`` where a GPU
    is present), one process, none of the layout options of the module docstring."""
    dev = str(resolve_device(cfg.device, world_size))
    return dev.startswith("cuda") and world_size <= 1 and not _user_chose_layout(cfg)


def apply_layout_plan(ds, cfg, device: torch.device, world_size: int = 1, free_bytes=None):
    """``(cfg to build from, plan dict)``: on a GPU, one process, no layout option given, a copy
    of ``cfg`` with :func:`plan_layout`'s choices; otherwise ``cfg`` itself and a plan that says
    why nothing was planned. ``free_bytes``: the GPU's free memory (None = ask CUDA)."""
    if device.type != "cuda":
        return cfg, {"planned": False, "reason": "no GPU: features in host memory, CPU sampler"}
    if world_size > 1:
        return cfg, {"planned": False, "reason": "several ranks: the placement decides"}
    if _user_chose_layout(cfg):
        return cfg, {"planned": False, "reason": "layout options given on the command line"}
    if free_bytes is None:
        free_bytes, _total = torch.cuda.mem_get_info(device)
    feats = ds.features
    row_bytes = int(np.dtype(feats.dtype).itemsize * (feats.shape[1] if feats.ndim > 1 else 1))
    feat_bytes = row_bytes * int(feats.shape[0])
    csr_bytes = np.asarray(ds.graph.indptr).nbytes + np.asarray(ds.graph.indices).nbytes
    plan = plan_layout(feat_bytes, row_bytes, csr_bytes, ds.num_nodes, int(free_bytes))
    member = _member_bytes(ds, cfg, plan)
    if member:  # (the locality-aware sampler's member index lives beside the CSR: plan both)
        plan = plan_layout(feat_bytes, row_bytes, csr_bytes + member, ds.num_nodes,
                           int(free_bytes))  # fmt: skip
        plan["gpu_member_index_bytes"] = member if plan["gpu_csr_bytes"] else 0
        if plan["gpu_csr_bytes"]:
            plan["gpu_csr_bytes"] -= member
    if getattr(cfg, "locality_scale", None) is not None:
        plan["locality"] = _locality_note(plan, ds.num_nodes)
    plan["planned"] = True
    plan["modeled_load_s"] = _modeled_load_s(ds, cfg, plan, row_bytes)
    new = dataclasses.replace(
        cfg,
        gpu_cache_fraction=plan["gpu_cache_fraction"],
        sampler_device=plan["sampler_device"],
        graph_in=plan["graph_in"] if plan["sampler_device"] == "cuda" else "auto",
    )
    return new, plan


def _locality_note(plan: dict, num_nodes: int) -> str:
    """What ``--locality-scale`` does with the planned hot rows as its set B."""
    hot = plan["hot_rows"]
    if hot >= num_nodes:
        return ("every row is on the GPU: no host row to avoid, so --locality-scale samples as "
                "s = 1 would (uniform weights), its member index kept")  # fmt: skip
    if hot == 0:
        return "no row fits on the GPU: B is empty, so --locality-scale samples as s = 1 would"
    return f"B = the {hot:,} planned hot rows: their neighbours are favoured (Song & Jiang)"


def _member_bytes(ds, cfg, plan: dict) -> int:
    """The locality-aware sampler's member index on the GPU (0 without ``--locality-scale``, or
    where the plan keeps the topology off the GPU: UVA sampling pins it in host memory), estimated
    as :func:`~gnnio.train.setup.member_index_bytes` does with ``B`` = the hot rows of ``plan``:
    planning again with it can only shrink ``B``, so the estimate stays an upper bound."""
    if getattr(cfg, "locality_scale", None) is None or plan["gpu_csr_bytes"] == 0:
        return 0
    from .setup import member_index_bytes

    return member_index_bytes(ds, dataclasses.replace(cfg, gpu_cache_fraction=max(
        plan["gpu_cache_fraction"], 1e-12)))  # fmt: skip


def _modeled_load_s(ds, cfg, plan: dict, row_bytes: int) -> float:
    """Cold rows' host-to-GPU seconds per epoch (module docstring: modeled, an upper bound)."""
    from ..sampling import LaborSampler, LadiesSampler, Sampler, UniformSampler

    seeds = np.asarray(ds.train_idx, dtype=np.int64)
    if seeds.size == 0:
        return 0.0
    fo, kind = [int(f) for f in cfg.fanouts], getattr(cfg, "sampler", "uniform")
    s: Sampler
    if kind == "ladies":  # (its rows: about B + L K, whatever the fanouts' values)
        s = LadiesSampler(ds.graph, [int(cfg.layer_size)] * len(fo), seed=cfg.seed)
    elif kind == "labor":
        s = LaborSampler(ds.graph, fo, seed=cfg.seed, importance_sampling=cfg.importance_sampling)
    else:
        s = UniformSampler(ds.graph, fo, seed=cfg.seed)
    b = int(cfg.batch_size)
    rows = [int(s.sample(torch.from_numpy(seeds[i * b : (i + 1) * b])).input_nodes.shape[0])
            for i in range(min(2, -(-seeds.size // b)))]  # fmt: skip
    batches = -(-seeds.size // b)
    cold = 1.0 - plan["gpu_cache_fraction"]
    return float(np.mean(rows)) * batches * cold * row_bytes / DEFAULT_HOST_BW
