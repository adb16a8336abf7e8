"""Data-parallel training on several ranks: the hooks :func:`gnnio.train.train` runs with.

:class:`DistRun` is :class:`gnnio.train.loop.LocalRun` for one rank of a torch.distributed run:

* **store**: a :class:`~gnnio.distributed.store.ShardedFeatureStore` over the placement (``--placement
  FILE`` from ``gnnio plan --save``, or ``--placement-strategy S --buffer B`` computed on rank 0
  and broadcast); host rows from the memory-mapped feature file (``--store mmap``, the default
  with ranks) or a per-rank copy in memory (``--store memory``), optionally behind a per-rank
  cache (``--cache-policy``; tier ``cache``; it serves host reads only, so every gather still
  takes part in the exchange); cross-batch reuse (``--reuse``, default on).
* **seeds**: one seeded global shuffle (or BGL's PO order) per epoch, cut into disjoint per-rank
  slices with the same number of batches on every rank (``equal_batches``: no seed is dropped or
  repeated; batch sizes differ by at most one), or with ``--local-seeds`` the training nodes of
  the rank's own partition, shuffled (or in PO order), in as many batches as the largest
  partition needs.
* **model**: wrapped in ``DistributedDataParallel`` (identical initial parameters: same seed, and
  DDP broadcasts rank 0's); a communication hook counts the gradient bytes handed to all-reduce.
* **evaluation**: each rank evaluates a slice of the valid/test seeds; correct and labelled counts
  are summed over ranks, so every rank reports the same accuracy (and early stopping agrees).
* **summary** (written by rank 0): ``world_size``, ``topology``, ``placement``, ``bytes_by_link``
  (``local``/``peer``/``host``/``network``, summed and ``per_rank``), ``feature_bytes_by_link``,
  ``gradient_bytes_by_link``, ``modeled_bytes_by_link`` (the cost model's rows for the same reads),
  per-rank stage times, collective seconds (NCCL: ``ddp.GradCounter``) and the share of the fetch
  the loader hid behind compute, ``rss_mb_peak_per_rank`` (each rank's peak resident memory, MiB,
  file pages it touched included; ``rss_mb_by_kind_per_rank`` splits its memory at the end into
  anonymous, file and shared pages), ``whole_graph_bytes_per_rank`` (the arrays a rank holds that
  are sized by the whole graph: the store's lookup and trace, the partition's owner of every node,
  a ``--cache-policy`` cache's maps). A rank holds the labels of its seeds only
  (:mod:`gnnio.distributed.labels`). ``heap_mmap_threshold_per_rank``: the size from which glibc
  maps each allocation and returns it when freed, fixed by every rank at 1 MiB
  (:func:`gnnio.utils.heap.limit_heap`; None where it does not apply).
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..ordering import RandomOrder
from ..placement import Placement
from ..preprocess.partition import Partition
from ..train.evaluate import evaluate_sampled_counts
from ..train.loop import LocalRun
from ..train.setup import StoreSetup
from ..utils.heap import limit_heap
from ..utils.rss import peak_rss_bytes, rss_by_kind
from ..utils.warnings_at import warn
from .context import DistContext
from .ddp import GradCounter, counting_allreduce, param_digest
from .group_reuse import level_info
from .hostcache import host_cache
from .hostrows import pread_rows_of
from .plan import LocalSeedsOrder, check_placement_file, get_placement, proximity_order
from .store import LINKS, ShardedFeatureStore, fault_from_env

__all__ = [
    "DistRun",
    "LocalSeedsOrder",
    "check_placement_file",
    "get_placement",
    "param_digest",
]


def cfg_partition(run) -> str:
    """The partition directory a run samples over (for the summary)."""
    return getattr(run, "partition_dir", "") or ""


class DistRun(LocalRun):
    """One rank's hooks (module docstring)."""

    def __init__(self, ctx: DistContext) -> None:
        # first: batch-sized blocks freed on the loader's threads leave glibc's arenas (heap.py)
        self.heap_threshold = limit_heap()
        self.ctx = ctx
        self.rank = ctx.rank
        self.world_size = ctx.world_size
        self.is_main = ctx.is_main
        self.grad = GradCounter(ctx.world_size, ctx)
        self.placement: Placement | None = None
        self._last = {"collective_s": 0.0, "grad_bytes": 0, "grad_s": 0.0}
        self._model: torch.nn.Module | None = None
        self.partition: Partition | None = None  # topology shards, when training with one
        self.samplers: list = []
        self._graph: tuple[int, int, list] | None = None  # (N, E, dirs) for GNNIO_MEM_CHECK
        self._censuses: list[str] = []

    # -- building -------------------------------------------------------------------------
    def build_store(self, ds, cfg, device):
        from ..features import open_store

        ctx = self.ctx
        pl = get_placement(ds, cfg, ctx)
        self.placement = pl
        self._graph = (
            ds.num_nodes,
            ds.num_edges,
            [ds.path, *([cfg.partition] * bool(cfg.partition))],
        )
        # host memory: the memory-mapped feature file (one copy per machine, in the page cache),
        # or with --store memory a private copy per rank
        base = open_store(ds, cfg.store, "cpu", num_threads=cfg.threads, progress=cfg.progress)
        info: dict[str, Any] = {
            "store": "mmap (every rank maps the dataset's feature file)"
            if cfg.store == "mmap"
            else "memory (every rank reads the features into its own host memory)"
        }
        host, cache_info = host_cache(ds, cfg, ctx, pl, base)
        if cache_info:
            info["cache"] = cache_info
        # the cache only serves the host reads: every gather still takes part in the exchange
        store = ShardedFeatureStore(host, pl, ctx, reuse=cfg.reuse and cfg.reuse_level)
        if cfg.reuse:  # (--reuse-level machine acts as gpu where it cannot hand rows over)
            info["reuse"] = level_info(ctx.topo, cfg.reuse_level)
            if "why" in info["reuse"] and ctx.is_main:
                warn(f"--reuse-level machine: acts as gpu here: {info['reuse']['why']}")
        store.fault = fault_from_env(ctx.rank)
        gpu_ids = torch.nonzero(store.dev_num >= 0).squeeze(1).numpy()  # its shard + peers'
        # evaluation: the same shard and exchange, without cross-batch reuse and, as in one
        # process, without a dynamic cache (evaluation batches do not evict training rows)
        eval_store = ShardedFeatureStore.__new__(ShardedFeatureStore)
        eval_store.__dict__.update(store.__dict__)
        eval_store.counters = type(store.counters)()
        eval_store.reuse, eval_store.trace, eval_store.fault = False, None, None
        eval_store.group_reuse = eval_store._prev_ids = eval_store._prev_rows = None
        eval_store.group = "eval_fetch"  # the evaluation loaders' gather thread (context.py)
        eval_store._buffers = {}
        eval_store.keep_log, eval_store._log = False, collections.deque(maxlen=store.LOG)
        eval_store._state_lock = threading.Lock()
        # a checkpoint within an epoch rewinds the store to the last batch trained on
        store.keep_log = bool(cfg.checkpoint_every) and bool(cfg.checkpoint_dir or cfg.resume)
        if host is not base and cfg.cache_policy != "static":  # below every dynamic cache
            eval_store.host_store = base
            eval_store._pread = pread_rows_of(base, cfg.threads)
        info["placement"] = {
            "file": cfg.placement,
            "strategy": pl.strategy,
            "num_devices": pl.num_devices,
            "buffer_rows": [int(len(b)) for b in pl.buffers],
            "prep_s": pl.prep_s,
            "simulated": ctx.simulated,
        }
        return StoreSetup(
            store=store, tiers=store.tiers, gpu_ids=gpu_ids, info=info, eval_store=eval_store
        )

    def _seed_parts(self):
        """The owner of every node for ``--local-seeds``: the topology's partition when there
        is one, else the placement's (None: neither has one)."""
        if self.partition is not None:  # the topology's partition decides who owns a seed
            return self.partition.parts
        return None if self.placement is None else self.placement.parts

    def build_labels(self, ds, cfg):
        """Only the labels of the seeds this rank may train (``--local-seeds``: its own) or
        evaluate on, read by ``pread``: no ``[N]`` array, nothing of the file mapped."""
        from .labels import read_seed_labels

        train, parts = np.asarray(ds.train_idx, dtype=np.int64), self._seed_parts()
        if cfg.local_seeds and parts is not None:
            train = train[np.asarray(parts)[train] == self.rank]
        return read_seed_labels(ds.labels, train, ds.valid_idx, ds.test_idx)

    def build_order(self, ds, cfg, seeds, labels, batch_size: int, seed: int):
        ctx = self.ctx
        seeds = np.asarray(seeds, dtype=np.int64)
        if cfg.local_seeds:
            parts = self._seed_parts()
            if parts is None:
                raise UsageError(
                    f"--local-seeds: placement '{getattr(self.placement, 'strategy', '?')}' has "
                    "no partition; use --placement-strategy metis|naive|random"
                )
            mine = seeds[np.asarray(parts)[seeds] == ctx.rank]
            counts = ctx.all_reduce_sum(
                [0.0] * ctx.rank + [float(mine.size)] + [0.0] * (ctx.world_size - ctx.rank - 1)
            )
            if min(counts) == 0:
                raise UsageError(
                    f"--local-seeds: rank {counts.index(0)}'s partition holds no training node"
                )
            nb = max(-(-int(c) // batch_size) for c in counts)
            inner = None
            if cfg.order == "po":  # BGL's order over the rank's own seeds
                inner = proximity_order(
                    ds, cfg, mine, labels, -(-mine.size // nb), seed, 0, 1, False
                )
            return LocalSeedsOrder(mine, batch_size, nb, seed=seed, order=inner)
        try:
            if cfg.order == "po":
                return proximity_order(
                    ds, cfg, seeds, labels, batch_size, seed, ctx.rank, ctx.world_size, True
                )
            return RandomOrder(
                seeds,
                batch_size,
                seed=seed,
                rank=ctx.rank,
                world_size=ctx.world_size,
                equal_batches=True,
            )
        except ValueError as e:  # too few seeds for the ranks, or batch size 1
            raise UsageError(f"--batch-size {batch_size} on {ctx.world_size} ranks: {e}") from None

    def eval_order(self, seeds, batch_size: int, seed: int):
        try:
            return RandomOrder(
                np.asarray(seeds, dtype=np.int64),
                batch_size,
                seed=seed,
                rank=self.ctx.rank,
                world_size=self.ctx.world_size,
                equal_batches=True,
            )
        except ValueError as e:
            raise UsageError(
                f"--eval-batch-size {batch_size} on {self.world_size} ranks: {e}"
            ) from None

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        dev = self.ctx.device
        self._model = model
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        ddp.register_comm_hook(self.grad, counting_allreduce)
        return ddp

    def _load_partition(self, ds, cfg):
        if self.partition is None and cfg.partition is not None:
            from ..preprocess.partition import load_partition

            # the launcher checked every shard before the ranks started; under torchrun each
            # rank checks the one it reads from its files (a peer's comes from the peer's memory)
            self.partition = load_partition(
                cfg.partition, ds, self.ctx.world_size, shards=[self.ctx.rank]
            )
        return self.partition

    def build_sampler(self, ds, cfg, fanouts, setup):
        if cfg.partition is None:
            return super().build_sampler(ds, cfg, fanouts, setup)
        from .sampling import ShardedSampler

        self.partition_dir = cfg.partition
        part = self._load_partition(ds, cfg)
        pt = cfg.prune_threshold
        prune = (float(pt[0]), float(pt[1])) if pt else None
        s = ShardedSampler(
            part, cfg.partition, self.ctx, fanouts, cfg.seed, cfg.sampling_mode, prune=prune,
            avg_degree=ds.num_edges / max(ds.num_nodes, 1),
        )  # fmt: skip
        self.samplers.append(s)
        return s, None

    def build_eval_sampler(self, ds, cfg, fanouts):
        if cfg.partition is None:
            return super().build_eval_sampler(ds, cfg, fanouts)
        from .sampling import ShardedSampler

        part = self._load_partition(ds, cfg)
        return ShardedSampler(
            part, cfg.partition, self.ctx, fanouts, cfg.seed + 1, cfg.sampling_mode,
            group="eval_sample", share_with=self.samplers[0] if self.samplers else None,
        )  # fmt: skip

    # -- per epoch ------------------------------------------------------------------------
    def evaluate(self, model, loaders: dict, epoch: int, bars: bool = False) -> dict[str, float]:
        names = list(loaders)
        counts: list[float] = []
        for k in names:
            c, t = evaluate_sampled_counts(model, loaders[k], epoch, f"eval {k}" if bars else None)
            counts += [float(c), float(t)]
        tot = self.ctx.all_reduce_sum(counts)
        return {k: tot[2 * i] / max(tot[2 * i + 1], 1.0) for i, k in enumerate(names)}

    def mean_over_ranks(self, value: float) -> float:
        return self.ctx.all_reduce_sum([float(value)])[0] / self.world_size

    def epoch_record(self, rec: dict[str, Any], setup) -> None:
        store = setup.store
        last = self._last
        coll = store.collective_s - last["collective_s"]
        gb = self.grad.bytes - last["grad_bytes"]
        gs = self.grad.seconds - last["grad_s"]
        last.update(
            collective_s=store.collective_s, grad_bytes=self.grad.bytes, grad_s=self.grad.seconds
        )
        if len(self._censuses) < 1:  # GNNIO_MEM_CHECK (tests): after the first epoch
            self._census("epoch", store)
        bd = rec["breakdown_s"]
        fetch = bd["gather"]
        rec["rank"] = self.rank
        rec["collective_s"] = coll
        rec["gradient_bytes"] = gb
        rec["gradient_allreduce_s"] = gs
        rec["fetch_hidden_share"] = max(0.0, 1.0 - bd["wait"] / fetch) if fetch > 0 else 1.0
        if self._model is not None:  # DDP's promise, checked: one digest per rank per epoch
            digests = self.ctx.all_gather_object(param_digest(self._model))
            rec["params_identical"] = len(set(digests)) == 1

    # -- checkpoints ----------------------------------------------------------------------
    def all_gather_object(self, obj) -> list:
        return self.ctx.all_gather_object(obj)

    def state_dict(self) -> dict[str, Any]:
        """This rank's counters of the epoch under way (gradient bytes and seconds handed to
        all-reduce since the epoch began: exact at any batch, DDP reduces within the step) and
        the partitioned sampler's traffic so far (it samples ahead of training: within an
        epoch it includes up to ``prefetch + 2`` batches sampled ahead)."""
        last = self._last
        out: dict[str, Any] = {
            "grad_bytes": int(self.grad.bytes - last["grad_bytes"]),
            "grad_s": float(self.grad.seconds - last["grad_s"]),
        }
        if self.samplers:
            smp = self.samplers[0]
            out["sampler_stats"] = {k: float(v) for k, v in smp.stats.items()}
            out["sampler_bytes"] = {k: int(v) for k, v in smp.bytes_by_link.items()}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.grad.bytes, self.grad.seconds = int(state["grad_bytes"]), float(state["grad_s"])
        self._last.update(grad_bytes=0, grad_s=0.0)
        if self.samplers and "sampler_stats" in state:
            smp = self.samplers[0]
            for k, v in state["sampler_stats"].items():
                smp.stats[k] = type(smp.stats.get(k, 0.0))(v)
            smp.bytes_by_link.clear()
            smp.bytes_by_link.update(state["sampler_bytes"])

    # -- summary --------------------------------------------------------------------------
    def _gradient_links(self, handed: int) -> dict[str, int]:
        """Gradient bytes this rank sends, as a ring all-reduce moves them (``2 (W-1) / W`` of
        the bytes handed to it), on the network when the ranks span machines, else peer links."""
        w = self.world_size
        sent = int(round(handed * 2 * (w - 1) / w))
        out = dict.fromkeys(LINKS, 0)
        out["network" if self.ctx.num_machines > 1 else "peer"] = sent
        return out

    def _census(self, when: str, store) -> None:
        """``GNNIO_MEM_CHECK=DIR`` (tests, :mod:`gnnio.distributed.memcheck`): what this rank
        holds that is sized by the whole graph, beside what it keeps on purpose."""
        from .memcheck import ENV, write_census

        self._censuses.append(when)
        if os.environ.get(ENV) and self._graph is not None:
            keep = [store.dev_num, store.buf_pos, store.trace, *self._node_arrays(store)]
            write_census(when, self.rank, self._graph[0], self._graph[1], keep, self._graph[2])

    def _node_arrays(self, store) -> list:
        """Arrays sized by the whole graph a rank keeps besides the store's lookup and trace
        (counted in ``whole_graph_bytes``): the partition book, a ``--cache-policy`` cache's
        maps (memcheck.node_arrays_of says why they stay)."""
        from .memcheck import node_arrays_of

        cache = node_arrays_of(store.host_store, store.num_rows)
        return cache + ([self.partition.parts] if self.partition is not None else [])

    def finish(self, summary: dict[str, Any], setup, model) -> dict[str, Any]:
        ctx, store = self.ctx, setup.store
        hist = summary["history"]
        feat = {t: int(summary["bytes_by_tier"].get(t, 0)) for t in LINKS}
        modeled_rows = store.modeled_rows()
        modeled = {t: int(round(r * store.row_bytes)) for t, r in modeled_rows.items()}
        grad_handed = sum(int(h.get("gradient_bytes", 0)) for h in hist)
        mine = {
            "rank": self.rank,
            "machine": ctx.machine,
            "feature_bytes_by_link": feat,
            "gradient_bytes_by_link": self._gradient_links(grad_handed),
            "gradient_bytes_handed": grad_handed,
            "modeled_bytes_by_link": modeled,
            "modeled_fetch_s": store.modeled_seconds(modeled_rows),
            "bytes_by_tier": {t: int(v) for t, v in summary["bytes_by_tier"].items()},
            "rows_by_tier": {t: int(v) for t, v in summary["rows_by_tier"].items()},
            "control_bytes": int(store.control_bytes),
            "breakdown_s": summary["breakdown_s"],
            "epoch_time_s": summary["epoch_time_s"],
            "collective_s": float(sum(h.get("collective_s", 0.0) for h in hist)),
            "gradient_allreduce_s": float(sum(h.get("gradient_allreduce_s", 0.0) for h in hist)),
            "fetch_hidden_share": float(
                np.mean([h.get("fetch_hidden_share", 1.0) for h in hist]) if hist else 1.0
            ),
            "batches_per_epoch": summary["batches_per_epoch"],
            "seeds_per_epoch": int(hist[0]["seeds"]) if hist else 0,
            "epochs": len(hist),  # the same on every rank: early stopping reads reduced accs
            # issue 26: the rank's peak resident memory, and the arrays it holds that are sized
            # by the whole graph (the store's lookup and trace, the partition's owner of each
            # node, a --cache-policy cache's maps)
            "rss_mb_peak": peak_rss_bytes() / 2**20,
            "rss_mb_by_kind": {k: v / 2**20 for k, v in rss_by_kind().items()},  # now
            "heap_mmap_threshold": self.heap_threshold,
            "whole_graph_bytes": int(store.lookup_bytes)
            + sum(int(a.nbytes) for a in self._node_arrays(store)),
        }
        if self.samplers:  # partitioned topology: the training sampler's traffic
            smp = self.samplers[0]
            b = max(smp.stats["batches"], 1)
            mine["sampling"] = {
                "bytes_by_link": {
                    t: int(smp.bytes_by_link.get(t, 0)) for t in ("local", "peer", "network")
                },
                "requests_per_batch": smp.stats["requests"] / b,
                "ms_per_batch": 1000 * smp.stats["seconds"] / b,
                "collective_s": smp.stats["collective_s"],
            }
        self._census("finish", store)
        ranks = ctx.all_gather_object(mine)
        if self.samplers:
            per, links = [r["sampling"] for r in ranks], ("local", "peer", "network")
            summary["partitioned_sampling"] = {
                "partition": str(cfg_partition(self)),
                "method": self.partition.method if self.partition is not None else None,
                "mode": self.samplers[0].mode,
                "bytes_by_link": {
                    **{t: sum(p["bytes_by_link"][t] for p in per) for t in links},
                    "per_rank": [p["bytes_by_link"] for p in per],
                },
                "requests_per_batch": float(np.mean([p["requests_per_batch"] for p in per])),
                "ms_per_batch": max(p["ms_per_batch"] for p in per),
                "scope": "training sampler only (evaluation excluded)",
            }

        def total(key: str) -> dict[str, Any]:
            d: dict[str, Any] = {t: sum(r[key][t] for r in ranks) for t in LINKS}
            d["per_rank"] = [r[key] for r in ranks]
            return d

        feat_t, grad_t = total("feature_bytes_by_link"), total("gradient_bytes_by_link")
        both = {t: feat_t[t] + grad_t[t] for t in LINKS}
        both["per_rank"] = [
            {t: r["feature_bytes_by_link"][t] + r["gradient_bytes_by_link"][t] for t in LINKS}
            for r in ranks
        ]
        tiers: dict[str, int] = {}
        rows: dict[str, int] = {}
        for r in ranks:
            for t, v in r["bytes_by_tier"].items():
                tiers[t] = tiers.get(t, 0) + v
            for t, v in r["rows_by_tier"].items():
                rows[t] = rows.get(t, 0) + v
        summary.update(
            world_size=ctx.world_size,
            num_machines=ctx.num_machines,
            topology=ctx.topology_spec,
            topology_inferred=ctx.inferred_topology,
            backend=ctx.backend,
            simulated_devices=ctx.simulated,
            placement=self.placement.strategy if self.placement is not None else None,
            bytes_by_link=both,
            feature_bytes_by_link=feat_t,
            gradient_bytes_by_link=grad_t,
            modeled_bytes_by_link=total("modeled_bytes_by_link"),
            bytes_by_link_scope=(
                "feature rows received per link during training passes (counted at the "
                "all_to_all buffers, the own shard and host reads; evaluation excluded) plus "
                "gradient all-reduce bytes (bucket bytes x 2(W-1)/W, the ring volume)"
            ),
            bytes_by_tier=tiers,
            rows_by_tier=rows,
            per_rank=ranks,
            rss_mb_peak_per_rank=[r["rss_mb_peak"] for r in ranks],
            rss_mb_by_kind_per_rank=[r["rss_mb_by_kind"] for r in ranks],
            heap_mmap_threshold_per_rank=[r["heap_mmap_threshold"] for r in ranks],
            whole_graph_bytes_per_rank=[r["whole_graph_bytes"] for r in ranks],
            collective_s=max(r["collective_s"] for r in ranks),
            seeds_per_epoch_per_rank=[r["seeds_per_epoch"] for r in ranks],
            epochs_per_rank=[r["epochs"] for r in ranks],
            params_identical=all(h.get("params_identical", True) for h in hist),
        )
        return summary
