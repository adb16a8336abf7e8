"""The default ``--memory-budget`` of prepare, reorder, partition and plan (issue 25: "the default
is a fraction of the available RAM"): the chunked paths run within half the available RAM unless
the user names a budget or ``none``; the in-memory methods (METIS, bfs-block, ``--refine``) keep
working without one."""

from __future__ import annotations

import json

import pytest

from gnnio.cli.main import main
from gnnio.preprocess import chunked
from gnnio.preprocess.chunked import resolve_budget


def test_resolve_budget(monkeypatch):
    monkeypatch.setattr(chunked, "default_budget", lambda: 12345678)
    assert resolve_budget(None) == 12345678
    assert resolve_budget(None, default_applies=False) is None
    assert resolve_budget("none") is None and resolve_budget(" NONE ", False) is None
    assert resolve_budget("2MiB") == 2 << 20 and resolve_budget("2MiB", False) == 2 << 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("b") / "d"
    rc = main(["prepare", "synthetic", "--num-nodes", "3000", "--avg-degree", "6", "--feat-dim",
               "8", "--num-classes", "3", "--seed", "1", "--out", str(out), "--no-progress"])  # fmt: skip
    assert rc == 0  # (--no-progress: --quiet's other name, as in plan and the benches)
    return out


def test_reorder_runs_within_the_default_budget(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(chunked, "default_budget", lambda: 64 << 20)
    assert main(["reorder", str(tiny), "--by", "degree", "--out", str(tmp_path / "r"),
                 "--json", "--quiet"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["memory_budget"] == 64 << 20
    assert main(["reorder", str(tiny), "--by", "degree", "--out", str(tmp_path / "n"),
                 "--memory-budget", "none", "--json", "--quiet"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["memory_budget"] is None
    for name in ("indptr.npy", "indices.npy", "features.npy", "labels.npy"):
        assert (tmp_path / "r" / name).read_bytes() == (tmp_path / "n" / name).read_bytes()


@pytest.mark.parametrize(
    "args", [["--method", "bfs-block"], ["--method", "random", "--refine", "1"]]
)
def test_in_memory_partitions_need_no_budget(tiny, tmp_path, monkeypatch, capsys, args):
    """A default budget far too small for the in-memory methods does not refuse them; a chunked
    method under it is refused with one line (so the default does apply to it)."""
    monkeypatch.setattr(chunked, "default_budget", lambda: 1024)
    assert main(["partition", str(tiny), "--parts", "2", *args, "--out", str(tmp_path / "p"),
                 "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    rc = main(["partition", str(tiny), "--parts", "2", "--method", "random",
               "--out", str(tmp_path / "q"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert (
        rc == 2
        and err.startswith("gnnio: error: --memory-budget: 1,024 bytes")
        and not (tmp_path / "q").exists()
    )
