"""Row gather on the GPU as one Triton kernel: ``dst[dst_idx[i]] = src[src_idx[i]]``.

Measured on an H100 (``benchmarks/gpu_gather_variants.py``, 200,000 random 512-byte rows out of
1,000,000): ATen's ``index_select`` delivers 718 GB/s of row bytes, 0.58 of a device-to-device
copy of the same bytes; this kernel 933-943 GB/s, 0.76 (docs/benchmarks.md). Each program copies
``BR`` whole rows as a ``[BR, row words]`` tile, rows read through the widest word the row size
and both base addresses allow (as the CPU kernel does, :func:`gnnio.features._gather.word_views`).
With ``dst_idx`` the rows go to scattered output rows in the same pass, instead of an
``index_select`` into a temporary and an ``index_copy_`` (the tiered store's hot part).

How it is launched -- rows per program, warps, cache hints, 32-bit offsets -- is one of
:data:`gnnio.features._row_variants.VARIANTS`, chosen per row width by measuring them on the
first large gathers (:class:`~gnnio.features._row_variants.RowTuner`); every variant writes the
same bytes.

Used through :func:`gnnio.features._gather.copy_rows`, which falls back to torch ops where this
kernel does not apply. This module imports Triton; ``TRITON_INTERPRET=1`` (set before the import)
runs it on CPU tensors, which is how the tests check it without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _row_variants
from ._row_variants import DEFAULT, VARIANTS, RowVariant

__all__ = ["MAX_WORDS", "copy_rows_triton", "copy_tiered_triton"]

#: widest row handled in one tile, in words (wider rows: torch ops)
MAX_WORDS = 8192
_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


@triton.jit(do_not_specialize=["n"])
def _rows(src, src_idx, dst, dst_idx, n, W: tl.constexpr, WP: tl.constexpr, BR: tl.constexpr,
          SCATTER: tl.constexpr, SKIP: tl.constexpr = False, STREAM: tl.constexpr = False,
          I32: tl.constexpr = False):  # fmt: skip
    # STREAM: rows read once (evicted first from L1 and L2) and written streaming (.cs); I32: 32-bit offsets
    # (the caller checks that every word offset fits). The bytes written are the same either way.
    if I32:
        r = tl.program_id(0) * BR + tl.arange(0, BR)
    else:
        r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rm = r < n
    if SCATTER:
        d = tl.load(dst_idx + r, mask=rm, other=0)
        if I32:
            d = d.to(tl.int32)
        else:
            d = d.to(tl.int64)
        if SKIP:  # a negative destination: nothing read, nothing written
            rm = rm & (d >= 0)
    else:
        d = r
    s = tl.load(src_idx + r, mask=rm, other=0)
    if I32:
        s = s.to(tl.int32)
    else:
        s = s.to(tl.int64)
    c = tl.arange(0, WP)
    m = rm[:, None] & (c < W)[None, :]
    if STREAM:
        v = tl.load(src + s[:, None] * W + c[None, :], mask=m, eviction_policy="evict_first")
        tl.store(dst + d[:, None] * W + c[None, :], v, mask=m, cache_modifier=".cs")
    else:
        v = tl.load(src + s[:, None] * W + c[None, :], mask=m)
        tl.store(dst + d[:, None] * W + c[None, :], v, mask=m)


@triton.jit(do_not_specialize=["n"])
def _tiered(hot, cold, slots, ids, dst, n, W: tl.constexpr, WP: tl.constexpr, BR: tl.constexpr,
            SKIP: tl.constexpr):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rm = r < n
    s = tl.load(slots + r, mask=rm, other=0).to(tl.int64)
    h = rm & (s >= 0)  # a hot row
    # a cold row: slot -1; with SKIP, below -1 the output row is left as it is. (Both masks are
    # comparisons of ``s``: ``rm & ~h`` after ``rm &= s >= -1`` made Triton 3.6 -- the GPU
    # image's -- fail to compile SKIP with int64 slots, rows up to 512 bytes: "'arith.andi' op
    # requires the same encoding" in TritonGPURemoveLayoutConversions.)
    if SKIP:
        cm = rm & (s == -1)
    else:
        cm = rm & (s < 0)
    i = tl.load(ids + r, mask=cm, other=0).to(tl.int64)
    c = tl.arange(0, WP)
    m = (h | cm)[:, None] & (c < W)[None, :]
    # masked-off lanes issue no load: a hot row reads the GPU tier only, a cold row the host only
    vh = tl.load(hot + s[:, None] * W + c[None, :], mask=m & h[:, None], other=0)
    vc = tl.load(cold + i[:, None] * W + c[None, :], mask=m & cm[:, None], other=0)
    tl.store(dst + r[:, None] * W + c[None, :], tl.where(h[:, None], vh, vc), mask=m)


def _word(row_bytes: int, *ptrs: int) -> int:
    for w in (8, 4, 2, 1):
        if row_bytes % w == 0 and all(p % w == 0 for p in ptrs):
            return w
    return 1


def _tiling(row_bytes: int, *tensors: torch.Tensor) -> tuple[int, int, int, int] | None:
    """``(word bytes, words per row, words padded to a power of two, rows per program)`` for rows
    of ``row_bytes`` read and written through ``tensors`` (rows per program of
    :data:`~gnnio.features._row_variants.DEFAULT`); None past :data:`MAX_WORDS` words."""
    w = _word(row_bytes, *(x.data_ptr() for x in tensors))
    words = row_bytes // w
    if words > MAX_WORDS:
        return None
    wp = 1 << (words - 1).bit_length()
    return w, words, wp, DEFAULT.rows_per_program(w, wp)


def _as_words(x: torch.Tensor, w: int) -> torch.Tensor:
    """``x``'s bytes as ``w``-byte words (a view)."""
    return x.view(torch.uint8).view(_WORDS[w]) if w > 1 else x.view(torch.uint8)


