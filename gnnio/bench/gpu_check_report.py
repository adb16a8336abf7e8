"""``report.md`` of the GPU check (:mod:`gnnio.bench.gpu_check`): the goals met or not, one line
per step, the feature-bound techniques and the epochs at each hot fraction, from ``report.json``'s
content. A step's result of an unexpected shape shows as a dash, never stops the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_markdown"]


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
                      f"loss difference {res['max_rel_loss_diff']:.2e}")  # fmt: skip
        if name == "sampling" and "checksum_equal" in res:
            status = f"GPU batches bit-identical to the CPU's (checksum): {res['checksum_equal']}"
        if name == "cache" and "manage_ms_median" in res:
            status = "; ".join(
                f"{p} {ms:.2f} ms, hits {res['hit_ratio'][p]:.3f}"
                for p, ms in res["manage_ms_median"].items()
            )
        if name == "step" and "ms_per_batch" in res:
            status = (f"{res['ms_per_batch']:.2f} ms per batch; host syncs per batch: "
                      f"{res.get('host_syncs_per_batch')} by the op counter (training thread), "
                      f"{res.get('cuda_syncs_per_batch')} by CUDA (every thread)")  # fmt: skip
        if name == "nccl" and "modes" in res:
            status = (f"{res['nccl_modes_failed']} of {len(res['modes'])} modes failed"
                      + (f": {', '.join(res['failed'])}" if res.get("failed") else "")
                      + (f"; skipped: {', '.join(res['skipped_modes'])}"
                         if res.get("skipped_modes") else ""))  # fmt: skip
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
            if f in ep:
                e = ep[f]
                hf = e.get("hidden_fraction")
                lines.append(f"| {f} | {e['epoch_time_s']:.2f} | "
                             f"{'-' if hf is None else f'{hf:.2f}'} | "
                             f"{e['bytes_by_tier'].get('host', 0):,} |")  # fmt: skip
    from ..utils.outputs import write_atomic

    text = "\n".join(lines) + "\n"
    write_atomic(path, lambda f: f.write(text.encode()), "report")
