"""``gnnio train --nproc N``'s own rules (mutation pass over ``gnnio/cli/train_dist.py``): what is
refused before any rank starts (a partition, ``--resume`` or ``--checkpoint-dir`` that no rank
could use: one line at once, not N processes started to say it); what one rank does with the
group's options (its share of the cores, progress bars and the summary on rank 0 only); and one
small real two-rank run on gloo that shows it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gnnio.cli.main import main
from gnnio.train import TrainConfig
from tests.helpers import write_tiny_dataset

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("d") / "tiny", num_nodes=60, num_edges=300)


@pytest.fixture(scope="module")
def part3(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "p3"
    assert main(["partition", str(tiny), "--parts", "3", "--method", "random", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    return out


def _names(d: Path, *names: str) -> Path:
    """A directory holding files under checkpoint names (the launcher reads names only)."""
    d.mkdir()
    for n in names:
        (d / n).write_bytes(b"")
    return d


E1 = "ckpt-e000001-b000000000"


@pytest.fixture
def launched(monkeypatch):
    """Calls of the launcher (none are made: a refusal must come before any process starts)."""
    calls = []
    monkeypatch.setattr("gnnio.distributed.launch.launch",
                        lambda n, entry, argv, timeout_s=None: calls.append((n, argv)))  # fmt: skip
    return calls


def _train(tiny, *extra) -> list[str]:
    return ["train", str(tiny), "--nproc", "2", "--epochs", "2", "--quiet", *map(str, extra)]


@pytest.mark.parametrize(
    "setup, words",
    [
        (lambda t, p: ["--partition", p], "has 3 parts, the run has 2 ranks"),
        (lambda t, p: ["--resume", _names(t / "r3", *(f"{E1}-r{r}of3.pt" for r in range(3)))],
         "written by 3 ranks, this run has 2 ranks; resume with --nproc 3"),
        (lambda t, p: ["--resume", _names(t / "r1", f"{E1}.pt")],
         "written by one process, this run has 2 ranks; resume with --nproc 1"),
        (lambda t, p: ["--checkpoint-dir", _names(t / "c", f"{E1}-r0of2.pt", f"{E1}-r1of2.pt")],
         "already holds checkpoints of another run"),
        (lambda t, p: ["--resume", t / "missing"], "no such checkpoint directory"),
        (lambda t, p: ["--resume", _names(t / "empty")], "no complete checkpoint in it"),
        (lambda t, p: ["--resume", _names(t / "half", f"{E1}-r0of2.pt")],
         "no checkpoint position that all 2 ranks hold"),
    ],
    ids=["partition-of-3", "resume-of-3-ranks", "resume-of-1-process", "checkpoint-dir-taken",
         "resume-missing", "resume-empty", "resume-rank-1-has-none"],
)  # fmt: skip
def test_refused_in_one_line_before_any_rank_starts(tiny, part3, tmp_path, capsys, launched,
                                                    setup, words):  # fmt: skip
    """Each of these was refused only by the ranks (each rank started, loaded the dataset and
    failed: "rank 0 (pid ...) failed: UsageError: ..."), or refused with the wrong counts."""
    from tests.test_bad_input_prepare import one_line_error

    assert main(_train(tiny, *setup(tmp_path, str(part3)))) == 2
    one_line_error(capsys, words)
    assert launched == []


def test_a_directory_this_world_size_can_resume_is_launched(tiny, tmp_path, launched):
    """Two ranks' checkpoints resume with ``--nproc 2``, also with ``--checkpoint-dir`` naming
    the same directory (it continues them: not another run's)."""
    c = _names(tmp_path / "c", f"{E1}-r0of2.pt", f"{E1}-r1of2.pt")
    assert main(_train(tiny, "--resume", c)) == 0
    assert main(_train(tiny, "--resume", c, "--checkpoint-dir", c)) == 0
    assert [n for n, _ in launched] == [2, 2]
    assert launched[1][1][-4:] == ["--resume", str(c), "--checkpoint-dir", str(c)]


# ----------------------------------------------------------------------------------------------
# one rank: train_rank with a stand-in process group


@pytest.fixture
def rank(monkeypatch):
    """``train_rank`` with the group, the run and ``train`` replaced: returns a function that
    runs rank ``r`` of a world with ``cores`` cores and the given environment, and what it saw."""
    import gnnio.distributed.context as context
    import gnnio.distributed.train as dtrain
    import gnnio.train as gtrain
    from gnnio.cli.train_dist import train_rank

    def go(r: int, cfg: TrainConfig, cores: int = 8, **env):
        seen: dict = {"calls": []}
        ctx = SimpleNamespace(is_main=r == 0, barrier=lambda: seen["calls"].append("barrier"))

        def init(**kw):
            seen["init"] = kw
            return ctx

        def train(dataset, c, run=None):
            seen["calls"].append("train")
            seen["threads"], seen["progress"] = c.threads, c.progress
            return {"summary of rank": r}

        monkeypatch.setattr(context, "init", init)
        monkeypatch.setattr(context, "shutdown", lambda: seen["calls"].append("shutdown"))
        monkeypatch.setattr(dtrain, "DistRun", lambda c: c)
        monkeypatch.setattr(gtrain, "train", train)
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        for k in ("LOCAL_WORLD_SIZE", "WORLD_SIZE", "NUMBA_NUM_THREADS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        seen["returned"] = train_rank("DIR", cfg)
        return seen

    return go


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"nproc": 2, "progress": True, **kw})