def copy_rows_triton(
    src: torch.Tensor,
    src_idx: torch.Tensor,
    dst: torch.Tensor,
    dst_idx: torch.Tensor | None,
    skip: bool = False,
    variant: RowVariant | None = None,
) -> bool:
    """``dst[dst_idx] = src[src_idx]`` (``dst[:n] = src[src_idx]`` without ``dst_idx``) when the
    kernel applies -- contiguous 2-D ``src``/``dst`` of one dtype and row width, 1-D int32/int64
    indices on their device, rows of at most :data:`MAX_WORDS` words -- returning True; False
    (nothing written) otherwise. With ``skip`` a negative ``dst_idx[i]`` copies nothing. Indices
    are not checked. ``variant``: how to launch (one of
    :data:`~gnnio.features._row_variants.VARIANTS`); None: the process's measured choice for
    this row width (:data:`~gnnio.features._row_variants.TUNER`)."""
    n = int(src_idx.shape[0])
    if (
        src.dim() != 2 or dst.dim() != 2 or src.dtype != dst.dtype or src.shape[1] != dst.shape[1]
        or not src.is_contiguous() or not dst.is_contiguous() or src.device != dst.device
        or src_idx.dim() != 1 or src_idx.dtype not in (torch.int32, torch.int64)
        or (dst_idx is not None and (dst_idx.shape != src_idx.shape
                                     or dst_idx.dtype not in (torch.int32, torch.int64)))
    ):  # fmt: skip
        return False
    rb = src.shape[1] * src.element_size()
    if n == 0 or rb == 0:
        return True
    tiling = _tiling(rb, src, dst)
    if tiling is None:
        return False
    w, words, wp, _ = tiling
    si = src_idx.contiguous()
    di = si if dst_idx is None else dst_idx.contiguous()
    sw, dw = _as_words(src, w), _as_words(dst, w)
    fits32 = max(sw.numel(), dw.numel(), n) < 2**31 - 2 * wp  # every offset, padded lanes too
    scatter, skip = dst_idx is not None, bool(skip) and dst_idx is not None

    def launch(v: RowVariant) -> None:
        br = v.rows_per_program(w, wp)
        _rows[(triton.cdiv(n, br),)](sw, si, dw, di, n, W=words, WP=wp, BR=br, SCATTER=scatter,
                                     SKIP=skip, STREAM=v.stream, I32=v.i32 and fits32,
                                     num_warps=v.num_warps)  # fmt: skip

    if variant is None:
        key = f"{rb}B" + ("" if w == 8 else f"/{w}B words") + ("+scatter" if scatter else "")
        cands = VARIANTS if fits32 else [v for v in VARIANTS if not v.i32]
        variant = _row_variants.TUNER.pick(key, n * rb, src.device, launch, cands)
    launch(variant)
    return True


def copy_tiered_triton(
    hot: torch.Tensor,
    cold: torch.Tensor,
    slots: torch.Tensor,
    ids: torch.Tensor,
    dst: torch.Tensor,
    skip: bool = False,
) -> bool:
    """``dst[i] = hot[slots[i]]`` where ``slots[i] >= 0``, else ``cold[ids[i]]``: the tiered
    store's gather as one kernel, without splitting the batch into hot and cold positions first
    (``nonzero`` twice: two host synchronisations per batch on a GPU). ``cold`` is the zero-copy
    view of the pinned host rows. With ``skip`` a slot below -1 leaves ``dst[i]`` as it is and
    reads nothing (the caches' masked gathers). Returns False (nothing written) where the kernel
    does not apply (as :func:`copy_rows_triton`). Indices are not checked."""
    n = int(ids.shape[0])
    tensors = (hot, cold, dst)
    if (
        any(x.dim() != 2 or not x.is_contiguous() or x.dtype != dst.dtype
            or x.shape[1] != dst.shape[1] or x.device != dst.device for x in tensors)
        or slots.shape != ids.shape or ids.dim() != 1
        or slots.dtype not in (torch.int32, torch.int64) or ids.dtype not in (torch.int32, torch.int64)
    ):  # fmt: skip
        return False
    rb = dst.shape[1] * dst.element_size()
    if n == 0 or rb == 0:
        return True
    tiling = _tiling(rb, hot, cold, dst)
    if tiling is None:
        return False
    w, words, wp, br = tiling
    _tiered[(triton.cdiv(n, br),)](_as_words(hot, w), _as_words(cold, w), slots.contiguous(),
                                   ids.contiguous(), _as_words(dst, w), n, W=words, WP=wp,
                                   BR=br, SKIP=bool(skip))  # fmt: skip
    return True
