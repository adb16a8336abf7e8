"""Neighbour sampling over a topology partitioned across ranks (HyDRA §II-C/§III-A, BGL §3.3).

Rank ``r`` holds only its shard of the partition (:mod:`gnnio.preprocess.partition`): the
in-neighbour lists of the nodes it owns plus the replicated ones, memory-mapped from
``PDIR/part<r>/``. A batch is sampled hop by hop exactly as
:class:`~gnnio.sampling.UniformSampler` samples it -- the destination rows of hop ``h`` are all
input nodes so far, each row takes ``min(deg, fanout)`` distinct neighbours -- but every row's
list is read where it lives:

* rows whose list the rank stores (own or replicated) are sampled locally;
* ``dsp`` (DSP-style request/response): the other rows are sent to their owners with
  ``all_to_all_single``; each owner samples them from its shard and returns the sampled neighbour
  ids (4 collectives per hop: request sizes, row ids, per-row counts, neighbour ids);
* ``shared`` (HyDRA memory sharing): the rank reads the owner's list directly from the owner's
  memory -- on the CPU each rank's shard is a torch shared-memory tensor in ``/dev/shm`` mapped
  by the other local ranks; on GPUs the owner's GPU memory through CUDA IPC
  (:mod:`gnnio.distributed.shm`) -- and samples it itself. Owners on
  another machine cannot be read this way, so their rows fall back to request/response.

The random choice of a row is a pure function of (sampler seed, call key, hop, node id): the same
counter-based state as the single-process kernels, so for the same seeds and ``epoch_seed`` both
modes give **exactly** the single-process :class:`~gnnio.sampling.UniformSampler`'s batch (a
test checks it), whoever samples which row. Every collective goes through the rank context on
its ``sample`` group (``eval_sample`` for evaluation), so the sampling thread never interleaves
with the feature exchange or DDP, and every tensor is on the device the backend needs.

Counted per batch (:attr:`ShardedSampler.stats`): ``requests`` (remote rows asked for or read),
``local_rows`` (rows sampled from the own shard),
``bytes_by_link`` ``local`` (entries read from the own shard: the sampled ones, plus the row's
``indptr`` pair), ``peer`` / ``network`` (dsp: 8-byte row ids out, 8-byte counts and sampled ids
back; shared: the whole remote list and its ``indptr`` pair, which is what memory sharing moves,
HyDRA Eq. 3). Against the paper's Eq. 2-3 (counted in vertex ids, with ``(M-1)/M`` the modeled
remote share): per remote row dsp counts ``2 + min(d, f)`` 8-byte values, not ``f + 1`` (the
per-row count that delimits the replies, and a short row returns ``d < f``), shared ``d``
entries of the graph's index dtype (4 bytes for int32) plus 16 bytes, not ``d``: HyDRA's
"hybrid pointer" keeps each vertex's head/tail address as a local mapping, whereas here only
the node -> row lookup is local (a bucketed search in the peer's sorted node ids, not a pointer
indexed by global id, issue 26) and the row's ``indptr`` pair is read from the owner's shard.

**Threshold pruning** (``prune=(alpha, beta)``, HyDRA §III-A3, Eq. 4): every row longer than the
hop's threshold ``ceil(alpha * avg_degree + beta * fanout)`` is cut to a circular window of that
many consecutive list positions from a uniformly random start, and its ``min(threshold, fanout)``
neighbours are drawn from the window (:mod:`gnnio.sampling.locality` explains why the window
wraps). Rows are then sampled with the kernels and counter-based streams of
:class:`~gnnio.sampling.PrunedUniformSampler` -- the window start is drawn from the row's stream,
so whoever samples a row picks the same window -- and a batch is **exactly** that sampler's
batch, edge weights included (HT weights ``deg / k``, equal within a row; the owner's degree comes
back with the dsp counts, 8 more bytes per requested row). What pruning changes is what ``shared``
reads: only the window (``threshold`` entries, up to two contiguous runs when it wraps) and the
``indptr`` pair, not the whole list, and it is counted that way (over CUDA IPC too: only the
window is copied, :func:`gnnio.distributed.shm.gather_lists`). ``dsp`` moves the same sampled
ids as before (the owner reads its own list locally).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from ..sampling import _kernels
from ..sampling import _las_kernels as _las
from ..sampling.base import Block, MiniBatch, Sampler
from ..sampling.locality import prune_pair, prune_thresholds
from ..sampling.threaded import ThreadedCPUSampler, _hop_key, check_seeds
from ..utils.triton_kernels import kernel_ran
from ._ids import BatchIds, ShardIndex, place_rows
from .context import DistContext

_LINKS = ("local", "peer", "network")  # the links a sampled row crosses (DistContext.link_to)

__all__ = ["MODES", "ShardedSampler"]

MODES = ("dsp", "shared")


class _Shard:
    """One part's CSR shard (memory-mapped) and the row of every stored node.

    The row of a global id is found in the shard's sorted node ids through a bucket directory
    (:class:`~gnnio.distributed._ids.ShardIndex`: about 18 bytes per *stored* node), not through a
    map of all ``N`` nodes: a rank's memory shrinks with its shard (issue 26), and in shared mode
    it holds one such index per peer shard."""

    def __init__(self, pdir: Path, k: int, num_nodes: int, arrays: dict | None = None) -> None:
        """``arrays``: the shard's ``nodes``/``indptr``/``indices`` already mapped (shared
        memory, or CUDA tensors of a peer's GPU: :mod:`gnnio.distributed.shm`); None: the
        partition files, memory-mapped."""
        d = Path(pdir) / f"part{k}"
        if arrays is None:
            arrays = {
                n: np.load(d / f"{n}.npy", mmap_mode="r", allow_pickle=False)
                for n in ("nodes", "indptr", "indices")
            }
        self.nodes, self.indptr, self.indices = arrays["nodes"], arrays["indptr"], arrays["indices"]
        # tensors (a peer's GPU memory): rows are copied into a compact CSR before sampling
        self.tensors = isinstance(self.indices, torch.Tensor)
        if isinstance(self.nodes, torch.Tensor):
            self.nodes = self.nodes.cpu().numpy()
        self.index = ShardIndex(np.asarray(self.nodes, dtype=np.int64))
        self.num_nodes = int(num_nodes)
        self.itemsize = int(self.indices.dtype.itemsize)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The shard row of every global id in ``ids`` (-1 where the shard does not store it)."""
        return self.index.rows_of(ids)

    def sample(
        self,
        rows_global: np.ndarray,
        fanout: int,
        hkey,
        theta: int | None = None,
        local: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, flat neighbour ids)`` of rows (global ids stored here; ``local``: their
        shard rows, when known). ``theta`` None: :class:`~gnnio.sampling.UniformSampler`'s
        kernels; an int (0 = this hop is not pruned): :class:`~gnnio.sampling.PrunedUniformSampler`'s,
        with pruning threshold ``theta``."""
        counts, edges = self.sample_edges(rows_global, fanout, hkey, theta, local)
        return counts, edges[0]

    def sample_edges(
        self,
        rows_global: np.ndarray,
        fanout: int,
        hkey,
        theta: int | None = None,
        local: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`sample`'s counts and ``[2, E]`` edges: the neighbour ids, and the position of
        each one's row in ``rows_global`` (the kernels write both)."""
        if local is None:
            local = self.rows_of(rows_global)
        if rows_global.size and local.min() < 0:
            raise RuntimeError("a requested row is not stored in this shard")
        indptr, indices = self.indptr, self.indices
        if self.tensors:  # the rows' lists, read from the owner's memory into a compact CSR
            from .shm import gather_lists

            window = None
            if theta and fanout >= 0:  # pruned: copy only each long row's window (Eq. 4)
                window = (lambda d: _window_starts(rows_global, d, hkey, theta), theta)
            indptr, indices = gather_lists(indptr, indices, local, window)
            local = np.arange(local.shape[0], dtype=np.int64)
        if theta is not None:
            return self._sample_pruned(indptr, indices, rows_global, local, fanout, hkey, theta)
        offs, info = _kernels.count_rows(indptr, local, np.int64(fanout))
        edges = np.empty((2, int(offs[-1])), dtype=np.int64)
        _kernels.sample_rows(indices, rows_global, info, hkey, offs, 0, rows_global.shape[0], edges)
        return np.diff(offs), edges

    @staticmethod
    def _sample_pruned(indptr, indices, rows_global, local, fanout: int, hkey, theta: int):
        n = int(rows_global.shape[0])
        offs = np.empty(n + 1, dtype=np.int64)
        rows = np.zeros((4, n), dtype=np.int64)
        fo, th = np.int64(fanout), np.int64(theta)
        qptr, qpos = np.zeros(1, np.int64), np.zeros(0, np.int32)
        # ``count_rows`` reads row starts and degrees through the shard's local rows;
        # ``sample_rows`` keys each row's stream by its global id (``nodes``)
        e = int(_las.count_rows(indptr, local, fo, th, False, qptr, qpos, offs, rows)[0])
        edges = np.empty((2, e), dtype=np.int64)
        src, dst = edges[0], edges[1]
        _las.sample_rows(
            indices, rows_global, 0, n, offs, rows, hkey, fo, th, 1.0, False, qpos,
            _las.W_NONE, src, dst, np.empty(0, dtype=np.float32),
        )  # fmt: skip
        return np.diff(offs), edges

    def degrees(self, rows_global: np.ndarray, local: np.ndarray | None = None) -> np.ndarray:
        if local is None:
            local = self.rows_of(rows_global)
        if self.tensors:
            loc = torch.from_numpy(local).to(self.indptr.device)
            return (self.indptr[loc + 1] - self.indptr[loc]).long().cpu().numpy()
        return np.asarray(self.indptr)[local + 1] - np.asarray(self.indptr)[local]


