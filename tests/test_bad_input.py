"""Bad input to the command line (issue 16, items 2, 4, 6, 7, 10): every case ends with one
error line and a non-zero exit, no traceback, and nothing outside the run is replaced."""

from __future__ import annotations

import os

import pytest

from gnnio.cli.main import build_parser, join_negative_lists, main
from gnnio.errors import UsageError
from gnnio.utils.outputs import check_output_path, write_atomic
from tests.helpers import write_tiny_dataset


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    ds = write_tiny_dataset(root / "ds", num_nodes=40, num_edges=160)
    (root / "adir").mkdir()
    (root / "afile").write_text("x")
    os.mkfifo(root / "fifo")
    return {"D": str(ds), "DIR": str(root / "adir"), "FILE": str(root / "afile"),
            "FIFO": str(root / "fifo"), "ROOT": str(root)}  # fmt: skip


# (argv after "gnnio", a word the error line must contain); D, DIR, FILE, FIFO, ROOT filled in
CASES = [
    ("train D --fanouts 15,,5", "empty value between commas"),
    ("train D --fanouts 99999999999999999999", "at most 2147483647"),
    ("train D --fanouts=-2,5", ">= 0 or -1"),
    ("train D --prune-threshold=0,0", "must not both be 0"),
    ("train D --prune-threshold=1e308,1", "at most 1e9"),
    ("train D --prune-threshold -1,1", "two numbers >= 0"),
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
    ("train D --heads 2", "--heads: has no effect without --model gat"),
    ("train D --po-sequences 3", "--po-sequences: has no effect without --order po"),
    ("bench placement --num-nodes 1e10", "invalid int value"),
]


def _fill(text: str, paths: dict) -> list[str]:
    out = []
    for tok in text.split():
        for k in ("FIFO", "FILE", "ROOT", "DIR", "D"):  # longest names first
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


def test_negative_list_values_are_values():
    argv = join_negative_lists(["train", "d", "--fanouts", "-1,-1,-1", "--prune-threshold", "-1,2"])
    assert argv == ["train", "d", "--fanouts=-1,-1,-1", "--prune-threshold=-1,2"]
    args = build_parser().parse_args(argv)
    assert args.fanouts == "-1,-1,-1"
    assert join_negative_lists(["--epochs", "-1"]) == ["--epochs", "-1"]  # argparse's own case


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
