"""Hostile input to gnnio's parsers (issue 27, item 4): corrupt placement archives, JSON nested
100,000 deep, infinite bandwidths, array files symlinked out of a dataset, a user module that
raises. Each ends with one ``gnnio: error:`` line and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset
from tests.test_bad_input_prepare import one_line_error, write_facebook

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("p") / "tiny", num_nodes=40, num_edges=160)


def _good_plan(tiny, tmp_path):
    assert main(["plan", str(tiny), "--topology", "2", "--buffer", "0.1", "--save",
                 str(tmp_path / "good.npz"), "--quiet"]) == 0  # fmt: skip
    return (tmp_path / "good.npz").read_bytes()


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b"PK\x03\x04" + b"\x00" * 64,  # a zip header and nothing
        lambda b: b[:40] + bytes(x ^ 0xFF for x in b[40:200]) + b[200:],  # corrupt members
    ],
    ids=["truncated", "header-only", "corrupt"],
)
def test_corrupt_placement_npz_is_one_line(tiny, tmp_path, capsys, damage):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(damage(_good_plan(tiny, tmp_path)))
    capsys.readouterr()
    assert main(["train", str(tiny), "--epochs", "1", "--placement", str(bad), "--quiet"]) == 2
    one_line_error(capsys, "bad.npz")


def test_deep_json_in_meta_json(tiny, tmp_path, capsys):
    d = tmp_path / "d"
    shutil.copytree(tiny, d)
    (d / "meta.json").write_text(DEEP)
    assert main(["info", str(d)]) == 2
    one_line_error(capsys, "meta.json", "nested too deep")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "meta.json").write_text(DEEP)  # an output next to it: not a dataset
    assert main(["train", str(tiny), "--epochs", "1", "--quiet", "--summary",
                 str(tmp_path / "p" / "s.json")]) == 0  # fmt: skip
    capsys.readouterr()


def test_deep_json_topology_file(tiny, tmp_path, capsys):
    (tmp_path / "t.json").write_text(DEEP)
    assert main(["plan", str(tiny), "--topology", str(tmp_path / "t.json")]) == 2
    one_line_error(capsys, "t.json", "cannot parse topology file", "recursion")


def test_deep_json_facebook(tmp_path, capsys):
    root = write_facebook(tmp_path / "fb", [[0], [1], [0], [1]])
    (root / "facebook.json").write_text(DEEP)
    argv = ["prepare", "facebook", "--root", str(root), "--split", "0.5,0.2", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "facebook.json", "nested too deep")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "text",
    [
        '{"groups": "2", "host_bw": 1e400}',
        '{"groups": "2", "peer_bw": Infinity}',
        '{"groups": "2", "network_bw": "1e400 GB/s"}',
        '{"groups": "2", "host_bw": NaN}',
        '{"groups": "2", "feature_budget_bytes": 1e400}',
    ],  # fmt: skip
)
def test_infinite_bandwidth_refused(tiny, tmp_path, capsys, text):
    """1e400 read as infinity: every modeled cost printed 0 before."""
    (tmp_path / "t.json").write_text(text)
    assert main(["plan", str(tiny), "--topology", str(tmp_path / "t.json"), "--json"]) == 2
    one_line_error(capsys, "t.json")


def test_array_symlinked_outside_the_dataset_refused(tiny, tmp_path, capsys):
    d = tmp_path / "d"
    shutil.copytree(tiny, d)
    outside = tmp_path / "labels.npy"
    os.replace(d / "labels.npy", outside)
    (d / "labels.npy").symlink_to(outside)
    assert main(["info", str(d)]) == 2
    one_line_error(capsys, "labels.npy", "outside the dataset directory")
    os.replace(outside, d / "real_labels.npy")  # a link to a file of its own directory is fine
    (d / "labels.npy").unlink()
    (d / "labels.npy").symlink_to("real_labels.npy")
    assert main(["info", str(d)]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("where", ["call", "attr"])
def test_user_module_exception_is_one_line(tmp_path, capsys, where):
    mod = tmp_path / "boom.py"
    body = {
        "call": "def build():\n    raise ValueError('boom\\nsecond line')\n",
        "attr": "def __getattr__(name):\n    raise RuntimeError('lazy boom')\nbuild = 1\n",
    }[where]
    mod.write_text(body)
    attr = "build" if where == "call" else "other"
    argv = ["prepare", "pyg", "--module", str(mod), "--attr", attr, "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "--", "boom")
    assert not (tmp_path / "o").exists()


def test_a_module_file_python_cannot_import_is_named_as_such(tmp_path, capsys):
    """A ``--module`` file with a suffix no importer reads (``.txt``) has no import spec: one line
    saying so (it was ``AttributeError: 'NoneType' object has no attribute 'loader'``)."""
    mod = tmp_path / "graph.txt"
    mod.write_text("build = 1\n")
    argv = ["prepare", "pyg", "--module", str(mod), "--attr", "build", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "--module", "not a Python module file (name it .py)")
    assert not (tmp_path / "o").exists()


def test_valid_topology_still_plans(tiny, tmp_path, capsys):
    (tmp_path / "t.json").write_text(json.dumps({"groups": "2", "host_bw": "12 GB/s"}))
    argv = ["plan", str(tiny), "--topology", str(tmp_path / "t.json"), "--buffer", "0.1"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["topology"]["host_bw"] == 12e9
