"""The CPU row-gather kernel behind every host/disk feature store (one native boundary).

``gather_rows(src, ids, out)`` copies ``src[ids[i]]`` to ``out[i]`` for every ``i``. Two
implementations sit behind it:

* **numba** (default when numba imports): a ``prange`` loop over contiguous chunks of output
  rows, ``nogil`` so the loader's background thread runs it while the consumer thread keeps the
  GIL, with a software prefetch of every cache line of the row ``PREFETCH_ROWS`` ahead (random
  rows defeat the hardware prefetcher; a row that does not start on a 64-byte boundary spans one
  line more than its size, and that line is prefetched too). Each row is copied by one ``memcpy``
  call (:func:`gnnio.utils.row_copy.copy_row`), so every feature dtype (float32, float16,
  bfloat16, ...) and row width is served; the same pass checks each id's range (no separate
  min/max pass over the ids: that pass cost about 3 % of a 2^21-node graph's gather). The
  kernel is latency bound (one 512-byte row = 8 cache lines, each thread keeps a few rows in
  flight). On the 2-core Intel VM the ``memcpy`` copy measured 9.0-9.4 GB/s on the 2^21 graph's
  batches where numba's uint64 slice copy (the kernel before) measured 6.3-7.2, and ATen's
  ``index_select`` 8.1-9.0 (``gnnio bench gather``, docs/benchmarks.md). The plain fallback
  kernel (when the prefetching one cannot compile) still copies through the widest word view
  that the row size and both base addresses allow (:func:`word_views`).

  Feature buffers start on a 2 MiB boundary (:func:`host_empty`; NumPy's start 16 bytes past a
  line, so a 512-byte row spanned 9 lines: 5-12% slower).
* **torch**: ``torch.index_select(src, 0, ids, out=out)``, the reference/fallback path (used when
  numba is missing, on CUDA tensors, and in tests so the fallback stays tested).

Id validation lives here too (:func:`as_index_array`) so every store raises the same errors.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ..utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from ..utils.warnings_at import warn

try:  # numba is a hard dependency, but keep the pure-torch path usable and tested
    import numba
    from numba import njit, prange

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only without numba
    numba = None  # type: ignore[assignment]  # (no numba: the torch paths)
    HAVE_NUMBA = False

__all__ = [
    "HAVE_NUMBA",
    "KERNELS",
    "as_index_array",
    "check_out",
    "check_range",
    "copy_masked",
    "copy_rows",
    "gather_rows",
    "host_empty",
    "host_rows",
    "prefetch_lines",
    "row_bytes_view",
    "scatter_masked",
    "set_numba_threads",
    "tensor_view",
    "word_views",
]

KERNELS = ("auto", "numba", "torch")

#: rows ahead of the copy whose cache lines are prefetched, and the most bytes prefetched per row
PREFETCH_ROWS = 8
PREFETCH_MAX_BYTES = 1024


def prefetch_lines(row_bytes: int) -> int:
    """Cache lines of each row the kernel prefetches ahead: its first ``PREFETCH_MAX_BYTES``."""
    return (min(row_bytes, PREFETCH_MAX_BYTES) + 63) // 64


def set_numba_threads(num_threads: int | None) -> int:
    """numba's threads on the calling thread set to ``num_threads`` (clamped to
    ``[1, NUMBA_NUM_THREADS]``; None: left as they are); returns the count in effect."""
    if num_threads is None:
        return numba.get_num_threads()
    nt = max(1, min(int(num_threads), numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]  # set by numba.config at import
    numba.set_num_threads(nt)
    return nt


if HAVE_NUMBA:
    from ..utils.prefetch import prefetch_row
    from ..utils.row_copy import copy_row

    @njit(parallel=True, nogil=True, cache=True)
    def _gather_bytes(src, ids, out):  # pragma: no cover - compiled, tested through gather_rows
        # src: [N, R] uint8, ids: [n] int32/int64 (already bounds-checked), out: [n, R] uint8
        for i in prange(ids.shape[0]):
            out[i, :] = src[ids[i], :]

    def _make_prefetch_kernel(pf_lines: int, tail: bool):
        """The kernel gather_rows uses, for rows whose first ``pf_lines`` cache lines (and, with
        ``tail``, the line of byte ``last_off``) are prefetched: as _gather_bytes (any word view:
        uint64 / uint32 / uint16 / uint8 [N, words]) but a ``memcpy`` per row and each id's range
        checked (returns how many were out of range), plus a software prefetch of the row
        PREFETCH_ROWS ahead: each thread walks a contiguous chunk of ids, so "ahead" is known,
        and the next rows' cache lines are already on their way while this row is copied (random
        rows defeat the hardware prefetcher). chunks: a few per thread
        (numba.get_num_threads() inside would block on-disk caching). A row that does not start
        on a 64-byte boundary spans one line more than its size suggests: ``tail`` prefetches
        the line of its last byte too.

        One compiled kernel per (pf_lines, tail), the line count a constant of the closure:
        one kernel taking both at run time (a branch per row on the count, constant-trip loops
        inside) measured 4 % below the bench's ceiling kernel on a 2^21-node graph's batches,
        this form 5 % above it (docs/benchmarks.md; a runtime-trip prefetch loop measured about
        10 % slower still). numba keys its on-disk cache on the closure's values."""
        pf_bytes = 64 * pf_lines

        @njit(parallel=True, nogil=True, cache=True)
        def kernel(src, ids, out, chunks, last_off):  # pragma: no cover - compiled
            n = ids.shape[0]
            num_rows = src.shape[0]
            nbytes = src.shape[1] * src.itemsize
            bad = np.zeros(chunks, np.int64)
            for c in prange(chunks):
                start = c * n // chunks
                end = (c + 1) * n // chunks
                nbad = 0
                for i in range(start, end):
                    j = i + PREFETCH_ROWS
                    if j < end:  # (a hint: an id out of range prefetches nothing harmful)
                        r = ids[j]
                        for off in range(0, pf_bytes, 64):
                            prefetch_row(src, r, off)
                        if tail:
                            prefetch_row(src, r, last_off)
                    r = ids[i]
                    if r < 0 or r >= num_rows:
                        nbad += 1  # not copied; the caller raises
                    else:
                        copy_row(out, i, src, r, nbytes)
                bad[c] = nbad
            return bad.sum()

        return kernel

    _PREFETCH_KERNELS: dict = {}

    def _gather_rows_prefetch(src, ids, out, chunks, pf_lines, last_off) -> int:
        """Rows ``src[ids]`` into ``out`` with the specialised kernel for ``pf_lines`` prefetched
        lines per row ahead, plus the line of byte ``last_off`` unless it is -1. Returns how many
        ids were outside ``[0, len(src))``: those rows are not read, their ``out`` rows not
        written."""
        key = (int(pf_lines), last_off >= 0)
        k = _PREFETCH_KERNELS.get(key)
        if k is None:
            k = _PREFETCH_KERNELS[key] = _make_prefetch_kernel(*key)
        return int(k(src, ids, out, chunks, max(int(last_off), 0)))

    def _gather_bytes_prefetch(src, ids, out, chunks) -> int:
        """:func:`_gather_rows_prefetch` prefetching the first ``PREFETCH_MAX_BYTES`` of each row
        ahead from its start only (the byte-view kernel before word views and ``last_off``)."""
        pf_lines = prefetch_lines(src.shape[1])
        return _gather_rows_prefetch(src, ids, out, chunks, pf_lines, -1)


