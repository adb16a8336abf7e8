"""``scripts/gpu-check.sh``: one line and exit 0 without a GPU; the report's goals and markdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnio.bench import gpu_check
from tests.helpers import run_gnnio_in_process

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_script_without_a_gpu_prints_one_line_and_exits_0(tmp_path):
    env = dict(os.environ)
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():  # tested from another venv
        env["PYTHON"] = sys.executable  # (the script would take the checkout's .venv)
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "no GPU" in lines[0]
    assert f"torch {torch.__version__} of " in lines[0]  # a CPU build in .venv is seen at once
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
    skip = ",".join(name for name, _ in gpu_check.STEPS if name != "env")  # every step but env
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


def test_issue24_goals_at_most_and_fallbacks():
    steps = {
        "step": {"train_step_ms": 2.5, "fell_back": False},
        "epoch_default": {"epoch_s": 1.4, "fell_back": True},
        "feature_bound": {
            "tiering_speedup_10pct": 1.7,
            "techniques": {"labor": {"speedup": 1.1, "fell_back": False}},
        },
    }
    g = gpu_check.goals(steps)
    assert g["train_step_ms"]["met"] is True and g["train_step_ms"]["direction"] == "<="
    assert g["epoch_s"]["met"] is False
    assert g["tiering_speedup_feature_bound"]["met"] is True
    assert g["kernel_fallbacks"]["value"] == 1 and g["kernel_fallbacks"]["met"] is False
    assert gpu_check.goals({})["kernel_fallbacks"]["value"] is None
    # the LAS GPU sampler's batches on the CPU kernels are a fallback without a failed kernel
    from gnnio.bench.gpu_check_epoch import fallbacks

    las = {"kernels": {"las_hop": "numba+triton", "hop": "numba", "fallbacks": 0}}
    assert fallbacks(las) == 1 and fallbacks({"kernels": {"las_hop": "triton"}}) == 0


def test_the_goals_are_also_read_with_cuda_graphs():
    steps = {
        "step": {"train_step_ms": 5.0, "cuda_graph": {"step_ms": 1.5}},
        "epoch_default": {"epoch_s": 1.5, "cuda_graph": {"error": "RuntimeError: no capture"}},
        "sampling": {"gpu_over_cpu": 8.0, "graphed_over_cpu": 12.0},
        "feature_bound": {"tiering_speedup_10pct": 1.2, "tiering_speedup_10pct_graphed": 1.5},
    }
    g = gpu_check.goals(steps)
    assert g["train_step_ms"]["met"] is False and g["train_step_ms_cuda_graph"]["met"] is True
    assert g["train_step_ms_cuda_graph"]["value"] == 1.5
    assert g["epoch_s_cuda_graph"]["value"] is None  # its run failed: not measured
    assert g["gpu_sampling_cuda_graph"]["met"] is True and g["gpu_sampling"]["met"] is False
    assert g["tiering_speedup_feature_bound_cuda_graph"]["value"] == 1.5
    assert g["tiering_speedup_feature_bound_cuda_graph"]["met"] is False


def test_feature_bound_step_compares_each_technique_with_its_baseline(tmp_path, monkeypatch):
    """The step's bookkeeping, with `gnnio bench step` replaced by a fake that is 2x faster with
    10 % hot rows and falls back from a Triton kernel for LABOR-0."""
    from gnnio.bench import gpu_check_epoch as ge

    class FakeCheck:
        out = tmp_path
        device = "cuda"
        args = type("A", (), {"fb_nodes": 64, "fb_batches": 2})()
        calls: list = []

        def left_s(self):
            return 1e9

        def gnnio(self, *argv, limit_s=0):
            self.calls.append(argv)
            if argv[0] == "prepare":
                (tmp_path / "data" / "fb64").mkdir(parents=True)
                return {}
            ms = 5.0 if "0.1" in argv and "--locality-scale" not in argv else 10.0
            fell = 1 if "labor" in argv else 0
            return {"ms_per_batch": ms, "kernels": {"fallbacks": fell}, "breakdown": {},
                    "phases_s": {"start": ms / 10, "build": 1.0}}  # fmt: skip

    c = FakeCheck()
    out = ge.step_feature_bound(c)
    t = out["techniques"]
    assert set(t) == {name for name, _, _ in ge.TECHNIQUES}
    assert out["tiering_speedup_10pct"] == 2.0 and t["tiering_5pct"]["speedup"] == 1.0
    assert t["labor"]["fell_back"] is True and t["bgl_static"]["fell_back"] is False
    assert ge.kernel_fallbacks({"feature_bound": out}) == 1
    assert t["tiering_10pct"]["phases_s"]["start"] == 0.5  # each run's wall time by part, kept
    assert t["tiering_10pct"]["baseline_phases_s"]["start"] == 1.0
    runs = [a for a in c.calls if a[0] == "bench"]
    assert len(runs) == len({a for a in runs})  # each configuration measured once


def test_a_dry_run_of_the_step_and_epoch_steps(tmp_path, monkeypatch):
    """`step`, `epoch_default` and `profile` end to end on the CPU (a dry run: tiny graph); the
    `gnnio` and benchmark calls run in this process (their plumbing as a child's: exit status,
    last JSON line; test_gpu_check_faults tests the subprocess itself)."""
    ran = run_gnnio_in_process(monkeypatch)
    keep = ("env", "dataset", "step", "epoch_default", "profile")
    skip = ",".join(n for n, _ in gpu_check.STEPS if n not in keep)
    rc = gpu_check.main([str(tmp_path), "--device", "cpu", "--nodes", "4096", "--skip", skip])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    st = report["steps"]["step"]
    assert "error" not in st, st
    assert st["train_step_ms"] > 0 and st["fell_back"] is False
    assert report["steps"]["epoch_default"]["epoch_s"] > 0
    assert report["goals"]["train_step_ms"]["value"] == st["train_step_ms"]
    assert report["goals"]["train_step_ms"]["met"] is None  # not a GPU figure
    cg = st["cuda_graph"]  # --cuda-graph's step measured beside the eager one (padded, eagerly)
    assert cg["step_ms"] > 0 and cg["cuda_graph"]["graphed"] > 0, cg
    prof = report["steps"]["profile"]
    assert "error" not in prof, prof
    assert prof["isolated"]["isolated_step_ms"] > 0 and prof["graphed"]["graphed_step_ms"] > 0
    assert "by_cpu" in prof["profile_isolated"]
    assert len(ran) == 5, ran  # prepare, bench step (eager, --cuda-graph), train, step_profile


def test_feature_bound_leaves_its_reserve_to_the_profile(tmp_path):
    """With --fb-reserve-s R, no technique starts once less than 30 + R s are left: the goal
    pairs run first, the rest are skipped as out of time (the profile after it keeps R)."""
    from gnnio.bench import gpu_check_epoch as ge

    class FakeCheck:
        out = tmp_path
        device = "cuda"
        args = type("A", (), {"fb_nodes": 64, "fb_batches": 2, "fb_reserve_s": 60.0})()
        left = 200.0

        def left_s(self):
            return self.left

        def gnnio(self, *argv, limit_s=0):
            if argv[0] == "prepare":
                (tmp_path / "data" / "fb64").mkdir(parents=True, exist_ok=True)
                return {}
            self.left -= 25.0  # each run takes 25 s of the budget
            iso = {"cores_by_stage": {"sample": [0]}} if "auto" in argv else None
            return {"ms_per_batch": 5.0, "kernels": {"fallbacks": 0}, "breakdown": {},
                    "isolation": iso}  # fmt: skip

    c = FakeCheck()
    c.left = 1e4  # every pair: --isolation auto's allocation is in its entry
    t = ge.step_feature_bound(c)["techniques"]
    assert t["bgl_isolation"]["isolation"] == {"cores_by_stage": {"sample": [0]}}
    assert all("isolation" not in r for n, r in t.items() if n != "bgl_isolation")
    c.left = 200.0
    t = ge.step_feature_bound(c)["techniques"]
    ran = [n for n, r in t.items() if "speedup" in r]
    # 200 s: tiering_10pct (2 runs, 150 left), _graphed (2, 100 left), labor (1: its baseline
    # is tiering_10pct's technique, measured once; 75 left), then under 30 + 60: stop
    assert ran == ["tiering_10pct", "tiering_10pct_graphed", "labor"]
    assert all(t[n] == {"skipped": "out of time"} for n in t if n not in ran)
    c.args.fb_reserve_s, c.left = 0.0, 200.0  # without a reserve the next pairs run too
    assert len([r for r in ge.step_feature_bound(c)["techniques"].values() if "speedup" in r]) > 2


def _wheel(folder: Path) -> None:
    """A minimal pure-Python wheel (``gnnio_probe``), as scripts/gpu-wheels.sh's are carried."""
    import zipfile

    folder.mkdir()
    info = "gnnio_probe-0.1.dist-info"
    files = {
        "gnnio_probe.py": "VALUE = 7\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: gnnio-probe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / "gnnio_probe-0.1-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_session_installs_the_carried_wheels_and_records_the_machine(tmp_path):
    """``OUT=DIR bash scripts/gpu-session.sh COMMIT``: the device call in one line. The carried
    wheels go into SITE (on the path of what runs next), ``pip list`` and ``nvidia-smi`` into
    OUT; gpu-check then runs (here: no GPU, one line, exit 0). Without OUT: usage, exit 2."""
    _wheel(tmp_path / "whl")
    out, site = tmp_path / "out", tmp_path / "site"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "WHEELS": str(tmp_path / "whl"),
           "SITE": str(site), "GC_DIR": str(tmp_path / "gc")}  # fmt: skip
    script = str(ROOT / "scripts" / "gpu-session.sh")
    r = subprocess.run(["bash", script, "abc123"], capture_output=True, text=True, timeout=300,
                       env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "no GPU" in r.stdout.strip().splitlines()[-1]
    assert (site / "gnnio_probe.py").is_file()
    listed = (out / "pip-list.txt").read_text()
    assert "gnnio-probe" in listed and "torch" in listed  # (the site is on the path)
    assert (out / "nvidia-smi.txt").is_file()
    (tmp_path / "bad").mkdir()  # wheels that do not install (another Python's): a warning
    (tmp_path / "bad" / "x-1.0-cp99-cp99-linux_x86_64.whl").write_bytes(b"not a wheel")
    r = subprocess.run(["bash", script, "abc123"], capture_output=True, text=True, timeout=300,
                       env={**env, "WHEELS": str(tmp_path / "bad"), "OUT": str(tmp_path / "o2")})  # fmt: skip
    assert r.returncode == 0 and "did not install" in r.stderr, r.stderr
    assert "no GPU" in r.stdout and (tmp_path / "o2" / "pip-list.txt").is_file()
    env.pop("OUT")
    r = subprocess.run(["bash", script, "abc123"], capture_output=True, text=True, timeout=60,
                       env=env)  # fmt: skip
    assert r.returncode == 2 and "usage: OUT=DIR" in r.stderr


def test_each_goal_reads_its_own_figure_and_is_met_at_its_threshold():
    """Every goal from its own key (each figure a distinct value, so a goal reading a neighbour's
    key reads the wrong one), and a figure equal to the threshold meets it, either direction."""
    from gnnio.bench.gpu_check_report import AT_MOST, GOALS

    steps = {
        "bandwidth": {"bandwidth": {"ratio": {"zero_copy/h2d_copy": 1.01,
                                              "gpu_resident/d2d_copy": 1.02}}},
        "sampling": {"gpu_over_cpu": 1.03, "uva_over_cpu": 1.04, "graphed_over_cpu": 1.05},
        "epochs": {"speedup_10pct": 1.06},
        "cache": {"manage_ms_median": {"lru": 1.07 * 2, "lookahead": 2.0}},
        "step": {"train_step_ms": 1.08, "cuda_graph": {"step_ms": 1.09}, "fell_back": False},
        "epoch_default": {"epoch_s": 1.10, "cuda_graph": {"epoch_s": 1.11}},
        "feature_bound": {"tiering_speedup_10pct": 1.12, "tiering_speedup_10pct_graphed": 1.13},
        "nccl": {"nccl_modes_failed": 3},
    }  # fmt: skip
    want = {"uva_gather": 1.01, "gpu_tier_gather": 1.02, "gpu_sampling": 1.03,
            "uva_sampling": 1.04, "gpu_sampling_cuda_graph": 1.05, "tiering_speedup": 1.06,
            "lookahead_overhead": 1.07, "train_step_ms": 1.08, "train_step_ms_cuda_graph": 1.09,
            "epoch_s": 1.10, "epoch_s_cuda_graph": 1.11, "tiering_speedup_feature_bound": 1.12,
            "tiering_speedup_feature_bound_cuda_graph": 1.13, "kernel_fallbacks": 0,
            "nccl_modes_failed": 3}  # fmt: skip
    g = gpu_check.goals(steps)
    assert {k: v["value"] for k, v in g.items()} == pytest.approx(want)
    for name, _what, thr in GOALS:  # at the threshold: met
        direction = "<=" if name in AT_MOST else ">="
        assert g[name]["direction"] == direction and g[name]["goal"] == thr
        got = gpu_check.goals(_steps_with(steps, name, thr))[name]
        assert got["value"] == pytest.approx(thr) and got["met"] is True, name


def _steps_with(steps: dict, name: str, value: float) -> dict:
    """``steps`` (deep-copied) with the figure behind goal ``name`` set to ``value``."""
    import copy

    s = copy.deepcopy(steps)
    where = {
        "uva_gather": ("bandwidth", "bandwidth", "ratio", "zero_copy/h2d_copy"),
        "gpu_tier_gather": ("bandwidth", "bandwidth", "ratio", "gpu_resident/d2d_copy"),
        "gpu_sampling": ("sampling", "gpu_over_cpu"),
        "uva_sampling": ("sampling", "uva_over_cpu"),
        "gpu_sampling_cuda_graph": ("sampling", "graphed_over_cpu"),
        "tiering_speedup": ("epochs", "speedup_10pct"),
        "train_step_ms": ("step", "train_step_ms"),
        "train_step_ms_cuda_graph": ("step", "cuda_graph", "step_ms"),
        "epoch_s": ("epoch_default", "epoch_s"),
        "epoch_s_cuda_graph": ("epoch_default", "cuda_graph", "epoch_s"),
        "tiering_speedup_feature_bound": ("feature_bound", "tiering_speedup_10pct"),
        "tiering_speedup_feature_bound_cuda_graph": ("feature_bound",
                                                     "tiering_speedup_10pct_graphed"),
        "nccl_modes_failed": ("nccl", "nccl_modes_failed"),
    }  # fmt: skip
    if name == "lookahead_overhead":
        s["cache"]["manage_ms_median"] = {"lru": value * 2.0, "lookahead": 2.0}
    elif name == "kernel_fallbacks":
        assert value == 0  # (none in these steps: the value is 0 already)
    else:
        d = s
        *path, last = where[name]
        for k in path:
            d = d[k]
        d[last] = value
    return s


def test_a_step_that_fell_back_is_marked_failed_in_the_report(tmp_path):
    """Issue 24 item 7: gpu-check marks a step whose Triton kernel fell back as failed; a level
    of a step that is not a dict (a step that failed differently) reads as not measured."""
    report = {"elapsed_s": 1.0, "goals": gpu_check.goals({}), "steps": {
        "env": {"device": "cuda"}, "step": {"ms_per_batch": 2.0, "fell_back": True},
        "cache": {"skipped": "--skip", "fell_back": False}}}  # fmt: skip
    gpu_check.write_markdown(report, tmp_path / "r.md")
    md = (tmp_path / "r.md").read_text()
    assert "| step | **failed: a Triton kernel fell back** (2.00 ms per batch;" in md
    assert "| cache | --skip |" in md
    g = gpu_check.goals({"step": {"train_step_ms": 2.0, "cuda_graph": "failed"}})
    assert g["train_step_ms_cuda_graph"]["value"] is None and g["train_step_ms"]["met"] is True
