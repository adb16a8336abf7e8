"""``scripts/gpu-check.sh``: one line and exit 0 without a GPU; the report's goals and markdown."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from gnnio.bench import gpu_check

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_script_without_a_gpu_prints_one_line_and_exits_0(tmp_path):
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "no GPU" in lines[0]
    assert not (tmp_path / "out").exists()


def test_goals_from_the_steps():
    steps = {
        "bandwidth": {
            "bandwidth": {"ratio": {"zero_copy/h2d_copy": 0.85, "gpu_resident/d2d_copy": 0.5}}
        },  # fmt: skip
        "sampling": {"gpu_over_cpu": 12.0},
        "epochs": {},
        "cache": {"manage_ms_median": {"lru": 3.0, "lookahead": 2.0}},
    }
    g = gpu_check.goals(steps)
    assert g["lookahead_overhead"]["value"] == 1.5 and g["lookahead_overhead"]["met"] is True
    assert g["uva_gather"]["met"] is True and g["gpu_tier_gather"]["met"] is False
    assert g["gpu_sampling"]["met"] is True and g["tiering_speedup"]["value"] is None
    assert all(v["met"] is None for v in gpu_check.goals(steps, device="cpu").values())


def test_a_dry_run_writes_both_reports(tmp_path):
    skip = "gpu_tests,cpu_vs_cuda,dataset,bandwidth,sampling,loader,epochs,cache,nccl"
    rc = gpu_check.main([str(tmp_path), "--device", "cpu", "--skip", skip])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"]["env"]["device"] == "cpu"
    assert report["steps"]["epochs"] == {"skipped": "--skip"}
    md = (tmp_path / "report.md").read_text()
    assert "Dry run on the CPU" in md and "| epochs | --skip |" in md
    gpu_check.write_markdown({**report, "steps": {**report["steps"], "epochs": {
        "0": {"epoch_time_s": 2.0, "hidden_fraction": 0.5, "bytes_by_tier": {"host": 10}},
    }}}, tmp_path / "r2.md")  # fmt: skip
    assert "| 0 | 2.00 | 0.50 | 10 |" in (tmp_path / "r2.md").read_text()
