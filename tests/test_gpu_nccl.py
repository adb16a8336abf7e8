"""The gpu-check step ``nccl`` (issue 26), as far as a CPU can take it: skipped with a line
without CUDA; the CPU dry run (gloo, the check in its simulated-NCCL mode) passes every mode,
and a mode that breaks the rules is counted in ``nccl_modes_failed``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gnnio.bench import gpu_check
from gnnio.bench.gpu_nccl import STRATEGIES, step_nccl


def _check(tmp_path: Path, device: str):
    return SimpleNamespace(out=tmp_path, device=device, left_s=lambda: 300.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_cuda_the_step_is_skipped_with_a_line(tmp_path):
    r = step_nccl(_check(tmp_path, "cuda"))
    assert "no CUDA device" in r["skipped"] and r["nccl_modes_failed"] is None
    g = gpu_check.goals({"nccl": r})["nccl_modes_failed"]
    assert g["value"] is None and g["met"] is None and g["goal"] == 0


def test_cpu_dry_run_passes_every_mode_and_counts_failures(tmp_path):
    ck = tmp_path / "nccl" / "ck"  # a previous gpu-check's, into the same outdir: removed first
    ck.mkdir(parents=True)
    (ck / "ckpt-e000001-b000000000.pt").write_bytes(b"")
    r = step_nccl(_check(tmp_path, "cpu"))
    modes = r["modes"]
    expected = {f"store/{s}" for s in STRATEGIES} | {
        "sample/dsp", "sample/shared", "sample/dsp+prune", "sample/shared+prune",
        "train/dsp+checkpoints", "train/resume", "train/shared+prune",
        "ipc/shared", "ipc/shared+prune",  # two ranks (issue 26 item 4; /dev/shm on the CPU)
    }  # fmt: skip
    assert set(modes) == expected
    assert r["nccl_modes_failed"] == 0, {m: v for m, v in modes.items() if not v["ok"]}
    assert r["backend"] == "gloo" and r["calls"] > 0 and r["awaiting_two_gpus"]
    for m in ("ipc/shared", "ipc/shared+prune"):
        assert modes[m]["shared_via"] == ["shm"] and modes[m]["peer_bytes"] > 0, modes[m]
        assert len(modes[m]["peer_bytes_per_rank"]) == 2
    assert not any("another rank's shard" in a for a in r["awaiting_two_gpus"])
    g = gpu_check.goals({"nccl": r}, device="cpu")["nccl_modes_failed"]
    assert g["value"] == 0 and g["met"] is None  # a CPU dry run is not a GPU figure
    assert gpu_check.goals({"nccl": r})["nccl_modes_failed"]["met"] is True
    broken = gpu_check.goals({"nccl": {**r, "nccl_modes_failed": 1}})
    assert broken["nccl_modes_failed"]["met"] is False
