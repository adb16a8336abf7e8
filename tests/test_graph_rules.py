"""Rules of the graph layer that the broader tests leave open (mutation-testing pass): the
transposed CSR, the integrity check's size boundary, meta.json's type checks, the int8 codec's
arithmetic, the feature checks' corner cases and the CLI's range types."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnio
from gnnio.errors import DatasetError
from gnnio.graph import CSRGraph
from gnnio.graph.format import META_FILE
from gnnio.graph.transpose import transpose_csr

from .helpers import write_tiny_dataset

CHECK = settings(deadline=None, max_examples=40)


@st.composite
def graphs(draw, max_nodes=20, max_edges=60):
    n = draw(st.integers(1, max_nodes))
    e = draw(st.integers(0, max_edges))
    ends = st.lists(st.integers(0, n - 1), min_size=e, max_size=e)
    src, dst = np.array(draw(ends), dtype=np.int64), np.array(draw(ends), dtype=np.int64)
    return CSRGraph.from_edges(src, dst, n, dedup=draw(st.booleans()))


# ---- transpose ---------------------------------------------------------------------------------


@CHECK
@given(graphs())
def test_transpose_is_the_reversed_csr_with_sorted_lists(g):
    """The counting-sort transpose equals ``reverse()`` exactly: out-neighbour lists ascending
    (the CSR convention of ``edges_to_csr``), so BFS walks over either visit nodes alike."""
    rptr, ridx = transpose_csr(g)
    rev = g.reverse()
    assert rptr.dtype == np.int64 and ridx.dtype == g.indices.dtype
    np.testing.assert_array_equal(rptr, rev.indptr)
    np.testing.assert_array_equal(ridx, rev.indices)


# ---- integrity ---------------------------------------------------------------------------------


def _edit_meta(ds_dir, fn):
    meta = json.loads((ds_dir / META_FILE).read_text())
    fn(meta)
    (ds_dir / META_FILE).write_text(json.dumps(meta))


def _drop_sample_hashes(meta):
    for info in meta["arrays"].values():
        info.pop("sample_sha256", None)


def test_an_array_of_exactly_sample_bytes_is_hashed_whole_without_a_sampled_hash(tmp_path):
    """A file of exactly SAMPLE_BYTES is "at most SAMPLE_BYTES": a dataset written before
    ``sample_sha256`` existed still gets its whole-file hash checked at open."""
    from gnnio.graph.format import DatasetWriter
    from gnnio.graph.integrity import SAMPLE_BYTES

    ds = write_tiny_dataset(tmp_path / "ds")
    np.save(tmp_path / "probe.npy", np.zeros(8, np.uint8))
    header = (tmp_path / "probe.npy").stat().st_size - 8
    extra = np.arange(SAMPLE_BYTES - header, dtype=np.int64).astype(np.uint8)
    arrays = {k: np.load(ds / f"{k}.npy") for k in ("indptr", "indices", "features", "labels")}
    with DatasetWriter(ds, name="tiny", overwrite=True) as w:
        for k, a in arrays.items():
            w.save_array(k, a)
        w.save_array("extra", extra)
    f = ds / "extra.npy"
    assert f.stat().st_size == SAMPLE_BYTES
    _edit_meta(ds, _drop_sample_hashes)  # as written by an older gnnio
    gnnio.load(ds)
    with open(f, "r+b") as fh:  # a byte in the middle, inside no block edge
        fh.seek(SAMPLE_BYTES // 2 + 3)
        fh.write(b"\xff")
    with pytest.raises(DatasetError, match="extra.npy: sha256 mismatch at open"):
        gnnio.load(ds)


def test_the_sampled_hash_covers_the_file_size(tmp_path):
    """Two files whose sampled blocks are alike but whose sizes differ (zeros, 8 bytes apart) have
    different sampled hashes: the size is part of what is hashed."""
    from gnnio.graph.integrity import SAMPLE_BYTES, sample_sha256

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(bytes(2 * SAMPLE_BYTES))
    b.write_bytes(bytes(2 * SAMPLE_BYTES + 8))
    assert sample_sha256(a) != sample_sha256(b)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (
            lambda m: m["arrays"]["labels"].update(shape=[-1]),
            "shape must be a list of integers >= 0",
        ),
        (lambda m: m["arrays"]["labels"].update(shape=[12.0]), "shape must be a list of integers"),
        (lambda m: m["arrays"]["labels"].update(sha256="A" * 64), "sha256 must be 64 lowercase"),
        (lambda m: m["arrays"]["labels"].update(sample_sha256=None), "sample_sha256 must be 64"),
        (lambda m: m["arrays"]["labels"].update(file="sub/labels.npy"), "is not a file name"),
        (lambda m: m.update(format_version=1.0), "format_version must be the integer 1"),
        (lambda m: m.update(format_version=2), "format_version 2 is not supported"),
        (lambda m: m.update(num_edges=-1), "num_edges must be an integer >= 0"),
        (lambda m: m.update(feat_dtype=16), "feat_dtype must be a string"),
    ],
)
def test_meta_values_of_the_wrong_kind_are_refused(tmp_path, edit, needle):
    """Each bad meta.json value is refused at open with one line naming its key."""
    ds = write_tiny_dataset(tmp_path / "ds")
    _edit_meta(ds, edit)
    with pytest.raises(DatasetError, match="meta.json") as ei:
        gnnio.load(ds)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf + -inf in the sum
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_infinities_count_as_non_finite_features(dtype):
    """count_nonfinite counts +inf and -inf as well as NaN, whatever the float width."""
    from gnnio.graph.integrity import count_nonfinite

    x = np.zeros((5, 3), dtype=dtype)
    x[0, 0], x[2, 1], x[4, 2] = np.inf, -np.inf, np.nan
    assert count_nonfinite(x) == 3
    assert count_nonfinite(x, chunk_bytes=1) == 3  # one row at a time


@pytest.mark.parametrize("chunk", [8, 1 << 20])
def test_one_pass_count_ignores_bytes_after_the_array(tmp_path, chunk):
    """sha256_and_nonfinite hashes bytes appended after the array but does not count them as
    values: a NaN's bits appended to a file with one NaN still count one."""
    from gnnio.graph.integrity import sha256_and_nonfinite, sha256_file

    f = tmp_path / "x.npy"
    np.save(f, np.array([[1.0, np.nan], [2.0, 3.0]], dtype=np.float32))
    with open(f, "ab") as fh:
        fh.write(np.full(4, np.nan, dtype=np.float32).tobytes())
    assert sha256_and_nonfinite(f, "float32", chunk=chunk) == (sha256_file(f), 1)


