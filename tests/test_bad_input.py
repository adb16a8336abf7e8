"""Bad input to the command line (issue 16, items 2, 4, 6, 7, 9, 10): every case ends with one
error line and a non-zero exit, no traceback, and nothing outside the run is replaced. Every
command and every benchmark appears in the table at least once (``test_every_entry_point``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gnnio.cli.main import build_parser, join_negative_lists, main, normalise_argv
from gnnio.errors import UsageError
from gnnio.utils.outputs import check_output_path, write_atomic
from tests.helpers import write_tiny_dataset


def _bad_dataset(src, out, edit=None, replace=None):
    """A copy of dataset ``src`` with its meta.json edited by ``edit(meta)`` and/or an array file
    rewritten by ``replace(dir)``."""
    shutil.copytree(src, out)
    if edit is not None:
        meta = json.loads((out / "meta.json").read_text())
        edit(meta)
        (out / "meta.json").write_text(json.dumps(meta))
    if replace is not None:
        replace(out)
    return str(out)


def _flip_byte(d, name="indices.npy", pos=200):
    with open(d / name, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 1]))


def _zip_as_npy(d):
    np.savez(d / "l.npz", labels=np.load(d / "labels.npy"))
    os.replace(d / "l.npz", d / "labels.npy")


def _placements(root, ds_dir, other_dir):
    """Placement files: a good one bound to ``ds_dir`` and one corrupt file per field."""
    import gnnio
    from gnnio.placement import PlacementRequest, place, save_placement
    from gnnio.placement.topology import load_topology
    from gnnio.placement.validate import bind

    ds = gnnio.load(ds_dir)
    req = PlacementRequest(probs=np.arange(ds.num_nodes, dtype=float),
                           topology=load_topology("2"), buffer_rows=8)  # fmt: skip
    pl = place("alg1", req)
    save_placement(pl, root / "p_unbound.npz")
    bind(pl, gnnio.load(other_dir))
    save_placement(pl, root / "p_other.npz")
    bind(pl, ds)
    save_placement(pl, root / "p_good.npz")
    good = dict(np.load(root / "p_good.npz"))
    bad = {
        "oor": {"buffer_0": np.array([0, 1, 99999])},
        "dup": {"buffer_0": np.array([3, 3])},
        "neg": {"num_nodes": np.array(-1)},
        "float": {"buffer_1": good["buffer_1"].astype(np.float64) + 0.5},
        "groups": {"group_sizes": np.array([3])},
        "extra": {"buffer_2": np.array([1])},
    }
    out = {"PGOOD": str(root / "p_good.npz"), "PUNBOUND": str(root / "p_unbound.npz"),
           "POTHER": str(root / "p_other.npz")}  # fmt: skip
    for k, change in bad.items():
        np.savez(root / f"p_{k}.npz", **{**good, **change})
        out[f"P{k.upper()}"] = str(root / f"p_{k}.npz")
    return out


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    ds = write_tiny_dataset(root / "ds", num_nodes=40, num_edges=160)
    other = write_tiny_dataset(root / "other", num_nodes=40, num_edges=160, seed=1)
    (root / "adir").mkdir()
    (root / "afile").write_text("x")
    os.mkfifo(root / "fifo")
    (root / "topo.json").write_text(json.dumps({"groups": "2", "num_gpus": "x"}))
    out = {"D": str(ds), "DIR": str(root / "adir"), "FILE": str(root / "afile"),
           "FIFO": str(root / "fifo"), "ROOT": str(root), "TOPO": str(root / "topo.json")}  # fmt: skip
    bad = {
        "DSEVEN": {"edit": lambda m: m.update(num_classes="seven")},
        "DNOSHA": {"edit": lambda m: m["arrays"]["indices"].pop("sha256")},
        "DCLASSES": {"edit": lambda m: m.update(num_classes=1000)},
        "DPASSWD": {"edit": lambda m: m["arrays"]["labels"].update(file="/etc/passwd")},
        "DVERSION": {"edit": lambda m: m.update(format_version="1")},
        "DZIP": {"replace": _zip_as_npy},
        "DFLIP": {"replace": _flip_byte},
    }
    for k, kw in bad.items():
        out[k] = _bad_dataset(ds, root / k.lower(), **kw)
    out.update(_placements(root, ds, other))
    return out


# (argv after "gnnio", a word the error line must contain); the upper-case names of the
# ``paths`` fixture (D, DIR, FILE, FIFO, ROOT, TOPO, the bad datasets D*, placements P*) filled in
CASES = [
    ("train D --fanouts 15,,5", "empty value between commas"),
    ("train D --fanouts 99999999999999999999", "at most 2147483647"),
    ("train D --fanouts=-2,5", ">= 0 or -1"),
    ("train D --prune-threshold=0,0", "must not both be 0"),
    ("train D --prune-threshold=1e308,1", "at most 1e9"),
    ("train D --prune-threshold -1,1", "two numbers >= 0"),
    ("train D --prune-threshold=1e-12,0", "it must be >= 1"),  # (was the sampler's traceback)
    ("train D --summary DIR", "is a directory"),
    ("train D --log DIR", "is a directory"),
    ("train D --checkpoint DIR", "is a directory"),
    ("train D --summary FIFO", "not a regular file"),
    ("train D --summary FILE/sub.json", "is a file, not a directory"),
    ("train D --summary D/meta.json", "inside the dataset directory"),
    ("train D --checkpoint D/features.npy", "inside the dataset directory"),
    ("train D --checkpoint-dir D/ck", "inside the dataset directory"),
    ("train D --checkpoint-every 2", "needs --checkpoint-dir"),
    ("train D --checkpoint-every 0 --checkpoint-dir ROOT/ck0", "--checkpoint-every: must be >= 1"),
    ("train D --resume ROOT/none", "no such checkpoint directory"),
    ("train D --checkpoint-dir FILE", "not a directory"),
    ("train D --cache-size 0.2", "--cache-size: has no effect without --cache-policy"),
    ("train D --reader 1", "--reader: has no effect without --placement"),
    ("train D --gpu-budget 1000", "--gpu-budget: has no effect"),
    ("train D --gpu-cache-fraction 0.1 --gpu-budget 4GB/s", "--gpu-budget: cannot read '4GB/s'"),
    ("train D --heads 2", "--heads: has no effect without --model gat"),
    ("train D --po-sequences 3", "--po-sequences: has no effect without --order po"),
    ("bench placement --num-nodes 1e10", "invalid int value"),
    # item 7: the rest of the tracebacks
    ("train D --summary /dev/full", "not a regular file"),
    ("train D --log /dev/full", "not a regular file"),
    ("train D --checkpoint /dev/full", "not a regular file"),
    ("plan D --topology TOPO", "num_gpus must be an integer, got 'x'"),
    ("plan D --topology 2 --save FILE/p.npz", "is a file, not a directory"),
    ("plan D --topology 2 --save DIR", "is a directory"),
    ("train D --lr 1e300", "--lr: must be in (0, 1e9]"),
    ("train D --weight-decay 1e300", "--weight-decay: must be in [0, 1e9]"),
    ("reorder D --by degree --out ROOT/r0 --threads 0", "argument --threads: must be >= 1"),
    ("partition D --parts 2 --method random --out ROOT/p0 --seed -1", "--seed: must be >= 0"),
    ("bench hotness D --threads 0", "argument --threads: must be >= 1, got 0"),
    ("bench tiers D --threads 0", "argument --threads: must be >= 1, got 0"),
    ("bench reorder D --threads 0", "argument --threads: must be >= 1, got 0"),
    ("bench sampling D --threads 99999999999", "--threads: must be at most 4096"),
    ("bench gather D --ceiling-gib 1e300", "--ceiling-gib 1e+300: more than half of the"),
    ("bench gather D --evict-mib -1", "--evict-mib must be >= 0"),
    ("bench loader D --passes 0", "argument --passes: must be >= 1, got 0"),
    ("bench step D --batches 0", "argument --batches: must be >= 1, got 0"),
    ("bench cache D --warmup -1", "argument --warmup: must be >= 0, got -1"),
    ("bench locality D --threads 0", "argument --threads: must be >= 1, got 0"),
    ("bench dist D --threads 0", "argument --threads: must be >= 1, got 0"),
    ("bench dist D --dist-timeout 1e300", "--dist-timeout: must be at most 1e+07 seconds"),
    ("bench cache D --po-sequences 0", "argument --po-sequences: must be >= 1, got 0"),
    ("train D --dist-timeout -1", "--dist-timeout: must be a finite number > 0, got -1"),
    ("bench dist-sampling D --partition DIR", "not a gnnio partition"),
    ("bench placement --skew -1", "--skew: must be a finite number > 0, got -1"),
    ("bench disk D --sizes 2", "--sizes: every size must be in (0, 1]"),
    ("bench placement --passes 0", "argument --passes: must be >= 1, got 0"),
    ("prepare synthetic --num-nodes 0 --out ROOT/s0", "--num-nodes must be an integer"),
    ("prepare synthetic --seed -1 --out ROOT/s1", "argument --seed: must be >= 0, got -1"),
    ("prepare npy --features DIR/none.npy --edges DIR/none.npy --out ROOT/s2", "no such file"),
    ("prepare planetoid --name cora --root DIR --out ROOT/s3", "ind.cora.x: no such file"),
    ("prepare ogb --root DIR --out ROOT/s4", "holds no OGB dataset folder"),
    ("prepare facebook --root DIR --out ROOT/s5", "facebook_edges.csv: no such file"),
    ("prepare pyg --module no_such_module_xyz --out ROOT/s6", "cannot import it"),
    ("info DSEVEN", "num_classes must be an integer >= 0, got 'seven'"),
    ("train DSEVEN", "num_classes must be an integer >= 0, got 'seven'"),
    ("info DNOSHA --verify", "arrays.indices: missing 'sha256'"),
    ("info DZIP", "labels.npy: not a .npy file (it is a zip archive"),
    ("train DZIP", "labels.npy: not a .npy file (it is a zip archive"),
    ("train D --placement POOR", "buffer 0 holds node 99999, outside [0, 40)"),
    ("train D --placement PDUP", "buffer 0 holds a node twice"),
    ("train D --placement PNEG", "num_nodes must be in [0, 2^40], got -1"),
    # item 9: placements checked whole and bound to the dataset's checksums
    ("train D --placement PFLOAT", "'buffer_1' must be a 1-D integer array, got float64"),
    ("train D --placement PGROUPS", "group_sizes [3] do not split the 2 group_devices"),
    ("train D --placement PEXTRA", "unexpected array 'buffer_2'"),
    ("train D --placement PUNBOUND", "records no dataset it was made for"),
    ("train D --placement POTHER", "made for dataset 'tiny'"),
    ("train D --placement D/labels.npy", "not a gnnio placement file (a .npy, not an .npz)"),
    ("train D --placement TOPO", "not a gnnio placement file (not an .npz; 'gnnio plan --save'"),
    # item 10: trusted input checked at open
    ("train DCLASSES", "num_classes is 1000 but the largest label is 2; set num_classes to 3"),
    ("info DPASSWD", "file '/etc/passwd' is not a file name inside the dataset directory"),
    ("info DVERSION", "format_version must be the integer 1, got '1' (a string)"),
    ("train DFLIP", "indices.npy: sha256 mismatch at open"),
    ("info DFLIP --verify", "indices.npy: sha256 mismatch (file changed"),
]


def _fill(text: str, paths: dict) -> list[str]:
    out = []
    for tok in text.split():
        for k in sorted(paths, key=len, reverse=True):  # longest names first
            if tok == k or tok.startswith(k + "/") or tok.endswith("=" + k):
                tok = tok.replace(k, paths[k], 1)
                break
        out.append(tok)
    return out


@pytest.mark.parametrize("argv,words", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_is_one_line(argv, words, paths, capsys):
    meta_before = (paths["D"] + "/meta.json", open(paths["D"] + "/meta.json").read())
    try:
        rc = main(_fill(argv, paths))
    except SystemExit as e:  # argparse's own errors: usage line + one error line, exit 2
        rc = e.code
    err = capsys.readouterr().err
    assert rc not in (0, None)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and words in lines[0], err
    if rc == 2 and not err.startswith("usage:"):
        assert err.count("\n") == 1, err  # gnnio's own errors: exactly one line
    assert open(meta_before[0]).read() == meta_before[1]  # the dataset is untouched
    assert os.path.exists(paths["FIFO"]) and not os.path.isfile(paths["FIFO"])


def test_gpu_budget_takes_sizes_as_memory_budget_does():
    from gnnio.cli.train_config import config_from_args

    for text, want in (("4GiB", 4 << 30), ("1e9", 10**9), ("123456", 123456)):
        argv = ["train", "d", "--gpu-cache-fraction", "0.1", "--gpu-budget", text]
        assert config_from_args(build_parser().parse_args(argv), 1).gpu_budget_bytes == want


def test_negative_list_values_are_values():
    argv = join_negative_lists(["train", "d", "--fanouts", "-1,-1,-1", "--prune-threshold", "-1,2"])
    assert argv == ["train", "d", "--fanouts=-1,-1,-1", "--prune-threshold=-1,2"]
    args = build_parser().parse_args(argv)
    assert args.fanouts == "-1,-1,-1"
    assert join_negative_lists(["--epochs", "-1"]) == ["--epochs", "-1"]  # argparse's own case


def test_an_optional_value_does_not_swallow_the_dataset_directory(tmp_path):
    d = str(tmp_path)
    for cmd in (["train"], ["bench", "step"]):
        args = build_parser().parse_args(normalise_argv([*cmd, "--cuda-graph", d, "--epochs", "2"]))
        assert (args.dir, args.cuda_graph, args.epochs) == (d, "all", 2)
        args = build_parser().parse_args(normalise_argv([*cmd, "--prune-threshold", d]))
        assert (args.dir, args.prune_threshold) == (d, "1,1")
        args = build_parser().parse_args(normalise_argv([*cmd, "--cuda-graph", "step", d]))
        assert (args.dir, args.cuda_graph) == (d, "step")  # a value stays a value
        for both in (["--cuda-graph", "--prune-threshold"], ["--prune-threshold", "--cuda-graph"]):
            args = build_parser().parse_args(normalise_argv([*cmd, *both, d, "--epochs", "2"]))
            assert (args.dir, args.cuda_graph, args.prune_threshold) == (d, "all", "1,1")
        args = build_parser().parse_args(
            normalise_argv([*cmd, "--cuda-graph", "sampler", "--prune-threshold", d])
        )
        assert (args.dir, args.cuda_graph, args.prune_threshold) == (d, "sampler", "1,1")
    args = build_parser().parse_args(normalise_argv(["bench", "sampling", "--prune-threshold", d]))
    assert (args.dataset, args.prune_threshold) == (d, "1,1")
    # not a directory: still the option's value, refused as such
    assert normalise_argv(["train", "--cuda-graph", "nope"]) == ["train", "--cuda-graph", "nope"]


def test_atomic_writes_use_unique_temporaries(tmp_path):
    seen = []

    def writer(f):
        seen.append(f.name)
        f.write(b"x")

    write_atomic(tmp_path / "s.json", writer, "--summary")
    write_atomic(tmp_path / "s.json", writer, "--summary")
    assert seen[0] != seen[1] and (tmp_path / "s.json").read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]

    def broken(f):
        raise OSError(28, "No space left on device")

    with pytest.raises(UsageError, match="--summary .*: cannot write it \\(No space left"):
        write_atomic(tmp_path / "t.json", broken, "--summary")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    with pytest.raises(UsageError, match="not a regular file"):
        check_output_path("/dev/null", "--log")


def _entry_points(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[str]:
    """Every command line entry point ("train", "bench gather", ...) of ``parser``."""
    out = set()
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                inner = _entry_points(sub, (*prefix, name))
                out |= inner or {" ".join((*prefix, name))}
    return out


def test_every_entry_point_is_in_the_table():
    covered = set()
    for argv, _ in CASES:
        words = argv.split()
        covered.add(" ".join(words[:2]) if words[0] in ("bench", "prepare") else words[0])
    missing = _entry_points(build_parser()) - covered
    assert not missing, f"entry points without a bad-input case: {sorted(missing)}"


def test_placement_bound_to_its_dataset_trains(paths):
    from gnnio.train import TrainConfig, train

    cfg = TrainConfig(epochs=1, fanouts=[3, 3], batch_size=8, hidden=8, progress=False,
                      placement=paths["PGOOD"])  # fmt: skip
    s = train(paths["D"], cfg)
    assert s["data_setup"]["placement"]["file"] == paths["PGOOD"]


def test_reordered_dataset_refuses_the_plan_of_the_original(paths, tmp_path):
    """Same node count, other ids: the checksums differ, so the plan is refused."""
    assert main(["reorder", paths["D"], "--by", "degree", "--out", str(tmp_path / "r"),
                 "--quiet"]) == 0  # fmt: skip
    import gnnio
    from gnnio.placement import load_placement
    from gnnio.placement.validate import check_for_dataset

    pl = load_placement(paths["PGOOD"])
    with pytest.raises(UsageError, match="reordered or rewritten"):
        check_for_dataset(pl, paths["PGOOD"], gnnio.load(tmp_path / "r"))
    check_for_dataset(pl, paths["PGOOD"], gnnio.load(paths["D"]))


def test_train_verify_reads_every_byte(paths, capsys):
    """A byte changed in a large array outside the sampled blocks is found by --verify only."""
    rc = main(["train", paths["D"], "--verify", "--epochs", "1", "--fanouts", "2", "--quiet"])
    assert rc == 0
    rc = main(["train", paths["DFLIP"], "--verify", "--epochs", "1", "--quiet"])
    assert rc == 2 and "sha256 mismatch (file changed" in capsys.readouterr().err


def test_open_reads_only_a_few_mib(tmp_path, monkeypatch):
    """The quick check at open reads at most SAMPLE_BYTES per array, whatever their size."""
    import builtins

    import gnnio
    from gnnio.graph.integrity import SAMPLE_BYTES

    d = write_tiny_dataset(tmp_path / "big", num_nodes=1 << 14, num_edges=1 << 16, feat_dim=256)
    read = []
    real_open = builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            b = self.f.read(n)
            read.append(len(b))
            return b

        def __getattr__(self, k):
            return getattr(self.f, k)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    def counting_open(file, mode="r", *a, **kw):
        f = real_open(file, mode, *a, **kw)
        return Counting(f) if "b" in mode and str(file).endswith(".npy") else f

    monkeypatch.setattr("gnnio.graph.integrity.open", counting_open, raising=False)
    ds = gnnio.load(d)
    assert ds.features.nbytes == (1 << 14) * 256 * 4  # 16 MiB of features
    assert 0 < sum(read) <= len(ds.meta["arrays"]) * SAMPLE_BYTES


def _loading_numpy(pid: int) -> bool:
    """Has process ``pid`` mapped NumPy's extension module? ``import gnnio`` loads no NumPy, so
    this means the CLI is inside ``main``, importing its subcommands."""
    with open(f"/proc/{pid}/maps") as f:
        return "_multiarray_umath" in f.read()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_sigint_while_loading_is_one_line(tmp_path):
    """Ctrl-C in the first seconds (while NumPy and torch load) ends with one line, exit 130.
    The signal is sent once NumPy is being loaded (before that, tens of milliseconds of Python's
    own start-up), then 0.5 s later (torch)."""
    d = write_tiny_dataset(tmp_path / "ds", num_nodes=40, num_edges=160)
    for delay in (0.0, 0.5):
        p = subprocess.Popen(
            [sys.executable, "-m", "gnnio", "train", str(d), "--epochs", "300", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not _loading_numpy(p.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        err = p.communicate(timeout=120)[1]
        assert p.returncode == 130, (delay, err[-2000:])
        assert err == "gnnio: interrupted\n", (delay, err[-2000:])


def test_warnings_of_gnnio_are_one_line(tmp_path):
    """A warning of gnnio's own is one ``gnnio: warning:`` line, as its errors are, not Python's
    path, category and a line of gnnio's source (``--cuda-graph`` without a GPU warns twice)."""
    d = write_tiny_dataset(tmp_path / "ds", num_nodes=40, num_edges=160)
    r = subprocess.run(
        [sys.executable, "-m", "gnnio", "train", str(d), "--epochs", "1", "--quiet",
         "--device", "cpu", "--hidden", "8", "--cuda-graph"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert sum(ln.startswith("gnnio: warning: --cuda-graph: ") for ln in lines) == 2, r.stderr
    assert "Warning:" not in r.stderr and ".py:" not in r.stderr, r.stderr


def test_a_partition_directory_given_as_the_dataset_says_so(tmp_path, capsys):
    d = write_tiny_dataset(tmp_path / "ds", num_nodes=40, num_edges=160)
    p = tmp_path / "ds.p2"
    assert main(["partition", str(d), "--parts", "2", "--method", "random", "--out", str(p),
                 "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["train", str(p), "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'gnnio partition' output" in err and "--partition" in err
