"""Which variant of the GPU row-gather kernel (:mod:`gnnio.features._triton_rows`) runs: a measured
choice per row width, made once per process, the way cuDNN's benchmark mode or Triton's autotune
choose (issue 24: the GPU-tier gather at >= 0.8 of a device-to-device copy).

Why measure: the kernel's speed on random rows depends on the GPU (an H100 and an H200 trail the
copy by different margins), on the row width (512-byte rows: 32 rows per 16 KiB program; 2 KiB
rows: 8) and on settings no model predicts well (rows per program, warps, cache hints). Each
candidate (:data:`VARIANTS`) writes the same bytes -- they differ in tiling, warps, cache hints
and index arithmetic only -- so the choice changes speed, never results (tested bit-identical).

How: the first gather of a row width that moves at least :data:`MIN_BYTES` launches every
candidate on that call's own rows (a gather's writes are idempotent), each a few times back to
back behind a short GPU sleep so that CUDA events time the kernels and not the host's launches.
Nothing waits for them: the call and the following ones use :data:`DEFAULT` until the events have
completed (``Event.query``, no host synchronisation), then the fastest is kept for the process and
recorded in the run's ``kernels`` report (``configs``). Not while a CUDA graph is captured.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..utils.triton_kernels import kernel_config

__all__ = ["DEFAULT", "MIN_BYTES", "VARIANTS", "RowTuner", "RowVariant", "TUNER", "cuda_trials"]

#: the smallest gather (rows x row bytes) whose timings choose a variant: below it a kernel takes
#: a few microseconds and the candidates' times differ by noise
MIN_BYTES = 4 << 20


@dataclass(frozen=True)
class RowVariant:
    """One way to launch the row kernel. ``tile_bytes``: bytes of (padded) rows per program;
    ``max_rows``: at most this many rows per program (narrow rows); ``num_warps``: warps per
    program; ``stream``: rows read once (``evict_first`` loads; not ``.cg``, which ptxas refuses
    beside it) and written streaming (``.cs`` stores); ``i32``: index arithmetic in 32 bits (only
    where every word offset of the source and the destination fits, else it runs with 64-bit
    offsets)."""

    name: str
    tile_bytes: int
    num_warps: int
    max_rows: int = 64
    stream: bool = False
    i32: bool = False

    def rows_per_program(self, word_bytes: int, padded_words: int) -> int:
        """Rows per program for rows of ``padded_words`` words of ``word_bytes`` (a power of 2)."""
        return max(1, min(self.max_rows, self.tile_bytes // (word_bytes * padded_words)))


#: the candidates; the first is the kernel as it ran before the choice (16 KiB programs, 4 warps)
VARIANTS: tuple[RowVariant, ...] = (
    RowVariant("t16k_w4", 16384, 4),
    RowVariant("t4k_w4", 4096, 4),  # small programs: more of them resident, shorter tail
    RowVariant("t8k_w2", 8192, 2),
    RowVariant("t32k_w8", 32768, 8, max_rows=128),  # more bytes in flight per program
    RowVariant("t16k_w4_stream", 16384, 4, stream=True),
    RowVariant("t16k_w4_i32", 16384, 4, i32=True),
)
DEFAULT = VARIANTS[0]


class _Pending:
    """A candidate's timed launches: ``reps`` pairs of CUDA events around ``calls`` launches."""

    def __init__(self, events: list, calls: int):
        self.events, self.calls = events, calls

    def ready(self) -> bool:
        return all(b.query() for _, b in self.events)

    def seconds(self) -> float:
        return min(a.elapsed_time(b) for a, b in self.events) / 1e3 / self.calls


#: GPU cycles of the sleep that the timed launches queue behind (~3 ms at 1.7 GHz: more than the
#: host takes to queue every candidate's launches, so the events time the kernels back to back)
SLEEP_CYCLES = 5_000_000