_prefetch_ok: bool | None = None  # None: not tried yet; False: compiling it failed (LLVM)


def _numba_gather(src_b: np.ndarray, ids: np.ndarray, out_b: np.ndarray) -> None:
    """Row gather on byte views: a ``memcpy`` per row with software prefetch, the ids' range
    checked in the same pass (IndexError after the copy: rows of ``out`` are then unspecified);
    the plain word-view kernel, after a separate range check, where that kernel cannot compile."""
    global _prefetch_ok
    if _prefetch_ok is not False:
        try:
            pf_lines = prefetch_lines(src_b.shape[1])
            chunks = 4 * numba.get_num_threads()
            # (byte views: memcpy's count is in bytes, so no word view is needed, and one kernel
            # per line count compiles instead of one per word width)
            bad = _gather_rows_prefetch(
                src_b, ids, out_b, chunks, pf_lines, _last_line_offset(src_b)
            )
            _prefetch_ok = True
        except Exception as e:  # an LLVM without the intrinsic: keep the plain kernel
            if _prefetch_ok:  # it worked before, so this is a real error
                raise
            _prefetch_ok = False
            warn(f"gnnio: prefetching gather kernel unavailable ({e})")
        else:
            if bad:
                check_range(ids, src_b.shape[0])  # raises, naming the id
            return
    check_range(ids, src_b.shape[0])
    src_w, out_w = word_views(src_b, out_b)
    _gather_bytes(src_w, ids, out_w)


