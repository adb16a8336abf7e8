"""The dataset format: atomic writes, and one test per invariant checked on open."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import gnnio
from gnnio.errors import DatasetError
from gnnio.graph import DatasetWriter
from gnnio.graph.format import META_FILE, sha256_file

from .helpers import write_tiny_dataset


@pytest.fixture
def ds_dir(tmp_path):
    return write_tiny_dataset(tmp_path / "ds")


def tamper(ds_dir, key, arr, fix_meta=True):
    """Replace one array file; by default also update meta.json's shape/dtype/sha256 so that only
    the invariant under test is broken."""
    path = ds_dir / f"{key}.npy"
    np.save(path, arr)
    if fix_meta:
        meta = json.loads((ds_dir / META_FILE).read_text())
        meta["arrays"][key].update(
            shape=list(arr.shape), dtype=str(arr.dtype), sha256=sha256_file(path)
        )
        (ds_dir / META_FILE).write_text(json.dumps(meta))


def arr(ds_dir, key):
    return np.load(ds_dir / f"{key}.npy")


def expect_error(ds_dir, *needles, verify=False):
    with pytest.raises(DatasetError) as ei:
        gnnio.load(ds_dir, verify=verify)
    msg = str(ei.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_roundtrip(ds_dir):
    ds = gnnio.load(ds_dir, verify=True)
    assert ds.num_nodes == 12 and ds.feat_dim == 4 and ds.num_classes == 3
    assert isinstance(ds.features, np.memmap)
    assert ds.meta["format_version"] == gnnio.graph.FORMAT_VERSION
    for key in ("indptr", "indices", "features", "labels", "train_idx"):
        assert key in ds.meta["arrays"] and len(ds.meta["arrays"][key]["sha256"]) == 64


def test_indptr_must_start_at_zero(ds_dir):
    ip = arr(ds_dir, "indptr")
    ip[0] = 1
    ip[1] = max(ip[1], 1)
    tamper(ds_dir, "indptr", ip)
    expect_error(ds_dir, "indptr.npy", "start at 0")


def test_indptr_must_not_decrease(ds_dir):
    ip = arr(ds_dir, "indptr")
    ip[3] = ip[4] + 1
    tamper(ds_dir, "indptr", ip)
    expect_error(ds_dir, "indptr.npy", "decreases")


def test_indptr_must_end_at_num_edges(ds_dir):
    ip = arr(ds_dir, "indptr")
    ip[-1] -= 1
    tamper(ds_dir, "indptr", ip)
    expect_error(ds_dir, "indptr.npy", "end at num_edges")


@pytest.mark.parametrize("bad", [-1, 12, 1000])
def test_indices_in_range(ds_dir, bad):
    ix = arr(ds_dir, "indices")
    ix[5] = bad
    tamper(ds_dir, "indices", ix)
    expect_error(ds_dir, "indices.npy", f"{bad}", "out of range")


def test_shape_matches_meta(ds_dir):
    f = arr(ds_dir, "features")
    tamper(ds_dir, "features", np.concatenate([f, f[:1]]), fix_meta=False)
    expect_error(ds_dir, "features.npy", "shape")


def test_dtype_matches_meta(ds_dir):
    tamper(ds_dir, "labels", arr(ds_dir, "labels").astype(np.int32), fix_meta=False)
    expect_error(ds_dir, "labels.npy", "dtype")


def test_dtype_invariant_even_if_meta_agrees(ds_dir):
    tamper(ds_dir, "indptr", arr(ds_dir, "indptr").astype(np.int32))
    expect_error(ds_dir, "indptr.npy", "int64")


def test_split_ids_in_range(ds_dir):
    tr = arr(ds_dir, "train_idx")
    tr[0] = 99
    tamper(ds_dir, "train_idx", tr)
    expect_error(ds_dir, "train_idx.npy", "99", "out of range")


def test_splits_disjoint(ds_dir):
    va = arr(ds_dir, "valid_idx")
    va[0] = arr(ds_dir, "train_idx")[0]
    tamper(ds_dir, "valid_idx", va)
    expect_error(ds_dir, "valid_idx.npy", "disjoint")


@pytest.mark.parametrize("bad", [-2, 3])
def test_labels_in_range(ds_dir, bad):
    lab = arr(ds_dir, "labels")
    lab[2] = bad
    tamper(ds_dir, "labels", lab)
    expect_error(ds_dir, "labels.npy", str(bad), "out of range")


def test_checksum_of_a_small_array_checked_at_open(ds_dir):
    f = arr(ds_dir, "features")
    f[0, 0] += 1.0
    np.save(ds_dir / "features.npy", f)  # same shape and dtype, stale sha256
    gnnio.load(ds_dir, quick=False)  # invariants still hold
    expect_error(ds_dir, "features.npy", "sha256 mismatch at open")  # small: hashed whole
    expect_error(ds_dir, "features.npy", "sha256", verify=True)


def test_missing_meta_and_array(tmp_path, ds_dir):
    expect_error(tmp_path, "meta.json")
    os.remove(ds_dir / "labels.npy")
    expect_error(ds_dir, "labels.npy", "missing")


def test_wrong_format_version(ds_dir):
    meta = json.loads((ds_dir / META_FILE).read_text())
    meta["format_version"] = 999
    (ds_dir / META_FILE).write_text(json.dumps(meta))
    expect_error(ds_dir, "format_version 999")


def test_interrupted_write_leaves_nothing(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError):
        with DatasetWriter(out, name="x") as w:
            w.save_array("indptr", np.zeros(3, dtype=np.int64))
            raise RuntimeError("killed")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_invalid_arrays_never_renamed_into_place(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(DatasetError):
        with DatasetWriter(out, name="x") as w:
            w.save_array("indptr", np.array([0, 1, 2], dtype=np.int64))
            w.save_array("indices", np.array([0, 7], dtype=np.int32))  # 7 out of range
            w.save_array("features", np.zeros((2, 3), dtype=np.float32))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_existing_output_needs_overwrite(tmp_path, ds_dir):
    with pytest.raises(DatasetError, match="already exists"):
        write_tiny_dataset(ds_dir)
    with DatasetWriter(ds_dir, name="again", overwrite=True) as w:
        w.save_array("indptr", np.array([0, 0], dtype=np.int64))
        w.save_array("indices", np.array([], dtype=np.int32))
        w.save_array("features", np.zeros((1, 2), dtype=np.float32))
    assert gnnio.load(ds_dir).name == "again"
    assert sorted(p.name for p in ds_dir.parent.iterdir()) == ["ds"]


def test_float16_features_and_no_labels(tmp_path):
    out = tmp_path / "f16"
    with DatasetWriter(out, name="f16") as w:
        w.save_array("indptr", np.array([0, 1, 1], dtype=np.int64))
        w.save_array("indices", np.array([1], dtype=np.int32))
        w.save_array("features", np.ones((2, 3), dtype=np.float16))
    ds = gnnio.load(out)
    assert ds.features.dtype == np.float16 and ds.labels is None and ds.num_classes == 0
    with pytest.raises(DatasetError, match="not be trained|cannot be trained|can be benchmarked"):
        ds.require_labels()


# ---- meta.json values, file names, and the quick check at open (issue 16) -----------------------


def edit_meta(ds_dir, fn):
    meta = json.loads((ds_dir / META_FILE).read_text())
    fn(meta)
    (ds_dir / META_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "edit,needles",
    [
        (lambda m: m.update(num_classes="seven"), ["num_classes must be an integer", "'seven'"]),
        (lambda m: m.update(num_nodes=-1), ["num_nodes must be an integer >= 0"]),
        (
            lambda m: m.update(format_version="1"),
            ["format_version must be the integer 1", "string"],
        ),
        (lambda m: m.update(num_classes=1000), ["num_classes is 1000", "largest label is 2"]),
        (lambda m: m["arrays"]["labels"].update(file="/etc/passwd"), ["'/etc/passwd'", "inside"]),
        (lambda m: m["arrays"]["labels"].update(file="../ds/labels.npy"), ["not a file name"]),
        (lambda m: m["arrays"]["indices"].pop("sha256"), ["arrays.indices: missing 'sha256'"]),
        (lambda m: m["arrays"]["indices"].update(sha256="x"), ["sha256 must be 64"]),
        (lambda m: m["arrays"]["indices"].update(shape="[40]"), ["shape must be a list"]),
        (lambda m: m.update(arrays=[]), ["'arrays' must be a non-empty object"]),
        (lambda m: m.update(name=["x"]), ["name must be a string"]),
    ],
)
def test_bad_meta_values_are_one_line(ds_dir, edit, needles):
    edit_meta(ds_dir, edit)
    expect_error(ds_dir, "meta.json", *needles)


def test_npy_that_is_a_zip_archive(ds_dir):
    np.savez(ds_dir / "z.npz", a=arr(ds_dir, "labels"))
    os.replace(ds_dir / "z.npz", ds_dir / "labels.npy")
    expect_error(ds_dir, "labels.npy", "zip archive")


def test_bytes_appended_are_found_at_open(ds_dir):
    with open(ds_dir / "indptr.npy", "ab") as f:
        f.write(b"\0" * 8)
    expect_error(ds_dir, "indptr.npy", "bytes appended")


def test_name_escapes_are_not_printed_raw(ds_dir):
    edit_meta(ds_dir, lambda m: m.update(name="\x1b[31mred\x1b[0m\n"))
    ds = gnnio.load(ds_dir)
    assert ds.name == "\\x1b[31mred\\x1b[0m\\n" and ds.name.isprintable()


def test_large_array_checked_by_its_sampled_hash(tmp_path):
    from gnnio.graph.integrity import SAMPLE_BLOCK, SAMPLE_BYTES, sample_sha256

    n, f = 2048, 128  # features 1 MiB: above SAMPLE_BYTES, so only sampled at open
    ds_dir = write_tiny_dataset(tmp_path / "big", num_nodes=n, num_edges=4 * n, feat_dim=f)
    path = ds_dir / "features.npy"
    size = path.stat().st_size
    assert size > SAMPLE_BYTES
    meta = json.loads((ds_dir / META_FILE).read_text())
    assert meta["arrays"]["features"]["sample_sha256"] == sample_sha256(path)

    def flip(pos):
        with open(path, "r+b") as fh:
            fh.seek(pos)
            b = fh.read(1)
            fh.seek(pos)
            fh.write(bytes([b[0] ^ 1]))

    last = size - 1  # in the last sampled block
    flip(last)
    expect_error(ds_dir, "features.npy", "sampled sha256 mismatch")
    flip(last)
    gnnio.load(ds_dir)
    between = SAMPLE_BLOCK + 10  # in no sampled block: only the full check finds it
    assert between < (size - SAMPLE_BLOCK) // 7
    flip(between)
    gnnio.load(ds_dir)
    expect_error(ds_dir, "features.npy", "sha256 mismatch", verify=True)


def _ram_and_swap() -> int:
    with open("/proc/meminfo") as f:
        kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in f if ln.split()[-1] == "kB"}
    return (kb["MemTotal"] + kb.get("SwapTotal", 0)) * 1024


def test_npy_larger_than_ram_and_swap_opens_read_only(tmp_path):
    """Issue 25: a copy-on-write mapping of a file larger than RAM + swap is refused (ENOMEM) by
    the kernel's heuristic overcommit; such an array opens read-only instead. The file is sparse:
    it takes no disk space."""
    from gnnio.graph.format import load_arrays

    if not os.path.exists("/proc/meminfo"):
        pytest.skip("needs /proc/meminfo")
    cols = 1024
    rows = _ram_and_swap() // (4 * cols) + 1
    path = tmp_path / "big.npy"
    with open(path, "wb") as f:
        header = {"descr": "<f4", "fortran_order": False, "shape": (rows, cols)}
        np.lib.format.write_array_header_1_0(f, header)
        off = f.tell()
    os.truncate(path, off + rows * cols * 4)
    a = load_arrays(tmp_path, ["big"])["big"]
    assert a.shape == (rows, cols) and float(a[rows - 1, cols - 1]) == 0.0


def test_dataset_opens_when_a_private_mapping_is_refused(ds_dir, monkeypatch):
    """The same, deterministic: np.load refuses every copy-on-write mapping with ENOMEM; the
    dataset still opens (read-only arrays, same values), and another OSError stays one line."""
    import errno

    import gnnio.graph.format as fmt

    want = {k: arr(ds_dir, k) for k in ("features", "indices", "labels")}
    real = np.load

    def refuse(f, mmap_mode=None, **kw):
        if mmap_mode == "c":
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(f, mmap_mode=mmap_mode, **kw)

    monkeypatch.setattr(fmt.np, "load", refuse)
    ds = gnnio.load(ds_dir, verify=True)
    assert not ds.features.flags.writeable
    got = {"features": ds.features, "indices": ds.graph.indices, "labels": ds.labels}
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)

    def eacces(f, mmap_mode=None, **kw):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fmt.np, "load", eacces)
    expect_error(ds_dir, "features.npy", "not a readable .npy file", "Permission denied")


# ---- the writer hashes the features and counts their non-finite values in one pass --------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
def test_one_pass_hash_and_count_equal_the_two_passes(tmp_path, dtype):
    """Chunks that cut values and rows anywhere (1000 bytes is no multiple of a row): the sha256
    is the whole file's and every NaN/inf is counted once, at the file's first value, across a
    chunk boundary and at its last value."""
    from gnnio.graph.format import count_nonfinite, sha256_and_nonfinite

    x = np.random.default_rng(0).standard_normal((97, 13)).astype(np.float32)
    flat = x.reshape(-1)
    for i, v in ((0, np.nan), (250, np.inf), (251, -np.inf), (flat.size - 1, np.nan)):
        flat[i] = v
    stored = {
        "float32": x,
        "float16": x.astype(np.float16),
        "bfloat16": (x.view(np.uint32) >> 16).astype(np.uint16).view(np.int16),
        "int8": np.nan_to_num(x).astype(np.int8),
    }[dtype]
    path = tmp_path / "features.npy"
    np.save(path, stored)
    want = 0 if dtype == "int8" else 4
    assert count_nonfinite(np.load(path), feat_dtype=dtype) == want
    for chunk in (1000, 4096, 1 << 24):
        assert sha256_and_nonfinite(path, dtype, chunk=chunk) == (sha256_file(path), want)


def test_the_writer_counts_a_nan_past_its_first_chunk(tmp_path):
    """The writer's own pass (16 MiB chunks) over 20 MB of features with one NaN, the very last
    value: refused unless allowed, then counted in meta.json, and the stored sha256 is the file's.
    Fails when the writer skips the count, or counts only the first chunk."""
    x = np.ones((5000, 1000), dtype=np.float32)
    x[-1, -1] = np.nan

    def write(out, **kw):
        with DatasetWriter(out, name="nan", **kw) as w:
            w.save_array("indptr", np.zeros(5001, dtype=np.int64))
            w.save_array("indices", np.zeros(0, dtype=np.int32))
            w.save_array("features", x)
        return w

    with pytest.raises(DatasetError, match="hold 1 NaN or infinite values"):
        write(tmp_path / "a")
    assert not (tmp_path / "a").exists()
    w = write(tmp_path / "b", allow_nonfinite=True)
    assert w.meta["nonfinite_features"] == 1
    f = tmp_path / "b" / "features.npy"
    assert w.meta["arrays"]["features"]["sha256"] == sha256_file(f)
    gnnio.load(tmp_path / "b", verify=True)
