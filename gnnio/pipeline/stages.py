"""The stage threads of one :class:`~gnnio.pipeline.loader.NodeLoader` epoch: sampling workers
and the gather (+ copy) thread, joined by bounded queues, with the stream handovers described in
the loader's module docstring. Split from the loader so each file holds one idea: the loader is the
public object and its iterator, this is what runs behind it."""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time

import torch

from ..features.base import ids_in_range
from ..sampling.base import MiniBatch
from ..utils.streams import batch_tensors
from ..utils.warnings_at import warn
from .affinity import pin_current_thread

__all__ = ["END", "POLL_S", "EpochRun", "StageFailure", "Stopped"]

POLL_S = 0.05  # how often blocked threads look at the stop flag (latency of close(), not of data)
JOIN_S = 30.0  # how long close() waits for a stage thread stuck in a user sampler/store call


class StageFailure:
    """An exception raised in a stage thread, carried to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _note(exc: BaseException, stage: str, busy, epoch: int) -> None:
    """Say on the exception where in the loader it was raised (shown under its traceback)."""
    if busy is not None and hasattr(exc, "add_note"):
        exc.add_note(f"(raised in the gnnio loader's {stage} stage: {busy[0]} for batch "
                     f"{busy[1]} of epoch {epoch})")  # fmt: skip


def _announce(store, item, ahead, carried: list, j: int) -> list:
    """Announce sampled batch ``j`` of the epoch to a lookahead store, unless the previous epoch
    announced it already (``carried[j]``, checked equal). A carried batch that differs (a
    sampler not keyed after all) drops the carried window: the batches held are announced
    again. Returns what is left of ``carried``."""
    ids = item[0].input_nodes
    if j < len(carried):
        if torch.equal(ids, carried[j]):
            item[0].input_nodes = carried[j]  # the announced tensor: deduplicated once
            return carried
        store.reset_window()
        for held in ahead:
            store.announce(held[0].input_nodes)
        carried = []
    store.announce(ids)
    return carried


class NextEpoch:
    """The first batches of epoch ``epoch``, sampled early (keyed, so as that epoch will) and
    announced to the loader's lookahead store; ``ids``: their input nodes, in order."""

    def __init__(self, loader, epoch: int) -> None:
        self.loader, self.epoch = loader, epoch
        self.batches: list[torch.Tensor] | None = None
        self.ids: list[torch.Tensor] = []

    def top_up(self, want: int) -> None:
        """Announce batches until ``want`` of them are (at most the epoch's)."""
        ld = self.loader
        if self.batches is None:
            self.batches = [torch.as_tensor(s).long() for s in ld.order.batches(self.epoch)]
        while len(self.ids) < min(want, len(self.batches)):
            j = len(self.ids)
            mb = ld.sampler.sample(self.batches[j], epoch_seed=(self.epoch << 32) + j)
            with ids_in_range():  # (as at the gather)
                ld.store.announce(mb.input_nodes)
            self.ids.append(mb.input_nodes)


class Stopped(Exception):
    """The run was closed while a stage thread was blocked."""


END = object()


