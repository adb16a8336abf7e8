"""BGL's profiling-based resource isolation: fit, min-max solve, and ``gnnio train --isolation``."""

from __future__ import annotations

import itertools
import json
import os

import pytest
import torch

from gnnio.pipeline.isolation import (
    StageFit,
    fit_stage,
    profile_stages,
    solve,
    thread_candidates,
)


def test_thread_candidates():
    assert thread_candidates(1) == [1]
    assert thread_candidates(2) == [1, 2]
    assert thread_candidates(6) == [1, 2, 4, 6]
    assert thread_candidates(16) == [1, 2, 4, 8, 16]


def test_fit_recovers_a_over_c_plus_d():
    f = fit_stage({c: 0.8 / c + 0.05 for c in (1, 2, 4, 8)})
    assert f.a == pytest.approx(0.8) and f.d == pytest.approx(0.05)
    flat = fit_stage({1: 0.3, 2: 0.31, 4: 0.32})  # no gain from threads
    assert flat.a == 0.0 and flat.d == pytest.approx(0.31)
    assert fit_stage({1: 1.0}).seconds(3) == pytest.approx(1.0)


def brute(fits, cores):
    names = list(fits)
    best = min(
        max(fits[s].seconds(c) for s, c in zip(names, combo))
        for combo in itertools.product(range(1, cores + 1), repeat=len(names))
        if sum(combo) <= cores
    )
    return best


@pytest.mark.parametrize("cores", [3, 4, 8, 12])
def test_solve_is_the_min_max_allocation(cores):
    fits = {
        "sample": StageFit(a=0.8, d=0.0),  # scales linearly
        "gather": StageFit(a=0.2, d=0.05),  # memory bound: saturates
        "compute": StageFit(a=0.6, d=0.02),
    }
    alloc = solve(fits, cores)
    assert sum(alloc.threads.values()) <= cores
    assert alloc.bottleneck_s == pytest.approx(brute(fits, cores))
    assert alloc.describe().startswith("isolation: sample")
    assert json.dumps(alloc.as_dict())


def test_solve_edge_cases():
    fits = {"sample": StageFit(0.5, 0.0), "gather": StageFit(0.0, 0.1), "compute": StageFit(1, 0)}
    a = solve(fits, 8)
    assert a.threads["gather"] == 1  # does not scale: no cores wasted on it
    few = solve(fits, 2)  # fewer cores than stages: shared; the scalable compute gets both
    assert few.shared and few.threads == {"sample": 1, "gather": 1, "compute": 2}
    # objective: max(slowest stage, CPU-seconds per batch / cores) = max(0.5, (0.5+0.1+2*0.5)/2)
    assert few.bottleneck_s == pytest.approx(0.8) and not a.shared
    flat = solve({"s": StageFit(0.0, 0.2), "g": StageFit(0.0, 0.2), "c": StageFit(0.0, 0.2)}, 2)
    assert flat.threads == {"s": 1, "g": 1, "c": 1}  # nothing scales: no thread wasted
    gpu = solve({"sample": StageFit(0.5, 0.0)}, 4, fixed={"compute": 0.2})
    assert gpu.threads == {"sample": 3} and gpu.bottleneck_s == pytest.approx(0.2)


def test_profile_stages_calls_every_candidate():
    seen = []

    def stage(c):
        seen.append(c)
        return 1.0 / c

    fits = profile_stages({"s": stage}, [1, 2, 4])
    assert seen == [1, 2, 4] and fits["s"].a == pytest.approx(1.0)
    with pytest.raises(ValueError, match="gave"):
        profile_stages({"s": lambda c: float("nan")}, [1])


def test_cli_train_isolation_auto_records_the_allocation(tmp_path):
    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200, feat_dim=8)
    threads = torch.get_num_threads()
    out = tmp_path / "s.json"
    args = ["train", str(path), "--device", "cpu", "--epochs", "1", "--fanouts", "3,2"]
    args += ["--batch-size", "16", "--hidden", "8", "--quiet", "--summary", str(out)]
    assert main(args + ["--isolation", "auto"]) == 0
    s = json.loads(out.read_text())
    assert set(s["isolation"]) == {"sample", "gather", "compute"}
    assert all(isinstance(v, int) and v >= 1 for v in s["isolation"].values())
    assert s["isolation_profile"]["cores"] >= 1 and s["simulated"] is True
    assert torch.get_num_threads() == threads  # restored after the run
    assert main(args + ["--isolation", "off"]) == 0
    assert json.loads(out.read_text())["isolation"] is None


def test_core_sets_are_disjoint_blocks_or_none():
    from gnnio.pipeline.affinity import core_sets

    assert core_sets({"sample": 2, "gather": 1, "compute": 3}, list(range(8))) == {
        "sample": [0, 1], "gather": [2], "compute": [3, 4, 5]}  # fmt: skip
    assert core_sets({"sample": 1, "gather": 1, "compute": 1}, [0, 1]) is None  # would overlap


