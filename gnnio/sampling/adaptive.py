"""Song & Jiang's Algorithm 2 (adaptive LAS scale ``s``) and a *modeled* data-loading share.

Algorithm 2, as printed (inputs ``lt``, ``ut``, ``MAXS``; ``r`` = the ratio of data-loading time to
total execution time of the previous epoch; ``pre`` = previous value of ``s``)::

    1 if fixed == false then
    2   if s >= MAXS then fixed = true
    3   else if r > ut then pre = s; s = s * 2
    4   else if r < lt and s != 1 then s = (s + pre) / 2
    5   else fixed = true

:class:`AdaptiveScale` runs exactly these lines once per :meth:`AdaptiveScale.update` call (after
each epoch). Points the paper leaves open, and what we do:

* ``pre`` before the first doubling: the paper starts at ``s = 1`` and line 4 needs ``s != 1``, so
  ``pre`` is never read unset from that start. For another ``s0`` we start with ``pre = 1`` (the
  uniform sampler, the paper's starting point), so line 4 moves ``s`` back toward 1.
* ``s`` above ``MAXS``: line 3 can overshoot MAXS when ``s`` is not a power of two (1, 2, 4 ->
  ``r < lt`` -> 3 -> 6 -> 12); the paper then fixes ``s`` at the next call (line 2). We keep that
  by default; ``clamp=True`` caps line 3 at ``MAXS`` (the paper's text calls MAXS "a maximum value
  for s"), a deviation you have to ask for.
* Line 4 does not update ``pre``, so repeated halving steps approach the last ``pre``; as printed.

The loading share that drives it: on a real GPU, the measured (gather + transfer) / epoch time. On
simulated devices (no GPU), :func:`modeled_loading_share` turns the bytes each tier served into
modeled seconds with the link bandwidths of :mod:`gnnio.placement.topology` -- label such shares *modeled*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..placement.topology import DEFAULT_HOST_BW, DEFAULT_PEER_BW, GB, Topology

__all__ = [
    "AdaptiveScale",
    "DEFAULT_GPU_BW",
    "MAX_SCALE",
    "check_scale",
    "modeled_loading_time",
    "modeled_loading_share",
]

#: GPU-local memory bandwidth for the model, bytes/s: V100 HBM2, 900 GB/s nominal (Song & Jiang's
#: platform, as :mod:`gnnio.placement.topology`'s defaults). Local reads are "free" in the placement cost
#: model (Eq. 3); here they get this small cost so a share never divides 0 by 0.
DEFAULT_GPU_BW = 900 * GB

#: The locality-aware samplers take ``1 / MAX_SCALE <= s <= MAX_SCALE``. Eq. 8 multiplies weights
#: by ``s``: near 1e308 their sums overflowed (every LADIES layer came out empty, the node-wise
#: kernel divided by zero), near 5e-324 they vanished. LADIES' ``p_j`` (sums of ``1 / (d + 1)^2``)
#: and the node-wise counts lie within ``2^-126 .. 2^63``, so ``s`` times them stays normal and
#: finite over this range; far past it anyway, ``B`` takes all that the budget allows.
MAX_SCALE = 1e200


def check_scale(value) -> float:
    """``float(value)`` where it is in ``[1 / MAX_SCALE, MAX_SCALE]``, else a ValueError."""
    s = float(value)
    if not (math.isfinite(s) and 1.0 / MAX_SCALE <= s <= MAX_SCALE):
        raise ValueError(f"scale: must be a number in [1e-200, 1e200], got {value!r}")
    return s


@dataclass
class AdaptiveScale:
    """Algorithm 2 (module docstring): call :meth:`update` once per epoch with that epoch's
    data-loading share; it returns the ``s`` for the next epoch.

    Attributes:
        lt, ut: lower / upper thresholds on the share (0.15, 0.2 in the paper).
        maxs: MAXS (8 in the paper).
        s0: the starting ``s`` (1 in the paper).
        clamp: cap line 3 at ``maxs`` (a deviation; default False = as printed).
        s: the current scale; ``pre``: the previous one (line 3); ``fixed``: frozen.
        history: one dict per update: ``r``, ``s_before``, ``s``, ``line`` (2-5, or 0 when fixed).
    """

    lt: float = 0.15
    ut: float = 0.2
    maxs: float = 8.0
    s0: float = 1.0
    clamp: bool = False
    s: float = field(init=False)
    pre: float = field(init=False)
    fixed: bool = field(init=False, default=False)
    history: list[dict] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        for name in ("lt", "ut", "maxs", "s0"):
            v = float(getattr(self, name))
            if not math.isfinite(v):
                raise ValueError(f"AdaptiveScale: {name} must be finite, got {v!r}")
            setattr(self, name, v)
        if not 0 <= self.lt <= self.ut:
            raise ValueError(f"AdaptiveScale: need 0 <= lt <= ut, got lt={self.lt}, ut={self.ut}")
        if self.s0 <= 0 or self.maxs <= 0:
            raise ValueError(f"AdaptiveScale: s0 and maxs must be > 0, got {self.s0}, {self.maxs}")
        self.s = self.s0
        self.pre = 1.0

    def update(self, loading_share: float) -> float:
        """One step of Algorithm 2 with ``r = loading_share``; returns the new ``s``."""
        r = float(loading_share)
        if not math.isfinite(r) or r < 0:
            raise ValueError(f"loading_share: must be a finite number >= 0, got {loading_share!r}")
        before, line = self.s, 0
        if not self.fixed:
            if self.s >= self.maxs:  # line 2
                self.fixed, line = True, 2
            elif r > self.ut:  # line 3
                self.pre = self.s
                self.s = self.s * 2
                if self.clamp:
                    self.s = min(self.s, self.maxs)
                line = 3
            elif r < self.lt and self.s != 1:  # line 4
                self.s = (self.s + self.pre) / 2
                line = 4
            else:  # line 5
                self.fixed, line = True, 5
        self.history.append({"r": r, "s_before": before, "s": self.s, "line": line})
        return self.s


def modeled_loading_time(
    host_bytes: float,
    gpu_bytes: float = 0.0,
    peer_bytes: float = 0.0,
    *,
    host_bw: float = DEFAULT_HOST_BW,
    peer_bw: float = DEFAULT_PEER_BW,
    gpu_bw: float = DEFAULT_GPU_BW,
    topology: Topology | None = None,
) -> float:
    """Modeled seconds to load feature bytes: ``host/host_bw + peer/peer_bw + gpu/gpu_bw``.

    Bandwidths in bytes/s; ``topology`` (when given) supplies ``host_bw`` and ``peer_bw``.
    Transfers are assumed serial and contention-free (as the cost model of
    :mod:`gnnio.placement.costmodel`). The result is **modeled**, not measured.
    """
    if topology is not None:
        host_bw, peer_bw = topology.host_bw, topology.peer_bw
    for name, v in (("host_bw", host_bw), ("peer_bw", peer_bw), ("gpu_bw", gpu_bw)):
        if not (math.isfinite(float(v)) and float(v) > 0):
            raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")
    for name, v in (
        ("host_bytes", host_bytes),
        ("gpu_bytes", gpu_bytes),
        ("peer_bytes", peer_bytes),
    ):
        if not (math.isfinite(float(v)) and float(v) >= 0):
            raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
    return float(host_bytes) / host_bw + float(peer_bytes) / peer_bw + float(gpu_bytes) / gpu_bw


def modeled_loading_share(
    host_bytes: float,
    gpu_bytes: float,
    compute_s: float,
    *,
    peer_bytes: float = 0.0,
    host_bw: float = DEFAULT_HOST_BW,
    peer_bw: float = DEFAULT_PEER_BW,
    gpu_bw: float = DEFAULT_GPU_BW,
    topology: Topology | None = None,
) -> float:
    """Modeled data-loading share ``t_load / (t_load + compute_s)`` of one epoch.

    Args:
        host_bytes, gpu_bytes, peer_bytes: feature bytes the epoch read from host memory, the
            training GPU's own memory and its NVLink peers (e.g. ``bytes_by_tier["host"]``,
            ``["gpu"]`` or ``["local"]``, ``["peer"]`` of a training epoch record).
        compute_s: seconds of the rest of the epoch (compute; measured or modeled).
        host_bw, peer_bw, gpu_bw, topology: see :func:`modeled_loading_time`.

    Returns:
        The share in ``[0, 1]`` (0 when nothing was loaded and nothing computed). Loading and
        compute are assumed not to overlap, i.e. Song & Jiang's "ratio of data loading time to
        total execution time". A **modeled** figure: label it so in reports.
    """
    c = float(compute_s)
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"compute_s: must be a finite number >= 0, got {compute_s!r}")
    t = modeled_loading_time(
        host_bytes, gpu_bytes, peer_bytes, host_bw=host_bw, peer_bw=peer_bw, gpu_bw=gpu_bw,
        topology=topology,
    )  # fmt: skip
    return t / (t + c) if t + c > 0 else 0.0
