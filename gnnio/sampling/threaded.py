"""What gnnio's numba CPU samplers share (:class:`~gnnio.sampling.uniform.UniformSampler`,
:class:`~gnnio.sampling.locality.LocalitySampler`): argument checks (fanouts, seeds), the
counter-based random keys (:func:`call_key` per ``sample`` call, :func:`hop_key` per hop; the
scheme is described in :mod:`gnnio.sampling.uniform`), and :class:`ThreadedCPUSampler`, the base
holding the CSR arrays, the seed stream, a scratch pool and the thread pool that runs one part of a
hop per thread.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch

from ..graph.csr import CSRGraph, check_csr
from .base import Sampler

__all__ = [
    "ThreadedCPUSampler",
    "call_key",
    "check_fanouts",
    "check_seeds",
    "hop_key",
    "parse_fanouts",
]

_MASK64 = (1 << 64) - 1
_DOMAIN_COUNTER = 0x5A3C_0001
_DOMAIN_EPOCH = 0x5A3C_0002


def _mix64(z: int) -> int:
    """SplitMix64 finalizer on Python ints (same function as the numba kernel)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def call_key(seed: int, counter: int | None = None, epoch_seed: int | None = None) -> int:
    """The 64-bit key of one ``sample`` call: from ``epoch_seed`` if given, else the counter."""
    if epoch_seed is not None:
        return _mix64(_mix64(_DOMAIN_EPOCH ^ _mix64(seed)) ^ _mix64(epoch_seed & _MASK64))
    return _mix64(_mix64(_DOMAIN_COUNTER ^ _mix64(seed)) ^ _mix64(int(counter or 0)))


def hop_key(key: int, hop: int) -> int:
    """The 64-bit key of hop ``hop`` (0-based) of a call."""
    return _mix64(key ^ _mix64(0x9E3779B97F4A7C15 * (hop + 1)))


def _hop_key(key: int, hop: int) -> np.uint64:
    return np.uint64(hop_key(key, hop))


#: the largest fanout (the kernels count neighbours in int32); -1 takes all neighbours
MAX_FANOUT = 2**31 - 1


def parse_fanouts(text: str) -> list[int]:
    """``"15,10,5"`` -> ``[15, 10, 5]`` (``fanouts[0]`` is hop 1, the seeds' neighbours)."""
    parts = [t.strip() for t in str(text).split(",")]
    if len(parts) > 1 and "" in parts:  # "15,,5" is not a 2-hop setting
        raise ValueError(f"--fanouts: an empty value between commas in {text!r}")
    try:
        fanouts = [int(t) for t in parts if t != ""]
    except ValueError:
        raise ValueError(f"--fanouts: expected comma-separated integers, got {text!r}") from None
    return check_fanouts(fanouts)


def int_list(values, name: str) -> list[int]:
    """``values`` (a list, tuple, array or tensor of integers) as a list of ints; TypeError naming
    ``name`` for anything else (a float is never truncated, a string never read digit by digit)."""
    try:
        if isinstance(values, (str, bytes)):
            raise TypeError
        return [operator.index(v) for v in values]
    except TypeError:
        raise TypeError(f"{name}: need a list of integers, one per hop, got {values!r}") from None


def check_fanouts(fanouts: Sequence[int]) -> list[int]:
    """Validate fanouts (each ``>= 0`` or ``-1`` for all neighbours; at least one hop)."""
    out = int_list(fanouts, "fanouts")
    if not out:
        raise ValueError("fanouts: need at least one hop, got an empty list")
    bad = [f for f in out if f < -1]
    if bad:
        raise ValueError(f"fanouts: each must be >= 0 or -1 (all neighbours), got {out}")
    big = [f for f in out if f > MAX_FANOUT]
    if big:
        raise ValueError(f"fanouts: each must be at most {MAX_FANOUT} (or -1: all), got {big[0]}")
    return out


