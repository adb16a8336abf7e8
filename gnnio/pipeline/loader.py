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
A slot holds up to 1.25x the largest batch seen, never more than the store's rows (unless a
batch repeats ids). Loaders whose epochs never overlap can share one ring (:class:`BufferRing`:
``gnnio train``'s training, valid and test loaders): the memory of one ring, not one per loader.
A store that itself returns rows on the GPU (a CUDA tiered store or cache) gets no ring: it
allocates each batch's rows on its device, on the loader's side stream.

Streams (whenever a CUDA device is involved: the delivery device, the store's or the sampler's).
Every stage has its own stream and stages hand each other events, never a device-wide sync::

    sample worker k on stream S_k -- event --> gather + copy on side stream G -- event --> consumer
                                               (waits S_k's event first)            (waits G's event)

* A GPU sampler's last kernels are still queued on ``S_k`` when it returns, so ``G`` waits for the
  batch's sample event before the gather reads ``input_nodes``; the batch's tensors are then
  "adopted" by ``G`` (``record_stream``) so the caching allocator does not reuse their memory
  while ``G`` still reads them. The consumer's stream waits for the copy event and adopts the
  batch in turn.
* A pinned slot is handed back to the ring as soon as its copy is *queued*, with the copy's event;
  the gather thread synchronizes that event (only it) before writing the slot again (FFCV's
  reasoning), so the copy of batch ``i`` overlaps the gather of batch ``i+1``.
* Transfer time (and the gather time of a GPU store) is the device time between events, summed
  when the epoch ends; CPU stages are timed by the wall clock.

All stream operations go through :mod:`gnnio.utils.streams`, whose
:class:`~gnnio.utils.streams.RecordingStreams` keeps CUDA's ordering rules on the CPU: a test
passes it as ``streams=`` and a missing wait fails there, without a GPU.
"""

from __future__ import annotations

import inspect
import queue
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..errors import GnnioError
from ..features._gather import host_rows
from ..features.base import FeatureStore
from ..sampling.base import MiniBatch, Sampler
from ..utils.devices import resolve_device
from ..utils.streams import batch_tensors, streams_for
from .stages import END, POLL_S, EpochRun, StageFailure

__all__ = ["BufferRing", "LoaderStall", "LoaderStats", "NodeLoader"]


class LoaderStall(GnnioError):
    """No batch came out of the loader within its ``stall_timeout``; the message names the stage
    that is stuck (a sampler or store call that does not return)."""


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
        timed_by_events: True when transfer (and a GPU store's gather) were timed with CUDA
            events (device time), False when by the wall clock.
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
    timed_by_events: bool = False

    @property
    def stage_sum_s(self) -> float:
        """Sample + gather + transfer seconds: the epoch time without any overlap."""
        return self.sample_s + self.gather_s + self.transfer_s

    @property
    def hidden_fraction(self) -> float:
        """How much of the loading work was hidden behind the consumer's work: ``1 - wait_s /
        stage_sum_s``, clipped to ``[0, 1]`` (1.0 when there was no loading work). 0 means the
        consumer waited as long as loading took (no overlap); 1 means it never waited."""
        load = self.stage_sum_s
        if load <= 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self.wait_s / load))

    def as_dict(self) -> dict:
        return {**asdict(self), "hidden_fraction": self.hidden_fraction}


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
        labels: optional ``[N]`` int64 labels (global ids), or a map of the seeds' labels
            (:class:`~gnnio.distributed.labels.SeedLabels`); ``batch.labels = labels[batch.seeds]``.
        device: where batches are delivered. On CUDA, rows of a CPU store are gathered into pinned
            host slots and copied with ``non_blocking`` on a side stream; a store on the GPU
            returns its rows there directly (no host slot).
        prefetch: batches ready ahead of the consumer (bound of the output queue and of each
            sampling queue); at least 1.
        num_workers: sampling threads (batch ``i`` goes to worker ``i % num_workers``; batches are
            delivered in order).
        reuse_buffers: gather into a ring of ``prefetch + 2`` preallocated buffers (see module
            docstring: on the CPU ``batch.x`` is valid until the next batch is requested).
        ring: a :class:`BufferRing` whose slots this loader shares with loaders that run at
            other times (None: a ring of its own).
        streams: the stream operations (:mod:`gnnio.utils.streams`); None = CUDA streams when
            the device, the store or the sampler is on a GPU, none otherwise. Tests pass a
            :class:`~gnnio.utils.streams.RecordingStreams` to check the ordering on the CPU
            (batches are then "copied" by cloning ``x``, as on a GPU).
        stall_timeout: seconds the consumer waits for one batch before the epoch ends with a
            :class:`LoaderStall` naming the stuck stage (None = wait forever). A stage thread
            that *raises* always ends the epoch at once with its own exception.

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
        streams=None,
        stall_timeout: float | None = None,
        ring: BufferRing | None = None,
    ) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.sampler = sampler
        try:
            self._keyed = "epoch_seed" in inspect.signature(sampler.sample).parameters
        except (TypeError, ValueError):  # builtins without a signature
            self._keyed = False
        self.store = store
        self.order = order
        self.device = resolve_device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device} asked for, but CUDA is not available")
        if stall_timeout is not None and not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be > 0 seconds, got {stall_timeout}")
        self.stall_timeout = None if stall_timeout is None else float(stall_timeout)
        self.prefetch = int(prefetch)
        self.num_workers = int(num_workers)
        self.reuse_buffers = bool(reuse_buffers)
        self.labels: Any = labels  # (None, a tensor or a label map; see _labels_for)
        if labels is not None and not _is_label_map(labels):
            self.labels = torch.as_tensor(np.asarray(labels)).long()
        self.stats: LoaderStats | None = None
        self._epoch = 0
        self._active: weakref.ref | None = None
        self._streams = streams
        if streams is None:
            self._streams = streams_for(self.device, store.device, _device_of(sampler))
        st = self._streams
        # ring of gather output buffers, shared by successive epochs (allocated lazily, grown to
        # the largest batch seen); only the gather thread writes them. With streams they only
        # stage the copy (pinned for a GPU), each with the event of the last copy out of it.
        self._pinned = self.device.type == "cuda" and store.device.type == "cpu"
        self._staged = st is not None and store.device.type == "cpu"
        self._use_ring = self.reuse_buffers and store.device.type == "cpu"
        self._ring = ring if self._use_ring else None
        self._slots: list[torch.Tensor | None]
        self._slot_events: list
        if self._ring is not None:  # (slots shared with loaders that run at other times)
            self._ring.join(self, (store.dim, store.dtype, self._pinned))
            self._slots, self._slot_events = self._ring.slots, self._ring.events
        else:
            self._slots = [None] * (self.prefetch + 2)
            self._slot_events = [None] * (self.prefetch + 2)
        self._side = st.new_stream("gather") if st is not None else None
        self._sample_streams = (
            [st.new_stream(f"sample{k}") for k in range(self.num_workers)] if st else []
        )
        self._labels_on: dict[torch.device, torch.Tensor] = {}
        # (epoch, input nodes of its first batches) announced to a lookahead store at the end
        # of the previous epoch (gnnio.pipeline.stages.NextEpoch)
        self._carried: tuple[int, list[torch.Tensor]] | None = None

    def __len__(self) -> int:
        return int(self.order.num_batches)

    def set_epoch(self, epoch: int) -> None:
        """Epoch that ``iter(loader)`` runs next (it selects the seed order)."""
        self._epoch = int(epoch)

    def __iter__(self) -> _EpochIterator:
        return self.epoch(self._epoch)

    def epoch(self, epoch: int, start: int = 0) -> _EpochIterator:
        """Start the background stages for ``epoch`` and return its batch iterator, from batch
        ``start`` on (a resumed run: batch ``i`` is the same whatever ``start`` is, its sampling
        keyed by ``(epoch, i)``)."""
        self.close()
        if self._ring is not None:
            self._ring.claim(self)  # (before anything starts: it may refuse)
        st = self._streams
        if st is not None:
            # work queued on the caller's stream before this epoch (e.g. a store filling its GPU
            # tier, a model update that a store reads) must finish before the stages read
            ev = st.record(st.current())
            for stream in (self._side, *self._sample_streams):
                st.wait(stream, ev)
        it = _EpochIterator(self, int(epoch), int(start))
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
            # headroom: batch sizes vary a little; no more rows than the store has, unless
            # this batch repeats ids
            cap = max(1, int(n * 1.25))
            cap = max(n, min(cap, int(getattr(self.store, "num_rows", 0) or cap)))
            if self._pinned:  # page-locked for the async copy (page-aligned by the allocator)
                buf = torch.empty((cap, self.store.dim), dtype=self.store.dtype, pin_memory=True)
            else:  # as the gather bench's ceiling: first row on a 2 MiB boundary, pre-faulted
                buf = host_rows(cap, self.store.dim, self.store.dtype)
            self._slots[k] = buf
        return buf[:n]

    def _labels_for(self, seeds: torch.Tensor) -> torch.Tensor:
        """``labels[seeds]`` on the seeds' device (labels copied there once)."""
        lab = self._labels_on.get(seeds.device)
        if lab is None:
            lab = self.labels.to(seeds.device)
            self._labels_on[seeds.device] = lab
        return lab[seeds]


class BufferRing:
    """The gather buffers ("slots") of :class:`NodeLoader` s whose epochs never overlap, shared:
    pass it as ``ring=`` to each (``gnnio train``: the training loader and the evaluation
    loaders). Starting an epoch while another loader of the ring is in one raises ValueError
    (that epoch's ``batch.x`` is a slot the new one would overwrite): finish or close it first.
    Every loader of a ring has ``prefetch + 2 == slots`` and a store with the same row width and
    dtype, and delivers to the same kind of device (a loader whose store is on the GPU has no
    slots and ignores its ring). A store that keeps the rows it returned for its next call
    (``CrossBatchReuse(keep="reference")``) would read them back overwritten by another loader:
    give it ``keep="copy"`` or a ring of its own."""

    def __init__(self, slots: int) -> None:
        if slots < 3:
            raise ValueError(f"a ring needs >= 3 slots (prefetch + 2), got {slots}")
        self.slots: list[torch.Tensor | None] = [None] * int(slots)
        self.events: list = [None] * int(slots)  # (the last copy out of each slot, on a GPU)
        self._kind: tuple | None = None  # (dim, dtype, pinned) of its loaders
        self._user: weakref.ref | None = None  # the loader whose epoch ran last

    def join(self, loader: NodeLoader, kind: tuple) -> None:
        if len(self.slots) != loader.prefetch + 2:
            raise ValueError(
                f"ring of {len(self.slots)} slots for a loader with prefetch {loader.prefetch} "
                f"(needs prefetch + 2 = {len(self.slots)})"
            )
        if self._kind is not None and self._kind != kind:
            raise ValueError(f"ring of rows {self._kind} shared with a loader of rows {kind}")
        self._kind = kind

    def claim(self, loader: NodeLoader) -> None:
        """Make ``loader`` the ring's user; ValueError while another loader's epoch runs."""
        prev = self._user() if self._user is not None else None
        it = prev._active() if prev is not None and prev._active is not None else None
        if prev is not loader and it is not None and it._run is not None:
            raise ValueError(
                "this loader shares its buffer ring with a loader whose epoch is still running "
                "(its batch.x would be overwritten): finish or close that epoch first"
            )
        self._user = weakref.ref(loader)


def _is_label_map(labels) -> bool:
    """Whether ``labels`` is a map of some nodes' labels (``labels[seeds]``, ``.to(device)``: a
    rank's :class:`gnnio.distributed.labels.SeedLabels`) rather than an array of all ``N``."""
    return not isinstance(labels, (np.ndarray, torch.Tensor)) and hasattr(labels, "numpy_of")


def _device_of(sampler) -> torch.device | None:
    """The sampler's device when it says (``sampler.device``), else None."""
    dev = getattr(sampler, "device", None)
    try:
        return None if dev is None else torch.device(dev)
    except (TypeError, RuntimeError):
        return None


class _EpochIterator:
    """Batches of one epoch. Close it (or drop it, or exhaust it) to stop the stage threads."""

    def __init__(self, loader: NodeLoader, epoch: int, start: int = 0) -> None:
        self._loader = loader
        self._t0 = time.perf_counter()
        self.stats = LoaderStats(epoch=epoch)
        batches = [torch.as_tensor(s).long() for s in loader.order.batches(epoch)]
        if not 0 <= start <= len(batches):
            raise ValueError(f"start: must be in [0, {len(batches)}], got {start}")
        self._run: EpochRun | None = EpochRun(loader, epoch, batches, start)
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
        if item is END:
            self._finish(complete=True)
            raise StopIteration
        if isinstance(item, StageFailure):
            self._finish(complete=False)
            raise item.exc
        mb, self._held, ready = item
        if ready is not None:
            # the batch was made (copied) on the side stream: the consumer's stream waits for
            # it, and adopts its tensors so their memory is not handed to a new side-stream
            # allocation while kernels the consumer queues still read them
            st = self._loader._streams
            cur = st.current()
            st.wait(cur, ready)
            st.adopt(batch_tensors(mb), cur)
        st = self.stats
        st.num_batches += 1
        st.num_seeds += int(mb.seeds.shape[0])
        st.num_input_nodes += int(mb.input_nodes.shape[0])
        return mb

    def _wait(self, run: EpochRun):
        gather_thread = run.threads[-1]
        limit = self._loader.stall_timeout
        t0 = time.monotonic()
        while True:
            try:
                return run.out.get(timeout=POLL_S)
            except queue.Empty:
                if not gather_thread.is_alive() and run.out.empty():
                    self._finish(complete=False)
                    raise RuntimeError(
                        "gnnio loader: the gather thread ended without a result"
                    ) from None
                waited = time.monotonic() - t0
                if limit is not None and waited > limit:
                    msg = run.stalled(waited)
                    self._finish(complete=False, join_s=1.0)
                    raise LoaderStall(msg) from None

    def _finish(self, complete: bool, join_s: float | None = None) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        run.close() if join_s is None else run.close(join_s)
        run.device_times()
        st = self.stats
        st.complete = complete
        st.timed_by_events = bool(
            self._loader._streams is not None and self._loader._streams.timing
        )
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
