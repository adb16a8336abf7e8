"""``gnnio bench KIND ... --json``: stdout is exactly one JSON document (nothing printed before
it), for every benchmark kind that runs in one process in a few seconds on a tiny dataset."""

from __future__ import annotations

import json

import pytest

from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset

#: kind -> arguments that keep its run short (DIR: the tiny dataset); not here: dist and
#: dist-sampling, which start several processes
CHEAP = {
    "reorder": "--num-nodes 1000 --avg-degree 4 --impls numpy --passes 1 --warmup 0",
    "placement": "--num-nodes 1000 --strategies alg1,mod --passes 1 --no-progress",
    "sampling": "DIR --fanouts 3,3 --batch-size 16 --passes 1 --warmup 0",
    "gather": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --passes 1 --warmup 0 "
    "--ceiling-gib 0.001",
    "loader": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --passes 1 --warmup 0",
    "hotness": "DIR --fanouts 3,3 --batch-size 16 --scores degree --fractions 0.1 --quiet",
    "tiers": "DIR --fanouts 3,3 --batch-size 16 --scores degree --fractions 0.1 --max-batches 2 "
    "--quiet",
    "cache": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --policies lru --orders random "
    "--sizes 0.1 --warmup 0",
    "locality": "DIR --fanouts 3,3 --batch-size 16 --scales 1,2 --gpu-cache-fraction 0.1 "
    "--no-progress",
    "disk": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --sizes 0.1 --policies lru "
    "--random-reads 8 --seq-mib 1 --repeats 1 --no-progress",
    "step": "DIR --fanouts 3,3 --batch-size 16 --hidden 8 --batches 2 --quiet",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_tiny_dataset(tmp_path_factory.mktemp("bj") / "ds", 200, 1200))


@pytest.mark.parametrize("kind", sorted(CHEAP))
def test_json_stdout_is_one_document(kind, tiny, capfd):
    argv = [tiny if a == "DIR" else a for a in CHEAP[kind].split()]
    assert main(["bench", kind, *argv, "--json"]) == 0
    out = capfd.readouterr().out
    assert isinstance(json.loads(out), dict), out[:400]  # the whole of stdout, nothing before


def test_bench_step_says_where_its_wall_time_went(tiny, capfd):
    """``phases_s``: the run's parts in order, each timed once (a one-shot GPU session reads which
    part of a short benchmark process its budget paid for)."""
    argv = [tiny if a == "DIR" else a for a in CHEAP["step"].split()]
    assert main(["bench", "step", *argv, "--json"]) == 0
    phases = json.loads(capfd.readouterr().out)["phases_s"]
    parts = [p for p in phases if p != "start"]
    assert parts == ["load", "build", "rates", "pipelined", "sequential"]  # no GPU: no gpu passes
    assert all(v >= 0 for v in phases.values())
    assert phases["start"] > 0  # (Linux: the process's age from /proc when the run began)


@pytest.mark.parametrize("kind", ["loader", "sampling"])
def test_bench_device_auto_is_taken_as_train_takes_it(kind, tiny, capfd):
    """``--device auto`` (as ``gnnio train``'s and ``bench step``'s): CUDA when present, else the
    CPU; the JSON names the device it resolved to."""
    import torch

    argv = [tiny if a == "DIR" else a for a in CHEAP[kind].split()]
    assert main(["bench", kind, *argv, "--device", "auto", "--json"]) == 0
    got = json.loads(capfd.readouterr().out)["device"]
    assert got == ("cuda" if torch.cuda.is_available() else "cpu")


def test_bench_sampling_auto_picks_cuda_when_present_for_every_sampler(monkeypatch):
    from gnnio.bench.sampling import _check
    from gnnio.cli.main import build_parser
    from tests.fake_cuda import fake_cuda

    fake_cuda(monkeypatch, count=1)
    for sampler, want in (("uniform", "cuda"), ("labor", "cuda"), ("ladies", "cuda")):
        args = build_parser().parse_args(
            ["bench", "sampling", "d", "--sampler", sampler, "--device", "auto"]
        )
        _check(args)
        assert args.device == want, sampler


def test_bench_gathers_defaults_fit_in_a_quarter_of_the_memory(tiny, monkeypatch, capsys):
    """Without --ceiling-gib and --evict-mib, the ceiling's buffer (1 GiB or 4x the last-level
    cache) and the eviction buffer (2x the cache) shrink to a quarter of the memory available:
    no error about an option the user did not give. 64 MiB free and a 1 GiB cache here."""
    import gnnio.bench.gather as gather

    monkeypatch.setattr(gather, "available_ram", lambda: 1 << 26)
    monkeypatch.setattr(gather, "llc_bytes", lambda: 1 << 30)
    args = "--fanouts 3,3 --batch-size 16 --batches 2 --passes 1 --warmup 0 --no-progress"
    assert main(["bench", "gather", tiny, *args.split(), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ceiling_gib"] == 1 / 64 and r["evict_mib"] == 16.0
    # a given --evict-mib above the quarter is refused
    assert main(["bench", "gather", tiny, *args.split(), "--evict-mib", "17"]) == 2
    assert "--evict-mib must be >= 0 and at most a quarter" in capsys.readouterr().err