def test_isolation_auto_pins_every_stage_thread_to_its_cores(tmp_path, monkeypatch):
    """The allocation is applied, not only recorded: the training thread, the loader's sampling
    and gather threads each run on their stage's core set (8 cores pretended; the affinity calls
    recorded instead of made). Fails when `apply` computes the sets but does not activate them, or
    when a stage thread does not pin itself."""
    import os
    import threading

    from gnnio.pipeline import affinity
    from gnnio.train import TrainConfig, train
    from gnnio.train import isolate as iso_mod
    from tests.helpers import write_tiny_dataset

    calls = []
    cores = list(range(8))
    monkeypatch.setattr(affinity, "available_cores", lambda: cores)
    monkeypatch.setattr(iso_mod, "available_cores", lambda: cores)
    monkeypatch.setattr(
        os, "sched_setaffinity", lambda pid, cpus: calls.append((threading.current_thread().name, sorted(cpus)))
    )  # fmt: skip
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    path = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200, feat_dim=8)
    cfg = TrainConfig(device="cpu", epochs=1, fanouts=(3, 2), batch_size=16, hidden=8,
                      progress=False, isolation="auto")  # fmt: skip
    s = train(path, cfg)
    plan = s["isolation_profile"]["cores_by_stage"]
    assert plan is not None and sum(len(v) for v in plan.values()) <= 8
    assert {k: len(v) for k, v in plan.items() if k != "compute"} == {
        k: v for k, v in s["isolation"].items() if k != "compute"}  # fmt: skip
    by_thread = {}
    for name, cpus in calls:
        by_thread.setdefault(name, []).append(cpus)
    main = threading.current_thread().name
    assert by_thread[main][0] == plan["compute"]  # pinned when applied ...
    assert by_thread[main][-1] == cores  # ... and given all cores back at the end
    assert by_thread["gnnio-sample-0"][0] == plan["sample"]
    assert by_thread["gnnio-gather"][0] == plan["gather"]
    assert affinity.pinned() == {}  # deactivated after the run: later threads are not pinned


def test_isolation_auto_changes_times_only(tmp_path):
    """docs/design.md: '--isolation auto picks threads from timings, which changes times only'.
    Its profile of the model step (on a copy, with dropout) draws from torch's generator; the
    run's own draws must not move (they did: another loss history and accuracy)."""
    from gnnio.train import TrainConfig, train
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200, feat_dim=8)
    runs = {}
    for iso in ("off", "auto"):
        cfg = TrainConfig(device="cpu", epochs=2, fanouts=(3, 2), batch_size=16, hidden=8,
                          dropout=0.5, progress=False, isolation=iso)  # fmt: skip
        s = train(path, cfg)
        runs[iso] = (s["loss_history"], s["test_acc"], s["best_valid_acc"])
    assert runs["auto"] == runs["off"]


def test_fit_better_than_linear_is_linear_through_the_origin():
    """Times falling faster than ``1/c`` give ``d < 0`` in the free fit: the fit is then
    ``d = 0`` and ``a`` the least squares through the origin (hand example)."""
    f = fit_stage({1: 1.0, 2: 0.45, 4: 0.2})
    assert f.d == 0.0
    assert f.a == pytest.approx((1.0 + 0.5 * 0.45 + 0.25 * 0.2) / (1.0 + 0.25 + 0.0625))
    with pytest.raises(ValueError, match="gave -0.1"):
        profile_stages({"s": lambda c: -0.1}, [1])


def test_solve_where_nothing_needs_a_second_thread():
    """One stage on one core; stages that do not scale on enough cores (one thread each);
    fewer cores than stages under a larger GPU stage (the GPU's time is the bottleneck, and no
    thread is wasted); cores < 1 count as one."""
    one = solve({"s": StageFit(0.5, 0.0)}, 1)
    assert one.threads == {"s": 1} and one.bottleneck_s == pytest.approx(0.5)
    flat = solve({"s": StageFit(0.0, 0.2), "g": StageFit(0.0, 0.2)}, 4)
    assert flat.threads == {"s": 1, "g": 1} and not flat.shared
    fits = {"s": StageFit(0.2, 0.0), "g": StageFit(0.0, 0.1), "c": StageFit(0.2, 0.0)}
    gpu = solve(fits, 2, fixed={"gpu": 5.0})
    assert gpu.shared and gpu.bottleneck_s == pytest.approx(5.0)
    assert gpu.threads == {"s": 1, "g": 1, "c": 1}
    assert solve({"s": StageFit(0.5, 0.0)}, 0).cores == 1


def test_pin_applies_and_records_only_a_planned_stage(monkeypatch):
    import os
    import threading

    from gnnio.pipeline import affinity

    calls = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.append((pid, list(cpus))))
    affinity.activate({"gather": [3, 4]})
    try:
        assert affinity.pin_current_thread("sample") is False and calls == []
        assert affinity.pin_current_thread("gather") is True and calls == [(0, [3, 4])]
        assert affinity.pinned() == {threading.current_thread().name: ("gather", (3, 4))}
    finally:
        affinity.deactivate()
    assert affinity.pinned() == {} and affinity.pin_current_thread("gather") is False
    assert calls == [(0, [3, 4])]


