"""A feature store over several GPUs' buffers plus host memory, read through a placement.

Each GPU ``k`` holds the rows ``placement.buffers[k]`` (a *shard*); host memory holds every row.
One :class:`MultiDeviceFeatureStore` serves one reading GPU (data-parallel training runs one per
GPU; :meth:`MultiDeviceFeatureStore.for_reader` makes the others, sharing the shards). A read of
node ``j`` goes where the reader's lookup arrays (Song & Jiang's ``dev_num`` / ``buf_pos``, see
:mod:`gnnio.placement`) say: its own shard (tier ``"local"``), a shard of a GPU of its NVLink group
(tier ``"peer"``), or host memory (tier ``"host"``).

Counters: ``counters`` (the :class:`~gnnio.features.base.TierCounters` of every store) counts rows
and bytes per tier -- ``local + peer + host`` rows always equal the rows requested -- and
``source_counters`` counts them per source: ``"host"`` and ``"gpu0"``, ``"gpu1"``, ... (the link a
row crossed, the reader's own ``"gpu<k>"`` being its local rows).

Simulated devices. Without GPUs (``devices=None``) every shard is a separate tensor in CPU memory:
the same routing, copies and counting run, only the bytes do not cross real links; turn counted
bytes into modeled time with a :class:`~gnnio.placement.topology.Topology`. With ``devices`` a list of torch
devices (``cuda:0``, ``cuda:1``, ...) shard ``k`` lives on ``devices[k]`` and the read is *routed*
(:meth:`MultiDeviceFeatureStore._routed_gather`): the ids go to the reader's GPU once, one host sync
reads how many rows each source serves, and then

* host rows are read zero-copy by the reader's gather kernel from pinned host memory (the tiered
  store's UVA machinery, :mod:`gnnio.features.tiers.uva`; a CPU gather + copy when pinning fails);
* a peer's rows are gathered on a stream of the peer GPU that first waits for the reader's stream
  (the ids are ready), copied to the reader there, and the reader's stream waits for that copy's
  event before writing the output (not the peer's default stream, unordered with the reader's);
* local rows are gathered on the reader's stream.

The same routed read runs on simulated devices when a stream layer is given (``streams=``, e.g.
:class:`~gnnio.utils.streams.RecordingStreams`, which checks the event order on the CPU).

Deviations from Data Tiering (Min et al. §4.2): its reader's kernel dereferences a peer's memory
("kernel-level direct peer GPU memory access"); here the peer gathers the rows and they are copied
to the reader (the peer-to-peer DMA the paper worked around): the same rows and counts, a different
cost. Its single logical tensor finds a row by arithmetic on reordered ids (hot boundary, interleave
by ``id mod g``); this store looks ids up in per-reader ``dev_num`` / ``buf_pos`` arrays of ``N``
entries (2 + 8 bytes a node), which any placement, reordered or not, can fill.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...placement import Placement
from ...placement.topology import Topology
from ...utils.devices import resolve_device
from ...utils.streams import CudaStreams
from ...utils.warnings_at import warn
from .._gather import as_index_array, gather_rows, output_rows, tensor_view
from ..base import FeatureStore, TierCounters
from ..batch_ops import ids_on
from . import uva

__all__ = ["MultiDeviceFeatureStore"]


class _Shared:
    """State shared by the stores of all readers: host rows, shards, placement."""

    def __init__(self, features, placement: Placement, devices: list[torch.device]):
        if isinstance(features, torch.Tensor):
            host = features.detach().cpu().contiguous()
        else:
            arr = np.asarray(features)
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            host = tensor_view(arr)
        if host.dim() != 2:
            raise ValueError(f"features must be 2-D [num_rows, dim], got shape {tuple(host.shape)}")
        if host.shape[0] != placement.num_nodes:
            raise ValueError(
                f"features have {host.shape[0]} rows but the placement covers {placement.num_nodes} nodes"
            )
        self.host = host
        self.host_np = host.numpy() if host.dtype != torch.bfloat16 else None
        self.placement = placement
        self.devices = devices
        # shard k: rows placement.buffers[k] in buffer order, on devices[k]
        self.shards = [
            host.index_select(0, torch.from_numpy(b)).to(devices[k])
            for k, b in enumerate(placement.buffers)
        ]


class MultiDeviceFeatureStore(FeatureStore):
    """Rows from the reader's shard, a peer GPU's shard, or host memory (see module docstring).

    Args:
        features: ``[N, F]`` host feature matrix (NumPy array, memmap or CPU tensor); rows are read
            from it for host reads and copied once into the shards.
        placement: per-GPU buffers (:class:`gnnio.placement.Placement`).
        reader: the GPU this store gathers for (0-based).
        devices: one torch device per GPU of the placement; None = simulated devices (all shards
            in CPU memory).
        topology: when given, peer reads are used only if its peer links are faster than host
            reads (Eq. 3); also checks the GPU count. None = peer reads as the placement allows.
        streams: the stream layer of the routed read (module docstring); None = CUDA streams when
            the reader is a GPU, the plain CPU read on simulated devices.
    """

    def __init__(
        self,
        features,
        placement: Placement,
        reader: int = 0,
        devices: Sequence[str | torch.device] | None = None,
        topology: Topology | None = None,
        _shared: _Shared | None = None,
        streams=None,
    ) -> None:
        super().__init__()
        n_dev = placement.num_devices
        if topology is not None and topology.num_gpus != n_dev:
            raise ValueError(
                f"placement has {n_dev} devices but topology {topology.name!r} has {topology.num_gpus}"
            )
        if not 0 <= int(reader) < n_dev:
            raise ValueError(f"reader {reader} out of range [0, {n_dev})")
        if _shared is None:
            devs = (
                [torch.device("cpu")] * n_dev
                if devices is None
                else [resolve_device(d) for d in devices]
            )
            if len(devs) != n_dev:
                raise ValueError(f"devices: need {n_dev} devices, got {len(devs)}")
            placement.check()  # (ids in range, no repeat: the shards are filled by them)
            _shared = _Shared(features, placement, devs)
        self._s = _shared
        self.topology = topology
        self.reader = int(reader)
        # (not ``simulated``: the class method of that name builds such a store)
        self.simulated_devices = all(d.type == "cpu" for d in _shared.devices)
        self.device = _shared.devices[self.reader]
        self.num_rows = int(_shared.host.shape[0])
        self.dim = int(_shared.host.shape[1])
        self.dtype = _shared.host.dtype
        self.source_counters = TierCounters()
        peers = True if topology is None else topology.peers_cheaper
        lk = placement.lookup(self.reader, peers=peers)
        self.dev_num = torch.from_numpy(lk.dev_num)
        self.buf_pos = torch.from_numpy(lk.buf_pos.astype(np.int64, copy=False))
        if streams is None and self.device.type == "cuda":
            streams = CudaStreams(self.device)
        self._streams = streams
        # lookups on the reader's device, peer streams, the host view
        self._routes: tuple | None = None

    @classmethod
    def simulated(
        cls,
        features,
        topology: str | Topology = "2+2",
        strategy: str = "alg1",
        buffer: float = 0.25,
        reader: int = 0,
        probs: np.ndarray | None = None,
        seed: int = 0,
    ) -> MultiDeviceFeatureStore:
        """A store on simulated devices in one call (tests, demos).

        Args:
            features: ``[N, F]`` host features.
            topology: a :class:`~gnnio.placement.topology.Topology` or anything
                :func:`~gnnio.placement.topology.load_topology` reads (``"2+2"``, a preset, a file).
            strategy: a placement strategy that needs no graph (``alg1``, ``rule1``,
                ``interleaved``, ``mod``, ``naive``, ``random``).
            buffer: rows per GPU as a fraction of ``N`` (:func:`gnnio.utils.counts.top_count`).
            reader: the GPU this store reads for.
            probs: access probabilities; None = a seeded heavy-tailed random vector.
            seed: seed of the random ``probs`` and of ``random``.
        """
        from ...placement import PlacementRequest, place
        from ...placement.topology import load_topology
        from ...utils.counts import top_count

        topo = topology if isinstance(topology, Topology) else load_topology(topology)
        n = int(features.shape[0])
        if probs is None:
            probs = np.random.default_rng(seed).pareto(1.2, n)
        req = PlacementRequest(
            probs=probs, topology=topo, buffer_rows=top_count(buffer, n), seed=seed
        )
        return cls(features, place(strategy, req), reader=reader, topology=topo)

    @property
    def placement(self) -> Placement:
        return self._s.placement

    def for_reader(self, reader: int) -> MultiDeviceFeatureStore:
        """A store for another GPU sharing this one's shards (its own counters and lookups)."""
        streams = None if isinstance(self._streams, CudaStreams) else self._streams
        return MultiDeviceFeatureStore(
            None, self._s.placement, reader, topology=self.topology, _shared=self._s,
            streams=streams,
        )  # fmt: skip

    def __repr__(self) -> str:
        kind = "simulated" if self.simulated_devices else "real"
        return (
            f"MultiDeviceFeatureStore(num_rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}, "
            f"reader={self.reader}, devices={len(self._s.devices)} {kind}, "
            f"strategy={self._s.placement.strategy!r})"
        )

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (int global ids, repeats allowed) as ``[len(ids), dim]`` on the reader's
        device; ``out[:len(ids)]`` is filled and returned when given. Counts rows and bytes per
        tier and per source. Raises IndexError for ids outside ``[0, num_rows)``."""
        if self._streams is not None:
            return self._routed_gather(ids, out)
        idx_np = as_index_array(ids, self.num_rows)
        m = int(idx_np.shape[0])
        dst = output_rows(out, m, self.dim, self.dtype, self.device)
        rb = self.row_bytes
        local = peer = host = 0
        if m:
            idx = torch.from_numpy(idx_np).long()
            src = self.dev_num[idx]
            pos = self.buf_pos[idx]
            for k in torch.unique(src).tolist():
                sel = (src == k).nonzero().squeeze(1)
                cnt = int(sel.shape[0])
                if k < 0:
                    rows = self._host_rows(pos[sel])
                    host += cnt
                    self.source_counters.add("host", cnt, rb)
                else:
                    shard = self._s.shards[k]
                    rows = shard.index_select(0, pos[sel].to(shard.device))
                    if k == self.reader:
                        local += cnt
                    else:
                        peer += cnt
                    self.source_counters.add(f"gpu{k}", cnt, rb)
                dst.index_copy_(0, sel.to(self.device), rows.to(self.device))
        self.counters.add("local", local, rb)
        self.counters.add("peer", peer, rb)
        self.counters.add("host", host, rb)
        return dst

    def _host_rows(self, pos: torch.Tensor) -> torch.Tensor:
        """Host rows ``pos`` (global ids) gathered on the CPU."""
        p = pos.numpy()
        if self._s.host_np is None:
            return self._s.host.index_select(0, pos)
        out = torch.empty((p.shape[0], self.dim), dtype=self.dtype)
        gather_rows(self._s.host_np, p, out, src_tensor=self._s.host)
        return out

    # ---- the routed read (real devices, or simulated ones with a stream layer) ---------------
    def _route_state(self):
        if self._routes is None:
            st, dev = self._streams, self.device
            host_view, pin = None, None
            if dev.type == "cuda" and self._s.host.numel():
                try:
                    host = self._s.host
                    pin = uva.pin_host_tensor(host, dev)
                    host_view = uva.device_view(host, dev)
                except (uva.PinError, ValueError, RuntimeError) as e:
                    if pin is not None:
                        pin.release()
                    pin = None
                    warn(
                        f"MultiDeviceFeatureStore: host rows gathered on the CPU and copied ({e})",
                        RuntimeWarning,
                    )
            peers = {
                k: st.new_stream(f"peer{k}") for k in range(len(self._s.shards)) if k != self.reader
            }
            self._routes = (self.dev_num.to(dev), self.buf_pos.to(dev), peers, host_view, pin)
        return self._routes

    def _routed_gather(self, ids, out: torch.Tensor | None) -> torch.Tensor:
        st, dev, rb = self._streams, self.device, self.row_bytes
        dev_num, buf_pos, peers, host_view, pin = self._route_state()
        idx = ids_on(self, ids, dev)
        m = int(idx.numel())
        dst = output_rows(out, m, self.dim, self.dtype, dev)
        tiers = {"local": 0, "peer": 0, "host": 0}
        if m:
            src = dev_num.index_select(0, idx).long()
            pos = buf_pos.index_select(0, idx)
            n_src = len(self._s.shards) + 1
            counts = torch.bincount(src + 1, minlength=n_src).tolist()  # the one host sync
            order = torch.sort(src, stable=True).indices
            off = 0
            for j, cnt in enumerate(counts):
                k = j - 1
                if cnt == 0:
                    continue
                sel = order[off : off + cnt]
                off += cnt
                p = pos.index_select(0, sel)
                if k < 0:
                    rows = self._host_read(p, host_view, pin)
                    tiers["host"] += cnt
                    self.source_counters.add("host", cnt, rb)
                else:
                    rows = self._shard_read(k, p, peers)
                    tiers["local" if k == self.reader else "peer"] += cnt
                    self.source_counters.add(f"gpu{k}", cnt, rb)
                st.check_read(rows, what=f"rows of source {k}")
                dst.index_copy_(0, sel, rows)
        for t, c in tiers.items():
            self.counters.add(t, c, rb)
        return dst

    def _host_read(self, p: torch.Tensor, host_view, pin) -> torch.Tensor:
        if host_view is not None:  # zero-copy: the reader's kernel reads pinned host memory
            rows = host_view.index_select(0, p)
            pin.note_use()
            return rows
        return self._host_rows(p.cpu()).to(self.device, non_blocking=True)

    def _shard_read(self, k: int, p: torch.Tensor, peers: dict) -> torch.Tensor:
        shard = self._s.shards[k]
        if k == self.reader:
            return shard.index_select(0, p.to(shard.device))
        st = self._streams
        ready = st.record()  # the reader's stream made `p`: the peer's stream waits for it
        ps = peers[k]
        st.wait(ps, ready)
        with st.use(ps):
            st.adopt([p], ps)
            rows = shard.index_select(0, p.to(shard.device, non_blocking=True))
            rows = rows.to(self.device, non_blocking=True)
            st.produce(rows)
            done = st.record()
        cur = st.current()
        st.wait(cur, done)  # the reader writes the output only after the peer's copy
        st.adopt([rows], cur)
        return rows
