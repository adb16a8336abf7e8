"""``gnnio bench tiers --bandwidth``: the GPU gather-bandwidth micro-benchmark of the three ways to
read feature rows (GPU-resident, zero-copy from pinned host memory, CPU gather + copy), each held
against a copy ceiling measured in the same run, and the tiered store end to end. CUDA only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from ..errors import UsageError
from ..features import _row_variants
from ..features._gather import copy_rows, gather_rows, row_bytes_view
from ..features.tiers import uva
from ..features.tiers.tiered import TieredFeatureStore
from ._timing import median, time_passes

__all__ = ["gpu_gather_bandwidth"]


def gpu_gather_bandwidth(
    num_rows: int = 1_000_000,
    dim: int = 128,
    dtype: torch.dtype = torch.float32,
    batch_rows: int = 200_000,
    hot_fractions: Sequence[float] = (0.0, 0.05, 0.1, 0.25, 1.0),
    warmup: int = 2,
    passes: int = 10,
    device: str | torch.device = "cuda",
    seed: int = 0,
) -> dict[str, Any]:
    """Measured gather bandwidth of each tier on one GPU, each held against its ceiling.

    Rows: ``[num_rows, dim]`` random features; each pass gathers ``batch_rows`` uniformly random
    ids. Bandwidth = useful bytes delivered (``batch_rows * row_bytes``) / median pass time (s),
    in GB/s (1e9 B/s).

    * ``gpu_resident``: the stores' gather (:func:`~gnnio.features._gather.copy_rows`: the Triton
      row kernel where Triton is installed, the variant measured fastest for the row width) of
      rows in GPU memory; ceiling ``d2d_copy``: copying the same number of contiguous bytes device
      to device. ``gpu_resident_index_select``: ATen's ``index_select`` on the same rows, for
      reference. These three are GPU time (:func:`_gpu_tier`: CUDA events around launches
      queued behind a GPU sleep, so the host's launch cost does not count); ``gpu_tier`` holds
      the details: each kernel variant's GB/s on 512-byte rows and on 2 KiB rows (the same
      bytes), the kernel on ids in order (what random rows cost), the host microseconds per call,
      the wall-clock figures with a sync per call as measured before, and the choice made.
    * ``zero_copy``: the same gather on the UVA view of pinned host rows (the GPU kernel reads
      host memory over PCIe); ceiling ``h2d_copy``: one contiguous pinned host->device copy of the
      same bytes. ``zero_copy_index_select``: ``index_select`` on the view, for reference.
    * ``cpu_gather_copy``: CPU gather (the numba kernel) into a pinned buffer + host->device copy;
      ``cpu_gather_only`` times the CPU half alone.
    * ``tiered``: :class:`TieredFeatureStore` (prefix mode, zero-copy cold path) per hot fraction;
      with uniform ids the GPU-tier hit ratio is the hot fraction.

    Raises:
        UsageError: CUDA is not available.
    """
    if not uva.cuda_available():
        raise UsageError("gpu_gather_bandwidth needs a CUDA GPU; none is available")
    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(seed)
    host = torch.randn((num_rows, dim), generator=g).to(dtype).contiguous()
    rb = dim * host.element_size()
    useful = batch_rows * rb
    ids_cpu = torch.randint(0, num_rows, (batch_rows,), generator=g)
    ids = ids_cpu.to(dev)
    out = torch.empty((batch_rows, dim), dtype=dtype, device=dev)
    sync = torch.cuda.synchronize

    def gbps(fn) -> float:
        return useful / median(time_passes(fn, warmup=warmup, passes=passes, sync=sync)) / 1e9

    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev),
        "num_rows": num_rows,
        "row_bytes": rb,
        "batch_rows": batch_rows,
        "passes": passes,
        "unit": "GB/s (1e9 B/s) of useful row bytes, median of passes (wall clock with a sync "
        "per pass; GPU time for gpu_resident, gpu_resident_index_select, d2d_copy: gpu_tier)",
    }
    # (a) GPU-resident rows vs device-to-device copy
    gfeat = host.to(dev)
    tier = _gpu_tier(gfeat, ids, out, gbps)
    for k in ("gpu_resident", "gpu_resident_index_select", "d2d_copy"):
        res[k] = tier[k]["gbps"]
    res["gpu_tier"] = tier
    gfeat = None  # type: ignore[assignment]  # free the GPU copy before the next measurements
    # (b) zero-copy host rows vs pinned host->device copy
    handle = uva.pin_host_tensor(host, dev)
    view = uva.device_view(host, dev)
    pinned_contig = host[:batch_rows]  # inside the registered range: a DMA-able pinned source
    res["zero_copy"] = gbps(lambda: copy_rows(view, ids, out))
    res["zero_copy_index_select"] = gbps(lambda: torch.index_select(view, 0, ids, out=out))
    res["h2d_copy"] = gbps(lambda: out.copy_(pinned_contig, non_blocking=True))
    # (c) CPU gather into a pinned buffer + copy
    staging = torch.empty((batch_rows, dim), dtype=dtype, pin_memory=True)
    src_bytes, ids_np = row_bytes_view(host), ids_cpu.numpy()

    def cpu_gather_only() -> None:
        gather_rows(src_bytes, ids_np, staging, src_tensor=host)

    def cpu_gather_copy() -> None:
        cpu_gather_only()
        out.copy_(staging, non_blocking=True)

    res["cpu_gather_copy"] = gbps(cpu_gather_copy)
    res["cpu_gather_only"] = gbps(cpu_gather_only)
    # the tiered store end to end (prefix mode, zero-copy cold path)
    tiered = {}
    for f in hot_fractions:
        with TieredFeatureStore.from_reordered(host, f, device=dev) as st:
            tiered[str(f)] = {
                "gbps": gbps(lambda st=st: st.gather(ids, out=out)),
                "cold_mode_used": st.cold_mode_used,
            }
    res["tiered"] = tiered
    res["ratio"] = {
        "gpu_resident/d2d_copy": res["gpu_resident"] / res["d2d_copy"],
        **tier["ratio"],
        "zero_copy/h2d_copy": res["zero_copy"] / res["h2d_copy"],
        "cpu_gather_copy/h2d_copy": res["cpu_gather_copy"] / res["h2d_copy"],
        "zero_copy/cpu_gather_copy": res["zero_copy"] / res["cpu_gather_copy"],
    }
    view = None  # type: ignore[assignment]  # (the view dropped before its pin)
    handle.release()
    return res


def _gpu_seconds(fn: Callable[[], Any], calls: int = 5, passes: int = 5) -> tuple[float, float]:
    """``(GPU seconds, host seconds)`` per call of ``fn``, medians of ``passes``: each pass queues
    ``calls`` back-to-back calls behind a GPU sleep between CUDA events, so the events time the
    kernels alone and the host's time of the loop is what it takes to launch them."""
    fn()
    torch.cuda.synchronize()
    gpu, cpu = [], []
    for _ in range(passes):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_row_variants.SLEEP_CYCLES)
        a.record()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        cpu.append((time.perf_counter() - t) / calls)
        b.record()
        b.synchronize()
        gpu.append(a.elapsed_time(b) / 1e3 / calls)
    return median(gpu), median(cpu)