def check_seeds(seeds, num_nodes: int, name: str = "seeds") -> np.ndarray:
    """Seeds (or other node ids, called ``name`` in the error) as a contiguous int64 NumPy array
    (global ids), with a one-line error if invalid."""
    if isinstance(seeds, torch.Tensor):
        if seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
            raise ValueError(f"{name}: need an integer tensor, got dtype {seeds.dtype}")
        seeds = seeds.detach().cpu().numpy()
    arr = np.asarray(seeds)
    if arr.ndim != 1:
        raise ValueError(f"{name}: need a 1-D array of node ids, got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: need integer node ids, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if not arr.flags.writeable:  # e.g. a slice of a read-only memmap; torch wants writeable
        arr = arr.copy()
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= num_nodes:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name}: node id {bad} out of range [0, {num_nodes})")
    return arr


def _pin_sample() -> None:
    from ..pipeline.affinity import pin_current_thread

    pin_current_thread("sample")


class ThreadedCPUSampler(Sampler):
    """What the numba CPU samplers share: fanouts, the random stream (:meth:`set_seed`, one key
    per :meth:`sample` call), the CSR as contiguous NumPy arrays, a pool of reusable scratch
    buffers and a lazily started thread pool that runs one part of a hop per thread."""

    _thread_prefix = "gnnio-sampler"

    def _init_threads(self, fanouts: Sequence[int], seed: int, num_threads: int | None) -> None:
        self.fanouts = check_fanouts(fanouts)
        if num_threads is not None and int(num_threads) < 1:
            raise ValueError(f"num_threads: must be >= 1, got {num_threads}")
        if num_threads is None:
            num_threads = min(8, int(numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]  # set by numba.config at import
        self.num_threads = int(num_threads)
        self._seed = int(seed)
        self._calls = 0
        self._lock = threading.Lock()
        self._scratch: list = []
        self._executor: ThreadPoolExecutor | None = None

    def _init_csr(self, graph) -> None:
        indptr, indices = graph.indptr, graph.indices
        # a CSRGraph checked its NumPy or CPU arrays when built; CUDA tensors and other objects
        # with indptr/indices are checked here, once (the kernels trust every index)
        checked = isinstance(graph, CSRGraph) and not (
            isinstance(indptr, torch.Tensor) and indptr.device.type != "cpu"
        )
        if isinstance(indptr, torch.Tensor):
            indptr, indices = indptr.cpu().numpy(), indices.cpu().numpy()
        self.indptr = np.ascontiguousarray(np.asarray(indptr), dtype=np.int64)
        self.indices = np.ascontiguousarray(np.asarray(indices))
        if not np.issubdtype(self.indices.dtype, np.integer):
            raise ValueError(f"graph.indices: need integer ids, got dtype {self.indices.dtype}")
        if not checked:
            check_csr(self.indptr, self.indices)
        self.num_nodes = int(self.indptr.shape[0]) - 1
        self._loc_dtype = np.int32 if self.num_nodes < 2**31 - 1 else np.int64

    @property
    def seed(self) -> int:
        return self._seed

    def set_seed(self, seed: int) -> None:
        """Restart the random streams: new base seed, call counter back to 0."""
        with self._lock:
            self._seed = int(seed)
            self._calls = 0

    def close(self) -> None:
        """Stop the pool threads (a later :meth:`sample` starts them again)."""
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True)

    def _next_key(self, epoch_seed: int | None) -> int:
        if epoch_seed is not None:
            return call_key(self._seed, epoch_seed=int(epoch_seed))
        with self._lock:
            c = self._calls
            self._calls += 1
        return call_key(self._seed, counter=c)

    def _run_split(self, fn, args_per_part: list[tuple]) -> None:
        """Run ``fn(*args)`` for every part: part 0 on this thread, the rest on the pool."""
        if len(args_per_part) == 1:
            fn(*args_per_part[0])
            return
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.num_threads - 1,
                    thread_name_prefix=self._thread_prefix,
                    initializer=_pin_sample,  # --isolation auto's core set for sampling
                )
                weakref.finalize(self, self._executor.shutdown, wait=False)
            ex = self._executor
        futures = [ex.submit(fn, *a) for a in args_per_part[1:]]
        try:
            fn(*args_per_part[0])
        finally:
            for f in futures:
                f.result()