def _last_line_offset(src_b: np.ndarray) -> int:
    """Byte offset of a row's last byte when the rows ahead need it prefetched on its own (their
    last byte can sit in a cache line the 64-byte steps from the row start miss), else -1."""
    row_bytes = src_b.shape[1]
    if row_bytes == 0 or row_bytes > PREFETCH_MAX_BYTES:
        return -1
    aligned = (src_b.__array_interface__["data"][0] | row_bytes) % 64 == 0
    return -1 if aligned else row_bytes - 1


def word_views(src_b: np.ndarray, out_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[rows, row_bytes]`` uint8 views -> the same memory as uint64 / uint32 / uint16
    ``[rows, words]`` views, the widest that divides the row size and both base addresses.

    Why: the byte-view row copy compiles to a loop with more overhead per row than the word copy;
    on random 512-byte rows the uint64 view measured about 5-10% faster (2-core machine, shared).
    """
    row_bytes = src_b.shape[1]
    # (__array_interface__ is several times cheaper than .ctypes.data on this per-call path)
    bits = row_bytes | src_b.__array_interface__["data"][0] | out_b.__array_interface__["data"][0]
    bits |= src_b.strides[0] | out_b.strides[0]
    for dt, k in ((np.uint64, 8), (np.uint32, 4), (np.uint16, 2)):
        if bits % k == 0:
            return src_b.view(dt), out_b.view(dt)
    return src_b, out_b


def host_empty(shape: tuple[int, int], dtype) -> np.ndarray:
    """An uninitialised C-contiguous host array whose first byte sits on a 64-byte boundary
    (on a 2 MiB one when the array is 2 MiB or more), for feature rows that are gathered.

    Why: NumPy's large allocations start 16 bytes past a page boundary (glibc's mmap chunk
    header), so a 512-byte row spans 9 cache lines instead of 8 and a random-row gather moves
    12.5% more lines; starting on a 2 MiB boundary also lets transparent huge pages (which NumPy
    requests for large arrays) cover the array from its first byte. Costs at most 2 MiB of slack.
    """
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    align = (2 << 20) if nbytes >= (2 << 20) else 64
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + nbytes].view(dt).reshape(shape)


def host_rows(n: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``[n, dim]`` host rows of a torch ``dtype`` from :func:`host_empty` (first row on a 2 MiB
    boundary) with every page touched once, as the gather bench's ceiling buffers are; a dtype
    NumPy lacks (bfloat16) falls back to torch's allocator."""
    try:
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return torch.zeros((n, dim), dtype=dtype)
    a = host_empty((n, dim), np_dtype)
    a.view(np.uint8).reshape(-1)[::4096] = 0  # pre-fault
    return torch.from_numpy(a)


def _as_bytes_2d(a: np.ndarray) -> np.ndarray:
    """``[rows, cols]`` C-contiguous array -> ``[rows, cols * itemsize]`` uint8 view (no copy)."""
    return a.view(np.uint8).reshape(a.shape[0], a.shape[1] * a.itemsize)


_RO_SILENCED = False  # torch's non-writable warning caught once (tensor_view)


def tensor_view(a: np.ndarray) -> torch.Tensor:
    """A torch view of a NumPy array, also a read-only one (a memmap opened with mode "r"; the
    gather only reads it). torch's non-writable warning comes once per process, so only the first
    is made inside ``catch_warnings``, whose swap of global filters races across threads."""
    global _RO_SILENCED
    if _RO_SILENCED or a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = torch.from_numpy(a)
    _RO_SILENCED = True
    return t


def row_bytes_view(t: torch.Tensor) -> np.ndarray:
    """A ``[rows, row_bytes]`` uint8 NumPy view of a C-contiguous 2-D CPU tensor (any dtype).

    A tensor without elements (zero rows or zero columns) gets a fresh empty array: there is no
    memory to share, and torch refuses to reinterpret such a tensor when its last stride is not 1.
    """
    shape = (int(t.shape[0]), int(t.shape[1]) * t.element_size())
    if t.numel() == 0:
        return np.empty(shape, dtype=np.uint8)
    return t.view(torch.uint8).numpy().reshape(shape)


