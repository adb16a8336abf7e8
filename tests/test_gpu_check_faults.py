"""gpu-check's behaviour when a step fails the hard way (the one-shot GPU session, issue 24/26): the
report is written after every step and when the run is stopped, a timed-out step keeps what it
saw, the nccl step survives a worker that hangs and skips what the image cannot run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gnnio.bench import gpu_check, gpu_check_epoch, gpu_ipc, gpu_nccl

ROOT = Path(__file__).resolve().parent.parent


def _steps(*extra):
    return [("env", gpu_check.step_env), ("first", lambda c: {"value": 1}), *extra]


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_a_killed_run_leaves_the_report_of_the_steps_before(tmp_path):
    """SIGKILL (a device session's limit) in the third step: report.json holds the first two."""
    code = (
        "import os, sys\n"
        "from gnnio.bench import gpu_check as g\n"
        "g.STEPS = [('env', g.step_env), ('first', lambda c: {'value': 1}),\n"
        "           ('dies', lambda c: os._exit(9))]\n"
        f"sys.exit(g.main([{str(tmp_path)!r}, '--device', 'cpu', '--report-dir', "
        f"{str(tmp_path / 'back')!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 9, r.stderr
    rep = _report(tmp_path)
    assert rep["steps"]["first"]["value"] == 1 and rep["complete"] is False
    assert "dies" not in rep["steps"] and (tmp_path / "report.md").is_file()
    back = tmp_path / "back"  # --report-dir: the reports only, as of the last step done
    assert sorted(p.name for p in back.iterdir()) == ["report.json", "report.md"]
    assert _report(back) == rep


def test_sigterm_records_the_step_and_writes_the_report(tmp_path, monkeypatch):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("gpu-check installs its SIGTERM handler only in the main thread")

    def term(c):
        os.kill(os.getpid(), signal.SIGTERM)
        return {"never": True}

    monkeypatch.setattr(gpu_check, "STEPS", _steps(("term", term), ("after", lambda c: {})))
    assert gpu_check.main([str(tmp_path), "--device", "cpu"]) == 143
    rep = _report(tmp_path)
    assert rep["steps"]["term"]["error"].startswith("stopped (Terminated)")
    assert "after" not in rep["steps"] and rep["complete"] is False
    assert signal.getsignal(signal.SIGTERM) is not gpu_check._on_sigterm  # handler put back


def test_ctrl_c_writes_the_report_then_stops(tmp_path, monkeypatch):
    def interrupt(c):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "STEPS", _steps(("ctrl_c", interrupt)))
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main([str(tmp_path), "--device", "cpu"])
    rep = _report(tmp_path)
    assert rep["steps"]["first"] == {"value": 1, "step_s": rep["steps"]["first"]["step_s"]}
    assert "KeyboardInterrupt" in rep["steps"]["ctrl_c"]["error"]


def test_a_complete_run_says_so_with_env_and_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "STEPS", _steps())
    assert gpu_check.main([str(tmp_path), "--device", "cpu", "--commit", "abc123"]) == 0
    rep = _report(tmp_path)
    assert rep["complete"] is True and rep["steps"]["env"]["commit"] == "abc123"
    assert rep["steps"]["env"]["numba"]  # versions of what the kernels run on


def test_a_report_md_that_cannot_be_made_does_not_stop_the_run(tmp_path, monkeypatch):
    """An epoch record without hidden_fraction (None) used to raise in the markdown."""
    epochs = {"0": {"epoch_time_s": 1.0, "hidden_fraction": None, "bytes_by_tier": {"host": 1}}}
    monkeypatch.setattr(gpu_check, "STEPS", _steps(("epochs", lambda c: dict(epochs)),
                                                   ("odd", lambda c: {"fell_back": object()})))  # fmt: skip
    assert gpu_check.main([str(tmp_path), "--device", "cpu"]) == 0
    assert "| 0 | 1.00 | - | 1 |" in (tmp_path / "report.md").read_text()
    assert _report(tmp_path)["complete"] is True


def _timeout(cmd, timeout, out=b"", err=b""):
    e = subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
    return e


