"""Hostile input (issue 27, item 4): the failures a probe of 448 bad inputs found, each reproduced
here first. Every case ends with one ``gnnio: error:`` line and exit 2 (or works as documented),
never a traceback, a segfault, a hang or a damaged original."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import gnnio
from gnnio.cli.main import main
from tests.test_bad_input_prepare import hidden, one_line_error
from tests.test_importers import gap_layout, write_planetoid

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def gnnio_proc(*argv: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """``python -m gnnio ARGV`` in a child process (a crash there cannot take pytest with it)."""
    return subprocess.run([sys.executable, "-m", "gnnio", *argv], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=timeout, **kw)  # fmt: skip


def assert_one_line(proc: subprocess.CompletedProcess, *words: str, rc: int = 2) -> None:
    assert proc.returncode == rc, (proc.returncode, proc.stderr[-2000:])
    err = proc.stderr
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("gnnio: error: "), err
    for w in words:
        assert w in err, err


# ---- memory-unsafe reads of crafted Planetoid pickles -------------------------------------------


def _crafted_csr(edit) -> sp.csr_matrix:
    """The gap layout's ``x`` matrix with its arrays edited in place after construction, as a
    crafted pickle carries them (the unpickler sets them without SciPy's checks)."""
    parts, _, _ = gap_layout()
    m = parts["x"]
    m.indices = m.indices.astype(np.int64)
    edit(m)
    return m


def _planetoid_argv(root: Path) -> list[str]:
    return ["prepare", "planetoid", "--name", "g", "--root", str(root), "--quiet"]


def test_planetoid_out_of_range_csr_index_is_one_line_not_a_segfault(tmp_path):
    """indices[0] = 10**8 made ``toarray`` write far out of bounds (segfault) before the fix."""
    parts, _, _ = gap_layout()
    parts["x"] = _crafted_csr(lambda m: m.indices.__setitem__(0, 10**8))
    write_planetoid(tmp_path / "pl", "g", parts)
    proc = gnnio_proc(*_planetoid_argv(tmp_path / "pl"), "--out", str(tmp_path / "o"))
    assert_one_line(proc, "ind.g.x", "column index 100000000", "out of range [0, 4)")
    assert not (tmp_path / "o").exists()


def _set(attr, value):
    return lambda m: setattr(m, attr, value)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: m.indices.__setitem__(0, -1), ["column index -1"]),
        (lambda m: m.indptr.__setitem__(-1, 10**6), ["indptr ends at 1000000"]),
        (lambda m: m.indptr.__setitem__(1, 10**6), ["never decrease"]),
        (lambda m: m.indptr.__setitem__(0, -3), ["start at 0"]),
        (_set("indptr", np.array([0, 1], np.int32)), ["indptr has 2 entries for 2 rows"]),
        (_set("data", np.array(["a"] * 4, dtype=object)), ["numeric array", "object"]),
        (_set("indices", np.array([0.5] * 4)), ["integer arrays"]),
        (_set("_shape", (2, -4)), ["bad shape"]),
        (_set("_shape", (2, 10**12)), ["bad shape"]),
    ],
)
def test_planetoid_crafted_csr_refused(tmp_path, capsys, edit, words):
    parts, _, _ = gap_layout()
    parts["x"] = _crafted_csr(edit)
    write_planetoid(tmp_path / "pl", "g", parts)
    assert main([*_planetoid_argv(tmp_path / "pl"), "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "ind.g.x", *words)
    assert not (tmp_path / "o").exists() and hidden(tmp_path) == []


def test_planetoid_object_array_and_huge_node_id_refused(tmp_path, capsys):
    parts, _, _ = gap_layout()
    parts["ally"] = parts["ally"].astype(object)
    write_planetoid(tmp_path / "pl", "g", parts)
    assert main([*_planetoid_argv(tmp_path / "pl"), "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "ind.g.ally", "numeric array")
    parts, _, _ = gap_layout()
    parts["graph"][0] = [10**30]
    write_planetoid(tmp_path / "pl2", "g", parts)
    assert main([*_planetoid_argv(tmp_path / "pl2"), "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "ind.g.graph", "not an int node id")


def test_planetoid_valid_csr_still_imports(tmp_path):
    parts, allx, _ = gap_layout()
    write_planetoid(tmp_path / "pl", "g", parts)
    assert main([*_planetoid_argv(tmp_path / "pl"), "--out", str(tmp_path / "o")]) == 0
    np.testing.assert_array_equal(np.asarray(gnnio.load(tmp_path / "o").features[:5]), allx)


# ---- outputs never written through a symlink into a dataset; --log atomic ------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.helpers import write_tiny_dataset

    return write_tiny_dataset(tmp_path_factory.mktemp("ds") / "tiny", num_nodes=60, num_edges=300)


TRAIN = ["--epochs", "2", "--batch-size", "16", "--quiet"]


@pytest.mark.parametrize("option", ["--log", "--summary", "--checkpoint"])
def test_output_symlinked_into_a_dataset_refused(tiny, tmp_path, capsys, option):
    before = (tiny / "meta.json").read_bytes()
    (tmp_path / "out").symlink_to(tiny / "meta.json")
    (tmp_path / "dir").symlink_to(tiny, target_is_directory=True)
    assert main(["train", str(tiny), *TRAIN, option, str(tmp_path / "out")]) == 2
    one_line_error(capsys, option, "inside the dataset directory", "through a symlink")
    assert main(["train", str(tiny), *TRAIN, option, str(tmp_path / "dir" / "new.json")]) == 2
    one_line_error(capsys, option, "inside the dataset directory")
    assert (tiny / "meta.json").read_bytes() == before and not (tiny / "new.json").exists()
    assert (tmp_path / "out").is_symlink()


def test_checkpoint_dir_symlinked_into_a_dataset_refused(tiny, tmp_path, capsys):
    (tmp_path / "ck").symlink_to(tiny, target_is_directory=True)
    assert main(["train", str(tiny), *TRAIN, "--checkpoint-dir", str(tmp_path / "ck")]) == 2
    one_line_error(capsys, "--checkpoint-dir", "inside the dataset directory")


def test_log_keeps_old_content_until_an_epoch_is_complete(tiny, tmp_path, monkeypatch, capsys):
    """An interrupt before the first epoch ends leaves the old log whole; one in the second epoch
    leaves the first epoch's complete line (the log was opened "w" at start before the fix)."""
    import gnnio.train.loop as loop

    log = tmp_path / "l.jsonl"
    log.write_text('{"old": 1}\n')
    real, calls = loop._train_epoch, []

    def interrupted_at(k):
        def epoch(*a, **kw):
            calls.append(1)
            if len(calls) > k:
                raise KeyboardInterrupt
            return real(*a, **kw)

        return epoch

    monkeypatch.setattr(loop, "_train_epoch", interrupted_at(0))
    assert main(["train", str(tiny), *TRAIN, "--log", str(log)]) == 130
    assert log.read_text() == '{"old": 1}\n'
    calls.clear()
    monkeypatch.setattr(loop, "_train_epoch", interrupted_at(1))
    assert main(["train", str(tiny), *TRAIN, "--log", str(log)]) == 130
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["epoch"] == 0
    assert hidden(tmp_path) == []
    capsys.readouterr()


def _fsize_limit(nbytes: int):
    resource = pytest.importorskip("resource")
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


@pytest.mark.parametrize("option, limit", [("--log", 800), ("--checkpoint", 64 << 10)])
def test_file_size_limit_on_train_outputs_is_one_line(tiny, tmp_path, option, limit):
    out = tmp_path / "o" / "f"
    proc = gnnio_proc("train", str(tiny), *TRAIN, option, str(out), preexec_fn=_fsize_limit(limit))
    assert_one_line(proc, option, "cannot write it", "too large")
    left = sorted(p.name for p in (tmp_path / "o").iterdir())
    if option == "--log":  # the first epoch's line (about 570 bytes) fit, the second did not
        assert left == ["f"] and len(out.read_text().splitlines()) == 1
    else:
        assert left == []


# ---- leftovers of killed writers ----------------------------------------------------------------


def test_temporary_dataset_dir_with_meta_never_opens(tiny, tmp_path, capsys):
    """A writer killed right after its meta.json leaves a complete-looking temporary directory;
    ``gnnio info`` opened it as a dataset before (docs/format.md says it cannot)."""
    import shutil

    tmp = tmp_path / ".tiny.tmp-12345-0a1b2c3d"
    shutil.copytree(tiny, tmp)
    assert main(["info", str(tmp)]) == 2
    one_line_error(capsys, "temporary directory of an interrupted write")
    with pytest.raises(gnnio.errors.DatasetError, match="temporary directory"):
        gnnio.load(tmp)
    shutil.copytree(tiny, tmp_path / ".tiny.old-12345-0a1b2c3d")  # the previous dataset: opens
    assert main(["info", str(tmp_path / ".tiny.old-12345-0a1b2c3d")]) == 0
    capsys.readouterr()


def test_partition_temporaries_carry_the_pid_and_stale_ones_go(tiny, tmp_path, caplog):
    from tests.test_bad_input_prepare import dead_pid

    stale = tmp_path / f".p.tmp-{dead_pid()}-0a1b2c3d"
    live = tmp_path / f".p.tmp-{os.getpid()}-0a1b2c3d"
    for d in (stale, live):
        d.mkdir()
        (d / "parts.npy").write_bytes(b"cut short")
    argv = ["partition", str(tiny), "--parts", "2", "--method", "random", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "p")]) == 0
    assert not stale.exists() and live.exists() and (tmp_path / "p" / "meta.json").is_file()
    assert "removed 1 stale temporary" in caplog.text


def test_file_size_limit_during_partition_is_one_line(tmp_path):
    from tests.helpers import write_tiny_dataset

    ds = write_tiny_dataset(tmp_path / "ds", num_nodes=400, num_edges=20000)
    out = tmp_path / "o" / "p"
    out.parent.mkdir()
    proc = gnnio_proc("partition", str(ds), "--parts", "2", "--method", "random", "--quiet",
                      "--out", str(out), preexec_fn=_fsize_limit(8 << 10))  # fmt: skip
    assert_one_line(proc, str(out), "no room to write")
    assert os.listdir(out.parent) == []


# ---- argparse errors: one line for every subcommand ---------------------------------------------


def _leaf_commands():
    import argparse

    from gnnio.cli.main import build_parser

    out = []

    def walk(p, prefix):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append(prefix)
        for a in subs:
            for name, sp_ in a.choices.items():
                walk(sp_, (*prefix, name))

    walk(build_parser(), ())
    return out


@pytest.mark.parametrize(
    "argv, words",
    [
        ("train D --threads 0", "argument --threads: must be >= 1, got 0"),
        ("train D --seed -1", "argument --seed: must be >= 0, got -1"),
        ("train D --po-sequences 0", "argument --po-sequences: must be >= 1"),
        ("reorder D --by bogus --out X", "argument --by: invalid choice: 'bogus'"),
        ("bench sampling D --threads 0", "see 'gnnio bench sampling --help'"),
        ("train D --epochs x", "argument --epochs: invalid int value: 'x'"),
        ("", "the following arguments are required: COMMAND"),
        ("frobnicate", "invalid choice: 'frobnicate'"),
    ],
)
def test_argparse_errors_are_one_line(argv, words, capsys):
    assert main(argv.split()) == 2
    one_line_error(capsys, words)


def test_every_subcommand_argparse_error_is_one_line(capsys):
    """Before: argparse's usage block (29 lines for train) and SystemExit from ``main``."""
    leaves = _leaf_commands()
    assert len(leaves) > 10
    for cmd in leaves:
        assert main([*cmd, "--no-such-option"]) == 2, cmd
        err = one_line_error(capsys, "--help'")  # required arguments first, or the unknown one
        assert "usage:" not in err
        assert main([*cmd, "--threads"]) == 2, cmd  # an option without its value, or unknown
        one_line_error(capsys, "--help'")


def test_output_temporaries_of_killed_writers_removed(tmp_path):
    from gnnio.utils.outputs import write_atomic
    from tests.test_bad_input_prepare import dead_pid

    stale = tmp_path / f".s.json.tmp-{dead_pid()}-0a1b2c3d"
    live = tmp_path / f".s.json.tmp-{os.getpid()}-0a1b2c3d"
    other = tmp_path / f".t.json.tmp-{dead_pid()}-0a1b2c3d"  # another target's: left alone
    for f in (stale, live, other):
        f.write_text("cut")
    write_atomic(tmp_path / "s.json", lambda f: f.write(b"{}"), "--summary")
    assert not stale.exists() and live.exists() and other.exists()
    assert (tmp_path / "s.json").read_text() == "{}"


# ---- partition shards: checked before the samplers' kernels index with them ---------------------


def _shard_edit(name, edit):
    def apply(p):
        a = np.load(p / "part0" / f"{name}.npy")
        a = edit(a)
        np.save(p / "part0" / f"{name}.npy", a)

    return apply


@pytest.mark.parametrize(
    "damage, words",
    [
        (_shard_edit("indices", lambda a: np.where(np.arange(a.size) == 0, 10**8, a)),
         "indices.npy: node ids outside [0, 60)"),
        (_shard_edit("indices", lambda a: -a - 1), "indices.npy: node ids outside"),
        (_shard_edit("indptr", lambda a: a * 3), "indptr.npy"),
        (_shard_edit("indptr", lambda a: a[::-1].copy()), "indptr.npy: not a CSR row pointer"),
        (_shard_edit("nodes", lambda a: a[::-1].copy()), "nodes.npy: not the nodes"),
        (_shard_edit("indices", lambda a: a.astype(np.float64)), "1-D integer arrays"),
    ],
)  # fmt: skip
def test_crafted_partition_shard_refused(tiny, tmp_path, capsys, damage, words):
    """A shard's indices/indptr were never checked: the sharded sampler's compiled kernels read
    with them (found next to the Planetoid case, issue 27)."""
    argv = ["partition", str(tiny), "--parts", "2", "--method", "random", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "p")]) == 0
    damage(tmp_path / "p")
    assert main(["train", str(tiny), "--nproc", "2", "--partition", str(tmp_path / "p"),
                 "--epochs", "1", "--quiet"]) == 2  # fmt: skip
    one_line_error(capsys, words)


def test_partition_never_replaces_or_writes_into_a_dataset(tiny, tmp_path, capsys):
    """``partition D --out D --overwrite`` replaced the dataset by the partition before (its
    meta.json passed for a partition's)."""
    import shutil

    d = tmp_path / "d"
    shutil.copytree(tiny, d)
    (tmp_path / "link").symlink_to(d, target_is_directory=True)
    (tmp_path / "notp").mkdir()
    (tmp_path / "notp" / "meta.json").write_text('{"format": "something-else"}')
    argv = ["partition", str(d), "--parts", "2", "--method", "random", "--quiet", "--overwrite"]
    for out, words in ((d, "dataset directory"), (d / "p", "dataset directory"),
                       (tmp_path / "link" / "p", "dataset directory"),
                       (tmp_path / "notp", "not a gnnio partition")):  # fmt: skip
        assert main([*argv, "--out", str(out)]) == 2
        one_line_error(capsys, words)
    assert gnnio.load(d).num_nodes == 60 and not (d / "p").exists()