def as_index_array(ids, num_rows: int, check: bool = True) -> np.ndarray:
    """Validate feature-row ids and return them as a 1-D int32/int64 NumPy array (CPU).

    Accepts a torch tensor (any device) or anything NumPy turns into an integer array. int32 and
    int64 are passed through without a copy; other integer types are widened to int64.
    ``check=False`` leaves the range check to the caller: :func:`gather_rows` makes it itself
    (inside the copy's pass on the numba path, which saves a pass over the ids).

    Raises:
        TypeError: ids are not integers (bool and float ids are refused, not cast).
        ValueError: ids are not 1-D.
        IndexError: an id is outside ``[0, num_rows)`` (negative ids do not wrap around).
    """
    if isinstance(ids, torch.Tensor):
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise TypeError(f"feature ids must be integers, got a tensor of {ids.dtype}")
        arr = ids.detach().cpu().numpy()
    else:
        arr = np.asarray(ids)
        if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64: treat as empty
            arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"feature ids must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"feature ids must be 1-D, got shape {tuple(arr.shape)}")
    if arr.dtype not in (np.int32, np.int64):
        arr = arr.astype(np.int64)
    arr = np.ascontiguousarray(arr)
    if check:
        check_range(arr, num_rows)
    return arr


def check_range(arr: np.ndarray, num_rows: int) -> None:
    """IndexError naming the smallest negative id or else the largest id ``>= num_rows`` of a
    1-D integer array, if there is one."""
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= num_rows:
            bad = lo if lo < 0 else hi
            raise IndexError(f"feature id {bad} out of range [0, {num_rows})")


def check_out(out: torch.Tensor, n: int, dim: int, dtype: torch.dtype, device: torch.device):
    """Validate an ``out=`` buffer for ``n`` rows and return the view ``out[:n]``."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dim() != 2 or out.shape[1] != dim or out.shape[0] < n:
        raise ValueError(f"out has shape {tuple(out.shape)}; need [>= {n}, {dim}]")
    if out.dtype != dtype:
        raise ValueError(f"out has dtype {out.dtype}; the store holds {dtype}")
    if out.device != device and not (out.device.type == device.type == "cpu"):  # (cpu = cpu:0)
        raise ValueError(f"out is on {out.device}; the store gathers to {device}")
    view = out[:n]
    if not view.is_contiguous():
        raise ValueError("out must be contiguous (rows stored back to back)")
    return view


def output_rows(
    out: torch.Tensor | None, n: int, dim: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The ``[n, dim]`` destination of a gather: a fresh tensor, or the checked view ``out[:n]``."""
    if out is None:
        return torch.empty((n, dim), dtype=dtype, device=device)
    return check_out(out, n, dim, dtype, device)


def copy_rows(
    src: torch.Tensor,
    src_idx: torch.Tensor,
    dst: torch.Tensor,
    dst_idx: torch.Tensor | None = None,
) -> None:
    """Device rows: ``dst[dst_idx] = src[src_idx]``, or ``dst[:n] = src[src_idx]`` without
    ``dst_idx`` (``src``, ``dst`` and the indices on one device; indices already checked).

    On a GPU this is one Triton kernel (:mod:`gnnio.features._triton_rows`: 0.76 of a
    device-to-device copy against ``index_select``'s 0.58, measured on an H100) where Triton is
    installed and the tensors suit it; otherwise ``index_select`` (+ ``index_copy_``)."""
    if triton_available(src.device, "copy_rows") and src.device == dst.device:
        try:
            from ._triton_rows import copy_rows_triton

            if copy_rows_triton(src, src_idx, dst, dst_idx):
                kernel_ran("rows", "triton")
                return
        except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: torch ops
            kernel_failed("copy_rows", e, "gathering rows with index_select instead")
    kernel_ran("rows", "torch")
    n = int(src_idx.shape[0])
    if dst_idx is None and dst.is_contiguous():
        torch.index_select(src, 0, src_idx, out=dst[:n])
    elif dst_idx is None:
        dst[:n].copy_(src.index_select(0, src_idx))
    else:  # index_copy_ takes int64 indices only; the kernel and callers also pass int32
        dst.index_copy_(0, dst_idx.long(), src.index_select(0, src_idx))