def test_gpu_tests_that_run_out_of_time_keep_their_log_and_failures(tmp_path, monkeypatch):
    log = b"tests/test_a.py ..F\nFAILED tests/test_a.py::test_x - AssertionError\n"

    def run(cmd, **kw):
        raise _timeout(cmd, kw["timeout"], log)

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    c = SimpleNamespace(out=tmp_path, left_s=lambda: 1000.0)
    res = gpu_check.step_gpu_tests(c)
    assert res["failed"] == ["FAILED tests/test_a.py::test_x - AssertionError"]
    assert "stopped after 180 s" in res["error"]
    assert "test_x" in (tmp_path / "gpu_tests.log").read_text()


def test_the_gpu_tests_run_where_pytest_has_no_xdist():
    """pyproject's addopts ask for xdist's ``-n``; a GPU image's pytest without xdist (``-p
    no:xdist`` here) refuses them and runs no test. The gpu tests' options replace them."""
    base = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--co",
            "-q", "-m", "gpu"]  # fmt: skip
    target = ["tests/test_graphed.py"]
    plain = subprocess.run(base + target, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and "-n" in plain.stderr  # what gpu-check would have run
    fixed = subprocess.run(base + gpu_check.pytest_workers_args(0) + target, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    assert "test_graphed.py::" in fixed.stdout


def test_the_gpu_tests_use_xdist_workers_where_it_is_installed(tmp_path, monkeypatch):
    import importlib.util

    cmds = []

    def run(cmd, **kw):
        cmds.append(cmd)
        return SimpleNamespace(stdout="1 passed in 1.0s\n", stderr="", returncode=0)

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    monkeypatch.setattr(gpu_check.os, "cpu_count", lambda: 16)
    c = SimpleNamespace(out=tmp_path, left_s=lambda: 1000.0)
    res = gpu_check.step_gpu_tests(c)
    assert res["workers"] == 4 and res["counts"] == {"passed": 1}
    assert cmds[-1][cmds[-1].index("-n") + 1] == "4" and "addopts=-ra" in cmds[-1]
    find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "xdist" else find(n, *a)
    )
    res = gpu_check.step_gpu_tests(c)
    assert res["workers"] == 0 and "-n" not in cmds[-1] and "addopts=-ra" in cmds[-1]


def test_a_bench_that_runs_out_of_time_says_where_it_was(tmp_path, monkeypatch):
    def run(cmd, **kw):
        raise _timeout(cmd, kw["timeout"], b"", b"loading\nepoch 1: batch 17\n")

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    c = gpu_check.Check(SimpleNamespace(outdir=str(tmp_path), device="cpu", budget_s=100.0,
                                        nodes=16))  # fmt: skip
    with pytest.raises(
        RuntimeError, match=r"bench step ran past .* s: loading \| epoch 1: batch 17"
    ):
        c.gnnio("bench", "step", "DIR")
    assert c.report["calls"] == [{"argv": "bench step DIR", "wall_s": c.report["calls"][0]["wall_s"],
                                  "timed_out": True}]  # fmt: skip


def test_each_call_records_its_wall_time(tmp_path, monkeypatch):
    """report.json's ``calls``: every gnnio process the check started, its options (the run's
    absolute paths by their last part), its wall time and exit status (where a budget went)."""

    def run(cmd, **kw):
        time.sleep(0.05)
        return subprocess.CompletedProcess(cmd, 0 if "ok" in cmd else 3, '{"x": 1}\n', "boom\n")

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    c = gpu_check.Check(SimpleNamespace(outdir=str(tmp_path), device="cpu", budget_s=100.0,
                                        nodes=16))  # fmt: skip
    assert c.gnnio("bench", "step", str(tmp_path / "d"), "ok", "--json") == {"x": 1}
    with pytest.raises(RuntimeError, match="exited 3: boom"):
        c.gnnio("train", str(tmp_path / "d"), "--epochs", "2")
    first, second = c.report["calls"]
    assert first["argv"] == "bench step d ok --json" and first["returncode"] == 0
    assert second["argv"] == "train d --epochs 2" and second["returncode"] == 3
    assert all(0.05 <= call["wall_s"] < 30 for call in (first, second))


def test_modes_of_a_worker_that_hung(tmp_path):
    """The worker hung in sample/dsp: the modes before it keep their results, it fails with the
    worker's last lines, the ones after it fail as not run."""
    names = gpu_nccl.mode_names()
    hung = names.index("sample/dsp")
    done = {n: {"ok": True, "error": None} for n in names[:hung]}
    (tmp_path / "modes.json").write_text(json.dumps({**done, gpu_nccl.RUNNING: "sample/dsp"}))
    modes = gpu_nccl.read_modes(tmp_path / "modes.json", "ran past 180 s", "a\nall_to_all\n")
    assert list(modes) == names
    assert all(modes[n]["ok"] for n in names[:hung])
    assert modes["sample/dsp"]["error"] == "nccl worker ran past 180 s in this mode: a | all_to_all"
    assert all(modes[n]["error"].startswith("not run") for n in names[hung + 1 :])
    nothing = gpu_nccl.read_modes(tmp_path / "none.json", "exited 1", "boom")
    assert not any(m["ok"] for m in nothing.values())


def test_the_nccl_step_survives_a_hanging_worker(tmp_path, monkeypatch):
    """The worker never returns: it is killed, its modes are read, and the ipc sub-step runs."""
    killed = []

    class Hanging:
        pid = 4242
        returncode = None

        def __init__(self, cmd, **kw):
            work = Path(cmd[3])
            first = gpu_nccl.mode_names()[0]
            (work / "modes.json").write_text(json.dumps({gpu_nccl.RUNNING: first}))
            self.calls = 0

        def communicate(self, timeout=None):
            self.calls += 1
            if self.calls == 1:
                raise subprocess.TimeoutExpired("worker", timeout)
            return "init\nstuck in a collective\n", None

    monkeypatch.setattr(gpu_ipc.subprocess, "Popen", Hanging)
    monkeypatch.setattr(gpu_ipc.os, "killpg", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(gpu_nccl, "step_ipc", lambda c: {"modes": {"ipc/shared": {"ok": True}}})
    c = SimpleNamespace(out=tmp_path, device="cpu", left_s=lambda: 300.0)
    r = gpu_nccl.step_nccl(c)
    assert killed == [(4242, signal.SIGKILL)]
    first = gpu_nccl.mode_names()[0]
    assert "ran past 180 s in this mode: init | stuck in a collective" in r["modes"][first]["error"]
    assert r["modes"]["ipc/shared"]["ok"] and r["nccl_modes_failed"] == len(gpu_nccl.mode_names())


def test_store_metis_is_skipped_without_pymetis(tmp_path, monkeypatch):
    """The GPU image has no pymetis: store/metis is reported as skipped, not failed; the other
    modes run, and modes.json names the mode in progress while it runs."""
    monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis -> ImportError
    path = tmp_path / "modes.json"
    seen = []

    def metis():
        raise RuntimeError("method 'metis' needs pymetis")

    def mod():
        seen.append(json.loads(path.read_text())[gpu_nccl.RUNNING])

    out = gpu_nccl.run_modes([("store/metis", metis), ("store/mod", mod)], None, path)
    assert out["store/metis"]["ok"] and "pymetis" in out["store/metis"]["skipped"]
    assert out["store/mod"]["ok"] and seen == ["store/mod"]
    assert gpu_nccl.RUNNING not in json.loads(path.read_text())


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory):
    from gnnio.importers.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("data") / "g"
    prepare_synthetic(out, num_nodes=1500, avg_degree=8, feat_dim=16, num_classes=4, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    return out


_CONFIGS = sorted({tuple(o) for _, base, tech in gpu_check_epoch.TECHNIQUES for o in (base, tech)})


@pytest.mark.parametrize("opts", _CONFIGS, ids=" ".join)
def test_every_feature_bound_configuration_runs_in_bench_step(small_graph, opts, capsys):
    """What the feature_bound step runs, each once on the CPU: `--cache-policy lookahead` used to
    fail in bench step's sequential pass (its batches were never announced to the cache)."""
    from gnnio.cli.main import main

    rc = main(["bench", "step", str(small_graph), "--device", "cpu", "--batches", "2", "--warmup",
               "1", "--fanouts", "5,5", "--batch-size", "64", "--no-gpu-passes", "--quiet",
               "--json", *opts])  # fmt: skip
    assert rc == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["ms_per_batch"] > 0 and r["kernels"]["fallbacks"] == 0


def test_cpu_vs_cuda_trains_with_a_short_stall_timeout(tmp_path, monkeypatch):
    """cpu_vs_cuda trains inside gpu-check's own process: a loader stage stuck on the GPU must
    end that step (LoaderStall after STALL_S), not hang the check for the default 600 s."""
    import gnnio.train

    seen = []

    def fake_train(path, cfg):
        seen.append(cfg.stall_timeout)
        h = [{"loss": 1.0}, {"loss": 0.5}]
        return {"history": h, "bytes_by_tier": {"gpu": 1}, "simulated": True}

    monkeypatch.setattr(gnnio.train, "train", fake_train)
    (tmp_path / "data" / "small").mkdir(parents=True)
    res = gpu_check.step_cpu_vs_cuda(SimpleNamespace(out=tmp_path, device="cpu"))
    assert seen == [gpu_check.STALL_S] * 5 and gpu_check.STALL_S <= 60
    assert res["identical_bytes_by_tier"] and res["losses_close"]
    assert res["runs_identical"] and res["runs_identical_labor"]


@pytest.mark.parametrize("odd,what", [(3, "loss"), (3, "bytes_by_tier"), (5, "loss")])
def test_cpu_vs_cuda_reports_a_run_that_does_not_repeat(tmp_path, monkeypatch, odd, what):
    """The device's runs are compared exactly, times aside, each with its pair (the run again:
    the 3rd call, LABOR-0's second: the 5th): a loss that differs in the last bit, or bytes
    read, between two runs is reported (``runs_identical*`` false); epoch times are not."""
    import gnnio.train

    calls = []

    def fake_train(path, cfg):
        calls.append(cfg.sampler)
        n = len(calls)
        off = {what: n == odd}  # (this call's loss or bytes off from its pair's)
        loss = (0.7 if cfg.sampler == "labor" else 0.5) + (1e-16 if off.get("loss") else 0.0)
        last = {"loss": loss, "epoch_time_s": 2.0 * n,
                "bytes_by_tier": {"gpu": 2 if off.get("bytes_by_tier") else 1}}  # fmt: skip
        h = [{"loss": 1.0, "epoch_time_s": float(n)}, last]
        return {"history": h, "bytes_by_tier": {"gpu": 1}, "simulated": True}

    monkeypatch.setattr(gnnio.train, "train", fake_train)
    (tmp_path / "data" / "small").mkdir(parents=True)
    res = gpu_check.step_cpu_vs_cuda(SimpleNamespace(out=tmp_path, device="cpu"))
    assert calls[-2:] == ["labor", "labor"]
    assert (res["runs_identical"], res["runs_identical_labor"]) == (odd != 3, odd != 5)


def test_a_failing_measurement_keeps_its_steps_other_figures(tmp_path, monkeypatch):
    """UVA sampling refused (pinning not allowed, say) and one epoch run failing: the GPU and
    CPU sampling figures, their ratio, and the other epochs are still reported."""
    c = gpu_check.Check(SimpleNamespace(outdir=str(tmp_path), device="cuda", budget_s=100.0,
                                        nodes=16, batches=2))  # fmt: skip

    def gnnio(*argv, limit_s=0):
        if argv[0] == "bench" and "host" in argv:  # UVA sampling refused
            return 1 / 0
        if argv[0] == "bench":
            return {"edges_per_s": 30.0 if "cuda" in argv else 10.0, "checksum": "x"}
        frac = argv[argv.index("--gpu-cache-fraction") + 1]
        if frac == "0.05":
            raise RuntimeError("train exited 1: boom")
        path = Path(argv[argv.index("--summary") + 1])
        last = {"epoch_time_s": 2.0 if frac == "0" else 1.0, "breakdown_s": {},
                "bytes_by_tier": {"host": 1}}  # fmt: skip
        path.write_text(json.dumps({"history": [last, last]}))
        return {}

    monkeypatch.setattr(c, "gnnio", gnnio)
    s = gpu_check.step_sampling(c)
    assert s["gpu_over_cpu"] == 3.0 and s["checksum_equal"] is True
    assert "ZeroDivisionError" in s["uva"]["error"] and s["uva_over_cpu"] is None
    assert s["las_gpu_over_cpu"] == 3.0 and s["las_graphed_over_eager"] == 1.0
    assert s["las_cuda_checksum_equal"] is True and s["las_cuda_graph_checksum_equal"] is True
    e = gpu_check.step_epochs(c)
    assert "boom" in e["0.05"]["error"] and e["speedup_10pct"] == 2.0
    md = tmp_path / "r.md"
    gpu_check.write_markdown({"steps": {"sampling": s, "epochs": e}, "goals": {},
                              "elapsed_s": 1.0}, md)  # fmt: skip
    assert "| 0.05 | RuntimeError: train exited 1: boom | | |" in md.read_text()
    assert "locality-aware s = 8: GPU 3.00x the CPU, graphed 1.00x eager" in md.read_text()
