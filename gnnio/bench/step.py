"""``gnnio bench step DIR``: where each millisecond of a training batch goes, next to its floor.

It builds the run exactly as ``gnnio train`` does (same options: store, tiers, caches, sampler,
model, optimizer; :func:`gnnio.train.build.build_training`) and measures three passes over the
training order, after ``--warmup`` untimed batches (``warmup`` in the result):

1. **pipelined** (``ms_per_batch``): the real training loop, the loader's stages in their
   background threads and the step (:func:`gnnio.train.build.train_step`, or with ``--cuda-graph``
   its graph replay, :mod:`gnnio.train.graphed`) on the main thread;
   wall time per batch over ``--batches`` batches, the device synchronised once at the end.
   ``step_ms`` is the step alone as ``gnnio train`` times it (CUDA events on a GPU).
2. **sequential** (``breakdown``, ms per batch): the same work one part after another in one
   thread, each part timed on its own (CUDA events on the current stream on a GPU, the wall clock
   on the CPU): ``sample`` (the sampler's call, without its relabelling where that is a separate
   step), ``relabel`` (the GPU sampler's relabelling; 0 where the kernel fuses it into sampling, as
   the CPU sampler's does: ``relabel_fused`` says so), ``gather`` (the store, into a reused buffer
   as the loader does), ``transfer`` (host to device), ``forward`` (model and loss), ``backward``,
   ``optimizer``, and ``other`` (the batch's wall time minus the parts: Python, labels, waits).
   A few more batches, untimed (the counter's dispatch mode slows the host), count
   ``host_syncs_per_batch`` and ``ops_per_batch`` with :class:`gnnio.utils.syncs.OpCounter` (the
   torch operations that would synchronise a GPU with the host, per part in
   ``host_syncs_by_part``; on the CPU nothing really waits, and the numba kernels are not seen).
3. **profiled** (a GPU only): ``kernel_launches_per_batch`` from torch's profiler (the CUDA runtime's
   launch calls), in a separate pass so the profiler does not disturb the timings.
4. **synced** (a GPU only): ``cuda_syncs_per_batch`` and ``cuda_sync_sites`` (``"<thread>
   <file>:<line>"`` -> syncs per batch), the host synchronisations CUDA itself reports
   (``torch.cuda.set_sync_debug_mode``) in every thread of the real loop, the loader's included.

``floor_ms`` is what the batch's arithmetic and bytes would take at the device's own rates, both
measured in the same run (``floor``): the dense layers' FLOPs (forward, and twice that backward)
at the measured float32 matmul rate, plus the bytes of the gather and of the aggregation (rows
read and written, forward and backward) at the measured copy bandwidth. It is a floor, not a
prediction: real kernels reach neither rate. ``phases_s``: the run's wall time by part.
"""

from __future__ import annotations

import inspect
import time
from collections import Counter

import torch

from ..errors import UsageError
from ..features.base import ids_in_range
from ..utils.capture import device_sync
from ..utils.progress import bar
from ..utils.syncs import OpCounter
from . import KINDS