def copy_masked(src: torch.Tensor, slots: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst[i] = src[slots[i]]`` where ``slots[i] >= 0``; other rows of ``dst`` are left as they
    are. No host synchronisation: one Triton kernel where it applies (nothing read for a skipped
    row), else torch ops that read a row for every ``i`` and keep the old one where skipped."""
    n = int(slots.shape[0])
    if n == 0 or src.shape[0] == 0:  # (no source row: every slot is negative)
        return
    if triton_available(dst.device, "copy_tiered") and src.device == dst.device:
        skip = torch.where(slots >= 0, slots, -2)
        try:
            from ._triton_rows import copy_tiered_triton

            if copy_tiered_triton(src, src, skip, skip, dst[:n], skip=True):
                kernel_ran("rows", "triton")
                return
        except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: torch ops
            kernel_failed("copy_tiered", e, "masked row copies with torch ops instead")
    kernel_ran("rows", "torch")
    rows = src.index_select(0, slots.clamp(min=0))
    keep = (slots < 0).unsqueeze(1)
    dst[:n] = torch.where(keep, dst[:n], rows)


def scatter_masked(src: torch.Tensor, dst_idx: torch.Tensor, dst: torch.Tensor) -> bool:
    """``dst[dst_idx[i]] = src[i]`` where ``dst_idx[i] >= 0``, as one Triton kernel that reads and
    writes only those rows (no host synchronisation); False (nothing written) where Triton or the
    kernel does not apply: the caller then writes every row, the skipped ones somewhere harmless."""
    if not triton_available(dst.device, "copy_rows") or src.device != dst.device:
        return False
    try:
        from ._triton_rows import copy_rows_triton

        ar = torch.arange(dst_idx.shape[0], device=dst_idx.device)
        if copy_rows_triton(src, ar, dst, dst_idx, skip=True):
            kernel_ran("rows", "triton")
            return True
    except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: the caller's path
        kernel_failed("copy_rows", e, "writing every row with index_copy_ instead")
    return False


def copy_tiered(
    hot: torch.Tensor,
    cold: torch.Tensor,
    slots: torch.Tensor,
    ids: torch.Tensor,
    dst: torch.Tensor,
    skip: bool = False,
) -> bool:
    """``dst[i] = hot[slots[i]]`` where ``slots[i] >= 0``, else ``cold[ids[i]]``, as one Triton
    kernel (:func:`gnnio.features._triton_rows.copy_tiered_triton`) with no host synchronisation;
    False (nothing written) where Triton or the kernel does not apply: the caller splits the batch
    into hot and cold positions instead. With ``skip``, a slot below -1 leaves ``dst[i]`` as it is."""
    if not triton_available(dst.device, "copy_tiered"):
        return False
    try:
        from ._triton_rows import copy_tiered_triton

        if copy_tiered_triton(hot, cold, slots, ids, dst, skip):
            kernel_ran("rows", "triton")
            return True
    except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: the split path
        kernel_failed("copy_tiered", e, "splitting hot and cold rows with torch ops instead")
    return False


def gather_rows(
    src: np.ndarray,
    ids: np.ndarray,
    out: torch.Tensor,
    kernel: str = "auto",
    num_threads: int | None = None,
    src_tensor: torch.Tensor | None = None,
) -> None:
    """Copy rows ``src[ids]`` into ``out`` (``[len(ids), dim]``, contiguous CPU tensor).

    Args:
        src: ``[N, dim]`` C-contiguous NumPy array (in RAM or a memmap; a memmap is read only at
            the rows touched).
        ids: 1-D int32/int64 ids (see :func:`as_index_array`; the range is checked here:
            IndexError for an id outside ``[0, N)``, after which ``out``'s rows are unspecified).
        out: destination, same dtype as ``src``; written in place (ValueError, nothing
            written, when it has fewer rows than ``ids`` or another row width).
        kernel: "auto" (numba if available), "numba" or "torch".
        num_threads: threads for the numba kernel (numba's setting is per calling thread, so this
            only affects the calling thread); None keeps numba's current setting.
        src_tensor: an optional torch view of ``src`` (saves re-wrapping on the torch path).
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown gather kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    src_rb = src.shape[1] * src.itemsize
    if out.dim() != 2 or out.shape[0] < ids.shape[0] or out.shape[1] * out.element_size() != src_rb:
        # (the kernel copies ``len(ids)`` rows of ``src``'s width: past a smaller buffer)
        raise ValueError(
            f"out of shape {tuple(out.shape)} ({out.dtype}) cannot take {ids.shape[0]} rows of "
            f"{src_rb} bytes"
        )
    if ids.shape[0] == 0 or out.numel() == 0:  # no rows, or zero-width rows: nothing to copy
        check_range(ids, src.shape[0])
        return
    use_numba = kernel == "numba" or (kernel == "auto" and HAVE_NUMBA)
    if use_numba:
        if not HAVE_NUMBA:
            raise RuntimeError("kernel='numba' asked for, but numba is not installed")
        if num_threads is not None:
            set_numba_threads(num_threads)
        _numba_gather(_as_bytes_2d(src), ids, row_bytes_view(out))
        kernel_ran("host_rows", "numba")
        return
    check_range(ids, src.shape[0])
    kernel_ran("host_rows", "torch")
    t = src_tensor if src_tensor is not None else tensor_view(src)
    torch.index_select(t, 0, torch.from_numpy(ids).long(), out=out)
