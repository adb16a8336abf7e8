"""Bad input on the write side (issue 16, items 1, 3, 4, 5, 8 and the output paths of item 7):
``prepare``, ``reorder`` and ``plan --save`` end with one error line and a non-zero exit, or work,
and never leave a partial output behind."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

import gnnio
from gnnio.cli.main import main
from gnnio.errors import DatasetError
from gnnio.graph import DatasetWriter
from tests.helpers import write_tiny_dataset
from tests.test_importers import gap_layout, write_planetoid

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SYN = ["prepare", "synthetic", "--num-nodes", "400", "--avg-degree", "4", "--feat-dim", "4",
       "--num-classes", "3", "--quiet"]  # fmt: skip
Usage = namedtuple("Usage", "total used free")


def one_line_error(capsys, *words: str) -> str:
    """The run's stderr is exactly one ``gnnio: error:`` line containing every word."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("gnnio: error: "), err
    for w in words:
        assert w in err, err
    return err


def hidden(parent: Path) -> list[str]:
    """Hidden entries (temporaries, lock files) in ``parent``."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def npy_files(tmp_path: Path, n: int = 30, feats=None, labels=None, train=None) -> list[str]:
    """``prepare npy`` arguments for a small random graph (edges, features, labels, train ids)."""
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((n, 4)).astype(np.float32) if feats is None else feats
    np.save(tmp_path / "x.npy", feats)
    np.save(tmp_path / "e.npy", rng.integers(0, n, (2, 4 * n)))
    argv = ["prepare", "npy", "--features", str(tmp_path / "x.npy"),
            "--edges", str(tmp_path / "e.npy"), "--quiet"]  # fmt: skip
    if labels is not None:
        np.save(tmp_path / "y.npy", labels)
        argv += ["--labels", str(tmp_path / "y.npy")]
    if train is not None:
        np.save(tmp_path / "t.npy", np.asarray(train, dtype=np.int64))
        argv += ["--train-idx", str(tmp_path / "t.npy")]
    return argv


# ---- 1: non-finite features, no labeled training node ------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_features_refused_unless_allowed(tmp_path, capsys, bad):
    feats = np.random.default_rng(1).standard_normal((30, 4)).astype(np.float32)
    feats[3, 2] = feats[17, 0] = bad
    argv = npy_files(tmp_path, feats=feats)
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    one_line_error(capsys, "2 NaN or infinite values", "--allow-nonfinite")
    assert not out.exists() and hidden(tmp_path) == []
    assert main([*argv, "--out", str(out), "--allow-nonfinite"]) == 0
    ds = gnnio.load(out, verify=True)
    assert ds.meta["nonfinite_features"] == 2
    # reordering a dataset that was accepted with them keeps them (and the count)
    assert (
        main(["reorder", str(out), "--by", "degree", "--out", str(tmp_path / "r"), "--quiet"]) == 0
    )
    assert gnnio.load(tmp_path / "r").meta["nonfinite_features"] == 2


def test_nonfinite_refused_by_every_importer(tmp_path):
    """The check lives in the shared writer: a library caller (here the PyG importer, and the
    writer itself) gets the same refusal."""
    torch = pytest.importorskip("torch")
    from gnnio.importers.pyg import from_pyg

    data = namedtuple("Data", "x edge_index")(
        torch.tensor([[0.0, float("nan")], [1.0, 2.0]]), torch.tensor([[0, 1], [1, 0]])
    )
    with pytest.raises(DatasetError, match="1 NaN or infinite"):
        from_pyg(data, tmp_path / "p", progress=False)
    assert from_pyg(data, tmp_path / "p", progress=False, allow_nonfinite=True).is_dir()
    with pytest.raises(DatasetError, match="NaN or infinite"):
        with DatasetWriter(tmp_path / "w", name="w") as w:
            w.save_array("indptr", np.array([0, 0], np.int64))
            w.save_array("indices", np.zeros(0, np.int32))
            w.save_array("features", np.array([[np.inf]], np.float16))
    assert hidden(tmp_path) == [] and not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "labels, train, why",
    [
        (np.full(30, -1), [0, 1, 2], "none of its 3 nodes has one"),
        (np.arange(30) % 3, [], "it is empty"),
    ],
)
def test_no_labeled_training_node(tmp_path, capsys, labels, train, why):
    argv = npy_files(tmp_path, labels=labels, train=train)
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "no labeled training node", why)
    assert hidden(tmp_path) == [] and not (tmp_path / "o").exists()


def test_facebook_empty_train_split_refused(tmp_path, capsys):
    root = write_facebook(tmp_path / "fb", [[0, 1], [2], [1, 3]])
    argv = ["prepare", "facebook", "--root", str(root), "--split", "0,0.5", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "no labeled training node", "it is empty")


# ---- 3: full disk -------------------------------------------------------------------------------


def small_disk(monkeypatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, (1 << 40) - free, free))


def test_prepare_and_reorder_check_free_space_first(tmp_path, capsys, monkeypatch):
    ds = write_tiny_dataset(tmp_path / "ds", num_nodes=200, num_edges=800, feat_dim=64)
    small_disk(monkeypatch, 20 << 10)
    assert main([*SYN, "--out", str(tmp_path / "s")]) == 2
    one_line_error(capsys, "the output needs about", "only 20 KiB is free")
    assert (
        main(["reorder", str(ds), "--by", "degree", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    )
    one_line_error(capsys, "the output needs about", "only 20 KiB is free")
    assert main([*SYN, "--out", str(tmp_path / "p"), "--reorder", "degree"]) == 2
    err = one_line_error(capsys, "the output needs about")
    assert ".prepare-" not in err  # names the user's DIR, not the temporary import
    assert hidden(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["ds"]


@pytest.mark.parametrize("where", ["fallocate", "save"])
def test_enospc_while_writing_is_one_line(tmp_path, capsys, monkeypatch, where):
    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "fallocate":  # the memory-mapped features (once a SIGBUS, now reserved first)
        monkeypatch.setattr(os, "posix_fallocate", no_space)
    else:  # an array written with np.save
        real = np.save
        monkeypatch.setattr(
            np, "save", lambda f, a, **k: no_space() if "labels" in str(f) else real(f, a, **k)
        )
    assert main([*SYN, "--out", str(tmp_path / "s")]) == 2
    one_line_error(
        capsys, "no room to write", "No space left on device", "partial output was removed"
    )
    assert sorted(os.listdir(tmp_path)) == []


def test_file_size_limit_in_a_real_process(tmp_path):
    """A real failed write (RLIMIT_FSIZE: the kernel refuses to grow a file past 64 KiB, EFBIG)
    in a separate process: one line, exit 2, nothing left."""
    resource = pytest.importorskip("resource")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    argv = [sys.executable, "-m", "gnnio", *SYN[:-1], "--num-nodes", "20000", "--feat-dim", "16"]
    r = subprocess.run([*argv, "--out", str(tmp_path / "s"), "--quiet"], env=ENV, cwd=tmp_path,
                       preexec_fn=limit, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "no room to write" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 2 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                       capture_output=True, timeout=30)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def test_really_full_disk_no_bus_error(tiny_tmpfs):
    """Without preallocation the memory-mapped features fault (SIGBUS, rc 135) when the tmpfs
    fills; the size estimate is bypassed here (library call without ``size_hint``)."""
    code = textwrap.dedent(f"""
        import numpy as np
        from gnnio.graph import DatasetWriter
        with DatasetWriter({str(tiny_tmpfs / "x")!r}, name="x") as w:
            w.save_array("indptr", np.zeros(5, np.int64))
            w.save_array("indices", np.zeros(0, np.int32))
            f = w.create_array("features", (4, 1 << 20), np.float32)
            f[:] = 1.0
    """)
    r = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 1 and "DatasetError" in r.stderr, (r.returncode, r.stderr)
    assert "no room to write features.npy" in r.stderr and "16 MiB needed" in r.stderr
    assert os.listdir(tiny_tmpfs) == []
    assert (
        main([*SYN, "--feat-dim", "64", "--num-nodes", "20000", "--out", str(tiny_tmpfs / "s")])
        == 2
    )


# ---- 4: concurrent writers ----------------------------------------------------------------------


def test_claimed_target_is_refused_with_the_holder(tmp_path, capsys):
    out = tmp_path / "s"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from gnnio.graph.output_dir import claim\n"
         f"with claim({str(out)!r}):\n    print('held', flush=True); sys.stdin.read()"],
        env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([*SYN, "--out", str(out)]) == 2
        one_line_error(capsys, f"another gnnio run (pid {holder.pid}) is writing it")
        assert main([*SYN, "--out", str(out), "--reorder", "degree"]) == 2
        one_line_error(capsys, "another gnnio run")
        assert not out.exists()
    finally:
        holder.communicate("", timeout=30)
    assert hidden(tmp_path) == []  # the holder removed its lock file
    assert main([*SYN, "--out", str(out)]) == 0


def test_two_prepare_processes_one_wins(tmp_path):
    """Two ``prepare`` runs to the same new directory, started together (both past their imports,
    then released at once): exactly one writes it and prints "wrote"; the other ends with one
    line (claimed, or already there if it came second)."""
    go = tmp_path / "go"
    code = textwrap.dedent(f"""
        import os, sys, time
        from gnnio.cli.main import main
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        sys.exit(main(sys.argv[1:]))
    """)
    argv = [*SYN[:-1], "--num-nodes", "3000", "--feat-dim", "8", "--out", str(tmp_path / "s")]
    procs = [
        subprocess.Popen([sys.executable, "-c", code, *argv, "--seed", str(s)], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for s in (1, 2)
    ]  # fmt: skip
    time.sleep(3)  # imports
    go.touch()
    res = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    assert sorted(rc for rc, _, _ in res) == [0, 2], res
    (seed,) = [s for s, (rc, _, _) in zip((1, 2), res) if rc == 0]
    (loser,) = [err for rc, _, err in res if rc == 2]
    assert sum("wrote" in o for _, o, _ in res) == 1
    assert loser.count("\n") == 1 and ("another gnnio run" in loser or "already exists" in loser)
    assert gnnio.load(tmp_path / "s").meta["source"]["seed"] == seed
    assert sorted(os.listdir(tmp_path)) == ["go", "s"]


# ---- 5: sizes implied by the input ---------------------------------------------------------------


def write_facebook(root: Path, feature_lists: list[list[int]]) -> Path:
    """Tiny MUSAE-layout files: a path graph, classes a/b alternating, the given feature lists."""
    root.mkdir(parents=True, exist_ok=True)
    n = len(feature_lists)
    (root / "facebook_edges.csv").write_text(
        "id_1,id_2\n" + "".join(f"{i},{i + 1}\n" for i in range(n - 1))
    )
    (root / "facebook_target.csv").write_text(
        "id,facebook_id,page_name,page_type\n"
        + "".join(f'{i},{100 + i},"page {i}",{"ab"[i % 2]}\n' for i in range(n))
    )
    (root / "facebook.json").write_text(
        json.dumps({str(i): f for i, f in enumerate(feature_lists)})
    )
    return root


def test_facebook_feature_id_bounded(tmp_path, capsys):
    lists = [[0, 1], [2], [1, 3], [0], [3, 1_000_000], [2]]
    root = write_facebook(tmp_path / "fb", lists)
    argv = ["prepare", "facebook", "--root", str(root), "--split", "0.5,0.2", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "facebook.json", "feature id 1,000,000", "1,000,001 feature columns",
                   "only 5 distinct")  # fmt: skip
    assert not (tmp_path / "o").exists() and hidden(tmp_path) == []
    lists[4] = [3, 9]  # sparse but small ids are fine
    write_facebook(root, lists)
    assert main([*argv, "--out", str(tmp_path / "o")]) == 0
    assert gnnio.load(tmp_path / "o").feat_dim == 10


def test_planetoid_test_index_bounded(tmp_path, capsys):
    parts, _, _ = gap_layout()
    parts["test.index"] = [8, 5, 3_000_000]
    write_planetoid(tmp_path / "pl", "g", parts)
    argv = ["prepare", "planetoid", "--name", "g", "--root", str(tmp_path / "pl"), "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "ind.g.test.index", "node id 3,000,000", "3,000,001 nodes")
    assert not (tmp_path / "o").exists()


def test_npy_huge_label_bounded(tmp_path, capsys):
    labels = np.arange(30) % 3
    labels[5] = 1_000_000_000
    argv = npy_files(tmp_path, labels=labels, train=[0, 1, 2])
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "--labels", "label 1,000,000,000", "1,000,000,001 classes")
    labels[5] = 1000  # up to 1024 classes are accepted however few are used
    np.save(tmp_path / "y.npy", labels)
    assert main([*argv, "--out", str(tmp_path / "o")]) == 0
    assert gnnio.load(tmp_path / "o").num_classes == 1001


def test_synthetic_size_checked_before_writing(tmp_path, capsys, monkeypatch):
    small_disk(monkeypatch, 100 << 30)
    argv = ["prepare", "synthetic", "--num-nodes", "2147483647", "--feat-dim", "128"]
    t0 = time.perf_counter()
    assert main([*argv, "--out", str(tmp_path / "big"), "--quiet"]) == 2
    one_line_error(capsys, "needs about 1.16 TiB on disk", "only 100 GiB is free")
    small_disk(monkeypatch, 1 << 50)  # room on disk: the memory the graph takes is checked
    from gnnio.graph import output_dir

    monkeypatch.setattr(output_dir, "available_ram", lambda: 16 << 30)
    assert main([*argv, "--out", str(tmp_path / "big"), "--quiet", "--memory-budget", "none"]) == 2
    one_line_error(capsys, "needs at least 256 GiB of memory", "only 16 GiB is available")
    # within the default --memory-budget: what the bounded generator keeps (issue 25)
    assert main([*argv, "--out", str(tmp_path / "big"), "--quiet"]) == 2
    one_line_error(capsys, "needs at least 394 GiB of memory", "only 16 GiB is available")
    assert time.perf_counter() - t0 < 30 and os.listdir(tmp_path) == []


# ---- 8: stale temporaries -----------------------------------------------------------------------


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_removed_with_one_line(tmp_path, caplog):
    out, gone = tmp_path / "s", dead_pid()
    made = {
        f".s.tmp-{gone}-0badc0de": True,  # its writer is gone
        f".s.prepare-{gone}-00000001": True,
        f".s.tmp-{os.getppid()}-12345678": False,  # a live process's
        ".s.tmp-ab_cd123": True,  # an older gnnio's name (no pid), untouched for 2 hours
        ".s.tmp-xy_zw456": False,  # ... and one just made
        f".s.old-{gone}-11111111": False,  # a previous dataset while s is missing: kept
        f".other.tmp-{gone}-22222222": False,  # another target's
    }
    for name in made:
        (tmp_path / name).mkdir()
        (tmp_path / name / "features.npy").write_bytes(b"\0" * 8192)
    old = time.time() - 7200
    os.utime(tmp_path / ".s.tmp-ab_cd123", (old, old))
    with caplog.at_level(logging.WARNING, logger="gnnio.graph.write"):
        assert main([*SYN, "--out", str(out)]) == 0
    left = set(hidden(tmp_path))
    assert left == {name for name, stale in made.items() if not stale}
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "removed 3 stale temporary directories" in msg and "\n" not in msg
    assert msg.endswith(" KiB)") and float(msg.rsplit("; ", 1)[1][:-5]) >= 24  # 3 x 8 KiB freed
    assert main([*SYN, "--out", str(out), "--overwrite"]) == 0  # now s exists: .old- goes too
    assert f".s.old-{gone}-11111111" not in hidden(tmp_path)


def test_crashed_writer_leftovers_cleaned_by_the_next_run(tmp_path):
    """A writer SIGKILLed mid-write leaves its temporary directory (and lock file); the next
    ``prepare`` to that target removes it and says so in one line on stderr."""
    out = tmp_path / "s"
    code = textwrap.dedent(f"""
        import os, signal, numpy as np
        from gnnio.graph import DatasetWriter
        with DatasetWriter({str(out)!r}, name="s") as w:
            w.save_array("indptr", np.zeros(1001, np.int64))
            w.create_array("features", (1000, 64), np.float32)[:] = 1.0
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], env=ENV, timeout=120)
    assert r.returncode == -signal.SIGKILL
    (tmp,) = [n for n in hidden(tmp_path) if ".tmp-" in n]
    r = subprocess.run([sys.executable, "-m", "gnnio", *SYN, "--out", str(out)], env=ENV,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and r.stderr.count("\n") == 1, r.stderr
    assert "removed 1 stale temporary directory" in r.stderr and tmp in r.stderr
    assert hidden(tmp_path) == []


# ---- output paths --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, extra, words",
    [
        ("FILE/sub", [], "is a file, not a directory"),
        ("FILE", ["--overwrite"], "exists and is not a directory"),
        ("/dev/null", ["--overwrite"], "exists and is not a directory"),
        ("DIR", ["--overwrite"], "not a gnnio dataset"),
        ("DS/sub", [], "inside the dataset directory"),
        ("/proc/foo", [], "cannot write in /proc"),
    ],
)
@pytest.mark.parametrize("cmd", ["prepare", "reorder"])
def test_bad_out_is_one_line(tmp_path, capsys, cmd, target, extra, words):
    if target.startswith("/proc") and not Path("/proc/self").exists():
        pytest.skip("no /proc")
    ds = write_tiny_dataset(tmp_path / "ds", num_nodes=40, num_edges=160)
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "mine.txt").write_text("keep")
    out = (target.replace("FILE", str(tmp_path / "file")).replace("DIR", str(tmp_path / "dir"))
           .replace("DS", str(ds)))  # fmt: skip
    argv = SYN if cmd == "prepare" else ["reorder", str(ds), "--by", "degree", "--quiet"]
    assert main([*argv, "--out", out, *extra]) == 2
    one_line_error(capsys, words)
    assert (tmp_path / "dir" / "mine.txt").read_text() == "keep"
    assert (tmp_path / "file").read_text() == "x" and Path("/dev/null").is_char_device()
    assert hidden(tmp_path) == [] and sorted(os.listdir(ds)) == sorted(
        ["meta.json", *(f"{k}.npy" for k in gnnio.load(ds).meta["arrays"])]
    )


def test_plan_save_never_replaces_dataset_files_and_full_disk_is_one_line(
    tmp_path, capsys, monkeypatch
):
    ds = write_tiny_dataset(tmp_path / "ds", num_nodes=60, num_edges=300)
    before = (ds / "features.npy").read_bytes()
    plan = ["plan", str(ds), "--topology", "2", "--buffer", "0.5", "--strategies", "naive",
            "--trace-epochs", "1", "--batch-size", "8", "--quiet"]  # fmt: skip
    assert main([*plan, "--save", str(ds / "features.npy")]) == 2
    one_line_error(capsys, "--save", "inside the dataset directory")
    assert (ds / "features.npy").read_bytes() == before

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)  # a full disk shows at the latest on fsync
    assert main([*plan, "--save", str(tmp_path / "p.npz")]) == 2
    one_line_error(capsys, "--save", "No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["ds"]
