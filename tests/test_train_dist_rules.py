"""``gnnio train --nproc N``'s own rules (mutation pass over ``gnnio/cli/train_dist.py``): what is
refused before any rank starts (a partition, ``--resume`` or ``--checkpoint-dir`` that no rank
could use: one line at once, not N processes started to say it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnio.cli.main import main
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
