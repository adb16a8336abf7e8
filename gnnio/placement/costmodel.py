"""Song & Jiang's cost model of feature reads (§3.1, Eq. 2-6), in rows, bytes and modeled seconds.

GPU ``i`` holds ``B_i``; in one iteration it needs the input nodes ``S_i``. Its remote nodes are
``R_i = S_i \\ B_i`` (Eq. 2) and, with ``B_gpu`` the rows it can reach on the GPUs of its NVLink
group, its read cost is (Eq. 3)::

    C_i(B) = C_cpu |R_i \\ B_gpu| + C_gpu |R_i ∩ B_gpu|     if C_gpu < C_cpu
           = C_cpu |R_i|                                   otherwise

with ``C_cpu = row_bytes / host_bw`` and ``C_gpu = row_bytes / peer_bw`` seconds per row and local
reads free. Training is data-parallel, so the time is set by the slowest GPU: the objective is
``max_i E[C_i(B)]`` subject to ``|B_i| <= BSIZE`` (Eq. 4). Writing ``S_i`` as independent
``xi_j ~ Bernoulli(p_j)`` gives ``E[C_i] = sum_j p_j * cost_i(j)``, with ``cost_i(j)`` = 0, ``C_gpu``
or ``C_cpu`` by where GPU ``i`` reads ``j`` (Eq. 5 and 6 are this sum rearranged for the two cases).

:func:`placement_cost` evaluates that sum for any per-node weights: expected reads per GPU from a
probability estimate (the *predicted* cost), or the counted reads of every GPU over an epoch of
sampled mini-batches (Eq. 3 summed over the epoch's iterations: the *trace* cost). Either way the
seconds are **modeled** from the link bandwidths of the :class:`~gnnio.placement.topology.Topology`, not
measured; contention of several GPUs on one link is not modeled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..placement.topology import Topology
from . import Placement

__all__ = ["DeviceCost", "CostReport", "placement_cost", "expected_reads"]

TIERS = ("local", "peer", "host")


@dataclass
class DeviceCost:
    """One GPU's reads under a placement.

    Attributes:
        device: the reading GPU.
        rows: expected or counted rows read per tier (``local``, ``peer``, ``host``).
        rows_by_source: float ``[1 + n]``: rows read from the host (index 0) and from each device
            ``k`` (index ``k + 1``; the reader's own index is its local rows).
        seconds: modeled seconds, ``C_gpu * rows["peer"] + C_cpu * rows["host"]`` (Eq. 3).
        row_bytes: bytes per feature row.
    """

    device: int
    rows: dict[str, float]
    rows_by_source: np.ndarray
    seconds: float
    row_bytes: int

    @property
    def bytes(self) -> dict[str, float]:
        """Bytes read per tier (rows times row bytes)."""
        return {t: r * self.row_bytes for t, r in self.rows.items()}


@dataclass
class CostReport:
    """Costs of all GPUs; ``max_s`` is the objective of Eq. 4 (modeled seconds)."""

    devices: list[DeviceCost]
    row_bytes: int

    @property
    def max_s(self) -> float:
        return max((d.seconds for d in self.devices), default=0.0)

    @property
    def slowest_device(self) -> int:
        return max(self.devices, key=lambda d: d.seconds).device if self.devices else -1

    @property
    def total_rows(self) -> dict[str, float]:
        return {t: float(sum(d.rows[t] for d in self.devices)) for t in TIERS}

    @property
    def shares(self) -> dict[str, float]:
        """Fraction of all rows read (all GPUs together) from each tier; sums to 1."""
        tot = self.total_rows
        s = sum(tot.values())
        return {t: (v / s if s else 0.0) for t, v in tot.items()}

    @property
    def max_remote_bytes(self) -> float:
        """Peer plus host bytes of the GPU that reads the most over links."""
        return max(
            ((d.rows["peer"] + d.rows["host"]) * self.row_bytes for d in self.devices),
            default=0.0,
        )

    def to_dict(self) -> dict:
        return {
            "max_s": self.max_s,
            "slowest_device": self.slowest_device,
            "shares": self.shares,
            "rows": self.total_rows,
            "max_remote_bytes": self.max_remote_bytes,
            "per_device_s": [d.seconds for d in self.devices],
        }


def placement_cost(
    placement: Placement,
    topology: Topology,
    weights: np.ndarray,
    row_bytes: int,
    devices: list[int] | None = None,
) -> CostReport:
    """Cost of every GPU under ``placement`` (Eq. 3 summed over the weighted nodes).

    Args:
        placement: the buffers (``placement.num_devices`` must equal ``topology.num_gpus``).
        topology: link bandwidths; peer reads are used only when ``peer_bw > host_bw``.
        weights: float ``[N]`` (the same expected reads for every GPU, e.g. ``E[s_i] = p``) or
            ``[n, N]`` (reads of each GPU, e.g. counts from a sampled epoch), by global id.
        row_bytes: bytes per feature row.
        devices: the GPUs to cost (default all; the report then holds only these, in order).

    Returns:
        A :class:`CostReport` in the unit of ``weights`` (per iteration, per epoch, ...).
    """
    n = placement.num_devices
    if topology.num_gpus != n:
        raise ValueError(f"placement has {n} devices but the topology has {topology.num_gpus}")
    w = np.asarray(weights)
    if w.ndim == 1:
        w = np.broadcast_to(w, (n, w.shape[0]))
    if w.shape != (n, placement.num_nodes):
        raise ValueError(
            f"weights: need shape ({placement.num_nodes},) or ({n}, {placement.num_nodes}), got {w.shape}"
        )
    c_cpu, c_gpu = topology.c_host(row_bytes), topology.c_peer(row_bytes)
    which = list(range(n)) if devices is None else [int(d) for d in devices]
    out: list[DeviceCost] = []
    for d in which:
        lk = placement.lookup(d, peers=topology.peers_cheaper)
        wd = np.asarray(w[d], dtype=np.float64)
        by_src = np.bincount(lk.dev_num.astype(np.int64) + 1, weights=wd, minlength=n + 1)
        local, host = float(by_src[d + 1]), float(by_src[0])
        peer = float(by_src.sum()) - local - host
        out.append(
            DeviceCost(
                device=d,
                rows={"local": local, "peer": peer, "host": host},
                rows_by_source=by_src,
                seconds=c_gpu * peer + c_cpu * host,
                row_bytes=int(row_bytes),
            )
        )
    return CostReport(out, int(row_bytes))


def expected_reads(probs: np.ndarray, reads_per_gpu: float) -> np.ndarray:
    """Scale a probability estimate to expected reads per GPU: ``probs / sum(probs) * reads``.

    A score such as :func:`gnnio.preprocess.hotness.sj_estimate` ranks nodes but is not calibrated to the
    sampler (it counts walks over full neighbourhoods); scaling it to the number of rows a GPU
    actually reads per epoch keeps its *distribution* and makes the predicted cost comparable in
    seconds. (For a calibrated ``p`` -- probability per iteration -- use ``reads = E|S| * iters``.)
    """
    p = np.asarray(probs, dtype=np.float64)
    s = float(p.sum())
    return p * (float(reads_per_gpu) / s) if s > 0 else np.zeros_like(p)
