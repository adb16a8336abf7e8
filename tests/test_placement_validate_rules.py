"""Placement files (``gnnio plan --save``) with one field edited are refused with one line naming
the field, and a good one reads back as written (rules of :mod:`gnnio.placement.validate` a
mutation pass found untested, 2026-11-29)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnnio.errors import UsageError
from gnnio.placement import Placement, load_placement, save_placement
from gnnio.placement.validate import check_for_dataset, read_fields

FP = "0123456789abcdef"


def _good(tmp_path) -> dict:
    """A placement of 6 nodes on 4 GPUs in the groups (0, 2) and (1, 3), with parts, saved and
    read back as its arrays."""
    pl = Placement("hand", 6, ((0, 2), (1, 3)),
                   [np.array([5, 0]), np.array([1]), np.array([], dtype=np.int64),
                    np.array([2, 3, 4])],
                   peer_reads=False, params={"dataset_fingerprint": FP}, prep_s=1.5,
                   parts=np.array([0, 1, 2, 3, -1, 0], dtype=np.int16))  # fmt: skip
    return dict(np.load(save_placement(pl, tmp_path / "good.npz")))


def _write(tmp_path, arrays: dict, name: str = "p.npz"):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def test_a_good_file_reads_back_as_written(tmp_path):
    f = read_fields(_write(tmp_path, _good(tmp_path)))
    assert f["groups"] == ((0, 2), (1, 3))  # devices as stored, not 0..n-1 in order
    assert f["num_nodes"] == 6 and f["peer_reads"] is False and f["prep_s"] == 1.5
    assert [b.tolist() for b in f["buffers"]] == [[5, 0], [1], [], [2, 3, 4]]
    assert f["parts"].dtype == np.int16 and f["parts"].tolist() == [0, 1, 2, 3, -1, 0]
    g = _good(tmp_path)
    wide = read_fields(_write(tmp_path, {**g, "parts": g["parts"].astype(np.int64)}, "w.npz"))
    assert wide["parts"].dtype == np.int16  # (a hand-written file's int64 parts too)
    pl = load_placement(tmp_path / "p.npz")
    assert pl.peers(0) == ()  # (peer_reads False) and pl.groups[0] == (0, 2)
    assert pl.groups[0] == (0, 2)


def _edits(g: dict) -> list:
    """(name, the arrays changed or removed (None), the words of the error)."""
    n = 6
    return [
        ("num_nodes bool", {"num_nodes": np.array(True)}, "'num_nodes' must be an integer"),
        ("num_nodes 1-D", {"num_nodes": np.array([n])}, "'num_nodes' must be an integer"),
        ("buffer 2-D", {"buffer_3": g["buffer_3"].reshape(1, 3)}, "'buffer_3' must be a 1-D"),
        ("buffer bool", {"buffer_1": np.array([True])}, "'buffer_1' must be a 1-D integer"),
        ("other tag", {"format": np.array("gnnio-placement-v2")}, "not a gnnio placement file"),
        ("tag as bytes", {"format": np.array(b"gnnio-placement-v1")}, "not a gnnio placement"),
        ("no prep_s", {"prep_s": None}, "missing 'prep_s'"),
        ("no strategy", {"strategy": None}, "missing 'strategy'"),
        ("too many nodes", {"num_nodes": np.array(2**40 + 1)}, "num_nodes must be in [0, 2^40]"),
        ("an empty group", {"group_sizes": np.array([2, 0, 2])}, "do not split"),
        ("groups short", {"group_sizes": np.array([2, 1])}, "do not split"),
        ("no groups", {"group_sizes": np.array([], dtype=np.int64)}, "do not split"),
        ("device twice", {"group_devices": np.array([0, 2, 1, 1])}, "exactly once"),
        ("device 4", {"group_devices": np.array([0, 2, 1, 4])}, "exactly once"),
        ("extra buffer", {"buffer_4": np.array([1])}, "unexpected array 'buffer_4'"),
        ("other array", {"notes": np.array([1])}, "unexpected array 'notes'"),
        ("no buffer_2", {"buffer_2": None}, "missing 'buffer_2'"),
        ("node n", {"buffer_1": np.array([n])}, "buffer 1 holds node 6, outside [0, 6)"),
        ("node -1", {"buffer_3": np.array([2, -1])}, "buffer 3 holds node -1, outside [0, 6)"),
        ("node twice", {"buffer_3": np.array([2, 4, 2])}, "buffer 3 holds a node twice"),
        ("parts short", {"parts": g["parts"][:-1]}, "'parts' must give each of the 6 nodes"),
        ("parts long", {"parts": np.append(g["parts"], 0)}, "'parts' must give each of the 6"),
        ("part -2", {"parts": np.array([0, 1, 2, 3, -2, 0])}, "a part in [-1, 4)"),
        ("part 4", {"parts": np.array([0, 1, 2, 4, -1, 0])}, "a part in [-1, 4)"),
        ("peer_reads int", {"peer_reads": np.array(1)}, "'peer_reads' must be a boolean"),
        ("peer_reads 1-D", {"peer_reads": np.array([True])}, "'peer_reads' must be a boolean"),
        ("params list", {"params_json": np.array("[1, 2]")}, "must hold a JSON object"),
        ("params not JSON", {"params_json": np.array("{x")}, "must hold a JSON object"),
        ("params deep", {"params_json": np.array("[" * 100000 + "]" * 100000)}, "JSON object"),
        (
            "bad print",
            {"params_json": np.array(json.dumps({"dataset_fingerprint": "abc"}))},
            "dataset_fingerprint must be 16 hex digits",
        ),  # fmt: skip
        ("prep_s nan", {"prep_s": np.array(np.nan)}, "'prep_s' must be a finite number"),
        ("prep_s int", {"prep_s": np.array(1)}, "'prep_s' must be a finite number"),
    ]


@pytest.mark.parametrize("i", range(32))
def test_each_edited_field_is_one_line_naming_it(tmp_path, i):
    g = _good(tmp_path)
    name, change, words = _edits(g)[i]
    arrays = {**g, **change}
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path = _write(tmp_path, arrays)
    with pytest.raises(UsageError) as e:
        read_fields(path)
    msg = str(e.value)
    assert words in msg and str(path) in msg and "\n" not in msg, (name, msg)


def test_the_edit_list_is_complete(tmp_path):
    assert len(_edits(_good(tmp_path))) == 32


def test_a_damaged_archive_is_one_line(tmp_path):
    path = _write(tmp_path, _good(tmp_path))
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\x00" * 64  # a member's compressed bytes
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="cannot read placement|not a gnnio") as e:
        read_fields(path)
    assert "\n" not in str(e.value)
    zp = tmp_path / "z.npz"
    np.savez_compressed(zp, **_good(tmp_path))
    data = bytearray(zp.read_bytes())
    i = data.index(b"buffer_0.npy") + 40  # inside that member's deflated bytes
    data[i : i + 16] = b"\xff" * 16
    zp.write_bytes(bytes(data))
    with pytest.raises(UsageError) as e:
        read_fields(zp)
    assert "\n" not in str(e.value)


class _Ds:
    name, num_nodes, fingerprint, path = "ds", 6, FP, "DIR"


def test_check_for_dataset_refuses_another_node_count_and_no_fingerprint(tmp_path):
    pl = load_placement(_write(tmp_path, _good(tmp_path)))
    check_for_dataset(pl, "p.npz", _Ds())  # made for it: accepted
    other = type("Other", (_Ds,), {"num_nodes": 7})()
    with pytest.raises(UsageError, match="made for a dataset of 6 nodes, ds has 7"):
        check_for_dataset(pl, "p.npz", other)
    pl.params.pop("dataset_fingerprint")
    with pytest.raises(UsageError, match="records no dataset it was made for"):
        check_for_dataset(pl, "p.npz", _Ds())
