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


def _compare(c, out: dict[str, Any], name: str, argv: list[str], cpu: list[str]) -> None:
    """``NAME_cpu``, ``NAME_cuda``, ``NAME_gpu_over_cpu`` (edges/s) and ``NAME_checksum_equal`` /
    ``NAME_checksum_ids_equal`` (ids and edges alone: the weights may round otherwise on a GPU)
    of ``gnnio ARGV`` on the CPU (with ``cpu``'s options) and on the GPU."""
    out[f"{name}_cpu"] = part(lambda: c.gnnio(*argv, "--device", "cpu", *cpu))
    out[f"{name}_cuda"] = part(lambda: c.gnnio(*argv, "--device", "cuda"))
    gpu, host = out[f"{name}_cuda"], out[f"{name}_cpu"]
    out[f"{name}_gpu_over_cpu"] = _over(gpu, host, "edges_per_s")
    for key in ("checksum", "checksum_ids"):
        if key in gpu and key in host:
            out[f"{name}_{key}_equal"] = gpu[key] == host[key]


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
        # the locality-aware LADIES (s = 8, 10 % of the rows local): the same comparison; LABOR-1
        # (numba on the CPU, gnnio.sampling.labor_importance_torch on the GPU) too, 10 batches
        # (its CPU pass takes about twice LABOR-0's)
        lloc = [*lad, "--locality-scale", "8", "--gpu-cache-fraction", "0.1"]
        li = [*common[:3], "--batches", "10", *common[5:], "--sampler", "labor",
              "--importance-sampling", "1"]  # fmt: skip
        for name, argv, cpu in (("ladies", lad, []), ("ladloc", lloc, []),
                                ("labor_i", li, ["--threads", threads])):  # fmt: skip
            _compare(c, out, name, argv, cpu)
    return out