# ---- feature dtypes ----------------------------------------------------------------------------


def test_int8_codec_of_hand_worked_columns():
    """int8 parameters and codes by the module docstring, worked by hand: [0, 255] has scale 1
    and zero point -128; [-1, 0] has scale 1/255 and zero point 127; an all-zero column 0, 0."""
    from gnnio.graph import feature_dtype as fdt

    x = np.array([[0.0, -1.0, 0.0], [255.0, 0.0, 0.0], [100.4, -0.4, 0.0], [0.6, -0.0, 0.0]])
    scale, zp = fdt.int8_params(x.min(0), x.max(0))
    assert scale[0] == 1.0 and scale[2] == 0.0
    assert abs(scale[1] * 255.0 - 1.0) < 1e-6  # the float32 nearest 1/255 (or the next one up)
    np.testing.assert_array_equal(zp, np.float32([-128, 127, 0]))
    q = fdt.encode(x, "int8", scale, zp)
    # round(x / scale) + zp: 0 -> -128, 255 -> 127, 100.4 -> -28, 0.6 -> 1 - 128;
    # -1 * 255 + 127 = -128, 0 -> 127, -0.4 * 255 = -102 -> -102 + 127 = 25
    np.testing.assert_array_equal(q[:, 0], [-128, 127, -28, -127])
    np.testing.assert_array_equal(q[:, 1], [-128, 127, 25, 127])
    np.testing.assert_array_equal(q[:, 2], [0, 0, 0, 0])
    np.testing.assert_array_equal(fdt.decode(q, "int8", scale, zp)[:, 2], 0.0)