def _gpu_tier(gfeat: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, wall_gbps) -> dict:
    """The GPU-tier gather against a device-to-device copy of the same bytes (issue 24's goal),
    in GPU time: the store's path (``copy_rows``, after its first gathers chose a variant), ATen's
    ``index_select``, the store's path on ids in order (the same kernel without random rows),
    and every kernel variant on these rows and on the same memory viewed as 4x wider rows (a
    quarter of the ids: the same bytes); with the wall-clock figures of a sync per call (as
    earlier runs measured: the host's launch cost counts) beside them."""
    n, dim = int(ids.shape[0]), gfeat.shape[1]
    contig = gfeat[:n]

    def row(fn, nbytes: int) -> dict:
        g, c = _gpu_seconds(fn)
        return {"gbps": nbytes / g / 1e9, "host_us_per_call": c * 1e6}

    def chosen(src, idx, dst) -> dict:
        copy_rows(src, idx, dst)  # the first big gather of a row width starts the choice...
        torch.cuda.synchronize()  # ...and once its timings are in, the next gather makes it
        return row(lambda: copy_rows(src, idx, dst), idx.shape[0] * src[0].nbytes)

    useful = n * gfeat[0].nbytes
    r: dict[str, Any] = {"unit": "GB/s of useful row bytes, GPU time (median of passes)"}
    r["gpu_resident"] = chosen(gfeat, ids, out)
    r["wall"] = {"gpu_resident": wall_gbps(lambda: copy_rows(gfeat, ids, out)),
                 "d2d_copy": wall_gbps(lambda: out.copy_(contig))}  # fmt: skip
    r["gpu_resident_index_select"] = row(lambda: torch.index_select(gfeat, 0, ids, out=out), useful)
    r["d2d_copy"] = row(lambda: out.copy_(contig), useful)
    seq = torch.arange(n, device=ids.device)
    r["gpu_resident_ids_in_order"] = row(lambda: copy_rows(gfeat, seq, out), useful)
    q, wn = n // 4, gfeat.shape[0] // 4  # (the first 4 * wn rows viewed 4 to a row)
    wide = (gfeat[: 4 * wn].view(wn, 4 * dim), ids[:q] % wn, out[: 4 * q].view(q, 4 * dim))
    r["wide_rows_gpu_resident"] = chosen(*wide)
    r["variants"] = {}
    try:
        from ..features._triton_rows import copy_rows_triton
    except Exception as e:  # noqa: BLE001 - no Triton here: the variants are not measured
        r["variants"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        copy_rows_triton = None  # type: ignore[assignment]  # (no Triton: no variants)
    for src, idx, dst in ((gfeat, ids, out), wide) if copy_rows_triton is not None else ():
        key, vs = f"{src[0].nbytes}B", cast(dict[str, float | str], {})
        for v in _row_variants.VARIANTS:
            try:
                g, _ = _gpu_seconds(
                    lambda v=v, s=src, i=idx, d=dst: copy_rows_triton(s, i, d, None, variant=v)  # type: ignore[misc]  # default-bound lambda
                )
                vs[v.name] = idx.shape[0] * src[0].nbytes / g / 1e9
            except Exception as e:  # noqa: BLE001 - a variant that cannot build: recorded
                vs[v.name] = f"{type(e).__name__}: {e}"[:200]
        r["variants"][key] = vs
        timed = {k: x for k, x in vs.items() if isinstance(x, float)}
        if timed:
            r.setdefault("best_variant", {})[key] = max(timed, key=lambda k: timed[k])
    r["choice"] = _row_variants.TUNER.report()
    d2d = r["d2d_copy"]["gbps"]
    r["ratio"] = {
        "gpu_resident_wall/d2d_copy_wall": r["wall"]["gpu_resident"] / r["wall"]["d2d_copy"],
        "ids_in_order/d2d_copy": r["gpu_resident_ids_in_order"]["gbps"] / d2d,
        "wide_rows/d2d_copy": r["wide_rows_gpu_resident"]["gbps"] / d2d,
        **{
            f"best_variant_{k}/d2d_copy": r["variants"][k][b] / d2d
            for k, b in r.get("best_variant", {}).items()
        },  # fmt: skip
    }
    return r