def test_a_rank_joins_with_the_groups_options_and_only_rank_0_reports(rank):
    cfg = _cfg(topology="1*2", dist_timeout=9.0)
    s0, s1 = rank(0, cfg), rank(1, _cfg(topology="1*2", dist_timeout=9.0))
    for s in (s0, s1):
        assert s["init"] == {"timeout_s": 9.0, "device": "cpu", "topology": "1*2"}
        # every rank has trained before any leaves the group
        assert s["calls"] == ["train", "barrier", "shutdown"]
    assert (s0["progress"], s0["returned"]) == (True, {"summary of rank": 0})
    assert (s1["progress"], s1["returned"]) == (False, None)  # one set of bars, one summary
    assert rank(0, _cfg(progress=False))["progress"] is False


@pytest.mark.parametrize(
    "cores, env, threads, want",
    [
        (8, {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}, None, 4),  # this machine's ranks
        (8, {}, None, 8),  # (a launcher that does not say: one local rank)
        (8, {"LOCAL_WORLD_SIZE": "2", "NUMBA_NUM_THREADS": "3"}, None, 3),  # the user's count
        (1, {"LOCAL_WORLD_SIZE": "4"}, None, 1),  # at least one
        (8, {"LOCAL_WORLD_SIZE": "2"}, 5, 5),  # --threads given
    ],
)  # fmt: skip
def test_a_rank_takes_its_share_of_this_machines_cores(rank, cores, env, threads, want):
    assert rank(1, _cfg(threads=threads), cores=cores, **env)["threads"] == want


def test_two_ranks_show_one_set_of_bars_and_one_summary(tiny, tmp_path):
    """A real ``--nproc 2`` run (gloo, 60 nodes, 1 epoch) without ``--quiet``: rank 0 alone
    draws the progress bars and prints the summary; ``--topology`` reaches the group; each rank
    takes half the cores."""
    s_path = tmp_path / "s.json"
    cmd = [sys.executable, "-m", "gnnio", "train", str(tiny), "--nproc", "2", "--epochs", "1",
           "--batch-size", "16", "--hidden", "8", "--fanouts", "3,3", "--topology", "1*2",
           "--summary", str(s_path), "--dist-timeout", "60"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_NUM_THREADS", "GNNIO_FAULT")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("test acc") == 1, r.stdout
    assert len(re.findall(r"epoch 0: +0%", r.stderr)) == 1, r.stderr[-3000:]  # one bar drawn
    s = json.loads(s_path.read_text())
    assert s["world_size"] == 2 and s["topology"] == "1*2"
    assert s["config"]["threads"] == max(1, (os.cpu_count() or 1) // 2)


# ----------------------------------------------------------------------------------------------
# the launcher (gnnio.distributed.launch)


@pytest.mark.parametrize("timeout_s, want", [(7.0, 7), (None, 120)])
def test_the_launchers_rendezvous_waits_dist_timeout(monkeypatch, timeout_s, want):
    """``--dist-timeout`` bounds the launcher's rendezvous too (a rank that never joins ends the
    run after it), 120 s by default."""
    import torch.distributed.launcher.api as api

    from gnnio.distributed import launch

    seen = {}

    def fake_launch(config, entry):
        seen.update(config.rdzv_configs)
        return lambda entry, argv: {0: 0, 1: 0}

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    launch.launch(2, print, ["train"], timeout_s=timeout_s)
    assert seen == {"timeout": want, "join_timeout": want}


def test_the_failure_line_names_the_other_failed_ranks_too():
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from gnnio.distributed.launch import failure_line

    def failure(rank, code, msg):
        f = ProcessFailure(local_rank=rank, pid=10 + rank, exitcode=code, error_file="<N/A>")
        f.message, f.timestamp = msg, 1
        return f

    lost = {"message": "RuntimeError: Connection closed by peer"}
    err = SimpleNamespace(failures={0: failure(0, 1, lost), 1: failure(1, -9, "Signal 9"),
                                    3: failure(3, 1, lost)})  # fmt: skip
    line = failure_line(err)
    assert line.startswith("rank 1 (pid 11) was killed by SIGKILL")
    assert line.endswith("; stopped rank(s) 0, 3 too")