def test_core_sets_give_every_stage_a_core_in_order():
    from gnnio.pipeline.affinity import core_sets

    got = core_sets({"io": 2, "gather": 1, "sample": 0}, [4, 5, 6, 7])
    assert got == {"sample": [4], "gather": [5], "io": [6, 7]}
    assert core_sets({"io": 3, "sample": 2}, [4, 5, 6, 7]) is None


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
    or not os.path.isdir("/proc/self/task"), reason="Linux, two cores")  # fmt: skip
def test_apply_pins_torch_intra_op_threads_that_profiling_started():
    """``compute``'s core set holds torch's intra-op threads too, not only the training thread:
    OpenMP's workers start during profiling (all cores), and a thread keeps the cores it had when
    the training thread is pinned later (they did: only the training thread moved). Real
    affinities, read back per thread; :func:`restore` gives them all their cores back."""
    import threading

    from gnnio.pipeline.isolation import Allocation
    from gnnio.train import isolate as iso_mod
    from gnnio.utils.torch_threads import set_torch_threads

    cores = sorted(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    set_torch_threads(2)
    torch.randn(1 << 22).exp_().sum()  # torch's OpenMP team starts: 2 threads, every core

    def native():
        python = {t.native_id for t in threading.enumerate()}
        return [int(t) for t in os.listdir("/proc/self/task") if int(t) not in python]

    assert native(), "torch's intra-op worker thread"
    threads1 = {"sample": 1, "compute": 1}  # CPU training: compute's threads set and pinned
    alloc = Allocation(threads=threads1, predicted_s={}, bottleneck_s=0.0, cores=2, fits={})
    undo = {"torch_threads": threads, "sampler": None, "gather": [], "affinity": cores}
    try:
        plan = iso_mod.apply(alloc, object(), [])
        assert plan == {"sample": cores[:1], "compute": cores[1:2]}
        torch.randn(1 << 22).exp_().sum()
        assert {t: os.sched_getaffinity(t) for t in native()} == dict.fromkeys(native(), {cores[1]})
        assert os.sched_getaffinity(0) == {cores[1]}
    finally:
        iso_mod.restore(undo, object(), None)
    assert all(os.sched_getaffinity(t) == set(cores) for t in [0, *native()])
    # on a GPU (compute fixed: torch's thread count not set) only the launching thread is pinned;
    # torch's team keeps every core rather than crowd compute's one
    set_torch_threads(2)
    torch.randn(1 << 22).exp_().sum()
    gpu = Allocation(threads={"sample": 1}, predicted_s={}, bottleneck_s=0.0, cores=2, fits={},
                     fixed={"compute": 0.01})  # fmt: skip
    try:
        assert iso_mod.apply(gpu, object(), []) == {"sample": cores[:1], "compute": cores[1:2]}
        assert os.sched_getaffinity(0) == {cores[1]}
        assert all(os.sched_getaffinity(t) == set(cores) for t in native())
    finally:
        iso_mod.restore(undo, object(), None)


def test_a_gpu_run_keeps_a_core_for_the_training_thread(monkeypatch):
    """On a GPU the model step is a constant in the objective (BGL's ``T_gpu``), yet the training
    thread that launches it gets ``compute``'s core. The CPU stages' min-max is solved over the
    cores left (brute force over the profile below: 7 of 8 cores to the sample stage), and the
    stages are pinned. It was solved over all 8 (sample 8), so the sets did not fit and nothing
    was pinned exactly when sampling binds. A knob-less gather keeps no core (not pinned)."""
    from gnnio.pipeline import affinity
    from gnnio.pipeline.isolation import solve
    from gnnio.train import isolate as iso_mod

    cores = list(range(8))
    monkeypatch.setattr(iso_mod, "available_cores", lambda: cores)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None)
    fits = {"sample": StageFit(a=0.8, d=0.0)}  # scales: the bottleneck on a fast GPU
    fixed = {"gather": 0.01, "compute": 0.02}
    alloc = iso_mod.solve_keeping_cores(fits, len(cores), fixed)
    brute = min(range(1, 8), key=lambda c: (max(0.02, fits["sample"].seconds(c)), c))
    assert alloc.threads == {"sample": brute} == {"sample": 7} and alloc.cores == 8
    try:
        plan = iso_mod.apply(alloc, object(), [])
    finally:
        affinity.deactivate()
    assert plan == {"sample": cores[:7], "compute": [7]} and alloc.cores_by_stage == plan
    # on the CPU (compute profiled, only gather fixed) nothing is kept: the plain solve
    cpu = {"sample": StageFit(0.8, 0.0), "compute": StageFit(0.4, 0.0)}
    got = iso_mod.solve_keeping_cores(cpu, 8, {"gather": 0.01})
    assert got.threads == solve(cpu, 8, {"gather": 0.01}).threads and sum(got.threads.values()) == 8
    # too few cores to keep one: solved over all of them, as before (and nothing pinned)
    two = {"sample": StageFit(0.8, 0.0), "gather": StageFit(0.1, 0.0)}
    few = iso_mod.solve_keeping_cores(two, 2, {"compute": 0.02})
    assert few.threads == solve(two, 2, {"compute": 0.02}).threads == {"sample": 1, "gather": 1}
    assert not few.shared
