"""The goals of the GPU check (:mod:`gnnio.bench.gpu_check`) and its ``report.md``: the goals
met or not, one line per step, the feature-bound techniques and the epochs at each hot fraction,
from ``report.json``'s content."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .gpu_check_epoch import kernel_fallbacks

__all__ = ["AT_MOST", "GOALS", "goals", "write_markdown"]

#: issues 15 and 24's goals: (name, what is measured, threshold); a value meets its goal when it
#: is >= the threshold, except the names in AT_MOST (<=)
GOALS = [
    ("uva_gather", "zero-copy gather / pinned host->device copy", 0.80),
    ("gpu_tier_gather", "GPU-tier gather / device-to-device copy", 0.80),
    ("gpu_sampling", "GPU sampler edges/s / CPU sampler edges/s", 10.0),
    ("uva_sampling", "UVA sampler (CSR in pinned host memory) edges/s / CPU edges/s", 4.0),
    ("tiering_speedup", "epoch time at 0 % hot / at 10 % hot", 1.6),
    ("lookahead_overhead", "LRU management ms / lookahead management ms (GPU cache)", 1.0),
    (
        "train_step_ms",
        "forward + backward + optimizer ms per batch, 2^21 graph, default model",
        3.0,
    ),
    ("epoch_s", "warm epoch seconds, 2^21 graph, default options on CUDA", 1.0),
    (
        "tiering_speedup_feature_bound",
        "feature-bound graph: ms per batch at 0 % / at 10 % hot",
        1.6,
    ),
    # the same goals with the step and the GPU sampler replayed as CUDA graphs (--cuda-graph, off
    # by default until a GPU run shows it faster: these entries are that comparison)
    ("train_step_ms_cuda_graph", "train_step_ms, the step replayed as a CUDA graph", 3.0),
    ("epoch_s_cuda_graph", "epoch_s with --cuda-graph (step and sampler graphed)", 1.0),
    ("gpu_sampling_cuda_graph", "gpu_sampling, the GPU sampler's batch as a CUDA graph", 10.0),
    (
        "tiering_speedup_feature_bound_cuda_graph",
        "tiering_speedup_feature_bound, both runs with --cuda-graph",
        1.6,
    ),
    ("kernel_fallbacks", "runs of this check that fell back from a Triton kernel", 0),
    ("nccl_modes_failed", "distributed modes failing (NCCL at world size 1; CUDA IPC, 2 ranks)", 0),
]
AT_MOST = {
    "train_step_ms",
    "epoch_s",
    "train_step_ms_cuda_graph",
    "epoch_s_cuda_graph",
    "kernel_fallbacks",
    "nccl_modes_failed",
}


def goals(steps: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
    """Each goal's measured value and whether it is met (None when its step did not run, and
    always on a CPU dry run: those figures are not GPU figures)."""
    bw = steps.get("bandwidth", {}).get("bandwidth", {}).get("ratio", {})
    values = {
        "uva_gather": bw.get("zero_copy/h2d_copy"),
        "gpu_tier_gather": bw.get("gpu_resident/d2d_copy"),
        "gpu_sampling": steps.get("sampling", {}).get("gpu_over_cpu"),
        "uva_sampling": steps.get("sampling", {}).get("uva_over_cpu"),
        "tiering_speedup": steps.get("epochs", {}).get("speedup_10pct"),
        "lookahead_overhead": _ratio(
            steps.get("cache", {}).get("manage_ms_median", {}), "lru", "lookahead"
        ),  # fmt: skip
        "train_step_ms": steps.get("step", {}).get("train_step_ms"),
        "epoch_s": steps.get("epoch_default", {}).get("epoch_s"),
        "tiering_speedup_feature_bound": steps.get("feature_bound", {}).get(
            "tiering_speedup_10pct"
        ),
        "train_step_ms_cuda_graph": _get(steps, "step", "cuda_graph", "step_ms"),
        "epoch_s_cuda_graph": _get(steps, "epoch_default", "cuda_graph", "epoch_s"),
        "gpu_sampling_cuda_graph": _get(steps, "sampling", "graphed_over_cpu"),
        "tiering_speedup_feature_bound_cuda_graph": _get(
            steps, "feature_bound", "tiering_speedup_10pct_graphed"
        ),
        "kernel_fallbacks": kernel_fallbacks(steps),
        "nccl_modes_failed": steps.get("nccl", {}).get("nccl_modes_failed"),  # issue 26
    }

    def met(name: str, thr: float):
        v = values[name]
        if v is None or device != "cuda":
            return None
        return v <= thr if name in AT_MOST else v >= thr

    return {
        name: {
            "what": what,
            "goal": thr,
            "direction": "<=" if name in AT_MOST else ">=",
            "value": values[name],
            "met": met(name, thr),
        }  # fmt: skip
        for name, what, thr in GOALS
    }


def _get(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...``, None where a level is missing or not a dict (a step that failed)."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _gpu_tier_line(t: dict[str, Any]) -> str:
    """The GPU-tier gather's figures (issue 24): each row width's variants against the copy."""
    r, d2d = t.get("ratio", {}), t["d2d_copy"]["gbps"]
    parts = [f"GPU-tier gather / d2d copy (GPU time): {t['gpu_resident']['gbps'] / d2d:.2f}, "
             f"rows in order {r.get('ids_in_order/d2d_copy', 0):.2f}, wall with a sync per call "
             f"{r.get('gpu_resident_wall/d2d_copy_wall', 0):.2f}"]  # fmt: skip
    for key, vs in t.get("variants", {}).items():
        if isinstance(vs, dict):
            chosen = t.get("choice", {}).get(key, {}).get("chosen", "-")
            each = ", ".join(f"{n} {x / d2d:.2f}" for n, x in vs.items() if isinstance(x, float))
            parts.append(f"{key}: chosen {chosen}; {each}")
    return "; ".join(parts)


def _ratio(d: dict[str, float], a: str, b: str) -> float | None:
    return d[a] / max(d[b], 1e-12) if a in d and b in d else None


def write_markdown(report: dict[str, Any], path: Path) -> None:
    env = report["steps"].get("env", {})
    lines = [
        "# gnnio GPU check",
        "",
        f"{env.get('gpu', 'no GPU')} ({env.get('gpu_memory_gib', '?')} GiB), torch "
        f"{env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, {env.get('cpus', '?')} CPUs; "
        f"device `{env.get('device', '?')}`; {report['elapsed_s']:.0f} s.",
        "",
        *(
            ["**Dry run on the CPU: no figure below is a GPU figure.**", ""]
            if env.get("device") != "cuda"
            else []
        ),  # fmt: skip
        "| goal | measured | goal | met |",
        "| --- | --- | --- | --- |",
    ]
    for g in report["goals"].values():
        v = "not measured" if g["value"] is None else f"{g['value']:.2f}"
        met = {None: "-", True: "yes", False: "**no**"}[g["met"]]
        lines.append(f"| {g['what']} | {v} | {g.get('direction', '>=')} {g['goal']} | {met} |")
    lines += ["", "| step | status |", "| --- | --- |"]
    for name, res in report["steps"].items():
        status = res.get("error") or res.get("skipped") or "ok"
        if name == "gpu_tests" and "summary" in res:
            status = res["summary"]
        if name == "cpu_vs_cuda" and "identical_bytes_by_tier" in res:
            status = (f"bytes_by_tier identical: {res['identical_bytes_by_tier']}, max relative "
                      f"loss difference {res['max_rel_loss_diff']:.2e}; on the device run to run "
                      f"identical: {res.get('runs_identical')}, LABOR-0 "
                      f"{res.get('runs_identical_labor')}")  # fmt: skip
        if name == "sampling" and "checksum_equal" in res:
            status = f"GPU batches bit-identical to the CPU's (checksum): {res['checksum_equal']}"
            if res.get("graphed_over_cpu") is not None:
                status += (f"; --cuda-graph: {res['graphed_over_cpu']:.2f}x the CPU "
                           f"({res.get('graphed_over_eager') or 0:.2f}x the eager GPU sampler), "
                           f"batches identical: {res.get('cuda_graph_checksum_equal')}")  # fmt: skip
            if res.get("las_gpu_over_cpu") is not None:
                status += (f"; locality-aware s = 8: GPU {res['las_gpu_over_cpu']:.2f}x the CPU, "
                           f"graphed {res.get('las_graphed_over_eager') or 0:.2f}x eager, batches "
                           f"identical: {res.get('las_cuda_checksum_equal')} / "
                           f"{res.get('las_cuda_graph_checksum_equal')}")  # fmt: skip
            for key, what in (("ladies", "LADIES"), ("ladloc", "locality-aware LADIES s = 8"),
                              ("labor_i", "LABOR-1")):  # fmt: skip
                if res.get(f"{key}_gpu_over_cpu") is not None:
                    status += (f"; {what}: GPU {res[f'{key}_gpu_over_cpu']:.2f}x the CPU, ids and "
                               f"edges identical: {res.get(f'{key}_checksum_ids_equal')}, weights "
                               f"too: {res.get(f'{key}_checksum_equal')}")  # fmt: skip
        if name == "cache" and "manage_ms_median" in res:
            status = "; ".join(
                f"{p} {ms:.2f} ms, hits {res['hit_ratio'][p]:.3f}"
                for p, ms in res["manage_ms_median"].items()
            )
        if name == "step" and "ms_per_batch" in res:
            status = (f"{res['ms_per_batch']:.2f} ms per batch; host syncs per batch: "
                      f"{res.get('host_syncs_per_batch')} by the op counter (training thread), "
                      f"{res.get('cuda_syncs_per_batch')} by CUDA (every thread)")  # fmt: skip
            cg = res.get("cuda_graph") or {}
            if cg.get("step_ms") is not None:
                status += (f"; --cuda-graph: {cg['ms_per_batch']:.2f} ms per batch, step "
                           f"{cg['step_ms']:.2f} ms (eager {res.get('step_ms', 0):.2f})")  # fmt: skip
        if name == "epoch_default" and "epoch_s" in res:
            cg = res.get("cuda_graph") or {}
            status = f"warm epoch {res['epoch_s']:.2f} s"
            if cg.get("epoch_s") is not None:
                status += f"; --cuda-graph: {cg['epoch_s']:.2f} s"
        if name == "nccl" and "modes" in res:
            status = (f"{res['nccl_modes_failed']} of {len(res['modes'])} modes failed"
                      + (f": {', '.join(res['failed'])}" if res.get("failed") else "")
                      + (f"; skipped: {', '.join(res['skipped_modes'])}"
                         if res.get("skipped_modes") else ""))  # fmt: skip
        if name == "bandwidth" and "gpu_tier" in res.get("bandwidth", {}):
            status = _gpu_tier_line(res["bandwidth"]["gpu_tier"])
        if res.get("fell_back"):
            status = f"**failed: a Triton kernel fell back** ({status})"
        lines.append(f"| {name} | {status} |")
    fb = report["steps"].get("feature_bound", {}).get("techniques", {})
    if fb:
        lines += ["", "| technique (feature-bound) | baseline ms/batch | ms/batch | speedup |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        for name, r in fb.items():
            if "speedup" in r:
                lines.append(f"| {name}: {r['technique']} vs {r['baseline']} | "
                             f"{r['baseline_ms_per_batch']:.2f} | {r['ms_per_batch']:.2f} | "
                             f"{r['speedup']:.2f} |")  # fmt: skip
            else:
                lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | |")
    ep = report["steps"].get("epochs", {})
    if any(k in ep for k in ("0", "0.1")):
        lines += ["", "| hot fraction | epoch s | hidden_fraction | host bytes |", "| --- | --- | --- | --- |"]  # fmt: skip
        for f in ("0", "0.05", "0.1", "0.25"):
            if f in ep and "error" in ep[f]:
                lines.append(f"| {f} | {ep[f]['error']} | | |")
            elif f in ep:
                e = ep[f]
                hf = e.get("hidden_fraction")
                lines.append(f"| {f} | {e['epoch_time_s']:.2f} | "
                             f"{'-' if hf is None else f'{hf:.2f}'} | "
                             f"{e['bytes_by_tier'].get('host', 0):,} |")  # fmt: skip
    from ..utils.outputs import write_atomic

    text = "\n".join(lines) + "\n"
    write_atomic(path, lambda f: f.write(text.encode()), "report")
