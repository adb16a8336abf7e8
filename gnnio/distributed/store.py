"""Feature rows sharded across ranks by a placement, fetched from each other with collectives.

Rank ``r`` holds the rows ``placement.buffers[r]`` (its *shard*) in its device memory (a CPU
tensor on simulated devices) and reads every other row through its lookup arrays (Song & Jiang's
``dev_num`` / ``buf_pos``, :meth:`gnnio.placement.Placement.lookup`): its own shard (link
``local``), the shard of a rank of its NVLink group (``peer``; ``network`` if that rank is on
another machine), or host memory (``host``: each process memory-maps the dataset's feature file,
so one machine keeps one copy in its page cache; a per-rank cache may sit in front of it).

One :meth:`ShardedFeatureStore.gather` is **one collective step on every rank**: the batch's ids
are deduplicated, the remote ones grouped by owner, and three ``all_to_all_single`` calls on the
context's ``fetch`` group (``eval_fetch`` for evaluation) move the request counts, the requested buffer positions and the rows (as bytes, so any
dtype works on gloo and NCCL). Every rank must therefore call ``gather`` the same number of times
in the same order -- the loader does (one gather per batch, one gather thread), and the training
loop gives every rank the same number of batches. A call with no remote ids still takes part.

Counting happens where the bytes are: rows received in the all_to_all's output buffer, per source
rank (``peer`` / ``network``), rows copied from the own shard (``local``), rows read from host memory
(``host``; a cache in front of it adds ``cache``). ``control_bytes`` counts the request traffic
(counts and positions). With ``reuse=True`` (HyDRA's cross-batch reuse), rows the rank obtained
for the previous batch from a peer, the network or the host are copied from that batch's buffer
instead (``reuse`` rows) and not fetched again: HyDRA's intra-GPU level (§III-B2, ①). With
``reuse="machine"`` also its intra-machine level ② (:mod:`gnnio.distributed.group_reuse`: an
NVLink group's batches as one, each host row read once and handed over; control bytes include
the ids the ranks send their group). The inter-machine level ③ has no counterpart (every machine
reads its own host memory).

For the cost model's view of the same reads, :attr:`ShardedFeatureStore.trace` (when
``record_trace``) counts every node read after deduplication (reuse not applied), ready for
:func:`gnnio.placement.costmodel.placement_cost`.

Checkpoints (``--checkpoint-dir``): :meth:`~ShardedFeatureStore.state_dict` holds what changes a
resumed run's results and counts: the previous batch's ids (reuse; the rows are read again from
host memory on load), the trace, the request bytes, the gather count and a per-rank cache's
state. The loader gathers ahead of training, so for a checkpoint within an epoch the store is
rewound to the last batch trained on: every gather's bookkeeping is applied at its end under a
lock, each batch carries :meth:`~ShardedFeatureStore.mark` (the gathers done after it), and with
``keep_log`` the store remembers the last gathers' ids to take them back out of the trace.
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import torch

from ..features._gather import as_index_array, output_rows
from ..features.base import FeatureStore
from ..features.batch_ops import move_rows
from .context import DistContext
from .group_reuse import GroupReuse, machine_level
from .hostrows import pread_rows_of

__all__ = ["LINKS", "ShardedFeatureStore"]

LINKS = ("local", "peer", "host", "network")


class ShardedFeatureStore(FeatureStore):
    """This rank's shard of a placement; other rows from peers' shards or host memory.

    ``LOG``: gathers a mid-epoch checkpoint can rewind (the loader runs at most ``prefetch + 2``
    ahead of training).

    Args:
        host_store: a store serving *every* row from this machine's host memory (e.g. the
            memory-mapped dataset, optionally behind a cache); the shard is filled from it once.
        placement: the placement (one buffer per rank).
        ctx: the rank context (rank, links, fetch group).
        reuse: HyDRA cross-batch reuse of the previous batch's non-local rows: False, True or
            ``"gpu"`` (the rank's own previous batch, §III-B2 ①), or ``"machine"`` (also the
            intra-machine level ②: the rank's NVLink group reads each host row once and hands
            it over, :mod:`gnnio.distributed.group_reuse`; as ``"gpu"`` where peer links are
            not faster than host reads or the rank has no peer).
        record_trace: count reads per node for the cost model (an ``[N]`` int64 array).
        group: the context's process group for the exchanges (:data:`gnnio.distributed.context.GROUPS`:
            ``fetch`` for training, ``eval_fetch`` for evaluation; one thread each).
    """

    LOG = 64

    def __init__(
        self,
        host_store: FeatureStore,
        placement,
        ctx: DistContext,
        reuse: bool | str = False,
        record_trace: bool = True,
        group: str = "fetch",
    ) -> None:
        super().__init__()
        if placement.num_devices != ctx.world_size:
            raise ValueError(
                f"placement has {placement.num_devices} devices, the run has {ctx.world_size} ranks"
            )
        if placement.num_nodes != host_store.num_rows:
            raise ValueError(
                f"placement covers {placement.num_nodes} nodes, the features have "
                f"{host_store.num_rows} rows"
            )
        self.host_store = host_store
        self.placement = placement
        self.ctx = ctx
        self.group = group
        self.rank = ctx.rank
        self.num_rows = int(host_store.num_rows)
        self.dim = int(host_store.dim)
        self.dtype = host_store.dtype
        self.device = ctx.device
        if reuse not in (False, True, "gpu", "machine"):
            raise ValueError(f"reuse: expected False, True, 'gpu' or 'machine', got {reuse!r}")
        self.reuse = bool(reuse)
        cached = getattr(host_store, "tier", None) == "cache"  # each cache holds a residue
        self.group_reuse = (
            GroupReuse(ctx, ctx.topo.group_of(self.rank), group, by_residue=cached)
            if machine_level(ctx.topo, reuse)
            else None
        )
        peers = bool(placement.peer_reads) and bool(ctx.topo.peers_cheaper)
        self._peers = peers
        lk = placement.lookup(self.rank, peers=peers)
        # Song & Jiang's per-node lookup (where each row is read from) is the one structure sized
        # by the whole graph a rank keeps: any row may be asked for. At the narrowest dtypes it
        # is 2 + 4 bytes per node (was 16); ``lookup_bytes`` counts it with the trace.
        self.dev_num = torch.from_numpy(lk.dev_num.astype(np.int16))
        self.buf_pos = torch.from_numpy(lk.buf_pos.astype(np.int32))
        del lk
        own = torch.from_numpy(np.asarray(placement.buffers[self.rank], dtype=np.int64))
        # rows of a memory-mapped feature file are read with pread (hostrows.py), so the pages
        # they come from do not stay mapped in this rank: its RSS holds its rows, not the file
        self._pread = pread_rows_of(host_store, getattr(host_store, "num_threads", None))
        if self._pread is not None:
            rows = torch.empty((own.shape[0], self.dim), dtype=self.dtype)
            self.shard = self._pread.gather(own, rows).to(self.device).contiguous()
        else:
            self.shard = host_store.gather(own).to(self.device).contiguous()
        host_store.counters.reset()  # filling the shard is set-up, not a batch's traffic
        self.shard_bytes = int(self.shard.numel() * self.shard.element_size())
        self.control_bytes = 0
        self.collective_s = 0.0
        self.num_gathers = 0
        # reads per node for the cost model (int32: a node read more than 2^31 times by one
        # rank would take ~10^5 epochs of a batch per node)
        self.trace = np.zeros(self.num_rows, dtype=np.int32) if record_trace else None
        #: bytes of the arrays sized by the whole graph that this rank holds (lookup + trace)
        self.lookup_bytes = int(
            self.dev_num.numel() * self.dev_num.element_size()
            + self.buf_pos.numel() * self.buf_pos.element_size()
            + (0 if self.trace is None else self.trace.nbytes)
        )
        self.fault: tuple[int, str] | None = None  # (gather number, "kill"|"raise"): tests only
        self._prev_ids: torch.Tensor | None = None  # sorted unique non-local ids of last batch
        self._prev_rows: torch.Tensor | None = None
        self._flip = 0
        self._buffers: dict[str, torch.Tensor] = {}
        # checkpoint bookkeeping (module docstring): the gathers' effects are applied under the
        # lock; with keep_log the last LOG gathers' (count, ids, prev ids, control bytes) are kept
        self._state_lock = threading.Lock()
        self.keep_log = False
        self._log: collections.deque = collections.deque(maxlen=self.LOG)

    def __repr__(self) -> str:
        return (
            f"ShardedFeatureStore(rank={self.rank}/{self.ctx.world_size}, rows={self.num_rows}, "
            f"dim={self.dim}, shard_rows={self.shard.shape[0]}, strategy="
            f"{self.placement.strategy!r}, {'simulated' if self.ctx.simulated else 'real'})"
        )

    @property
    def tiers(self) -> tuple[str, ...]:
        # a cache in front of host memory (FeatureCache(tier="cache")): its tier always shows
        extra = ("cache",) if getattr(self.host_store, "tier", None) == "cache" else ()
        return (*LINKS, *extra, *(("reuse",) if self.reuse else ()))

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` on this rank's device; a collective step (module docstring)."""
        if self.fault is not None and self.num_gathers == self.fault[0]:
            _inject(self.fault[1], self.rank)
        idx_np = as_index_array(ids, self.num_rows)
        m = int(idx_np.shape[0])
        dst = output_rows(out, m, self.dim, self.dtype, self.device)
        idx = torch.from_numpy(np.ascontiguousarray(idx_np)).long()
        uniq, inv = torch.unique(idx, sorted=True, return_inverse=True)
        u = int(uniq.shape[0])
        # unique ids (a sampler's n_id): each row goes straight to its place in dst, at[k] for
        # uniq[k]; else into a row buffer of the unique ids, copied to dst's order at the end
        direct = u == m and dst.is_contiguous()
        if direct:
            rows_u, at = dst, torch.empty(u, dtype=torch.int64)
            at[inv] = torch.arange(m)
        else:
            rows_u, at = self._scratch("rows", u), None

        def place(sel: torch.Tensor) -> torch.Tensor:
            return sel if at is None else at[sel]

        rb = self.row_bytes
        src = self.dev_num[uniq].long()
        pos = self.buf_pos[uniq].long()

        # local shard
        is_local = src == self.rank
        sel = is_local.nonzero().squeeze(1)
        move_rows(self.shard, pos[sel].to(self.device), rows_u, place(sel).to(self.device))
        self.counters.add("local", int(sel.numel()), rb)

        # cross-batch reuse of non-local rows
        need = ~is_local
        if self.reuse and self._prev_ids is not None and self._prev_ids.numel():
            p = torch.searchsorted(self._prev_ids, uniq).clamp_(max=self._prev_ids.numel() - 1)
            hit = need & (self._prev_ids[p] == uniq)
            hsel = hit.nonzero().squeeze(1)
            assert self._prev_rows is not None  # (kept with _prev_ids)
            move_rows(self._prev_rows, p[hsel].to(self.device), rows_u, place(hsel).to(self.device))
            self.counters.add("reuse", int(hsel.numel()), rb)
            need &= ~hit

        # host memory: this rank's rows, or (intra-machine level) the rows the group's plan
        # gives it to read; the others come from a group member after the exchange below
        gr = self.group_reuse if self.reuse else None
        gp, group_needs, gcontrol, extra = None, None, 0, None
        hsel = (need & (src < 0)).nonzero().squeeze(1)
        if gr is not None:
            gp, group_needs, gcontrol = gr.exchange(uniq[src < 0].numpy())
            mine = gp.reads[gp.reads_mine]
            n_recv = sum(int(r.size) for r in gp.recv)
            if int(mine.size) + n_recv != int(hsel.numel()):  # (the plan's own invariant)
                raise RuntimeError(
                    f"rank {self.rank}: group reuse plan covers {mine.size + n_recv} of "
                    f"{hsel.numel()} host rows"
                )
            hsel = torch.from_numpy(np.searchsorted(uniq.numpy(), mine))
            if not gp.reads_mine.all():  # rows of its cache's residue it reads for the others
                ids = torch.from_numpy(gp.reads[~gp.reads_mine])
                extra = (ids, self._scratch("extra", ids.numel()))
        if hsel.numel() or extra is not None:
            # the rows this thread read: the evaluation store reads the same host store (its
            # counters, its pread reader) on its own thread, DistRun.build_store
            with self.host_store.counters.counting() as got:
                if hsel.numel():
                    self._read_host(uniq[hsel], place(hsel), rows_u)
                if extra is not None:
                    self._read_host(extra[0], torch.arange(extra[0].numel()), extra[1])
            for t, d in got.rows.items():
                if d:
                    self.counters.add("host" if t not in ("cache",) else "cache", d, rb)
            for t, dev_rows, _ in got.dev:
                self.counters.add_device("host" if t not in ("cache",) else "cache", dev_rows, rb)

        # other ranks: one exchange, even when nothing is needed from them
        rsel = (need & (src >= 0)).nonzero().squeeze(1)
        control = self._exchange(src[rsel], pos[rsel], place(rsel), rows_u)
        if gr is not None and gp is not None:
            control += gcontrol
            gr.hand_over(self, gp, uniq, rows_u, place, extra)

        prev_ids, prev_rows = self._prev_ids, self._prev_rows
        if self.reuse:
            keep = (~is_local).nonzero().squeeze(1)
            prev_ids = uniq[keep]
            self._flip ^= 1  # two buffers: the previous batch's rows stay intact while read
            prev_rows = self._scratch(f"prev{self._flip}", keep.numel())
            move_rows(rows_u, place(keep).to(self.device), prev_rows, None)
        if not direct:
            move_rows(rows_u, inv.to(self.device), dst, None)
        with self._state_lock:  # this gather's bookkeeping, all at once (state_dict reads it)
            if self.trace is not None and u:
                self.trace[uniq.numpy()] += 1
            self._prev_ids, self._prev_rows = prev_ids, prev_rows
            if gr is not None and group_needs is not None:
                gr.prevs = group_needs
            self.control_bytes += control
            self.num_gathers += 1
            if self.keep_log:
                gprev = None if gr is None else gr.prevs
                self._log.append((self.num_gathers, uniq, prev_ids, self.control_bytes, gprev))
        return dst

    def _read_host(self, ids: torch.Tensor, at: torch.Tensor, rows_u: torch.Tensor) -> None:
        """Rows ``ids`` from host memory into ``rows_u[at]`` (counted in the host store's
        counters)."""
        if self._pread is not None and self.device.type == "cpu":
            self._pread.gather(ids, rows_u, at=at)  # straight into the batch's rows
            return
        hbuf = self._scratch("host", ids.numel()) if self.device.type == "cpu" else None
        if self._pread is not None:
            hbuf = torch.empty((ids.numel(), self.dim), dtype=self.dtype)
            rows = self._pread.gather(ids, hbuf).to(self.device)
        else:
            rows = self.host_store.gather(ids, out=hbuf).to(self.device)
        move_rows(rows, torch.arange(rows.shape[0], device=self.device), rows_u, at.to(self.device))

    # -- checkpoints ----------------------------------------------------------------------
    def mark(self) -> int:
        """Gathers done so far; the loader's gather thread notes it on each batch right after
        gathering it, and a mid-epoch checkpoint passes the last trained batch's mark to
        :meth:`state_dict`."""
        return self.num_gathers

    def state_dict(self, upto: int | None = None) -> dict:
        """What a checkpoint holds (module docstring), as it was after the gather that left
        :meth:`mark` at ``upto`` (None: now). Needs ``keep_log`` to rewind."""
        with self._state_lock:
            n, prev, control = self.num_gathers, self._prev_ids, self.control_bytes
            gprev = None if self.group_reuse is None else self.group_reuse.prevs
            trace = None if self.trace is None else self.trace.copy()
            log = list(self._log)
        if upto is not None and upto != n:
            entries = {e[0]: e for e in log}
            if not self.keep_log or upto > n or any(k not in entries for k in range(upto, n + 1)):
                raise RuntimeError(
                    f"sharded store: cannot rewind from gather {n} to {upto} (log of "
                    f"{len(log)} gathers, keep_log={self.keep_log})"
                )
            for k in range(upto + 1, n + 1):
                if trace is not None and entries[k][1].numel():
                    trace[entries[k][1].numpy()] -= 1
            _, _, prev, control, gprev = entries[upto]
            n = upto
        host = self.host_store
        return {
            "num_gathers": int(n),
            "control_bytes": int(control),
            "trace": None if trace is None else torch.from_numpy(trace),
            "prev_ids": None if prev is None else prev.clone(),
            # the group's host rows of that batch (intra-machine level): the next plan's prevs
            "group_prev": None if gprev is None else [torch.from_numpy(a.copy()) for a in gprev],
            "host": save() if callable(save := getattr(host, "state_dict", None)) else {},
        }

    def load_state_dict(self, state: dict) -> None:
        """Undo :meth:`state_dict`; the previous batch's rows are read again from host memory
        (the bottom store, uncounted: the same bytes the run held when it was saved)."""
        host = self.host_store
        load = getattr(host, "load_state_dict", None)
        if state.get("host") and callable(load):
            load(state["host"])
        with self._state_lock:
            self.num_gathers = int(state["num_gathers"])
            self.control_bytes = int(state["control_bytes"])
            if self.trace is not None and state["trace"] is not None:
                self.trace[:] = state["trace"].numpy()
            prev = state["prev_ids"]
            self._log.clear()
            gr = self.group_reuse
            if gr is not None:  # every member plans from the same lists, or none has a prev
                gprev = state.get("group_prev")
                if gprev is None or len(gprev) != len(gr.members):
                    prev, gprev = None, [np.zeros(0, dtype=np.int64)] * len(gr.members)
                gr.prevs = [np.asarray(a, dtype=np.int64) for a in gprev]
            if prev is None or not self.reuse:
                self._prev_ids = self._prev_rows = None
                return
            root = getattr(host, "root", host)  # below a cache: its counters stay untouched
            self._prev_ids = prev.to(torch.int64)
            self._flip ^= 1
            self._prev_rows = self._scratch(f"prev{self._flip}", int(prev.numel()))
            if prev.numel():
                if self._pread is not None and root is host:
                    buf = torch.empty((int(prev.numel()), self.dim), dtype=self.dtype)
                    rows = self._pread.gather(self._prev_ids, buf).to(self.device)
                else:
                    rows = root.gather(self._prev_ids).to(self.device)
                self._prev_rows.copy_(rows)

    def _scratch(self, name: str, n: int) -> torch.Tensor:
        """``[n, dim]`` rows of a buffer kept across batches (grown by half again when short): a
        fresh multi-MB tensor per batch would page-fault on first touch, which costs more than
        the copy itself."""
        b = self._buffers.get(name)
        if b is None or b.shape[0] < n:
            b = torch.empty((max(n, n * 3 // 2), self.dim), dtype=self.dtype, device=self.device)
            self._buffers[name] = b
        return b[:n]

    def _exchange(
        self, owner: torch.Tensor, pos: torch.Tensor, where: torch.Tensor, rows_u: torch.Tensor
    ) -> int:
        """Fetch rows ``pos`` of the shards of ranks ``owner`` into ``rows_u[where]`` and serve
        the other ranks' requests from this rank's shard (three ``all_to_all_single`` calls).
        Returns the request (control) bytes sent."""
        ctx, w, grp = self.ctx, self.ctx.world_size, self.group
        t0 = time.perf_counter()
        order = torch.argsort(owner, stable=True)
        owner, pos, where = owner[order], pos[order], where[order]
        send_counts = torch.bincount(owner, minlength=w).to(torch.int64)
        recv_counts = ctx.all_to_all_single(send_counts, group=grp).cpu()
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        # positions requested from each owner -> positions other ranks request from me
        req = ctx.all_to_all_single(pos, rc, sc, group=grp)
        control = 8 * (w + sum(sc))
        # serve: rows of my shard, as bytes
        rb = self.row_bytes
        served = self._scratch("served", req.numel())
        move_rows(self.shard, req.to(self.device), served, None)
        send_b = served.view(torch.uint8).reshape(-1, rb)
        got_b = ctx.all_to_all_single(send_b, sc, rc, group=grp)
        if where.numel():
            got = got_b.to(self.device).view(self.dtype).reshape(-1, self.dim)
            move_rows(
                got, torch.arange(got.shape[0], device=self.device), rows_u, where.to(self.device)
            )
        for k, c in enumerate(sc):
            if c:
                self.counters.add(ctx.link_to(k), c, rb)
        self.collective_s += time.perf_counter() - t0
        return control

    def modeled_rows(self) -> dict[str, float]:
        """Rows per link that the cost model (Eq. 3) counts for this rank's trace so far."""
        from ..placement.costmodel import placement_cost

        if self.trace is None:
            raise RuntimeError("record_trace=False: no trace to model")
        n = self.placement.num_devices
        if self._peers == bool(self.ctx.topo.peers_cheaper):
            # the model's lookup is this store's: its reads by source, a chunk of nodes at a
            # time (the model would build a second lookup and float64 and int64 copies of N)
            by_src = np.zeros(n + 1, dtype=np.float64)
            dev = self.dev_num.numpy()
            for a in range(0, self.num_rows, 1 << 20):
                src = dev[a : a + (1 << 20)].astype(np.int64) + 1
                by_src += np.bincount(src, weights=self.trace[a : a + (1 << 20)], minlength=n + 1)
        else:  # this rank's row of the cost model only (no dense [world, N] array)
            rep = placement_cost(
                self.placement, self.ctx.topo, self.trace, self.row_bytes, devices=[self.rank]
            )
            by_src = rep.devices[0].rows_by_source  # [1 + n]: host, then device k
        local, host = float(by_src[self.rank + 1]), float(by_src[0])
        rows = {"local": local, "peer": float(by_src.sum()) - local - host, "host": host}
        rows["network"] = 0.0
        if self.ctx.num_machines > 1 and rows["peer"]:
            # peers on another machine: split the modeled peer rows by the owner's machine
            net = sum(
                float(by_src[k + 1])
                for k in range(n)
                if k != self.rank and self.ctx.machine_of[k] != self.ctx.machine
            )
            rows["peer"] -= net
            rows["network"] = net
        return rows

    def modeled_seconds(self, rows: dict[str, float] | None = None) -> float:
        """Modeled read seconds (Eq. 3 with the topology's bandwidths; network rows at
        ``network_bw``) for ``rows`` (default: :meth:`modeled_rows`)."""
        r = self.modeled_rows() if rows is None else rows
        t, rb = self.ctx.topo, self.row_bytes
        return (
            r.get("peer", 0.0) * rb / t.peer_bw
            + r.get("host", 0.0) * rb / t.host_bw
            + r.get("network", 0.0) * rb / t.network_bw
        )

    def reset_trace(self) -> None:
        if self.trace is not None:
            self.trace[:] = 0


def _inject(kind: str, rank: int) -> None:
    """The fault a test asked for with ``GNNIO_FAULT`` (see :func:`fault_from_env`)."""
    import os
    import signal

    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault on rank {rank} (GNNIO_FAULT)")


def fault_from_env(rank: int) -> tuple[int, str] | None:
    """``GNNIO_FAULT=RANK:GATHER:kill|raise`` (for tests of the failure path): rank ``RANK``
    SIGKILLs itself, or raises, at its ``GATHER``-th feature gather (0-based). None otherwise."""
    import os

    spec = os.environ.get("GNNIO_FAULT")
    if not spec:
        return None
    try:
        r, g, kind = spec.split(":")
        if int(r) != rank:
            return None
        if kind not in ("kill", "raise"):
            raise ValueError(kind)
        return int(g), kind
    except ValueError:
        raise ValueError(f"GNNIO_FAULT: need RANK:GATHER:kill|raise, got {spec!r}") from None