def cuda_trials(runs: Sequence[tuple[str, Callable[[], None]]], calls: int = 3, reps: int = 2):
    """Launch every ``(name, run)`` once (compiling it), then, behind a GPU sleep on the current
    stream, ``reps`` times ``calls`` back-to-back launches between CUDA events. Returns ``{name:
    pending}`` (``ready()``, ``seconds()`` per launch) or ``{name: error}`` for a candidate that
    could not run. Nothing waits for the GPU."""
    out: dict = {}
    ok = []
    for name, run in runs:
        try:
            run()
            ok.append((name, run))
        except Exception as e:  # noqa: BLE001 - a candidate that cannot build is not chosen
            out[name] = f"{type(e).__name__}: {e}"[:200]
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(SLEEP_CYCLES)
    for name, run in ok:
        events = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                run()
            b.record()
            events.append((a, b))
        out[name] = _Pending(events, calls)
    return out


class RowTuner:
    """The per-process choice of a row-kernel variant per key (row width, word, scatter or not).

    ``trials(runs)`` starts the measurements (:func:`cuda_trials`, or a fake in tests);
    ``devices``: device types whose gathers are measured (others always get :data:`DEFAULT`)."""

    def __init__(
        self,
        trials: Callable = cuda_trials,
        devices: Sequence[str] = ("cuda",),
        min_bytes: int = MIN_BYTES,
    ):
        self._trials, self._devices, self.min_bytes = trials, tuple(devices), min_bytes
        self._lock = threading.Lock()
        self.chosen: dict[str, RowVariant] = {}
        self._pending: dict[str, dict] = {}
        self.timings: dict[str, dict[str, float | str]] = {}

    def pick(
        self,
        key: str,
        nbytes: int,
        device: torch.device,
        launch: Callable[[RowVariant], None],
        candidates: Sequence[RowVariant] = VARIANTS,
    ) -> RowVariant:
        """The variant for this gather: the chosen one, else :data:`DEFAULT` (measuring the
        candidates with ``launch(variant)`` on the first gather of ``key`` big enough to time)."""
        v = self.chosen.get(key)
        if v is not None:
            return v
        with self._lock:
            if key in self.chosen:
                return self.chosen[key]
            pending = self._pending.get(key)
            if pending is None:
                if nbytes >= self.min_bytes and self._may_time(device):
                    runs = [(c.name, lambda c=c: launch(c)) for c in candidates]
                    try:
                        self._pending[key] = self._trials(runs)
                    except Exception as e:  # noqa: BLE001 - no timing (events): keep the default
                        self._pending[key] = {"error": f"{type(e).__name__}: {e}"[:200]}
                return DEFAULT
            if not self._may_time(device) or not all(
                isinstance(p, str) or p.ready() for p in pending.values()
            ):  # (no event queried while this thread captures a CUDA graph)
                return DEFAULT
            times = {n: p if isinstance(p, str) else p.seconds() for n, p in pending.items()}
            del self._pending[key]
            timed = {n: t for n, t in times.items() if not isinstance(t, str)}
            best = min(timed, key=lambda n: timed[n]) if timed else DEFAULT.name
            self.chosen[key] = next((c for c in candidates if c.name == best), DEFAULT)
            self.timings[key] = times
            kernel_config("rows", key, best)
            return self.chosen[key]

    def _may_time(self, device: torch.device) -> bool:
        if device.type not in self._devices:
            return False
        return device.type != "cuda" or not torch.cuda.is_current_stream_capturing()

    def report(self) -> dict[str, dict]:
        """``{key: {"chosen": name, "us": {candidate: microseconds per launch, or its error}}}``."""
        return {
            k: {
                "chosen": self.chosen[k].name,
                "us": {n: (t if isinstance(t, str) else t * 1e6) for n, t in ts.items()},
            }  # fmt: skip
            for k, ts in self.timings.items()
        }


#: the process's tuner, used by :func:`gnnio.features._triton_rows.copy_rows_triton`
TUNER = RowTuner()
