"""``gnnio bench tiers --bandwidth``: the GPU gather-bandwidth micro-benchmark of the three ways to
read feature rows (GPU-resident, zero-copy from pinned host memory, CPU gather + copy), each held
against a copy ceiling measured in the same run, and the tiered store end to end. CUDA only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import UsageError
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
      row kernel where Triton is installed) of rows in GPU memory; ceiling ``d2d_copy``: copying
      the same number of contiguous bytes device to device. ``gpu_resident_index_select``: ATen's
      ``index_select`` on the same rows, for reference.
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
        "unit": "GB/s (1e9 B/s) of useful row bytes, median of passes",
    }
    # (a) GPU-resident rows vs device-to-device copy
    gfeat = host.to(dev)
    contig = gfeat[:batch_rows]
    res["gpu_resident"] = gbps(lambda: copy_rows(gfeat, ids, out))
    res["gpu_resident_index_select"] = gbps(lambda: torch.index_select(gfeat, 0, ids, out=out))
    res["d2d_copy"] = gbps(lambda: out.copy_(contig))
    gfeat = contig = None  # free the GPU copy before the next measurements
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
        "zero_copy/h2d_copy": res["zero_copy"] / res["h2d_copy"],
        "cpu_gather_copy/h2d_copy": res["cpu_gather_copy"] / res["h2d_copy"],
        "zero_copy/cpu_gather_copy": res["zero_copy"] / res["cpu_gather_copy"],
    }
    view = None
    handle.release()
    return res