@CHECK
@given(
    st.floats(-1e30, 0.0, allow_subnormal=True),
    st.floats(0.0, 1e30, allow_subnormal=True),
)
def test_int8_scale_covers_the_whole_range(lo, hi):
    """The float32 scale, stretched over 255 steps, never falls short of the column's range."""
    from gnnio.graph import feature_dtype as fdt

    scale, zp = fdt.int8_params(np.array([lo]), np.array([hi]))
    assert float(scale[0]) * 255.0 >= hi - lo
    assert -128 <= zp[0] <= 127 and zp[0] == np.round(zp[0])


@pytest.mark.parametrize(
    "scale,zp,needle",
    [
        ([1.0, 0.5], [127.0, -128.0], None),  # the ends of the zero point's range are allowed
        ([1.0, 0.0], [0.0, 0.0], None),  # scale 0: an all-zero column
        ([1.0, 1.0], [128.0, 0.0], "zero points must be integers in [-128, 127]"),
        ([1.0, 1.0], [0.0, -129.0], "zero points must be integers in [-128, 127]"),
        ([1.0, 1.0], [0.5, 0.0], "zero points must be integers in [-128, 127]"),
        ([1.0, -1e-30], [0.0, 0.0], "a negative scale"),
    ],
)
def test_int8_codec_arrays_are_checked(tmp_path, scale, zp, needle):
    """check_codec accepts integer zero points in [-128, 127] and scales >= 0, nothing else."""
    from gnnio.graph import feature_dtype as fdt

    meta = {"feat_dtype": "int8", "feat_dim": 2, "arrays": {}}
    arrays = {fdt.SCALE: np.float32(scale), fdt.ZERO_POINT: np.float32(zp)}
    if needle is None:
        fdt.check_codec(tmp_path, meta, arrays)
    else:
        with pytest.raises(DatasetError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            fdt.check_codec(tmp_path, meta, arrays)


def test_float16_holds_its_largest_finite_value():
    """±65504, float16's largest finite value, encodes exactly; one float32 step beyond is refused."""
    from gnnio.graph import feature_dtype as fdt

    x = np.array([[65504.0, -65504.0]], dtype=np.float32)
    np.testing.assert_array_equal(fdt.encode(x, "float16").astype(np.float32), x)
    with pytest.raises(ValueError, match="beyond float16's range"):
        fdt.encode(np.nextafter(x, np.float32(np.inf)), "float16")


def test_bfloat16_infinities_and_nans_are_counted():
    """Stored bfloat16 bits count as non-finite when the exponent is all ones: +-inf and NaN,
    not the largest finite values."""
    import torch

    from gnnio.graph import feature_dtype as fdt

    vals = [np.inf, -np.inf, np.nan, 3.0e38, -3.0e38, 0.0, 1.0]
    bits = torch.tensor(vals, dtype=torch.float32).to(torch.bfloat16).view(torch.int16).numpy()
    assert fdt.count_nonfinite_encoded(bits, "bfloat16") == 3


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 100])
def test_column_range_in_chunks_equals_numpy(chunk_rows):
    """Per-column min and max are the same whatever the chunking."""
    from gnnio.graph import feature_dtype as fdt

    x = np.random.default_rng(3).standard_normal((7, 4)).astype(np.float32)
    lo, hi = fdt.column_range(x, chunk_rows=chunk_rows)
    np.testing.assert_array_equal(lo, x.min(0))
    np.testing.assert_array_equal(hi, x.max(0))


