"""The options of a training run (:class:`TrainConfig`, the ``gnnio train`` flags), their
validation (one-line :class:`~gnnio.errors.UsageError` naming the option) and the device check."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UsageError
from ..utils.heap import HEAP_MODES
from .config_dist import (
    DEFAULT_BUFFER,
    DIST_STRATEGIES,
    MAX_RANKS_PER_CORE,
    PARTITION_STRATEGIES,
    validate_dist,
)
from .device import check_device
from .model_names import EDGE_WEIGHT_NORMS, FEATURE_NORMS, MODELS

#: the largest --lr and --weight-decay: far above any useful value and clear of float32's
#: overflow inside the optimizer (Adam divides lr by its bias correction)
MAX_RATE = 1e9

__all__ = [
    "DIST_STRATEGIES",
    "MAX_RANKS_PER_CORE",
    "PARTITION_STRATEGIES",
    "EVAL_MODES",
    "STAGES",
    "SAMPLERS",
    "STORE_KINDS",
    "TrainConfig",
    "check_device",
]

EVAL_MODES = ("sampled", "full")
#: training samplers (``--sampler``): node-wise uniform, LABOR-0, layer-wise LADIES
SAMPLERS = ("uniform", "labor", "ladies")
STORE_KINDS = ("memory", "mmap", "disk")
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
        edge_weight_norm: SAGE over HT weights: ``"mean"`` their Hajek ratio (consistent, not
            unbiased), ``"sum"`` the HT mean with ``1/(deg q)`` weights (unbiased).
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` accepted); where the model runs. ``"auto"``
            (the CLI's default): CUDA when present, else the CPU; on a GPU with no layout option
            given, the layout is planned from free GPU memory (:mod:`gnnio.train.gpu_plan`).
        seed: seeds the model init and dropout (``torch.manual_seed``, i.e. torch's global
            generator), the seed order and the sampler (evaluation sampler: ``seed + 1``).
        eval: ``"sampled"`` (default) or ``"full"`` (module docstring says why).
        eval_batch_size: seeds per evaluation batch (sampled) or nodes per chunk (full);
            None = ``max(batch_size, 4096)``.
        patience: stop after this many epochs without a better valid accuracy; None = never.
        checkpoint: path for the best model's ``state_dict`` (``torch.save``); None = not saved.
        checkpoint_dir: directory for resumable checkpoints, written at the end of every epoch
            (:mod:`gnnio.train.checkpoint`; the newest two kept); None = none. One that already
            holds checkpoints is refused unless ``resume`` names it (the run continues them).
        checkpoint_every: also write one every this many batches within an epoch; None = only
            at epoch ends.
        resume: a ``checkpoint_dir`` to continue from (its newest complete checkpoint); the run
            then ends exactly as the uninterrupted one would. Checkpoints keep going there unless
            ``checkpoint_dir`` names another directory.
        summary: path for the summary JSON; None = not written.
        log: path for the JSONL log (one line per epoch); None = not written.
        store: feature store kind, ``"memory"`` (features read into host RAM) or ``"mmap"`` (rows
            read from the memory-mapped file on every gather); either way the loader copies each
            batch's rows to ``device``. ``"disk"`` (``--features-on disk``): rows read with
            ``O_DIRECT`` under a host cache of ``host_cache_size`` (:mod:`gnnio.train.setup_disk`;
            ``cache_policy`` is then that cache's policy).
        threads: CPU threads of the sampler and of the feature gather kernel; None = their defaults.
        heap: ``"auto"`` (default: ``"keep"`` when the model trains on the CPU in one process,
            features not on disk),
            ``"keep"`` (glibc keeps freed memory for the next batch, process-wide:
            :func:`gnnio.utils.heap.keep_heap`) or ``"system"``; the summary's ``heap`` says
            what held.
        isolation: ``"off"`` (default) or ``"auto"``: BGL's profiling-based resource isolation
            (:mod:`gnnio.train.isolate`): the sample, gather and (on the CPU) compute stages are
            profiled against their threads and given the allocation that minimizes the slowest;
            recorded in the summary under ``isolation`` (stage -> threads).
        cuda_graph: what replays as CUDA graphs: ``"off"`` (default: not yet measured on a
            GPU), ``"step"`` (the training step, batches padded to fixed sizes:
            :mod:`gnnio.train.graphed`; one process), ``"sampler"`` (the GPU sampler's batch:
            :mod:`gnnio.sampling.gpu_graphed`) or ``"all"`` (both; ``True`` means this).
        sampler_device: ``"cpu"`` (the numba sampler), ``"cuda"`` (the uniform -- pruned and
            locality-aware too --, LABOR-0 or LADIES (locality-aware too) sampler runs on the
            training GPU inside the loader, on its own stream:
            :mod:`gnnio.sampling.gpu` and its subclasses) or ``"auto"``
            (default: ``cuda`` when training on a GPU with one of those samplers and the CSR --
            with the locality-aware sampler's member index -- takes at most a quarter of the
            free GPU memory, else ``cpu``).
        graph_in: with ``sampler_device="cuda"``: ``"gpu"`` (the CSR copied to the GPU),
            ``"host"`` (UVA sampling: the CSR pinned in host memory and read zero-copy, never
            copied) or ``"auto"`` (gpu when it takes at most a quarter of the free GPU memory).
        prefetch: batches the loader prepares ahead.
        stall_timeout: seconds the training loop waits for one batch before the run ends with
            one line naming the stuck loader stage (:class:`~gnnio.pipeline.loader.LoaderStall`).
        progress: show tqdm progress bars (stderr).
        gpu_cache_fraction: None = no tiering; else keep this fraction of the feature rows (the
            hottest by ``score``) in the GPU tier of a
            :class:`~gnnio.features.tiers.tiered.TieredFeatureStore` and read the rest from (pinned) host
            memory; simulated GPU tier without CUDA. ``bytes_by_tier`` then has ``gpu`` and
            ``host``.
        gpu_budget_bytes: cap on the GPU tier's bytes (hot rows clamped to fit); None = no cap.
        score: hotness score ranking the rows for tiering and for a static cache (a key of
            :data:`gnnio.preprocess.hotness.SCORES`, default ``wrpr``).
        placement: a placement file from ``gnnio plan --save``: features are read through a
            :class:`~gnnio.features.tiers.multidevice.MultiDeviceFeatureStore` as GPU ``reader``
            (tiers ``local``, ``peer``, ``host``). Exclusive with ``gpu_cache_fraction``.
        reader: which GPU of the placement this run trains on (0-based).
        cache_policy: ``none`` or a :class:`~gnnio.features.caches.cache.FeatureCache` policy
            (``static``, ``fifo``, ``lru``, ``lfu``, ``lookahead``) in front of the store (tier
            ``cache``).
        cache_size: cache rows as a fraction of the nodes (``0.1`` = 10 %).
        cpu_cache_size: with a dynamic ``cache_policy``: a second cache level of this fraction
            in host memory below the first (BGL's two-level GPU + CPU cache, same policy); the
            first level lives on the training device (simulated in host memory on a CPU).
        lookahead: ``cache_policy="lookahead"``: batches the loader announces ahead (Belady's MIN
            over them, :mod:`gnnio.features.caches.lookahead`); 0 = the frequency fallback alone.
        order: training seed order: ``random`` (seeded shuffle each epoch) or ``po`` (BGL's
            proximity-aware order, :class:`~gnnio.ordering.po.ProximityOrder`).
        po_sequences: number of BFS sequences of the ``po`` order; None = chosen from the
            shuffling-error bound.
        sampler: ``uniform`` (node-wise, GraphSAGE), ``labor`` (LABOR-0,
            :class:`~gnnio.sampling.LaborSampler`: same fanouts, fewer distinct input nodes) or
            ``ladies`` (layer-wise, :class:`~gnnio.sampling.LadiesSampler`: ``layer_size`` nodes
            expected per hop, ``len(fanouts)`` hops; the fanout values are not used).
        layer_size: LADIES nodes per layer (Song & Jiang: 8192).
        importance_sampling: ``sampler="labor"``: LABOR-i's fixed-point steps (0 = LABOR-0;
            :class:`~gnnio.sampling.LaborSampler`; on the GPU too).
        locality_scale: None = no locality; a number ``s >= 1`` = Song & Jiang's
            locality-aware sampling (:class:`~gnnio.sampling.LocalitySampler`) with that fixed
            scale; ``"auto"`` = Algorithm 2 adapts ``s`` after every epoch from the data-loading
            share (:class:`~gnnio.sampling.AdaptiveScale`, lt 0.15, ut 0.2, MAXS 8). Needs a
            GPU-resident set: ``gpu_cache_fraction``, ``placement`` or a ``static`` cache, or,
            on a GPU with none of the layout options, the planned hot rows
            (:mod:`gnnio.train.gpu_plan`).
            With ``sampler="ladies"`` it applies Eq. 8 to the layer distribution
            (:class:`~gnnio.sampling.LocalityLadiesSampler`); ``labor`` does not take it.
        locality_max_scale: MAXS of ``auto``.
        locality_compute_s: for ``auto`` without a GPU: the compute seconds per epoch that the
            *modeled* loading share assumes (None = the measured CPU compute time, which makes
            the share small, so Algorithm 2 tends to stop at ``s = 1``).
        prune_threshold: None, or ``(alpha, beta)`` of HyDRA's threshold pruning: a node with more
            than ``alpha * avg_degree + beta * fanout`` neighbours samples from a random contiguous
            window of that length of its neighbour list.

    Several ranks (``gnnio train --nproc N`` or ``torchrun``; :mod:`gnnio.distributed`):

    Attributes:
        nproc: local processes to start (1 = this process only; ignored under ``torchrun``).
        topology: NVLink groups of the ranks (``gnnio plan``'s strings); None = one group per
            machine.
        dist_timeout: seconds a rendezvous or a collective may wait before the run fails;
            None = :data:`gnnio.distributed.context.DEFAULT_TIMEOUT_S`.
        placement_strategy: the placement computed at start-up on rank 0 and broadcast
            (``alg1``, ``interleaved``, ``mod``, ``rule1``, ``metis``, ``naive``, ``random``) when
            no ``placement`` file is given; default ``alg1``.
        buffer: rows each rank holds, as a fraction of the nodes (``placement_strategy``).
        local_seeds: each rank trains on the training nodes of its own partition (partitioning
            strategies: ``metis``, ``naive``, ``random``, or a file with parts) instead of a slice
            of one global shuffle.
        reuse: HyDRA cross-batch reuse: rows fetched for the previous batch are not fetched again.
        reuse_level: ``gpu`` (a rank's own previous batch) or ``machine`` (also HyDRA's
            intra-machine level: an NVLink group reads each host row once; ``group_reuse.py``).
        partition: a ``gnnio partition`` directory: every rank holds only its shard of the
            topology and samples across ranks (:mod:`gnnio.distributed.sampling`); with ``local_seeds``
            each rank trains on the training nodes its part owns.
        sampling_mode: ``dsp`` (request/response) or ``shared`` (HyDRA memory sharing) with a
            ``partition``.
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
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    resume: str | None = None
    summary: str | None = None
    log: str | None = None
    store: str = "memory"
    threads: int | None = None
    heap: str = "auto"
    isolation: str = "off"
    cuda_graph: str | bool = "off"
    sampler_device: str = "auto"
    graph_in: str = "auto"
    prefetch: int = 2
    stall_timeout: float = 600.0
    progress: bool = True
    gpu_cache_fraction: float | None = None
    gpu_budget_bytes: int | None = None
    score: str = "wrpr"
    placement: str | None = None
    reader: int = 0
    cache_policy: str = "none"
    cache_size: float = 0.1
    cpu_cache_size: float = 0.0
    host_cache_size: float | None = None
    lookahead: int = 8
    order: str = "random"
    po_sequences: int | None = None
    sampler: str = "uniform"
    layer_size: int = 8192
    importance_sampling: int = 0
    locality_scale: float | str | None = None
    locality_max_scale: float = 8.0
    locality_compute_s: float | None = None
    prune_threshold: tuple[float, float] | None = None
    nproc: int = 1
    topology: str | None = None
    dist_timeout: float | None = None
    placement_strategy: str | None = None
    buffer: float = DEFAULT_BUFFER
    local_seeds: bool = False
    partition: str | None = None
    sampling_mode: str = "dsp"
    reuse: bool = True
    reuse_level: str = "gpu"

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    @property
    def eval_bs(self) -> int:
        """Seeds per evaluation batch: ``eval_batch_size``, else ``max(batch_size, 4096)``."""
        return self.eval_batch_size or max(self.batch_size, 4096)

    def validate(self, world_size: int = 1) -> None:
        """Raise :class:`~gnnio.errors.UsageError` (one line, naming the option) on a bad value.

        ``world_size``: ranks of the run (with several, the placement is always there, so it is
        the GPU-resident set of ``locality_scale``); :meth:`validate_dist` checks the rest."""
        if self.model not in MODELS:
            raise UsageError(
                f"--model: unknown model '{self.model}' (choose from {', '.join(MODELS)})"
            )
        from ..sampling.uniform import check_fanouts

        try:
            check_fanouts(self.fanouts)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--{e}") from None
        for name in ("batch_size", "epochs", "hidden", "heads", "prefetch"):
            if int(getattr(self, name)) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')}: must be >= 1, got {getattr(self, name)}"
                )
        if not (self.stall_timeout > 0 and math.isfinite(self.stall_timeout)):
            raise UsageError(f"--stall-timeout: must be > 0 seconds, got {self.stall_timeout}")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise UsageError(f"--eval-batch-size: must be >= 1, got {self.eval_batch_size}")
        if not (0 < self.lr <= MAX_RATE):
            raise UsageError(f"--lr: must be in (0, 1e9], got {self.lr}")
        if not 0 <= self.weight_decay <= MAX_RATE:
            raise UsageError(f"--weight-decay: must be in [0, 1e9], got {self.weight_decay}")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"--dropout: must be in [0, 1), got {self.dropout}")
        if self.eval not in EVAL_MODES:
            raise UsageError(f"--eval: must be one of {', '.join(EVAL_MODES)}, got '{self.eval}'")
        if self.store not in STORE_KINDS:
            raise UsageError(
                f"--store: must be one of {', '.join(STORE_KINDS)}, got '{self.store}'"
            )
        from .setup_disk import check_disk_options

        check_disk_options(self, world_size)
        if self.feature_norm not in FEATURE_NORMS:
            raise UsageError(f"--feature-norm: must be one of {', '.join(FEATURE_NORMS)}")
        if self.edge_weight_norm not in EDGE_WEIGHT_NORMS:
            raise UsageError(f"--edge-weight-norm: must be one of {', '.join(EDGE_WEIGHT_NORMS)}")
        if self.edge_weight_norm == "sum" and self.model != "sage":
            raise UsageError(f"--edge-weight-norm sum: applies to --model sage, not {self.model}")
        if self.patience is not None and self.patience < 1:
            raise UsageError(f"--patience: must be >= 1, got {self.patience}")
        if self.seed < 0:
            raise UsageError(f"--seed: must be >= 0, got {self.seed}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--threads: must be >= 1, got {self.threads}")
        if self.isolation not in ("auto", "off"):
            raise UsageError(f"--isolation: must be auto or off, got '{self.isolation}'")
        if self.heap not in HEAP_MODES:
            raise UsageError(f"--heap: must be auto, keep or system, got '{self.heap}'")
        from .graphed import CUDA_GRAPH_MODES, graph_mode

        if (mode := graph_mode(self)) not in CUDA_GRAPH_MODES:
            raise UsageError(f"--cuda-graph: one of {', '.join(CUDA_GRAPH_MODES)}, got '{mode}'")
        self._validate_sampler_device()
        self._validate_data_options(world_size)
        self._validate_checkpoints(world_size)
        check_device(self.device)

    def _validate_checkpoints(self, world_size: int) -> None:
        from ..utils.outputs import check_output_path, dataset_dir_of

        seen: dict[str, str] = {}  # real path -> the option that writes it
        for option, path in (("--summary", self.summary), ("--log", self.log),
                             ("--checkpoint", self.checkpoint)):  # fmt: skip
            if path is not None:
                check_output_path(path, option)
                if (other := seen.setdefault(os.path.realpath(path), option)) != option:
                    raise UsageError(f"{option} {path}: the file {other} writes; give each its own")
        for option, d in (("--checkpoint-dir", self.checkpoint_dir), ("--resume", self.resume)):
            ds = dataset_dir_of(os.path.realpath(f"{d}/x")) if d is not None else None
            if ds is not None:
                raise UsageError(f"{option} {d}: inside the dataset directory {ds}; use another")
        every = self.checkpoint_every
        if every is not None and every < 1:
            raise UsageError(f"--checkpoint-every: must be >= 1 batches, got {every}")
        if every is not None and self.checkpoint_dir is None and self.resume is None:
            raise UsageError("--checkpoint-every: needs --checkpoint-dir C (or --resume C)")
        if every is not None and self.cache_policy not in ("none", "static"):
            raise UsageError(
                f"--checkpoint-every: not with --cache-policy {self.cache_policy} (the cache "
                "runs ahead of training within an epoch); epoch-end checkpoints keep it exact"
            )

    def _validate_data_options(self, world_size: int = 1) -> None:
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
        if self.placement is not None and not os.path.isfile(self.placement):
            # (here, before the features are read; read_fields checks the file's contents)
            raise UsageError(f"{self.placement}: placement file not found")
        if self.reader < 0:
            raise UsageError(f"--reader: must be >= 0, got {self.reader}")
        if self.cache_policy not in CACHE_POLICIES:
            raise UsageError(
                f"--cache-policy: must be one of {', '.join(CACHE_POLICIES)}, "
                f"got '{self.cache_policy}'"
            )
        if not (math.isfinite(self.cache_size) and 0.0 <= self.cache_size <= 1.0):
            raise UsageError(f"--cache-size: must be a fraction in [0, 1], got {self.cache_size}")
        c2 = self.cpu_cache_size
        if not (math.isfinite(c2) and 0.0 <= c2 <= 1.0):
            raise UsageError(f"--cpu-cache-size: must be a fraction in [0, 1], got {c2}")
        if c2 > 0 and self.cache_policy not in ("fifo", "lru", "lfu", "static"):
            raise UsageError(
                "--cpu-cache-size: needs --cache-policy fifo, lru, lfu or static (a lookahead "
                f"level below another sees only its misses), got '{self.cache_policy}'"
            )
        if not 0 <= self.lookahead <= 4096:
            raise UsageError(f"--lookahead: must be in [0, 4096] batches, got {self.lookahead}")
        if self.order not in ORDERS:
            raise UsageError(f"--order: must be one of {', '.join(ORDERS)}, got '{self.order}'")
        if self.po_sequences is not None and self.po_sequences < 1:
            raise UsageError(f"--po-sequences: must be >= 1, got {self.po_sequences}")
        if self.sampler not in SAMPLERS:
            raise UsageError(
                f"--sampler: must be one of {', '.join(SAMPLERS)}, got '{self.sampler}'"
            )
        if int(self.layer_size) < 1:
            raise UsageError(f"--layer-size: must be >= 1, got {self.layer_size}")
        i = self.importance_sampling
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise UsageError(f"--importance-sampling: must be an integer >= 0, got {i!r}")
        if i > 0 and self.sampler != "labor":
            raise UsageError(
                f"--importance-sampling: works with --sampler labor, not {self.sampler}"
            )
        if self.sampler != "uniform" and self.prune_threshold is not None:
            raise UsageError(f"--prune-threshold: works with --sampler uniform, not {self.sampler}")
        unweighted = self.sampler == "uniform" and self.locality_scale is None
        if self.edge_weight_norm == "sum" and unweighted:
            raise UsageError("--edge-weight-norm sum: the uniform sampler gives no edge weights; "
                             "use it with --sampler labor|ladies or --locality-scale")  # fmt: skip
        if self.sampler == "labor" and self.locality_scale is not None:
            raise UsageError("--locality-scale: works with --sampler uniform or ladies, not labor")
        from ..sampling.adaptive import MAX_SCALE

        ls = self.locality_scale
        if ls is not None and ls != "auto":
            if isinstance(ls, str) or not (1.0 <= ls <= MAX_SCALE):  # (the samplers' range)
                raise UsageError(
                    f"--locality-scale: must be a number in [1, 1e200] or 'auto', got {ls!r}"
                )
        if not (1.0 <= self.locality_max_scale <= MAX_SCALE / 2):  # (line 3 may double s past it)
            raise UsageError(
                "--locality-max-scale: must be a number in [1, 5e199], got "
                f"{self.locality_max_scale}"
            )
        if self.locality_compute_s is not None and not self.locality_compute_s > 0:
            raise UsageError(
                f"--locality-compute-s: must be > 0 seconds, got {self.locality_compute_s}"
            )
        from .gpu_plan import plans_layout

        if ls is not None and (
            world_size <= 1
            and self.gpu_cache_fraction is None
            and self.placement is None
            and self.cache_policy != "static"
            and not plans_layout(self, world_size)  # (on a GPU the plan's hot rows are B)
        ):
            raise UsageError(
                "--locality-scale: needs nodes held on the GPU; add --gpu-cache-fraction F, "
                "--placement FILE or --cache-policy static (or train on a GPU with no layout "
                "option: the planned hot rows)"
            )
        pt = self.prune_threshold
        if pt is not None:
            if len(pt) != 2 or not all(math.isfinite(float(v)) and float(v) >= 0 for v in pt):
                raise UsageError(
                    f"--prune-threshold: needs ALPHA,BETA (two numbers >= 0), got {pt!r}"
                )
            if max(float(v) for v in pt) > 1e9 or not any(float(v) > 0 for v in pt):
                raise UsageError(
                    "--prune-threshold: ALPHA and BETA must not both be 0 (an empty window) and "
                    f"at most 1e9 each, got {','.join(f'{float(v):g}' for v in pt)}"
                )

    def _validate_sampler_device(self) -> None:
        if self.sampler_device not in ("auto", "cpu", "cuda"):
            raise UsageError(
                f"--sampler-device: must be auto, cpu or cuda, got '{self.sampler_device}'"
            )
        if self.graph_in not in ("host", "gpu", "auto"):
            raise UsageError(f"--graph-in: must be host, gpu or auto, got '{self.graph_in}'")
        if self.sampler_device != "cuda":
            if self.graph_in != "auto":
                raise UsageError("--graph-in: only with --sampler-device cuda")
            return
        if not str(self.device).startswith("cuda"):
            raise UsageError("--sampler-device cuda: needs --device cuda")
        if getattr(self, "sampler", "uniform") not in ("uniform", "labor", "ladies"):
            raise UsageError(
                "--sampler-device cuda: the GPU samplers are the uniform, labor and ladies ones "
                "(--prune-threshold and --locality-scale too)"
            )

    def validate_dist(self, world_size: int) -> None:
        """Refuse, with one line naming the option, what makes no sense with several ranks
        (:func:`gnnio.train.config_dist.validate_dist`)."""
        validate_dist(self, world_size)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["fanouts"] = list(self.fanouts)
        d["num_layers"] = self.num_layers
        return d
