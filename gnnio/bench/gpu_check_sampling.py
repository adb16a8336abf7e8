"""gpu-check's ``sampling`` step (:mod:`gnnio.bench.gpu_check`, step 6): ``gnnio bench sampling``
on the GPU and on the CPU -- the uniform sampler eagerly, with UVA and as a CUDA graph, the
locality-aware one, LADIES, the locality-aware LADIES and LABOR-1 -- each GPU run's edges/s over
the CPU's and its batches' checksum against the CPU's."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["part", "step_sampling"]


def part(fn) -> dict[str, Any]:
    """One measurement of a step: its result, or ``{"error": ...}`` -- so one that fails (UVA
    sampling where pinning is refused, say) does not take its step's other figures with it."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded; the step's other parts still run
        return {"error": f"{type(e).__name__}: {e}"}


def _over(a: dict, b: dict, key: str) -> float | None:
    return a[key] / b[key] if key in a and key in b and b[key] > 0 else None  # (0: unmeasured)


def step_sampling(c) -> dict[str, Any]:
    common = ["bench", "sampling", str(c.data), "--batches", str(c.args.batches), "--passes", "3",
              "--no-progress", "--json"]  # fmt: skip
    threads = str(os.cpu_count() or 1)
    out: dict[str, Any] = {}
    out["cpu"] = part(lambda: c.gnnio(*common, "--device", "cpu", "--threads", threads))
    if c.device == "cuda":
        out["cuda"] = part(lambda: c.gnnio(*common, "--device", "cuda"))
        out["gpu_over_cpu"] = _over(out["cuda"], out["cpu"], "edges_per_s")
        # UVA: the CSR read zero-copy from pinned host memory, the same batches and timing (until
        # 2026-11-26 a loop of its own sampled the first training ids in order: other batches,
        # 1.9x the edges per batch -- its ratio compared two workloads)
        out["uva"] = part(lambda: c.gnnio(*common, "--device", "cuda", "--graph-in", "host"))
        out["uva_over_cpu"] = _over(out["uva"], out["cpu"], "edges_per_s")
        # the GPU sampler's batch replayed as a CUDA graph (gnnio.sampling.gpu_graphed)
        out["cuda_graph"] = part(lambda: c.gnnio(*common, "--device", "cuda", "--cuda-graph"))
        out["graphed_over_cpu"] = _over(out["cuda_graph"], out["cpu"], "edges_per_s")
        out["graphed_over_eager"] = _over(out["cuda_graph"], out["cuda"], "edges_per_s")
        if "checksum" in out["cuda"] and "checksum" in out["cpu"]:
            out["checksum_equal"] = out["cuda"]["checksum"] == out["cpu"]["checksum"]
        for name in ("uva", "cuda_graph"):
            if "checksum" in out[name] and "checksum" in out["cpu"]:
                out[f"{name}_checksum_equal"] = out[name]["checksum"] == out["cpu"]["checksum"]
        # Song & Jiang's locality-aware sampler (s = 8, 10 % of the rows local): numba on the
        # CPU, the Triton LAS kernel eagerly and replayed as a CUDA graph; the same batches
        las = [*common, "--locality-scale", "8", "--gpu-cache-fraction", "0.1"]
        out["las_cpu"] = part(lambda: c.gnnio(*las, "--device", "cpu", "--threads", threads))
        out["las_cuda"] = part(lambda: c.gnnio(*las, "--device", "cuda"))
        out["las_cuda_graph"] = part(lambda: c.gnnio(*las, "--device", "cuda", "--cuda-graph"))
        out["las_gpu_over_cpu"] = _over(out["las_cuda"], out["las_cpu"], "edges_per_s")
        out["las_graphed_over_eager"] = _over(out["las_cuda_graph"], out["las_cuda"], "edges_per_s")
        for name in ("las_cuda", "las_cuda_graph"):
            if "checksum" in out[name] and "checksum" in out["las_cpu"]:
                out[f"{name}_checksum_equal"] = out[name]["checksum"] == out["las_cpu"]["checksum"]
        # LADIES (K = 512 per layer): numba on the CPU, gnnio.sampling.ladies_torch on the GPU;
        # ids and edges bit-identical (checksum_ids), the weights within float rounding
        # (checksum: equal unless a float32 weight rounds the other way, a ~1e-7 chance each)
        lad = [*common, "--sampler", "ladies", "--layer-size", "512"]
        out["ladies_cpu"] = part(lambda: c.gnnio(*lad, "--device", "cpu"))
        out["ladies_cuda"] = part(lambda: c.gnnio(*lad, "--device", "cuda"))
        out["ladies_gpu_over_cpu"] = _over(out["ladies_cuda"], out["ladies_cpu"], "edges_per_s")
        for key in ("checksum", "checksum_ids"):
            if key in out["ladies_cuda"] and key in out["ladies_cpu"]:
                out[f"ladies_{key}_equal"] = out["ladies_cuda"][key] == out["ladies_cpu"][key]
        # the locality-aware LADIES (s = 8, 10 % of the rows local): the same comparison
        lloc = [*lad, "--locality-scale", "8", "--gpu-cache-fraction", "0.1"]
        out["ladloc_cpu"] = part(lambda: c.gnnio(*lloc, "--device", "cpu"))
        out["ladloc_cuda"] = part(lambda: c.gnnio(*lloc, "--device", "cuda"))
        out["ladloc_gpu_over_cpu"] = _over(out["ladloc_cuda"], out["ladloc_cpu"], "edges_per_s")
        for key in ("checksum", "checksum_ids"):
            if key in out["ladloc_cuda"] and key in out["ladloc_cpu"]:
                out[f"ladloc_{key}_equal"] = out["ladloc_cuda"][key] == out["ladloc_cpu"][key]
        # LABOR-1 (numba on the CPU, gnnio.sampling.labor_importance_torch on the GPU), compared
        # as LADIES; 10 batches (its CPU pass takes about twice LABOR-0's)
        li = [*common[:3], "--batches", "10", *common[5:], "--sampler", "labor",
              "--importance-sampling", "1"]  # fmt: skip
        out["labor_i_cpu"] = part(lambda: c.gnnio(*li, "--device", "cpu", "--threads", threads))
        out["labor_i_cuda"] = part(lambda: c.gnnio(*li, "--device", "cuda"))
        out["labor_i_gpu_over_cpu"] = _over(out["labor_i_cuda"], out["labor_i_cpu"], "edges_per_s")
        for key in ("checksum", "checksum_ids"):
            if key in out["labor_i_cuda"] and key in out["labor_i_cpu"]:
                out[f"labor_i_{key}_equal"] = out["labor_i_cuda"][key] == out["labor_i_cpu"][key]
    return out