def test_recode_to_int8_in_chunks_uses_the_whole_columns_range(tmp_path):
    """Recoding to int8 a chunk of rows at a time finds each column's range over all chunks: the
    scales equal those of the whole matrix."""
    from gnnio.graph import feature_dtype as fdt

    x = np.random.default_rng(4).standard_normal((9, 3)).astype(np.float32)
    x[8] = [5.0, -7.0, 0.25]  # the extremes in the last chunk
    np.save(tmp_path / "features.npy", x)
    arrays = {"features": "features.npy"}
    fdt.recode_features(tmp_path, arrays, "float32", "int8", chunk_bytes=2 * 4 * 3)
    want_scale, want_zp = fdt.int8_params(x.min(0), x.max(0))
    np.testing.assert_array_equal(np.load(tmp_path / arrays[fdt.SCALE]), want_scale)
    np.testing.assert_array_equal(np.load(tmp_path / arrays[fdt.ZERO_POINT]), want_zp)


# ---- format ------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [1, -1])
def test_features_must_have_one_row_per_node_even_if_meta_agrees(tmp_path, extra):
    """A features file with a row more or fewer than num_nodes is refused at open, even when its
    meta.json entry (shape, sha256) was updated to match."""
    from gnnio.graph.integrity import sample_sha256, sha256_file

    ds = write_tiny_dataset(tmp_path / "ds")
    f = ds / "features.npy"
    x = np.load(f)
    x = np.concatenate([x, x[:1]]) if extra > 0 else x[:-1]
    np.save(f, x)

    def fix(m):
        m["arrays"]["features"].update(
            shape=list(x.shape), sha256=sha256_file(f), sample_sha256=sample_sha256(f)
        )

    _edit_meta(ds, fix)
    with pytest.raises(
        DatasetError, match=r"features.npy: must be float32 \(float32\) of shape \[12, F\]"
    ):
        gnnio.load(ds)


# ---- argparse range types ----------------------------------------------------------------------


def _refused(parse, text) -> str:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError) as ei:
        parse(text)
    return str(ei.value)


def test_int_range_bounds_are_inclusive():
    """int_range(least, most) accepts both ends and refuses one past each, naming the bound."""
    from gnnio.utils.argtypes import int_range

    p = int_range(1, 4096)
    assert p("1") == 1 and p("4096") == 4096
    assert _refused(p, "0") == "must be >= 1, got 0"
    assert _refused(p, "4097") == "must be at most 4096, got 4097"
    assert _refused(p, "1.5") == "invalid int value: '1.5'"
    assert int_range(0)("0") == 0 and int_range(0)(str(2**70)) == 2**70


def test_positive_floats_and_seconds():
    """positive_float takes finite values > 0 only; seconds_up_to also its (inclusive) limit."""
    from gnnio.utils.argtypes import positive_float, seconds_up_to

    assert positive_float("1e-300") == 1e-300
    for bad in ("0", "-1", "inf", "nan", "-inf"):
        assert "finite number > 0" in _refused(positive_float, bad)
    s = seconds_up_to(1e7)
    assert s("1e7") == 1e7
    assert _refused(s, "10000001") == "must be at most 1e+07 seconds, got 10000001"
    assert "finite number > 0" in _refused(s, "inf")


def test_fanouts_messages_lose_their_prefix_only():
    """fanouts_arg gives argparse the reason without the 'fanouts: ' / '--fanouts: ' prefix
    (argparse names the option itself)."""
    from gnnio.utils.argtypes import fanouts_arg

    assert fanouts_arg("15, 10,-1") == [15, 10, -1]
    assert _refused(fanouts_arg, "15,,5").startswith("an empty value between commas")
    assert _refused(fanouts_arg, "-2").startswith("each must be >= 0 or -1")


