"""BGL's profiling-based resource isolation (Gan et al., §3.4), for the stages of one machine.

Why: the pipeline's stages run at once, and when each of them grabs every core (free competition)
they contend for cores and memory bandwidth, and some stages do not scale past a few threads
anyway: "some operators may acquire more resources than what they actually need and block other
stages". BGL profiles each stage's time against its resources and gives each stage a fixed,
isolated share, chosen to minimize the slowest stage.

How (the paper's formulation, restricted to one machine's CPU cores):

1. **profile**: each CPU stage ``s`` (``sample``, ``gather``, and ``compute`` when training on
   the CPU) runs alone on a few batches with ``c`` threads, for ``c`` in 1, 2, 4, ... up to the
   cores (:func:`thread_candidates`): ``T_s(c)`` seconds per batch;
2. **fit** ``T_s(c) = a_s / c + d_s`` by least squares (BGL fits this form for its cache stage and
   assumes linear scaling, ``d = 0``, for the others; the fit covers both);
3. **solve** ``min max_s T_s(c_s)`` over integers ``c_s >= 1`` with ``sum c_s <= C`` (the
   cores) by brute force (:func:`solve`). Stages that use no CPU (the model step on a GPU) enter
   the maximum as a constant, as BGL's ``T_gpu`` does.

Fewer cores than CPU stages (CPU training on a small machine: sample, gather and compute on two
cores) leave BGL's constraint without a solution. Stages then share cores, and gnnio minimizes
``max(max_s T_s(c_s), sum_s c_s T_s(c_s) / C)`` over ``1 <= c_s <= C``: the slowest stage, or the
CPU-seconds all stages need per batch spread over the cores, whichever binds (when ``sum c_s <=
C`` the second term never exceeds the first, so this is BGL's objective wherever BGL's constraint
can hold). A stage that scales (``d = 0``) costs the same CPU-seconds at any thread count, one that
does not pays for every extra thread. ``Allocation.shared`` says which case applied.

The PCIe share of BGL's formulation (``b_I + b_II <= B_pcie``, graph structure vs features) is
not solved here: gnnio copies both in one transfer stage, so there is nothing to split.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["Allocation", "StageFit", "fit_stage", "profile_stages", "solve", "thread_candidates"]


@dataclass
class StageFit:
    """``seconds per batch = a / threads + d`` for one stage, with the times it was fitted to."""

    a: float
    d: float
    times: dict[int, float] = field(default_factory=dict)

    def seconds(self, threads: int) -> float:
        return self.a / threads + self.d


@dataclass
class Allocation:
    """The chosen threads per stage and what the fits predict for them.

    Attributes:
        threads: stage -> threads (the CPU stages).
        predicted_s: stage -> predicted seconds per batch with those threads.
        bottleneck_s: the objective's value: the largest predicted stage time (with shared
            cores, or the CPU-seconds per batch over the cores if larger).
        cores: the cores shared out.
        fits: stage -> :class:`StageFit`; fixed: stages that use no CPU, with their seconds.
    """

    threads: dict[str, int]
    predicted_s: dict[str, float]
    bottleneck_s: float
    cores: int
    fits: dict[str, StageFit]
    fixed: dict[str, float] = field(default_factory=dict)
    shared: bool = False
    cores_by_stage: dict[str, list[int]] | None = None

    def as_dict(self) -> dict:
        return {
            "threads": dict(self.threads),
            "predicted_ms_per_batch": {k: 1e3 * v for k, v in self.predicted_s.items()},
            "bottleneck_ms_per_batch": 1e3 * self.bottleneck_s,
            "cores": self.cores,
            "fits": {
                k: {
                    "a": f.a,
                    "d": f.d,
                    "ms_per_batch": {str(c): 1e3 * t for c, t in f.times.items()},
                }
                for k, f in self.fits.items()
            },
            "fixed_ms_per_batch": {k: 1e3 * v for k, v in self.fixed.items()},
            "shared_cores": self.shared,
            "cores_by_stage": self.cores_by_stage,
        }

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in self.threads.items())
        how = " (fewer cores than stages: shared)" if self.shared else ""
        pin = self.cores_by_stage
        where = (
            ""
            if pin is None
            else "; pinned to cores " + ", ".join(f"{k} {v[0]}-{v[-1]}" for k, v in pin.items())
        )
        return f"isolation: {parts} thread(s) of {self.cores} cores{how}{where}"


def thread_candidates(cores: int) -> list[int]:
    """1, 2, 4, ... below ``cores``, and ``cores`` itself."""
    out = [1 << i for i in range(max(1, cores).bit_length()) if (1 << i) < cores]
    return sorted({*out, max(1, cores)})


def fit_stage(times: Mapping[int, float]) -> StageFit:
    """Least-squares ``t = a / c + d`` with ``a, d >= 0`` through ``{threads: seconds}``."""
    pts = sorted((int(c), float(t)) for c, t in times.items())
    if not pts:
        raise ValueError("fit_stage: no measurements")
    xs = [1.0 / c for c, _ in pts]
    ts = [t for _, t in pts]
    n = len(pts)
    mx, mt = sum(xs) / n, sum(ts) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    a = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx if sxx > 0 else 0.0
    if a <= 0:  # no gain from threads (or noise): constant time
        a, d = 0.0, mt
    else:
        d = mt - a * mx
        if d < 0:  # better than linear within noise: linear through the mean
            d = 0.0
            a = sum(x * t for x, t in zip(xs, ts)) / sum(x * x for x in xs)
    return StageFit(a=a, d=d, times=dict(pts))


def solve(
    fits: Mapping[str, StageFit], cores: int, fixed: Mapping[str, float] | None = None
) -> Allocation:
    """The allocation minimizing the slowest stage (module docstring); ties go to fewer threads
    in total, then to the earlier stage.

    With at least as many cores as stages: every candidate objective value ``T`` is some
    ``T_s(c)``; for a given ``T`` each stage takes the fewest threads with ``T_s(c) <= T`` (the
    stages are independent), and the smallest ``T`` whose threads fit in ``C`` is the optimum:
    ``O(k C log(k C))``, exact (BGL searches exhaustively in ``O(C^2)``). With fewer cores than
    stages (``C < k``, at most ``C^k`` tiny cases) it searches exhaustively."""
    names = list(fits)
    fixed = dict(fixed or {})
    if not names:
        raise ValueError("solve: no CPU stages")
    cores = max(1, int(cores))
    shared = cores < len(names)
    floor = max(fixed.values(), default=0.0)
    best: tuple[float, int, tuple[int, ...]] | None = None
    if shared:
        for combo in itertools.product(range(1, cores + 1), repeat=len(names)):
            times = [fits[s].seconds(c) for s, c in zip(names, combo)]
            worst = max(floor, *times, sum(c * t for c, t in zip(combo, times)) / cores)
            key = (round(worst, 12), sum(combo), combo)
            if best is None or key < best:
                best = key
    else:
        top = cores - len(names) + 1  # the most one stage can get with one thread for each other
        values = sorted({max(floor, fits[s].seconds(c)) for s in names for c in range(1, top + 1)})
        for target in values:
            picks = [_fewest(fits[s], target, top) for s in names]
            combo = tuple(c for c in picks if c is not None)
            if len(combo) == len(names) and sum(combo) <= cores:
                worst = max(floor, *(fits[s].seconds(c) for s, c in zip(names, combo)))
                best = (worst, sum(combo), combo)
                break
    assert best is not None
    threads = dict(zip(names, best[2]))
    predicted = {s: fits[s].seconds(c) for s, c in threads.items()}
    return Allocation(
        threads=threads,
        predicted_s=predicted,
        bottleneck_s=best[0],
        cores=cores,
        fits=dict(fits),
        fixed=fixed,
        shared=shared,
    )


def _fewest(fit: StageFit, target: float, top: int) -> int | None:
    """The fewest threads in ``[1, top]`` with ``fit.seconds(c) <= target`` (it decreases in
    ``c``), or None."""
    if fit.seconds(top) > target + 1e-15:
        return None
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi) // 2
        if fit.seconds(mid) <= target + 1e-15:
            hi = mid
        else:
            lo = mid + 1
    return lo


def profile_stages(
    stages: Mapping[str, Callable[[int], float]], candidates: list[int]
) -> dict[str, StageFit]:
    """Run each stage function ``fn(threads) -> seconds per batch`` at every thread count of
    ``candidates`` and fit it (:func:`fit_stage`)."""
    fits = {}
    for name, fn in stages.items():
        times = {}
        for c in candidates:
            t = float(fn(c))
            if not math.isfinite(t) or t < 0:
                raise ValueError(f"profile of stage {name!r} with {c} threads gave {t}")
            times[c] = t
        fits[name] = fit_stage(times)
    return fits
