"""DiskFeatureStore (issue 25): O_DIRECT, page-aware, parallel reads; bit-identical rows; faults.

The shared FeatureStore contract runs over it too (``tests/test_feature_stores.py``)."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.errors import DatasetError
from gnnio.features import InMemoryFeatureStore, open_store
from gnnio.features.stores import _direct_io as dio
from gnnio.features.stores.disk import DiskFeatureStore
from tests.helpers import write_tiny_dataset

HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def refuse_o_direct_reads(monkeypatch, s: DiskFeatureStore) -> None:
    """``preadv`` fails with EINVAL while ``s``'s reader uses O_DIRECT (a filesystem that takes
    the flag at open and refuses it at read), then reads as usual."""
    real = os.preadv

    def refuse_direct(fd, bufs, off):
        if s._reader.direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(dio.os, "preadv", refuse_direct)


def _pages_of(offset: int, ids: np.ndarray, rb: int, block: int = 4096) -> set[int]:
    """Every block (4 KiB page by default) the rows ``ids`` touch, one row at a time (the
    reference)."""
    pages: set[int] = set()
    for i in np.unique(ids):
        a = offset + int(i) * rb
        pages.update(range(a // block, (a + rb - 1) // block + 1))
    return pages


@st.composite
def matrices_and_ids(draw):
    """Row sizes from 2 bytes to ~10 KiB (most of them not dividing a page), ids with repeats."""
    n = draw(st.integers(1, 300))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int8, np.float64]))
    dim = draw(st.sampled_from([1, 3, 7, 64, 100, 129, 1024, 1300]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    feats = (rng.standard_normal((n, dim)) * 50).astype(dtype)
    ids = np.array(draw(st.lists(st.integers(0, n - 1), max_size=200)), dtype=np.int64)
    if ids.size and draw(st.booleans()):
        ids = np.concatenate([ids, ids[: draw(st.integers(0, ids.size))]])  # more duplicates
    return feats, ids


@HYP
@given(
    data=matrices_and_ids(),
    small_buffer=st.booleans(),
    qd=st.sampled_from([1, 4, 16]),
    block=st.sampled_from([None, 512, 4096]),
)
def test_rows_are_bit_identical_to_the_in_memory_store(
    tmp_path_factory, data, small_buffer, qd, block
):
    feats, ids = data
    path = tmp_path_factory.mktemp("disk") / "f.npy"
    np.save(path, feats)
    # a 12 KiB buffer limit forces a batch into several chunks of rows
    kw = {"max_buffer_bytes": 3 * 4096} if small_buffer else {}
    disk = DiskFeatureStore(path, queue_depth=qd, max_run_pages=2, block_size=block, **kw)
    want = InMemoryFeatureStore(feats).gather(ids)
    got = disk.gather(ids)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.numpy().tobytes() == want.numpy().tobytes()
    assert disk.counters.snapshot()["rows"].get("disk", 0) == ids.size
    if not small_buffer:  # one chunk: every block read exactly once
        blocks = _pages_of(disk.offset, ids, disk.row_bytes, disk.block_size)
        assert disk.stats.pages_read == len(blocks)
        end = disk.offset + feats.nbytes  # the file's last block may be partial
        assert disk.stats.bytes_read == sum(
            min(disk.block_size, end - b * disk.block_size) for b in blocks
        )
    disk.close()


def test_pages_shared_by_rows_are_read_once(tmp_path):
    feats = np.arange(4096 * 4, dtype=np.float32).reshape(-1, 16)  # 64-byte rows, 64 per page
    path = tmp_path / "f.bin"
    feats.tofile(path)  # raw file: row 0 at byte 0
    s = DiskFeatureStore(path, dtype=np.float32, shape=feats.shape, block_size=4096)
    ids = np.array([0, 1, 63, 5, 5, 64, 127, 255], dtype=np.int64)  # pages 0, 1, 3
    assert s.gather(ids).numpy().tobytes() == feats[ids].tobytes()
    assert s.stats.pages_read == 3
    assert s.stats.unique_rows == 7
    assert s.stats.bytes_read == 3 * 4096
    assert s.stats.read_amplification == pytest.approx(3 * 4096 / (7 * 64))
    assert s.stats.reads == 2  # pages 0-1 in one read, page 3 in another


def test_a_batch_that_fits_the_buffer_is_read_in_one_chunk(tmp_path):
    # rows of 512 B after the 128-byte .npy header: row 7 straddles pages 0-1, row 8 is on page
    # 1, row 16 on page 2: three pages, the buffer limit. Counting 2 pages per first page would
    # cut the batch in three and read page 1 twice.
    path = tmp_path / "f.npy"
    feats = np.arange(40 * 128, dtype=np.float32).reshape(40, 128)
    np.save(path, feats)
    disk = DiskFeatureStore(path, max_buffer_bytes=3 * 4096, block_size=4096)
    assert disk.offset == 128
    got = disk.gather([16, 7, 8])
    assert got.numpy().tobytes() == feats[[16, 7, 8]].tobytes()
    assert disk.stats.pages_read == 3


def test_plan_pages_runs_and_positions():
    plan = dio.plan_pages(np.array([0, 4090, 3 * 4096 + 10]), 20, max_run_pages=1)
    assert plan.pages.tolist() == [0, 1, 3]
    assert plan.run_start.tolist() == [0, 1, 2] and plan.run_len.tolist() == [1, 1, 1]
    assert plan.span_pos.tolist() == [0, 4090, 2 * 4096 + 10]


def test_over_a_dataset_memmap_and_open_store(tmp_path):
    d = write_tiny_dataset(tmp_path / "ds", num_nodes=50, feat_dim=5)
    ds = open_store(str(d), "memory", progress=False)
    disk = DiskFeatureStore(__import__("gnnio").load(d).features)
    ids = np.arange(50)[::-1]
    assert disk.gather(ids).numpy().tobytes() == ds.gather(ids).numpy().tobytes()
    view = __import__("gnnio").load(d).features[7:]  # a view of the mapping: its own offset
    sub = DiskFeatureStore(view)
    assert sub.gather([0, 3]).numpy().tobytes() == ds.gather([7, 10]).numpy().tobytes()


@pytest.mark.parametrize("block", [None, 4096])
def test_direct_reads_are_device_reads(tmp_path, block):
    """With O_DIRECT the page cache serves nothing: reading the same rows twice costs the
    device twice, and the kernel's read_bytes grows by what the store counted (whole blocks:
    512-byte sectors where the device takes them, else 4 KiB pages)."""
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io on this system")
    feats = np.random.default_rng(0).standard_normal((20000, 64)).astype(np.float32)
    path = tmp_path / "f.npy"
    np.save(path, feats)
    s = DiskFeatureStore(path, block_size=block)
    if not s.direct:
        pytest.skip("this filesystem refuses O_DIRECT")
    ids = np.random.default_rng(1).integers(0, 20000, 5000)
    before = _read_bytes()
    s.gather(ids)
    s.gather(ids)
    delta = _read_bytes() - before
    if delta == 0:
        pytest.skip("the kernel does not count this filesystem's reads (tmpfs?)")
    assert s.stats.pages_read == 2 * len(_pages_of(s.offset, ids, 256, s.block_size))
    assert s.stats.bytes_read == s.stats.pages_read * s.block_size
    assert abs(delta - s.stats.bytes_read) <= 0.1 * s.stats.bytes_read


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(ln for ln in f if ln.startswith("read_bytes:")).split()[1])


def test_sub_page_blocks_where_the_device_takes_them(tmp_path):
    """3,200-byte rows (800 float32, issue 25's larger-than-RAM graph): read in 512-byte sectors
    they cost 1.16x their bytes, in 4 KiB pages 2.2x; the rows are the same."""
    feats = np.random.default_rng(0).standard_normal((4000, 800)).astype(np.float32)
    path = tmp_path / "f.npy"
    np.save(path, feats)
    auto = DiskFeatureStore(path)
    if not auto.direct:
        pytest.skip("this filesystem refuses O_DIRECT")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:  # what the device takes, by trying, independently of the store
        buf = dio.mmap.mmap(-1, 8192)
        try:
            os.preadv(fd, [memoryview(buf)[512:1024]], 512)
            takes_512 = True
        except OSError:
            takes_512 = False
        finally:
            buf.close()
    finally:
        os.close(fd)
    assert auto.block_size == (512 if takes_512 else 4096)
    if not takes_512:
        pytest.skip("this device takes no O_DIRECT read smaller than a page")
    pages = DiskFeatureStore(path, block_size=4096)
    ids = np.random.default_rng(1).choice(4000, 500, replace=False)
    assert auto.gather(ids).numpy().tobytes() == feats[ids].tobytes()
    assert pages.gather(ids).numpy().tobytes() == feats[ids].tobytes()
    assert auto.stats.pages_read == len(_pages_of(auto.offset, ids, 3200, 512))
    assert auto.stats.bytes_read == 512 * auto.stats.pages_read
    assert auto.stats.read_amplification < 1.2 < 2.0 < pages.stats.read_amplification
    assert auto.stats.as_dict()["block_bytes"] == 512


def test_a_device_without_sub_page_reads_gets_pages(tmp_path, monkeypatch, caplog):
    """Where O_DIRECT refuses reads smaller than a page (EINVAL), the store reads 4 KiB pages,
    still O_DIRECT, without a warning."""
    feats = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    path = tmp_path / "f.npy"
    np.save(path, feats)
    real = os.preadv

    def pages_only(fd, bufs, off):
        if off % 4096 or len(bufs[0]) % 4096:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(dio.os, "preadv", pages_only)
    with caplog.at_level(logging.WARNING, logger="gnnio.features.stores.disk"):
        s = DiskFeatureStore(path)
        ids = np.arange(0, 1000, 7)
        assert s.gather(ids).numpy().tobytes() == feats[ids].tobytes()
    if not s.direct:
        pytest.skip("this filesystem refuses O_DIRECT")
    assert s.block_size == 4096 and s.stats.pages_read == len(_pages_of(s.offset, ids, 12))
    assert caplog.records == []
    with pytest.raises(ValueError, match="block must be one of"):
        DiskFeatureStore(path, block_size=256)


def test_no_o_direct_at_open_falls_back_with_one_line(tmp_path, monkeypatch, caplog):
    feats = np.arange(300, dtype=np.float32).reshape(100, 3)
    path = tmp_path / "f.npy"
    np.save(path, feats)
    real_open = os.open

    def no_direct(p, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a)

    monkeypatch.setattr(dio.os, "open", no_direct)
    with caplog.at_level(logging.WARNING, logger="gnnio.features.stores.disk"):
        s = DiskFeatureStore(path)
    assert not s.direct
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "O_DIRECT" in msgs[0] and "buffered" in msgs[0]
    assert "\n" not in msgs[0]
    assert s.gather([5, 1, 5]).numpy().tobytes() == feats[[5, 1, 5]].tobytes()


def test_no_o_direct_at_read_falls_back_with_one_line(tmp_path, monkeypatch, caplog):
    feats = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    path = tmp_path / "f.npy"
    np.save(path, feats)
    s = DiskFeatureStore(path)
    refuse_o_direct_reads(monkeypatch, s)
    ids = np.arange(0, 1000, 7)
    with caplog.at_level(logging.WARNING, logger="gnnio.features.stores.disk"):
        got = s.gather(ids)
        s.gather(ids)
    assert got.numpy().tobytes() == feats[ids].tobytes()
    assert not s.direct
    assert len(caplog.records) == 1


def test_truncated_file_is_one_line(tmp_path):
    feats = np.ones((1000, 8), dtype=np.float32)
    path = tmp_path / "f.npy"
    np.save(path, feats)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(DatasetError, match="truncated") as e:
        DiskFeatureStore(path)
    assert "\n" not in str(e.value)
    with open(path, "r+b") as f:  # whole again; opened; then cut under the open store
        f.truncate(size)
    s = DiskFeatureStore(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(DatasetError, match="truncated") as e:
        s.gather([999])
    assert "\n" not in str(e.value)
    assert s.gather([0]).shape == (1, 8)  # rows before the cut still read


def test_eio_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "f.npy"
    np.save(path, np.ones((5000, 8), dtype=np.float32))
    s = DiskFeatureStore(path, queue_depth=4)

    def eio(fd, bufs, off):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(dio.os, "preadv", eio)
    for ids in ([3], np.arange(0, 5000, 97)):  # inline and through the reader threads
        with pytest.raises(DatasetError, match="read error at byte .*Input/output error") as e:
            s.gather(ids)
        assert "\n" not in str(e.value)


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="no such"):
        DiskFeatureStore(tmp_path / "missing.npy")
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"\0" * 64)
    with pytest.raises(DatasetError, match="dtype= and shape="):
        DiskFeatureStore(raw)
    with pytest.raises(ValueError, match="dim 0"):
        DiskFeatureStore(raw, dtype=np.float32, shape=(4, 0))
    with pytest.raises(TypeError):
        DiskFeatureStore(torch.zeros(3, 3))


def test_bench_disk_prints_the_issue_keys(tmp_path, capsys):
    import json

    from gnnio.cli.main import main
    from gnnio.importers.synthetic import prepare_synthetic

    d = tmp_path / "g"
    prepare_synthetic(d, num_nodes=2000, avg_degree=6, feat_dim=32, num_classes=4, seed=0,
                      progress=False)  # fmt: skip
    argv = ["bench", "disk", str(d), "--json", "--epochs", "2", "--batches", "3", "--fanouts",
            "3,3", "--batch-size", "64", "--random-reads", "300", "--seq-mib", "1", "--repeats",
            "1", "--sizes", "0.1", "--policies", "static,sieve,s3fifo,lookahead,optimal",
            "--lookahead", "2"]  # fmt: skip
    rc = main(argv)
    cap = capsys.readouterr()
    out = cap.out.strip().splitlines()[-1]
    if rc == 2:
        pytest.skip("this filesystem refuses O_DIRECT")
    assert "disk ceilings" in cap.err and "disk configurations" in cap.err  # progress bars
    r = json.loads(out)
    for key in ("seq_read_GBps", "random_4k_iops", "random_read_fraction_of_ceiling", "memory",
                "disk", "disk_bytes_by_policy"):  # fmt: skip
        assert key in r
    assert r["random_read_fraction_of_ceiling"] > 0
    assert r["block_bytes"] in (512, 1024, 2048, 4096)
    if r["block_bytes"] < 4096:  # sub-page blocks, compared with 4 KiB pages in the same run
        assert r["rows_per_s_over_4k"] > 0 and r["random_block_iops"] > 0
        assert r["store_read_amplification"] < r["store_4k_read_amplification"]
    assert [(c["policy"], c["host_cache"]) for c in r["disk"]] == [
        ("none", 0.0), ("static", 0.1), ("sieve", 0.1), ("s3fifo", 0.1),
        ("lookahead", 0.1), ("optimal", 0.1)]  # fmt: skip
    for c in r["disk"]:
        assert c["disk_bytes"] > 0 and len(c["epoch_s"]) == 2
        assert {"first_epoch_s", "steady_epoch_s", "ratio_to_bound", "ratio_to_run_ceiling",
                "ceiling_MBps"} <= set(c)  # fmt: skip
        assert c["replayed"] == (c["policy"] == "optimal")
    ratios = r["disk_bytes_over_optimal"]["0.1"]
    assert (
        ratios["optimal"] == 1.0
        and ratios["sieve"] == r["disk"][2]["disk_bytes"] / r["disk"][5]["disk_bytes"]
    )
    assert r["lookahead_over_best"]["0.1"] == r["disk"][4]["disk_bytes"] / min(
        c["disk_bytes"] for c in r["disk"][1:4]
    )
    assert r["disk"][1]["host_cache_hit_ratio"] > 0  # the static cache serves rows
    assert main(["bench", "disk", str(d), "--sizes", "2"]) == 2
    assert main(["bench", "disk", str(d), "--policies", "belady"]) == 2
    capsys.readouterr()
    small = ["--epochs", "1", "--batches", "1", "--fanouts", "3", "--batch-size", "64",
             "--random-reads", "50", "--seq-mib", "1", "--repeats", "1", "--sizes", "0.1",
             "--policies", "static", "--json"]  # fmt: skip
    for quiet in ("--quiet", "--no-progress"):  # like the other benches: no progress bars
        assert main(["bench", "disk", str(d), *small, quiet]) == 0
        cap = capsys.readouterr()
        assert "disk" not in cap.err and "it/s" not in cap.err and "%|" not in cap.err, cap.err
        assert json.loads(cap.out.strip().splitlines()[-1])["disk"][1]["policy"] == "static"