HELP = KINDS["step"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP

PARTS = ("sample", "relabel", "gather", "transfer", "forward", "backward", "optimizer", "other")


def add_arguments(p) -> None:
    from ..cli.train import add_train_arguments
    from ..utils.argtypes import int_range

    add_train_arguments(p)
    p._option_string_actions["--threads"].help += "; here torch's threads too (train leaves them)"
    p.add_argument("--batches", type=int_range(1), default=20, help="timed batches per pass")
    p.add_argument("--warmup", type=int_range(0), default=3, help="untimed batches ahead of a pass")
    p.add_argument(
        "--no-gpu-passes",
        action="store_true",
        help="skip passes 3 and 4 (a GPU only: kernel launches, CUDA's sync count); gpu-check "
        "runs bench step once per technique and needs only ms_per_batch and the breakdown",
    )


class _Clock:
    """Times consecutive parts of one thread's work: CUDA events on the current stream, or the
    wall clock on the CPU. ``mark(name)`` ends the part ``name`` begun at the previous mark."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.ms: Counter[str] = Counter()
        self._pending: list = []
        self._last = None

    def begin(self) -> None:
        self._last = self._now()

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def mark(self, name: str) -> None:
        now = self._now()
        if self.cuda:
            self._pending.append((name, self._last, now))
        else:
            self.ms[name] += (now - self._last) * 1e3
        self._last = now

    def collect(self) -> Counter:
        if self.cuda and self._pending:
            self._pending[-1][2].synchronize()
            for name, a, b in self._pending:
                self.ms[name] += a.elapsed_time(b)
            self._pending = []
        return self.ms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        device_sync(device)  # (the loader's thread may be capturing the sampler's graph)


def _batches(loader, start_epoch: int):
    """The loader's batches, epoch after epoch (benches may want more than one epoch has)."""
    epoch = start_epoch
    while True:
        got = False
        it = iter(loader.epoch(epoch))
        try:
            for b in it:
                got = True
                yield b
        finally:
            if hasattr(it, "close"):
                it.close()  # stops the loader's threads when the bench stops mid-epoch
        if not got:
            raise UsageError("bench step: the training split gives no batch")
        epoch += 1


def _seed_batches(order, n: int, epoch: int) -> list[tuple]:
    """``n`` (epoch, index, seeds) of the seed order, epoch after epoch from ``epoch``."""
    out: list[tuple] = []
    while len(out) < n:
        for i, s in enumerate(order.batches(epoch)):
            out.append((epoch, i, s))
            if len(out) == n:
                break
        epoch += 1
    return out


def pipelined(parts, device, warmup: int, k: int, progress: bool) -> dict:
    """Pass 1: the real loop (loader threads + step) over ``k`` batches after ``warmup``."""
    from ..train.timing import ComputeTimer

    parts.net.train()
    if hasattr(parts.step, "warmup"):  # --cuda-graph: its eager batches and the capture untimed
        warmup = max(warmup, parts.step.warmup + 2)
    it = _batches(parts.train_loader, 0)
    timer = ComputeTimer(device)
    with bar(warmup + k, "pipelined", "batch", enabled=progress) as pb:
        for _ in range(warmup):
            parts.step(parts.net, parts.opt, next(it))
            pb.update(1)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(k):
            parts.step(parts.net, parts.opt, next(it), timer)
            pb.update(1)
        _sync(device)
        wall = time.perf_counter() - t0
    it.close()
    return {"ms_per_batch": wall / k * 1e3, "step_ms": timer.total_s() / k * 1e3}


def _relabel_hook(sampler, clock_box: list):
    """Time the GPU sampler's relabelling inside ``sample`` through its ``phase_hook`` (it marks
    ``sample`` before each hop's relabelling and ``relabel`` after it,
    :mod:`gnnio.sampling.gpu`); None where there is none to time (the CPU sampler fuses it)."""
    inner = getattr(sampler, "_torch", None)
    if inner is None or not hasattr(inner, "phase_hook") or getattr(inner, "cuda_graph", False):
        return None  # (a batch replayed as a CUDA graph is one step: no relabel to time apart)
    inner.phase_hook = lambda phase: clock_box[0].mark(phase)
    return lambda: setattr(inner, "phase_hook", None)


def sequential(parts, device, warmup: int, k: int, progress: bool, counted: int = 5) -> dict:
    """Pass 2: one part after another, each timed; then ``counted`` more batches (untimed) with
    op and sync counts per part. Counting runs every torch op through a Python dispatch mode,
    which slows the host: inside the timed batches it had inflated forward + backward from 6.5
    to 8.4 ms per batch (H200 run of 2026-11-26, where the host paces the step)."""
    timed = _sequential(parts, device, warmup, k, progress, count=False)
    counts = _sequential(parts, device, 0, max(1, min(counted, k)), progress, count=True)
    for key in ("host_syncs_per_batch", "host_syncs_by_part", "sync_ops", "ops_per_batch"):
        timed[key] = counts[key]
    return timed


def _sequential(parts, device, warmup: int, k: int, progress: bool, count: bool) -> dict:
    """:func:`sequential`'s pass: timed (``count=False``) or counted."""
    import contextlib

    from ..features._gather import host_rows

    sampler, store, net, opt = parts.sampler, parts.store, parts.net, parts.opt
    keyed = "epoch_seed" in inspect.signature(sampler.sample).parameters
    seeds = _seed_batches(parts.order, warmup + k, 1)
    clock_box: list[_Clock | None] = [None]
    undo = _relabel_hook(sampler, clock_box)
    buf = None
    syncs: Counter[str] = Counter()
    sync_ops: Counter[str] = Counter()
    ops = 0
    wall = 0.0
    sizes = {"input_nodes": 0, "edges": 0}
    flops = membytes = 0.0
    total: Counter[str] = Counter()
    # a lookahead cache serves only the batches announced to it, in order (the loader announces
    # them from its gather thread): forget the window the pipelined pass left, announce each
    # batch just before its gather (a window of one batch)
    ahead = int(getattr(store, "lookahead", 0) or 0)
    if ahead:
        store.reset_window()
    net.train()
    try:
        name = "counted" if count else "sequential"
        with bar(warmup + k, name, "batch", enabled=progress) as pb:
            for n, (epoch, i, s) in enumerate(seeds):
                timed = n >= warmup
                clock = _Clock(device)
                clock_box[0] = clock
                counter = OpCounter()
                _sync(device)
                t0 = time.perf_counter()
                clock.begin()
                with counter if count else contextlib.nullcontext():
                    before = counter.syncs
                    mb = (
                        sampler.sample(s, epoch_seed=(epoch << 32) + i)
                        if keyed
                        else sampler.sample(s)
                    )
                    clock.mark("sample")
                    part_syncs = {"sample": counter.syncs - before}
                    ids = mb.input_nodes
                    rows = int(ids.shape[0])
                    if store.device.type == "cpu" and (buf is None or buf.shape[0] < rows):
                        buf = host_rows(max(rows, 1) * 5 // 4, store.dim, store.dtype)
                        if device.type == "cuda":
                            buf = buf.pin_memory()
                    before = counter.syncs
                    if ahead:
                        store.announce(ids)
                    with ids_in_range():  # the sampler's ids, as the loader's gather vouches
                        mb.x = store.gather(ids, out=None if store.device.type != "cpu" else buf)
                    mb.labels = parts.train_loader._labels_for(mb.seeds)  # as the loader does
                    clock.mark("gather")
                    part_syncs["gather"] = counter.syncs - before
                    before = counter.syncs
                    if mb.x.device != device or mb.blocks[0].edge_index.device != device:
                        mb = mb.to(device, non_blocking=True)
                    elif mb.labels is not None:
                        mb.labels = mb.labels.to(device, non_blocking=True)
                    clock.mark("transfer")
                    part_syncs["transfer"] = counter.syncs - before
                    before = counter.syncs
                    logits = net(mb.x, mb.blocks)
                    loss = torch.nn.functional.cross_entropy(logits, mb.labels, ignore_index=-1)
                    clock.mark("forward")
                    part_syncs["forward"] = counter.syncs - before
                    before = counter.syncs
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    clock.mark("backward")
                    part_syncs["backward"] = counter.syncs - before
                    before = counter.syncs
                    opt.step()
                    clock.mark("optimizer")
                    part_syncs["optimizer"] = counter.syncs - before
                _sync(device)
                dt = time.perf_counter() - t0
                ms = clock.collect()
                if timed:
                    wall += dt
                    total.update(ms)
                    ops += counter.ops
                    syncs.update(part_syncs)
                    sync_ops.update(counter.sync_ops)
                    sizes["input_nodes"] += rows
                    sizes["edges"] += sum(b.num_edges for b in mb.blocks)
                    f, m = batch_work(parts.model, mb, store.row_bytes)
                    flops += f
                    membytes += m
                pb.update(1)
    finally:
        if undo is not None:
            undo()
    breakdown = {p: total.get(p, 0.0) / k for p in PARTS if p != "other"}
    seq_ms = wall / k * 1e3
    breakdown["other"] = max(0.0, seq_ms - sum(breakdown.values()))
    return {
        "sequential_ms_per_batch": seq_ms,
        "breakdown": breakdown,
        "relabel_fused": undo is None,
        "host_syncs_per_batch": sum(syncs.values()) / k,
        "host_syncs_by_part": {p: v / k for p, v in syncs.items()},
        "sync_ops": dict(sync_ops),
        "ops_per_batch": ops / k,
        "input_nodes_per_batch": sizes["input_nodes"] / k,
        "edges_per_batch": sizes["edges"] / k,
        "flops_per_batch": flops / k,
        "bytes_per_batch": membytes / k,
    }


def batch_work(model, mb, row_bytes: int) -> tuple[float, float]:
    """``(flops, bytes)`` of one training step on ``mb`` (see module docstring): every
    ``nn.Linear`` of each layer on the rows it sees (the destinations for SAGE/GIN and for GCN
    where its ``lin`` goes after the product, the sources for GAT and for GCN where it goes
    first), forward + backward (3x); the gather's rows read and written, and each aggregation's
    edge rows read and destination rows written, forward and backward (2x), in float32."""
    flops = 0.0
    nbytes = 2.0 * int(mb.input_nodes.shape[0]) * row_bytes
    for layer, b in zip(getattr(model, "layers", []), mb.blocks):
        first = type(layer).__name__ == "GATLayer" or (
            type(layer).__name__ == "GCNLayer" and layer.transforms_first(b)
        )
        rows = b.num_src if first else b.num_dst
        width = None
        for m in layer.modules():
            if isinstance(m, torch.nn.Linear):
                flops += 3 * 2.0 * rows * m.in_features * m.out_features
                width = m.in_features if width is None else width
            elif type(m).__name__ == "Linear" and hasattr(m, "in_channels"):  # PyG's Linear
                flops += 3 * 2.0 * rows * m.in_channels * m.out_channels
                width = m.in_channels if width is None else width
        width = width or 0
        nbytes += 2 * 4.0 * (b.num_edges + b.num_dst) * width
    return flops, nbytes


def profiled(parts, device, k: int) -> float | None:
    """Pass 3 (CUDA only): kernel launches per batch of the pipelined loop, from the profiler."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    it = _batches(parts.train_loader, 2)
    parts.step(parts.net, parts.opt, next(it))
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(k):
            parts.step(parts.net, parts.opt, next(it))
        _sync(device)
    it.close()
    launches = sum(
        1
        for e in prof.events()
        if e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch"))
    )
    return launches / k


def sync_pass(parts, device, k: int) -> dict:
    """Pass 4 (CUDA only): the host synchronisations CUDA itself reports
    (:class:`~gnnio.utils.syncs.CudaSyncLog`) over ``k`` batches of the real loop, in every
    thread -- the training thread's and the loader's, which the op counter of pass 2 does not
    see -- by source line. The loader runs ahead of the step by its prefetch depth, so a few of
    the loader's are those of batches after the ``k``-th."""
    from ..utils.syncs import CudaSyncLog

    it = _batches(parts.train_loader, 3)
    parts.step(parts.net, parts.opt, next(it))
    _sync(device)
    try:
        with CudaSyncLog() as log:
            for _ in range(k):
                parts.step(parts.net, parts.opt, next(it))
    finally:
        it.close()
    _sync(device)
    return {
        "cuda_syncs_per_batch": log.count / k,
        "cuda_sync_sites": {where: n / k for where, n in log.sites.most_common(25)},
    }


def device_rates(device: torch.device) -> dict:
    """The device's float32 matmul rate and copy bandwidth, measured now."""
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    c = torch.empty(n, n, device=device)
    size = (256 << 20) if device.type == "cuda" else (64 << 20)
    src = torch.ones(size // 4, device=device)
    dst = torch.empty_like(src)

    def best(fn, reps=5):
        fn()
        _sync(device)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            ts.append(time.perf_counter() - t0)
        return min(ts)

    t_mm = best(lambda: torch.mm(a, b, out=c))
    t_cp = best(lambda: dst.copy_(src))
    return {
        "matmul_tflops": 2.0 * n**3 / t_mm / 1e12,
        "bandwidth_gb_per_s": 2.0 * size / t_cp / 1e9,
    }


def run(args) -> dict:
    from ..cli.train import config_from_args, refuse_epoch_options, refuse_ignored
    from ..graph.dataset import load
    from ..train import check_device
    from ..train.build import build_training
    from ..train.defaults import default_dataset
    from ..train.gpu_plan import apply_layout_plan
    from ..train.graphed import graph_report
    from ..train.isolate import isolate, restore
    from ..train.loop import LocalRun
    from ..utils.heap import apply_heap
    from ..utils.phases import Phases
    from ..utils.torch_threads import set_torch_threads
    from ..utils.triton_kernels import kernels_report, reset_kernel_record

    if args.nproc > 1:
        raise UsageError("bench step: one process (time a rank of --nproc with gnnio train)")
    refuse_ignored(args, 1)  # (an option without effect: one line, as gnnio train says it)
    refuse_epoch_options(args)
    cfg = config_from_args(args, 1)
    progress, cfg.progress = not args.quiet, False  # (this run's bars, not train's)
    device = check_device(cfg.device)
    cfg.validate(1)
    cfg.validate_dist(1)  # --partition, --topology, ...: several ranks' options, refused
    clock = Phases()  # (``phases_s``: where a run's wall time goes besides its timed batches)
    ds = default_dataset(progress=progress) if args.dir is None else load(args.dir, args.verify)
    ds = load(ds.path, verify=True) if args.dir is None and args.verify else ds  # (as train does)
    ds.require_labels("bench step times training batches, which need both (bench loader does not)")
    clock.mark("load")
    if cfg.threads:
        set_torch_threads(cfg.threads)
    reset_kernel_record()
    heap = apply_heap(cfg.heap, device.type, cfg.store)  # as gnnio train sets it
    build_cfg, plan = apply_layout_plan(ds, cfg, device)  # as gnnio train plans it
    parts = build_training(ds, build_cfg, LocalRun(), device)
    clock.mark("build")
    iso = undo = None
    if cfg.isolation == "auto":  # as gnnio train applies it (threads and core sets per stage)
        iso, undo = isolate(parts.sampler, parts.store, parts.model, parts.order, parts.labels,
                            device)  # fmt: skip
        clock.mark("isolate")
    try:
        rates = clock.run("rates", device_rates, device)
        k = args.batches
        pipe = clock.run("pipelined", pipelined, parts, device, args.warmup, k, progress)
        seq = clock.run("sequential", sequential, parts, device, args.warmup, k, progress)
        gpu_passes = device.type == "cuda" and not args.no_gpu_passes
        launches = profiled(parts, device, min(args.batches, 5)) if gpu_passes else None
        cuda_syncs = sync_pass(parts, device, min(args.batches, 10)) if gpu_passes else {}
        clock.mark("gpu_passes", when=gpu_passes)
    finally:
        if undo is not None:
            restore(undo, parts.sampler, parts.store)
        for ld in [parts.train_loader, *parts.eval_loaders.values()]:
            close = getattr(ld, "close", None)
            if callable(close):
                close()
    compute_ms = seq["flops_per_batch"] / (rates["matmul_tflops"] * 1e12) * 1e3
    memory_ms = seq["bytes_per_batch"] / (rates["bandwidth_gb_per_s"] * 1e9) * 1e3
    floor_ms = compute_ms + memory_ms
    return {
        "dataset": str(ds.path),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "model": cfg.model,
        "batch_size": cfg.batch_size,
        "fanouts": list(cfg.fanouts),
        "batches": args.batches,
        "warmup": args.warmup,  # (--cuda-graph: pass 1 also leaves its capture untimed)
        "ms_per_batch": pipe["ms_per_batch"],
        "step_ms": pipe["step_ms"],
        **seq,
        "kernel_launches_per_batch": launches,
        "cuda_syncs_per_batch": cuda_syncs.get("cuda_syncs_per_batch"),  # a GPU only
        "cuda_sync_sites": cuda_syncs.get("cuda_sync_sites"),
        "floor_ms": floor_ms,
        "floor": {"compute_ms": compute_ms, "memory_ms": memory_ms, **rates},
        "ms_per_batch_over_floor": pipe["ms_per_batch"] / floor_ms if floor_ms > 0 else None,
        "kernels": kernels_report(),
        "cuda_graph": graph_report(cfg, parts.step),
        "plan": plan,
        "heap": heap,
        "isolation": None if iso is None else iso.as_dict(),
        "sampler_device": str(getattr(parts.sampler, "device", "cpu")),
        "store": type(parts.store).__name__,
        "threads": torch.get_num_threads(),
        "phases_s": clock.phases,
        "simulated": device.type != "cuda",
    }