class EpochRun:
    """The threads and queues of one epoch. Stage threads reference this object, never the
    loader's epoch iterator, so dropping the iterator (e.g. ``break``) lets it be collected and
    close the run."""

    def __init__(self, loader, epoch: int, batches: list[torch.Tensor], start: int = 0) -> None:
        """``loader``: the :class:`~gnnio.pipeline.loader.NodeLoader` (its settings, ring and
        streams); ``batches``: all of the epoch's, run from index ``start`` on."""
        self.loader = loader
        self.epoch = epoch
        self.batches = batches
        self.start = int(start)
        self.stop = threading.Event()
        w, p = loader.num_workers, loader.prefetch
        self.sampled: list[queue.Queue] = [queue.Queue(maxsize=p) for _ in range(w)]
        self.out: queue.Queue = queue.Queue(maxsize=p)
        self.free: queue.Queue = queue.Queue()
        for k in range(len(loader._slots)):
            self.free.put(k)
        self.sample_s = [0.0] * w
        self.gather_s = 0.0
        self.transfer_s = 0.0
        # (start, end) event pairs timed on the device, summed when the epoch ends
        self.gather_events: list = []
        self.transfer_events: list = []
        self.last_event = None
        # what each stage thread is doing now, for a stalled loader's message: stage name ->
        # (what, batch index, monotonic start) while inside a sampler/store call, else absent
        self.busy: dict[str, tuple[str, int, float]] = {}
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
                q.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue
        raise Stopped

    def get(self, q: queue.Queue):
        while not self.stop.is_set():
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                continue
        raise Stopped

    def _on(self, stream):
        st = self.loader._streams
        return st.use(stream) if st is not None else contextlib.nullcontext()

    def _sample_worker(self, k: int) -> None:
        pin_current_thread("sample")  # --isolation auto's core set (a no-op without one)
        ld = self.loader
        sampler, w, keyed, st = ld.sampler, ld.num_workers, ld._keyed, ld._streams
        try:
            with self._on(ld._sample_streams[k] if st is not None else None):
                for i in range(self.start + k, len(self.batches), w):
                    t0 = time.perf_counter()
                    self.busy[f"sample (worker {k})"] = ("sampler.sample", i, time.monotonic())
                    if keyed:
                        mb = sampler.sample(self.batches[i], epoch_seed=(self.epoch << 32) + i)
                    else:
                        mb = sampler.sample(self.batches[i])
                    self.busy.pop(f"sample (worker {k})", None)
                    # a GPU sampler's kernels may still be queued: the gather waits for this
                    sampled = st.record() if st is not None else None
                    self.sample_s[k] += time.perf_counter() - t0
                    self.put(self.sampled[k], (mb, sampled))
        except Stopped:
            return
        except BaseException as e:  # every failure must reach the consumer
            _note(e, f"sample (worker {k})", self.busy.get(f"sample (worker {k})"), self.epoch)
            try:
                self.put(self.sampled[k], StageFailure(e))
            except Stopped:
                return

    def _gather_worker(self) -> None:
        pin_current_thread("gather")
        ld, st = self.loader, self.loader._streams
        # a lookahead cache (gnnio.features.caches.lookahead) is told the input nodes of batches
        # i + 1 .. i + K before batch i is gathered: the thread holds K sampled batches (ids and
        # blocks, never rows) and the sampling workers run K batches further ahead
        k = int(getattr(ld.store, "lookahead", 0) or 0)
        # the window does not end with the epoch: near its end the next epoch's first batches
        # are sampled here (keyed sampling: the very batches that epoch samples) and announced;
        # the next epoch checks them and announces only what follows
        carried, nexts = [], None
        if k:
            c, ld._carried = ld._carried, None
            if c is not None and c[0] == self.epoch and self.start == 0:
                carried = c[1]
            else:
                ld.store.reset_window()  # (batches announced by an epoch closed early)
            if ld._keyed and st is None:
                nexts = NextEpoch(ld, self.epoch + 1)
        ahead: collections.deque = collections.deque()
        nxt = self.start  # the next batch to take from the sampling queues
        try:
            with self._on(ld._side):
                for i in range(self.start, len(self.batches)):
                    while nxt < len(self.batches) and nxt <= i + k:
                        item = self.get(self.sampled[(nxt - self.start) % ld.num_workers])
                        if isinstance(item, StageFailure):
                            self.put(self.out, item)
                            return
                        if k:
                            if st is not None:  # the ids may still be written on a sampler stream
                                st.wait(ld._side, item[1])
                            with ids_in_range():  # the sampler's ids: no range check read back
                                carried = _announce(ld.store, item, ahead, carried,
                                                    nxt - self.start)  # fmt: skip
                        ahead.append(item)
                        nxt += 1
                    if nexts is not None and nxt == len(self.batches):
                        nexts.top_up(i + k - (len(self.batches) - 1))
                    mb, sampled = ahead.popleft()
                    self.put(self.out, self._gather_one(mb, sampled, i))
            if nexts is not None:
                ld._carried = (self.epoch + 1, nexts.ids)
            self.put(self.out, END)
        except Stopped:
            return
        except BaseException as e:  # every failure must reach the consumer
            stage = next((s for s in ("gather", "transfer") if s in self.busy), "gather")
            _note(e, stage, self.busy.get(stage), self.epoch)
            try:
                self.put(self.out, StageFailure(e))
            except Stopped:
                return

    def _gather_one(self, mb: MiniBatch, sampled, i: int = -1):
        """Gather (and, with streams, queue the copy of) one batch on the side stream; returns
        ``(batch, slot the consumer holds or None, event the consumer waits for or None)``."""
        ld, st = self.loader, self.loader._streams
        if st is not None:
            st.wait(ld._side, sampled)  # the sampler's work on its stream is done first
            st.adopt(batch_tensors(mb), ld._side)
        slot = self.get(self.free) if ld._use_ring else None
        if slot is not None and ld._slot_events[slot] is not None:
            st.synchronize(ld._slot_events[slot])  # the copy out of this slot has completed
            ld._slot_events[slot] = None
        device_gather = st is not None and st.timing and ld.store.device.type == "cuda"
        g0 = st.record(timing=True) if device_gather else None
        t0 = time.perf_counter()
        ids = mb.input_nodes
        buf = None if slot is None else ld._slot_view(slot, int(ids.shape[0]))
        counters = getattr(ld.store, "counters", None)
        # this batch's rows and bytes per tier (this thread's adds only: another loader may read
        # the store meanwhile; no device wait): the consumer adds up the batches it trained on,
        # not those gathered ahead (so a checkpoint taken mid-epoch counts exactly those)
        counting = counters.counting() if counters is not None else contextlib.nullcontext(None)
        self.busy["gather"] = ("store.gather", i, time.monotonic())
        with counting as counted, ids_in_range():  # the sampler's ids: no range check read back
            mb.x = ld.store.gather(ids, out=buf)
        del self.busy["gather"]
        if counted is not None:
            mb.meta["counted"] = counted  # device parts resolved by the consumer
        mark = getattr(ld.store, "mark", None)
        if callable(mark):  # a store with state a mid-epoch checkpoint rewinds to this batch
            mb.meta["store_mark"] = mark()
        if ld.labels is not None:
            mb.labels = ld._labels_for(mb.seeds)
        t1 = time.perf_counter()
        if st is None:
            # on the CPU ``mb.x`` is a view of ``slot``: the consumer hands the slot back when it
            # asks for the next batch, so a slot is never refilled while it is read
            dev = ld.device
            moved = mb if mb.x.device == dev and mb.seeds.device == dev else mb.to(dev)
            self.gather_s += t1 - t0
            self.transfer_s += time.perf_counter() - t1
            return moved, slot, None
        c0 = st.record(timing=True) if st.timing else None
        self.busy["transfer"] = ("the copy to the device", i, time.monotonic())
        moved = st.to_device(mb, ld.device)
        del self.busy["transfer"]
        done = st.record(timing=st.timing)
        self.last_event = done
        if st.timing:
            self.transfer_events.append((c0, done))
            if device_gather:
                self.gather_events.append((g0, c0))
            else:
                self.gather_s += t1 - t0
        else:
            self.gather_s += t1 - t0
            self.transfer_s += time.perf_counter() - t1
        if slot is not None and ld._staged:
            # the copy out of the slot is queued, not done: the slot goes back to the ring with
            # the copy's event, which the gather synchronizes before refilling it
            ld._slot_events[slot] = done
            self.free.put(slot)
            slot = None
        return moved, slot, done

    def device_times(self) -> None:
        """Add the event-timed seconds to ``gather_s`` / ``transfer_s`` (waits for the last
        event of the side stream, not for the device)."""
        st = self.loader._streams
        if st is None or not st.timing or self.last_event is None:
            return
        st.synchronize(self.last_event)
        self.gather_s += sum(st.elapsed_s(a, b) for a, b in self.gather_events)
        self.transfer_s += sum(st.elapsed_s(a, b) for a, b in self.transfer_events)
        self.gather_events, self.transfer_events = [], []

    def stalled(self, waited_s: float) -> str:
        """One line for a loader that delivered no batch for ``waited_s`` seconds: the stage
        busy longest inside its call (a sampler or store that does not return), or, with none
        busy, the thread that ended."""
        now = time.monotonic()
        busy = sorted(self.busy.items(), key=lambda kv: kv[1][2])
        head = (
            f"no batch from the loader for {waited_s:.0f} s (--stall-timeout), epoch {self.epoch}"
        )
        if busy:
            stage, (what, i, since) = busy[0]
            return (
                f"{head}: the {stage} stage has been in {what} for batch {i} for "
                f"{now - since:.0f} s"
            )
        dead = [t.name for t in self.threads if not t.is_alive()]
        return f"{head}: no stage is busy" + (f" (ended: {', '.join(dead)})" if dead else "")

    def close(self, join_s: float = JOIN_S) -> None:
        """Stop the stage threads, waiting up to ``join_s`` for each. A stalled run passes a
        short wait: its stuck (daemon) thread is left behind, already reported."""
        self.stop.set()
        me = threading.current_thread()
        for t in self.threads:
            if t is not me:
                t.join(timeout=join_s)
                if t.is_alive() and join_s >= JOIN_S:  # stuck in a call that does not return
                    warn(f"gnnio loader: thread {t.name} did not stop")