class ShardedSampler(ThreadedCPUSampler, Sampler):
    """Uniform node-wise sampling over partition ``pdir`` on rank ``ctx.rank`` (module docstring).

    Args:
        partition: a loaded :class:`~gnnio.preprocess.partition.Partition`.
        pdir: its directory (the shards are memory-mapped from it).
        ctx: the rank context (its ``group`` carries the dsp collectives).
        fanouts, seed: as :class:`~gnnio.sampling.UniformSampler`'s.
        mode: ``dsp`` or ``shared``.
        prune: HyDRA threshold pruning ``(alpha, beta)`` or None (module docstring); the batches
            are then :class:`~gnnio.sampling.PrunedUniformSampler`'s, with its HT weights.
        avg_degree: edges / nodes of the whole graph (Eq. 4's ``avg_degree``; needed with
            ``prune``, as a rank does not hold the whole graph).
        group: the context's process group (``sample``; ``eval_sample`` for evaluation).
        share_with: another sampler of the same partition and rank whose shard (and, both
            ``shared``, mapped peer shards) this one reads too (the evaluation sampler: no
            second index of the shard, no second copy in shared memory).
        shard_device: ``shared`` mode: where the shards are shared from (``"cpu"``: ``/dev/shm``;
            ``"cuda"``: the rank's GPU, CUDA IPC, whatever the backend); None: the rank's device
            (:func:`gnnio.distributed.shm.shard_device`). A ``ValueError`` in ``dsp`` mode.

    Attributes:
        thresholds: pruning threshold per hop (``fanouts`` order; 0 = not pruned), or None.
    """

    def __init__(
        self, partition, pdir, ctx: DistContext, fanouts, seed: int = 0, mode="dsp",
        prune: tuple[float, float] | None = None, avg_degree: float | None = None,
        group: str = "sample", share_with: ShardedSampler | None = None,
        shard_device: str | torch.device | None = None,
    ):  # fmt: skip
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
        if shard_device is not None and mode != "shared":
            raise ValueError(f"shard device: only with sampling mode shared, not {mode}")
        self._init_threads(fanouts, seed, 1)
        self.prune = prune_pair(prune)
        self.thresholds: list[int] | None = None
        if self.prune is not None:
            if avg_degree is None:
                raise ValueError("avg_degree: needed with prune (edges / nodes of the graph)")
            self.thresholds = prune_thresholds(float(avg_degree), self.fanouts, self.prune)
        self.partition, self.ctx, self.mode, self.group = partition, ctx, mode, group
        self.num_nodes = partition.num_nodes
        # the owner of every node (int16, 2 bytes per node): the one array sized by the whole
        # graph that stays, since any node may turn up in a frontier and its owner must be known
        # (DistDGL's partition book; a range book would need ids relabelled by part)
        self.parts = np.asarray(partition.parts)
        self.rank = ctx.rank
        # the evaluation sampler reads the training sampler's shard (one copy of its index)
        same = share_with is not None and share_with.rank == ctx.rank
        self.own: _Shard = (
            share_with.own if share_with is not None and same else self._own_shard(pdir)
        )
        # shared mode: the shards of the other ranks of this machine, read from the owner's
        # memory (/dev/shm on the CPU, CUDA IPC on GPUs: gnnio.distributed.shm)
        self.peer_shards: dict[int, _Shard] = {}
        self.shared_via: str | None = None
        if mode == "shared" and share_with is not None and share_with.mode == "shared":
            self.peer_shards, self.shared_via = share_with.peer_shards, share_with.shared_via
        elif mode == "shared":
            from .shm import shard_device as _where
            from .shm import share_shards

            where = _where(ctx, shard_device)  # before any collective: a refusal on every rank

            peers = [
                k for k in range(ctx.world_size)
                if k != ctx.rank and ctx.machine_of[k] == ctx.machine
            ]  # fmt: skip
            own = {"nodes": self.own.nodes, "indptr": self.own.indptr, "indices": self.own.indices}
            mapped, self.shared_via = share_shards(ctx, own, peers, where)
            for k in peers:
                self.peer_shards[k] = _Shard(pdir, k, self.num_nodes, arrays=mapped.get(k))
        self.stats = {"requests": 0, "local_rows": 0, "batches": 0, "seconds": 0.0,
                      "collective_s": 0.0}  # fmt: skip
        # every link up front: a mid-epoch checkpoint copies these while the sampling thread
        # runs, and a key added during the copy would end it ("dictionary changed size")
        self.bytes_by_link: dict[str, int] = defaultdict(int, dict.fromkeys(_LINKS, 0))
        # the last batch's id table (BatchIds) and how many ids it numbered, per thread
        self._spare = threading.local()

    #: every row is known to be in the own shard (no request step); bench dist-sampling's
    #: all-local run of HyDRA's overlap rates (:mod:`gnnio.bench.dist_overlap`)
    all_local = False

    def _own_shard(self, pdir) -> _Shard:
        """This rank's shard: its part's files (a hook for :mod:`gnnio.bench.dist_overlap`)."""
        return _Shard(pdir, self.ctx.rank, self.num_nodes)

    def _rows_here(self, ids: np.ndarray) -> np.ndarray:
        """The own shard's row of every id (-1: not stored there); looked up once per batch,
        when the id first turns up (a hook for :mod:`gnnio.bench.dist_overlap`)."""
        return self.own.rows_of(ids)

    def _owners(self, rows: np.ndarray) -> np.ndarray:
        """The owner of every row not stored here (a hook for :mod:`gnnio.bench.dist_overlap`)."""
        return self.parts[rows]

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def sample(self, seeds, epoch_seed: int | None = None) -> MiniBatch:
        """The batch of ``seeds``; a collective step on every rank in ``dsp`` mode (and in
        ``shared`` mode across machines), so every rank must call it equally often."""
        t0 = time.perf_counter()
        key = self._next_key(epoch_seed)
        # the summary's kernels: every shard's rows (own, peers', requested) go through the
        # single-process samplers' numba kernels (UniformSampler / PrunedUniformSampler)
        kernel_ran("hop", "numba")
        seeds = check_seeds(seeds, self.num_nodes)
        n0 = int(seeds.shape[0])
        # local ids in order of first appearance, from a hash table of the batch's ids (not a
        # map of all N: gnnio.distributed._ids)
        spare = self._spare
        ids = BatchIds(seeds, getattr(spare, "buffer", None), getattr(spare, "ids", 0))
        if ids.n != n0:
            raise ValueError("seeds: must be distinct")
        nodes = ids.ids()
        hop_nodes, hop_edges, hop_w = [n0], [], []
        where = np.empty((3, 0), dtype=np.int64)  # _locate of every node so far
        for h, fo in enumerate(self.fanouts):
            where = np.concatenate((where, self._locate(nodes[where.shape[1] :])), axis=1)
            cnt, edges, deg = self._hop(nodes, where, int(fo), _hop_key(key, h), h)
            if self.thresholds is not None:
                w = _ht_weights(deg, self.thresholds[h], int(fo))
                hop_w.append(torch.from_numpy(np.repeat(w, cnt)))
            ids.add(edges[0], out=edges[0])  # (relabelled in place: edges[1] is the row)
            hop_edges.append(edges)
            nodes = ids.ids()
            hop_nodes.append(int(nodes.shape[0]))
        blocks = [
            Block(
                torch.from_numpy(hop_edges[h]),
                hop_nodes[h + 1],
                hop_nodes[h],
                edge_weight=hop_w[h] if hop_w else None,
            )
            for h in range(len(hop_edges) - 1, -1, -1)
        ]
        spare.buffer, spare.ids = ids.buffer, ids.n  # (the table only: nodes go out with the batch)
        self.stats["batches"] += 1
        self.stats["seconds"] += time.perf_counter() - t0
        return MiniBatch(
            seeds=torch.from_numpy(seeds),
            input_nodes=torch.from_numpy(nodes),
            blocks=blocks,
            meta={"hop_nodes": hop_nodes},
        )

    def _locate(self, ids: np.ndarray) -> np.ndarray:
        """Where every id's list is read, ``[3, len(ids)]``: the own shard's row (-1: not
        stored there), the owner of an id not stored here (else -1), and its row in that
        owner's shard where this rank maps it (``shared`` mode; else -1). Looked up once per
        batch, when the id first turns up: a hop's rows are all the nodes so far."""
        out = np.full((3, ids.shape[0]), -1, dtype=np.int64)
        out[0] = self._rows_here(ids)
        away = np.flatnonzero(out[0] < 0)
        if away.size:
            out[1, away] = self._owners(ids[away])
            for k, shard in self.peer_shards.items() if self.mode == "shared" else ():
                sel = away[out[1, away] == k]
                out[2, sel] = shard.rows_of(ids[sel])
        return out

    # -- one hop --------------------------------------------------------------------------
    def _hop(self, rows: np.ndarray, where: np.ndarray, fo: int, hkey, h: int):
        """Per-row sampled counts, the ``[2, E]`` edges (neighbour ids in row order, and their
        rows' positions in ``rows``) and (with pruning) the rows' degrees (else None).
        ``where``: :meth:`_locate` of every row."""
        n = rows.shape[0]
        local = where[0]
        theta = None if self.thresholds is None else int(self.thresholds[h])
        remote = np.flatnonzero(local < 0)
        asks = (self.mode == "dsp" or self.ctx.num_machines > 1) and not self.all_local
        if not remote.size:  # every row stored here: the kernels' edges are the hop's
            c, e = self.own.sample_edges(rows, fo, hkey, theta, local=local)
            self._count_local(e.shape[1], n)
            if asks:  # (the other ranks' requests are served all the same)
                self._request(remote, remote, remote.astype(self.parts.dtype), fo, hkey, h, theta)
            return c, e, None if theta is None else self.own.degrees(rows, local)
        pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
        owner = where[1, remote]
        idx = np.flatnonzero(local >= 0)
        c, f = self.own.sample(rows[idx], fo, hkey, theta, local=local[idx])
        self._count_local(f.size, idx.size)
        deg = None if theta is None else self.own.degrees(rows[idx], local[idx])
        pieces.append((idx, c, f, deg))
        ask = np.ones(remote.shape[0], dtype=bool)
        if self.mode == "shared":
            for k, shard in self.peer_shards.items():
                sel = remote[owner == k]
                if sel.size:
                    loc = where[2, sel]
                    c, f = shard.sample(rows[sel], fo, hkey, theta, local=loc)
                    deg = shard.degrees(rows[sel], loc)
                    read = deg if not theta or fo < 0 else np.minimum(deg, theta)
                    self.bytes_by_link["peer"] += int(read.sum() * shard.itemsize + 16 * sel.size)
                    pieces.append((sel, c, f, None if theta is None else deg))
                    ask[owner == k] = False
            self.stats["requests"] += int((~ask).sum())
        need = remote[ask]
        if asks:
            pieces.append(self._request(need, rows[need], owner[ask], fo, hkey, h, theta))
        cnt = np.zeros(n, dtype=np.int64)
        deg_all = None if theta is None else np.zeros(n, dtype=np.int64)
        for r, c, _, d in pieces:
            cnt[r] = c
            if deg_all is not None:
                assert d is not None  # (pruned requests return their degrees)
                deg_all[r] = d
        offs = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(cnt, out=offs[1:])
        edges = np.empty((2, int(offs[-1])), dtype=np.int64)
        for r, c, f, _ in pieces:
            place_rows(offs, r, c.astype(np.int64, copy=False), f, edges)
        return cnt, edges, deg_all

    def _count_local(self, entries: int, rows: int) -> None:
        self.bytes_by_link["local"] += int(entries * self.own.itemsize + 16 * rows)
        self.stats["local_rows"] += int(rows)

    def _request(self, where, ids, owner, fo: int, hkey, h: int, theta: int | None = None):
        """Request/response for rows ``ids`` owned by ``owner`` (4 ``all_to_all_single``);
        serves the other ranks' requests from the own shard. Returns ``(where, counts, flat,
        degrees)``: with pruning (``theta`` not None) each count travels with its row's degree
        (for the HT weights), else degrees is None."""
        ctx, w, grp = self.ctx, self.ctx.world_size, self.group
        t0 = time.perf_counter()
        order = np.argsort(owner, kind="stable")
        where, ids, owner = where[order], ids[order], owner[order]
        send_n = np.bincount(owner, minlength=w).astype(np.int64)
        # every tensor goes through the context, which places it where the backend needs it
        # (NCCL: this rank's GPU; handing it numpy-backed CPU tensors fails on the first hop)
        recv_n = ctx.all_to_all_single(torch.from_numpy(send_n), group=grp).cpu()
        sc, rc = send_n.tolist(), recv_n.tolist()
        req = ctx.all_to_all_single(torch.from_numpy(ids), rc, sc, group=grp).cpu().numpy()
        # serve: sample the requested rows from my shard
        my_c, my_f = self.own.sample(req, fo, hkey, theta)
        per = 1 if theta is None else 2  # int64 values per row in the counts message
        if theta is None:
            reply = torch.from_numpy(my_c)
        else:
            reply = torch.from_numpy(np.stack([my_c, self.own.degrees(req)], axis=1))
        got = ctx.all_to_all_single(reply, sc, rc, group=grp).cpu()
        got_c = got if per == 1 else got[:, 0].contiguous()
        bounds = np.r_[0, np.cumsum(rc)]
        out_f = [int(my_c[bounds[k] : bounds[k + 1]].sum()) for k in range(w)]
        bounds_in = np.r_[0, np.cumsum(sc)]
        in_f = [int(got_c[bounds_in[k] : bounds_in[k + 1]].sum()) for k in range(w)]
        got_f = ctx.all_to_all_single(torch.from_numpy(my_f), in_f, out_f, group=grp).cpu()
        for k in range(w):
            if sc[k]:
                self.bytes_by_link[ctx.link_to(k)] += 8 * ((1 + per) * sc[k] + in_f[k])
        self.stats["requests"] += int(ids.size)
        self.stats["collective_s"] += time.perf_counter() - t0
        return where, got_c.numpy(), got_f.numpy(), None if per == 1 else got[:, 1].numpy()


def _window_starts(rows_global: np.ndarray, deg: np.ndarray, hkey, theta: int) -> np.ndarray:
    out = np.empty(rows_global.shape[0], dtype=np.int64)
    _las.window_starts(rows_global, deg.astype(np.int64), hkey, np.int64(theta), out)
    return out


def _ht_weights(deg: np.ndarray, theta: int, fanout: int) -> np.ndarray:
    """float32 per-row HT weight ``1 / pi`` of uniform sampling in a pruned window (every
    neighbour's inclusion probability is ``k / deg``), computed as the LAS kernel does
    (``deg / n``, times ``n / k`` when the window is not taken whole), so bit-equal to it."""
    d = deg.astype(np.float64)
    n = deg.copy()
    if fanout >= 0 and theta > 0:
        n = np.where(deg > theta, theta, deg)
    k = n if fanout < 0 else np.minimum(n, fanout)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = d / n
        w = np.where(k == n, w, w * n / k)
    return w.astype(np.float32)