def test_common_ranges_reach_float_and_int_options_of_subcommands():
    """apply_common_ranges puts the range on int and float options of every subcommand, and
    leaves options of other types and other names alone."""
    import argparse

    from gnnio.utils.argtypes import COMMON_RANGES, apply_common_ranges

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd").add_parser("x")
    sub.add_argument("--threads", type=int)
    sub.add_argument("--dist-timeout", type=float)
    sub.add_argument("--seed", type=str)
    sub.add_argument("--other", type=int)
    apply_common_ranges(p)
    types = {a.dest: a.type for a in sub._actions}
    assert types["threads"] is COMMON_RANGES["threads"]
    assert types["dist_timeout"] is COMMON_RANGES["dist_timeout"]
    assert types["seed"] is str and types["other"] is int


# ---- pages -------------------------------------------------------------------------------------


def _present(a: np.ndarray) -> list[bool]:
    """Per page of ``a`` (page-aligned), whether it is mapped in this process (pagemap)."""
    import mmap

    page = mmap.PAGESIZE
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            f.seek(8 * (a.ctypes.data // page))
            raw = f.read(8 * (a.nbytes // page))
    except OSError:
        pytest.skip("no /proc/self/pagemap here")
    return [bool(v >> 63) for v in np.frombuffer(raw, dtype=np.uint64)]


def test_drop_pages_of_a_range_drops_every_page_it_touches_and_no_other(tmp_path):
    """drop_pages(arr, start, stop) drops the whole pages holding arr[start:stop], partial ones at
    both ends included, and keeps the others (seen in the process's page table)."""
    import mmap

    from gnnio.utils.pages import drop_pages

    page = mmap.PAGESIZE
    (tmp_path / "f").write_bytes(bytes(range(256)) * (4 * page // 256))
    if not hasattr(mmap, "MADV_DONTNEED"):
        pytest.skip("no madvise(MADV_DONTNEED) here")
    for mode in ("r", "c"):  # (read-only; copy-on-write, never written)
        a = np.memmap(tmp_path / "f", dtype=np.uint8, mode=mode, shape=(4 * page,))
        assert int(a.reshape(4, page)[:, :1].sum()) == 0  # (every page read once: mapped)
        assert _present(a) == [True] * 4
        drop_pages(a, page + 10, 2 * page + 5)  # ends inside pages 1 and 2
        assert _present(a) == [True, False, False, True], mode
        drop_pages(a)
        assert _present(a) == [False] * 4, mode


def test_drop_pages_keeps_a_copy_on_write_maps_written_pages(tmp_path):
    """A copy-on-write map's pages written in this process (gnnio.load's arrays, edited in memory)
    are never dropped, which would lose the writes: not by a range holding one, not by the whole
    map; its clean pages elsewhere still go."""
    import mmap

    from gnnio.utils.pages import drop_pages, written_pages

    page = mmap.PAGESIZE
    (tmp_path / "f").write_bytes(bytes(4 * page))
    if not hasattr(mmap, "MADV_DONTNEED"):
        pytest.skip("no madvise(MADV_DONTNEED) here")
    a = np.memmap(tmp_path / "f", dtype=np.uint8, mode="c", shape=(4 * page,))
    int(a.sum())  # (every page mapped, none written)
    assert written_pages(a.ctypes.data, a.nbytes) is False
    a[page + 7] = 5  # page 1 written
    assert written_pages(a.ctypes.data + page, page) is True
    assert written_pages(a.ctypes.data + 2 * page, 2 * page) is False
    drop_pages(a, 0, 2 * page)  # holds page 1: kept whole
    drop_pages(a)
    drop_pages(a.reshape(4, page), 1, 2)
    assert a[page + 7] == 5 and int(a.sum()) == 5
    drop_pages(a, 2 * page, 4 * page)  # clean pages: dropped
    assert _present(a)[2:] == [False, False]
