"""Pipelined mini-batch loader: seeds -> sample -> gather -> host-to-device transfer.

Each stage runs in its own background thread and hands batches on through a bounded queue, so
while the consumer (training) works on batch ``i``, the gather thread fills batch ``i+1`` and the
sampling thread(s) sample ``i+2``; as in BGL's and HyDRA's pipelines. The heavy work of every stage
(numba kernels, torch ops) releases the GIL, so the threads really overlap::

    order.batches(epoch) --> [sample worker k] --q_k--> [gather + transfer] --out_q--> consumer
       (seed tensors)        k = i % num_workers         (ring of buffers)    (prefetch)

Why threads and not processes: the stages share the graph, the feature store and the output
buffers without copies or pickling, and the kernels run outside the GIL anyway.

Buffer ring. Gathered rows are written into preallocated output buffers ("slots") rather than a
fresh tensor per batch: a fresh multi-MB allocation per batch page-faults on first touch, which
costs most of the gather bandwidth. ``prefetch + 2`` slots suffice: one held by the consumer, up to
``prefetch`` queued, one being filled. On the CPU the yielded ``batch.x`` *is* a slot, so
``batch.x`` stays valid until the consumer asks for the next batch (or the iterator closes) —
copy it (or pass ``reuse_buffers=False``) to keep it longer. On a GPU, slots are pinned host
memory that only stages the copy: ``batch.x`` is a fresh device tensor and may be kept freely.
A store that itself returns rows on the GPU (a CUDA tiered store or cache) gets no ring: it
allocates each batch's rows on its device, on the loader's side stream.
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
import warnings
import weakref
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..features.base import FeatureStore
from ..sampling.base import MiniBatch, Sampler
from ..utils.devices import resolve_device

__all__ = ["LoaderStats", "NodeLoader"]

_POLL_S = 0.05  # how often blocked threads look at the stop flag (latency of close(), not of data)
_JOIN_S = 30.0  # how long close() waits for a stage thread stuck in a user sampler/store call


@dataclass
class LoaderStats:
    """Per-epoch timings and counts of a :class:`NodeLoader` (seconds, wall-clock).

    Attributes:
        epoch: the epoch these figures belong to.
        complete: False if the iterator was closed (or failed) before the epoch ended.
        num_batches, num_seeds, num_input_nodes: batches delivered and their seed / input-node
            totals.
        sample_s: seconds spent in ``sampler.sample`` (summed over sampling workers, so with
            several workers it can exceed ``epoch_s``).
        gather_s: seconds spent in ``store.gather`` (and looking up labels).
        transfer_s: seconds spent copying batches to ``device`` (0 when it is the CPU).
        wait_s: seconds the consumer was blocked waiting for the next batch. Small ``wait_s``
            means the pipeline keeps up with training; ``wait_s ~ epoch_s`` means training is
            starved by data loading.
        epoch_s: wall-clock seconds from the start of the epoch to its last batch.
    """

    epoch: int = 0
    complete: bool = False
    num_batches: int = 0
    num_seeds: int = 0
    num_input_nodes: int = 0
    sample_s: float = 0.0
    gather_s: float = 0.0
    transfer_s: float = 0.0
    wait_s: float = 0.0
    epoch_s: float = 0.0

    @property
    def stage_sum_s(self) -> float:
        """Sample + gather + transfer seconds: the epoch time without any overlap."""
        return self.sample_s + self.gather_s + self.transfer_s

    def as_dict(self) -> dict:
        return asdict(self)


class NodeLoader:
    """Iterates mini-batches with features (``x``) and labels filled, stages overlapped.

    Args:
        sampler: turns a seed tensor into a :class:`~gnnio.sampling.base.MiniBatch` (topology).
            With ``num_workers > 1`` it is called from several threads at once and must be
            thread-safe. If its ``sample`` takes an ``epoch_seed`` keyword (as
            :class:`~gnnio.sampling.UniformSampler` does), the loader passes
            ``epoch * 2**32 + batch_index``, so a batch depends only on the sampler's seed, the
            epoch and the batch's seeds -- not on thread scheduling or ``num_workers``.
        store: the feature store; ``batch.x = store.gather(batch.input_nodes)``.
        order: seed order with ``num_batches`` and ``batches(epoch) -> Iterator[Tensor]`` (global
            seed ids per batch), e.g. ``gnnio.ordering.shuffle.RandomOrder``.
        labels: optional ``[N]`` int64 labels (global ids); ``batch.labels = labels[batch.seeds]``.
        device: where batches are delivered. On CUDA, rows of a CPU store are gathered into pinned
            host slots and copied with ``non_blocking`` on a side stream; a store on the GPU
            returns its rows there directly (no host slot).
        prefetch: batches ready ahead of the consumer (bound of the output queue and of each
            sampling queue); at least 1.
        num_workers: sampling threads (batch ``i`` goes to worker ``i % num_workers``; batches are
            delivered in order).
        reuse_buffers: gather into a ring of ``prefetch + 2`` preallocated buffers (see module
            docstring: on the CPU ``batch.x`` is valid until the next batch is requested).

    Iterate with ``for batch in loader.epoch(e)``, or ``loader.set_epoch(e)`` then ``iter(loader)``
    (iterating does not advance the epoch by itself). One epoch runs at a time: starting another
    closes the previous iterator. ``loader.stats`` holds the :class:`LoaderStats` of the last epoch
    iterated (complete or closed).
    """

    def __init__(
        self,
        sampler: Sampler,
        store: FeatureStore,
        order,
        labels: np.ndarray | torch.Tensor | None = None,
        device: str | torch.device = "cpu",
        prefetch: int = 2,
        num_workers: int = 1,
        reuse_buffers: bool = True,
    ) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.sampler = sampler
        try:
            params = inspect.signature(sampler.sample).parameters
        except (TypeError, ValueError):  # builtins without a signature
            params = {}
        self._keyed = "epoch_seed" in params
        self.store = store
        self.order = order
        self.device = resolve_device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device} asked for, but CUDA is not available")
        self.prefetch = int(prefetch)
        self.num_workers = int(num_workers)
        self.reuse_buffers = bool(reuse_buffers)
        self.labels = None if labels is None else torch.as_tensor(np.asarray(labels)).long()
        self.stats: LoaderStats | None = None
        self._epoch = 0
        self._active: weakref.ref | None = None
        # ring of gather output buffers, shared by successive epochs (allocated lazily, grown to
        # the largest batch seen); only the gather thread writes them
        self._pinned = self.device.type == "cuda" and store.device.type == "cpu"
        self._use_ring = self.reuse_buffers and store.device.type == "cpu"
        self._slots: list[torch.Tensor | None] = [None] * (self.prefetch + 2)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __len__(self) -> int:
        return int(self.order.num_batches)

    def set_epoch(self, epoch: int) -> None:
        """Epoch that ``iter(loader)`` runs next (it selects the seed order)."""
        self._epoch = int(epoch)

    def __iter__(self) -> _EpochIterator:
        return self.epoch(self._epoch)

    def epoch(self, epoch: int) -> _EpochIterator:
        """Start the background stages for ``epoch`` and return its batch iterator."""
        self.close()
        if self._stream is not None:
            # work queued on the caller's stream before this epoch (e.g. a store filling its GPU
            # tier, a model update that a store reads) must finish before the side stream reads
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        it = _EpochIterator(self, int(epoch))
        self._active = weakref.ref(it)
        return it

    def close(self) -> None:
        """Stop the running epoch's threads, if any (also done when its iterator is dropped)."""
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None

    # ---- used by the stage threads -------------------------------------------------------------

    def _slot_view(self, k: int, n: int) -> torch.Tensor:
        """Rows ``[:n]`` of slot ``k``, (re)allocated when too small; only the gather thread calls
        this, and only for a slot it took from the free list."""
        buf = self._slots[k]
        if buf is None or buf.shape[0] < n:
            cap = max(1, int(n * 1.25))  # headroom: batch sizes vary a little
            buf = torch.empty(
                (cap, self.store.dim), dtype=self.store.dtype, pin_memory=self._pinned
            )
            self._slots[k] = buf
        return buf[:n]

    def _to_device(self, mb: MiniBatch) -> tuple[MiniBatch, torch.cuda.Event | None]:
        """Move a gathered batch to ``self.device``. On CUDA: copies on the side stream, then wait
        for them here, so the pinned slot they read from may be refilled as soon as we return."""
        dev = self.device
        if dev.type != "cuda":
            return (mb if mb.x.device == dev and mb.seeds.device == dev else mb.to(dev)), None
        with torch.cuda.stream(self._stream):
            moved = mb.to(dev, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        ready.synchronize()  # the copy out of the pinned slot is done: the slot may be reused
        return moved, ready


class _Failure:
    """An exception raised in a stage thread, carried to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Stopped(Exception):
    """The run was closed while a stage thread was blocked."""


_END = object()


class _Run:
    """The threads and queues of one epoch. Stage threads reference this object, never the
    :class:`_EpochIterator`, so dropping the iterator (e.g. ``break``) lets it be collected and
    close the run."""

    def __init__(self, loader: NodeLoader, epoch: int, batches: list[torch.Tensor]) -> None:
        self.loader = loader
        self.epoch = epoch
        self.batches = batches
        self.stop = threading.Event()
        w, p = loader.num_workers, loader.prefetch
        self.sampled = [queue.Queue(maxsize=p) for _ in range(w)]
        self.out: queue.Queue = queue.Queue(maxsize=p)
        self.free: queue.Queue = queue.Queue()
        for k in range(len(loader._slots)):
            self.free.put(k)
        self.sample_s = [0.0] * w
        self.gather_s = 0.0
        self.transfer_s = 0.0
        self.threads = [
            threading.Thread(target=self._sample_worker, args=(k,), name=f"gnnio-sample-{k}")
            for k in range(w)
        ]
        self.threads.append(threading.Thread(target=self._gather_worker, name="gnnio-gather"))
        for t in self.threads:
            t.daemon = True
            t.start()

    # queue operations that give up when the run is stopped, so no thread blocks forever
    def put(self, q: queue.Queue, item) -> None:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue
        raise _Stopped

    def get(self, q: queue.Queue):
        while not self.stop.is_set():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        raise _Stopped

    def _sample_worker(self, k: int) -> None:
        sampler, w, keyed = self.loader.sampler, self.loader.num_workers, self.loader._keyed
        try:
            for i in range(k, len(self.batches), w):
                t0 = time.perf_counter()
                if keyed:
                    mb = sampler.sample(self.batches[i], epoch_seed=(self.epoch << 32) + i)
                else:
                    mb = sampler.sample(self.batches[i])
                self.sample_s[k] += time.perf_counter() - t0
                self.put(self.sampled[k], mb)
        except _Stopped:
            return
        except BaseException as e:  # every failure must reach the consumer
            try:
                self.put(self.sampled[k], _Failure(e))
            except _Stopped:
                return

    def _gather_worker(self) -> None:
        ld = self.loader
        try:
            for i in range(len(self.batches)):
                mb = self.get(self.sampled[i % ld.num_workers])
                if isinstance(mb, _Failure):
                    self.put(self.out, mb)
                    return
                slot = self.get(self.free) if ld._use_ring else None
                t0 = time.perf_counter()
                ids = mb.input_nodes
                buf = None if slot is None else ld._slot_view(slot, int(ids.shape[0]))
                if ld.store.device.type == "cuda":
                    with torch.cuda.stream(ld._stream):  # GPU-resident rows: gather on the side
                        mb.x = ld.store.gather(ids, out=buf)  # stream too, ordered before copies
                else:
                    mb.x = ld.store.gather(ids, out=buf)
                if ld.labels is not None:
                    mb.labels = ld.labels[mb.seeds.to(ld.labels.device)]
                t1 = time.perf_counter()
                mb, ready = ld._to_device(mb)
                if ready is not None and slot is not None:
                    # the copy out of the pinned slot has completed (_to_device synchronised on
                    # its event), so the slot is free again at once; the consumer holds a
                    # device tensor of its own
                    self.free.put(slot)
                    slot = None
                self.transfer_s += time.perf_counter() - t1
                self.gather_s += t1 - t0
                # on the CPU ``mb.x`` is a view of ``slot``: the consumer hands the slot back when
                # it asks for the next batch, so a slot is never refilled while it is read
                self.put(self.out, (mb, slot, ready))
            self.put(self.out, _END)
        except _Stopped:
            return
        except BaseException as e:  # every failure must reach the consumer
            try:
                self.put(self.out, _Failure(e))
            except _Stopped:
                return

    def close(self) -> None:
        self.stop.set()
        me = threading.current_thread()
        for t in self.threads:
            if t is not me:
                t.join(timeout=_JOIN_S)
                if t.is_alive():  # stuck inside a sampler/store call that does not return
                    warnings.warn(f"gnnio loader: thread {t.name} did not stop", stacklevel=2)


class _EpochIterator:
    """Batches of one epoch. Close it (or drop it, or exhaust it) to stop the stage threads."""

    def __init__(self, loader: NodeLoader, epoch: int) -> None:
        self._loader = loader
        self._t0 = time.perf_counter()
        self.stats = LoaderStats(epoch=epoch)
        batches = [torch.as_tensor(s).long() for s in loader.order.batches(epoch)]
        self._run: _Run | None = _Run(loader, epoch, batches)
        self._held: int | None = None  # slot of the batch the consumer holds (CPU ring)

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> MiniBatch:
        run = self._run
        if run is None:
            raise StopIteration
        if self._held is not None:
            # the consumer has asked for the next batch, so it is done with the previous one:
            # only now may the gather thread overwrite its slot
            run.free.put(self._held)
            self._held = None
        t0 = time.perf_counter()
        item = self._wait(run)
        self.stats.wait_s += time.perf_counter() - t0
        if item is _END:
            self._finish(complete=True)
            raise StopIteration
        if isinstance(item, _Failure):
            self._finish(complete=False)
            raise item.exc
        mb, self._held, ready = item
        if ready is not None:
            self._adopt_on_current_stream(mb, ready)
        st = self.stats
        st.num_batches += 1
        st.num_seeds += int(mb.seeds.shape[0])
        st.num_input_nodes += int(mb.input_nodes.shape[0])
        return mb

    def _wait(self, run: _Run):
        gather_thread = run.threads[-1]
        while True:
            try:
                return run.out.get(timeout=_POLL_S)
            except queue.Empty:
                if not gather_thread.is_alive() and run.out.empty():
                    self._finish(complete=False)
                    raise RuntimeError(
                        "gnnio loader: the gather thread ended without a result"
                    ) from None

    def _adopt_on_current_stream(self, mb: MiniBatch, ready: torch.cuda.Event) -> None:
        # The batch was copied on the loader's side stream. Make the consumer's stream wait for
        # that copy (already complete, since the worker synchronised, but this keeps the order
        # explicit), and tell the caching allocator that these tensors are now used on the
        # consumer's stream, so their memory is not handed to a new side-stream allocation while
        # kernels queued by the consumer still read it.
        cur = torch.cuda.current_stream(self._loader.device)
        cur.wait_event(ready)
        tensors = [mb.seeds, mb.input_nodes, mb.x, mb.labels]
        for b in mb.blocks:
            tensors += [b.edge_index, b.edge_weight]
        for t in tensors:
            if t is not None:
                t.record_stream(cur)

    def _finish(self, complete: bool) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        run.close()
        st = self.stats
        st.complete = complete
        st.sample_s = float(sum(run.sample_s))
        st.gather_s = run.gather_s
        st.transfer_s = run.transfer_s
        st.epoch_s = time.perf_counter() - self._t0
        self._loader.stats = st

    def close(self) -> None:
        """Stop the stage threads; ``batch.x`` of the last batch is no longer protected."""
        self._finish(complete=False)

    def __enter__(self) -> _EpochIterator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._finish(complete=False)
        except Exception:  # never raise from a finaliser
            pass
