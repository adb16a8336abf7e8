"""BGL's profiling-based resource isolation: fit, min-max solve, and ``gnnio train --isolation``."""

from __future__ import annotations

import itertools
import json

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
