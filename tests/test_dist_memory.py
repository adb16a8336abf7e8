"""Per-rank memory that shrinks with the shard (issue 26, item 5): what a rank holds for the
partitioned sampler and the sharded store is sized by its shard, except the documented per-node
arrays, at their narrowest dtypes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.distributed.sampling import _Shard
from tests.test_dist_sampling import _write


def test_a_shard_holds_nothing_sized_by_the_graph(tmp_path):
    d, pdirs = _write(tmp_path)
    n = 300
    for k in (0, 1):
        sh = _Shard(pdirs[0], k, n)
        stored = int(sh.nodes.shape[0])
        assert 0 < stored < n
        arrays = [v for k, v in vars(sh).items() if isinstance(v, np.ndarray) and k != "indices"]
        arrays += [v for v in vars(sh.index).values() if isinstance(v, np.ndarray)]
        assert len(arrays) >= 4 and all(a.shape[0] <= stored + 2 for a in arrays), [
            a.shape for a in arrays]  # fmt: skip
        # the bucketed search finds every stored node's row, and -1 for the others
        rows = sh.rows_of(np.arange(n))
        dense = np.full(n, -1)
        dense[np.asarray(sh.nodes)] = np.arange(stored)
        assert np.array_equal(rows, dense)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10_000), unique=True, max_size=60),
       st.lists(st.integers(0, 10_000), max_size=60))  # fmt: skip
def test_rows_of_matches_a_dense_map(nodes, ask):
    from gnnio.distributed._ids import ShardIndex

    nodes_a = np.asarray(nodes, dtype=np.int64)
    index = ShardIndex(nodes_a)
    dense = np.full(10_001, -1)
    dense[nodes_a] = np.arange(nodes_a.size)
    assert np.array_equal(index.rows_of(np.asarray(ask, dtype=np.int64)), dense[ask])
    # ids below 0 or past the largest stored one are not stored (no read out of the directory)
    far = np.array([-5, -1, -(1 << 40), 10_001, 1 << 40], dtype=np.int64)
    assert (index.rows_of(far) == -1).all()


def test_rows_of_searches_a_crowded_bucket():
    """A shard whose ids cluster (a range, and one far id) puts hundreds in one bucket: the
    lookup halves the bucket before scanning it and must still find every id."""
    from gnnio.distributed._ids import ShardIndex

    nodes = np.r_[np.arange(1000)[::-1], 100_000, 5000:5003]
    index = ShardIndex(nodes)
    assert np.diff(index.directory).max() > 100
    dense = np.full(100_001, -1)
    dense[nodes] = np.arange(nodes.size)
    assert np.array_equal(index.rows_of(np.arange(100_001)), dense)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=40, unique=True),
       st.lists(st.lists(st.integers(0, 300), max_size=200), max_size=4),
       st.integers(0, 400))  # fmt: skip
def test_batch_ids_number_ids_in_order_of_first_appearance(seeds, hops, expect):
    """The partitioned sampler's relabelling (a hash table grown by rehashing, sized up front
    for ``expect`` ids, too many or too few) against a dict: the single-process samplers'
    numbering (seeds, then each new id where it first occurs)."""
    from gnnio.distributed._ids import BatchIds

    ids = BatchIds(np.asarray(seeds), expect=expect)
    ref = {v: i for i, v in enumerate(seeds)}
    for hop in hops:
        got = ids.add(np.asarray(hop, dtype=np.int64))
        for v in hop:
            ref.setdefault(v, len(ref))
        assert got.tolist() == [ref[v] for v in hop]
        assert ids.ids().tolist() == list(ref)


def test_batch_ids_sized_by_the_last_batch_never_rehash():
    """A batch like the last one (``expect``: the ids that one numbered) fills a table sized
    for it and never grows it: the per-hop estimate, which runs ahead of a batch's falling rate
    of new ids, doubled the table on the last hop, and rehashed every hop."""
    from gnnio.distributed._ids import BatchIds

    rng = np.random.default_rng(0)
    seeds = rng.choice(1 << 20, 500, replace=False)
    pool = (1 << 20) + rng.permutation(40_000)  # hop 1: all new; hop 2: half new
    hops = [pool[:20_000], pool[rng.integers(0, 40_000, 60_000)]]
    first = BatchIds(seeds)
    out = [first.add(h) for h in hops]
    again = BatchIds(seeds, first.buffer, expect=first.n)
    assert [again.add(h).tolist() for h in hops] == [o.tolist() for o in out]
    assert first.rehashes > 0 and again.rehashes == 0
    assert again.cap == 1 << (2 * first.n - 1).bit_length()
    assert np.array_equal(again.ids(), first.ids())


def test_a_shard_held_as_tensors_samples_exactly_as_the_files(tmp_path):
    """The CUDA IPC reader (a peer's shard as tensors, its rows copied into a compact CSR),
    run on CPU tensors: the same counts and neighbours, pruned or not, and the same degrees."""
    from gnnio.sampling.threaded import _hop_key

    d, pdirs = _write(tmp_path)
    files = _Shard(pdirs[1], 0, 300)
    arrays = {n: torch.from_numpy(np.array(getattr(files, n))) for n in ("indptr", "indices")}
    held = _Shard(pdirs[1], 0, 300, arrays={"nodes": files.nodes, **arrays})
    assert held.tensors and not files.tensors
    rows = np.asarray(files.nodes)[::3].astype(np.int64)
    key = _hop_key(12345, 0)
    for theta in (None, 0, 5):
        a, b = files.sample(rows, 4, key, theta), held.sample(rows, 4, key, theta)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        assert a[1].size > 0
    assert np.array_equal(files.degrees(rows), held.degrees(rows))


# ----------------------------------------------------------------------------------------------
# a whole training run: nothing sized by the whole graph beyond the documented arrays


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A graph whose node and edge counts no batch-sized buffer reaches (20,000 nodes, batches of
    64 with fanouts 3,2: at most 640 rows), partitioned in 2."""
    import gnnio
    from gnnio.importers.synthetic import prepare_synthetic
    from gnnio.preprocess.partition import partition_dataset, save_partition

    root = tmp_path_factory.mktemp("mem")
    d = root / "g"
    prepare_synthetic(d, num_nodes=20_000, avg_degree=8, feat_dim=16, num_classes=4, seed=3,
                      split=(0.02, 0.01, 0.01), progress=False)  # fmt: skip
    ds = gnnio.load(d)
    part = partition_dataset(ds, 2, "random", seed=1, measure=False)
    return d, save_partition(part, ds.graph, root / "p")


@pytest.mark.parametrize(
    "extra, cache_maps",
    [
        ([], []),
        # a cache's misses read by pread, its maps counted; the static score's CSR pages dropped
        (["--cache-policy", "static", "--cache-size", "0.05"], ["int32"]),
        (["--cache-policy", "lru", "--cache-size", "0.05"], ["int32", "int32"]),
    ],
    ids=["default", "static-cache", "lru-cache"],
)
def test_a_rank_holds_no_whole_graph_array(big, tmp_path, extra, cache_maps):
    """Every rank, after its first epoch and at the end: no array or tensor with a dimension of
    N, N + 1 or E in anonymous memory but the store's lookup and trace, the partition book and
    a cache's maps, all counted in ``whole_graph_bytes_per_rank``, and none of the feature file,
    the dataset's CSR or labels or another rank's shard mapped (what made a rank's RSS grow with
    the graph: docs/benchmarks.md, issue 26)."""
    from tests.test_dist import run_cli

    d, p = big
    out = tmp_path / "census"
    args = ["train", str(d), "--nproc", "2", "--partition", str(p), "--epochs", "1",
            "--batch-size", "64", "--fanouts", "3,2", "--hidden", "8", "--quiet",
            "--summary", str(tmp_path / "s.json"), *extra]  # fmt: skip
    r = run_cli(args, env={"GNNIO_MEM_CHECK": str(out)}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    counted = summary["whole_graph_bytes_per_rank"]
    # every rank fixed glibc's mmap threshold before building anything (tests/test_heap.py)
    from gnnio.utils.heap import HEAP_MMAP_THRESHOLD, limit_heap

    on = limit_heap() is not None  # this process: glibc, no MALLOC_* tunables set
    assert summary["heap_mmap_threshold_per_rank"] == [HEAP_MMAP_THRESHOLD if on else None] * 2
    for rank in (0, 1):
        for when in ("epoch", "finish"):
            rec = json.loads((out / f"rank{rank}-{when}.json").read_text())
            anon = [a for a in rec["arrays"] if a["file"] is None]
            # the census sees the arrays kept on purpose (so it is not vacuous) ...
            kept = sorted(a["dtype"].replace("torch.", "") for a in anon if a["allowed"])
            assert kept == sorted(["int16", "int16", "int32", "int32", *cache_maps]), kept
            if when == "finish":  # the summary counts exactly what the rank keeps
                assert counted[rank] == sum(a["bytes"] for a in anon if a["allowed"])
            # ... and nothing else sized by the graph
            bad = [a for a in anon if not a["allowed"]]
            assert not bad, f"rank {rank} ({when}) holds {bad}"
            mapped = rec["mapped"]
            # (labels: a rank reads its seeds' by pread, never labels[seeds] through a mapping)
            for f in ("g/features.npy", "g/indices.npy", "g/indptr.npy", "g/labels.npy",
                      f"p/part{1 - rank}/indices.npy", f"p/part{1 - rank}/indptr.npy"):  # fmt: skip
                assert mapped.get(f, 0) == 0, f"rank {rank} ({when}) maps {mapped.get(f)} B of {f}"
            assert mapped.get(f"p/part{rank}/indices.npy", 0) > 0  # its own shard: sampled


# ----------------------------------------------------------------------------------------------
# host rows by pread: the rows of the mapping, counted alike, nothing mapped


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pread_rows_are_the_mapped_rows(tmp_path, dtype):
    from gnnio.distributed.hostrows import pread_rows_of
    from gnnio.distributed.memcheck import _mapped_by_file
    from gnnio.features.stores.mmap import MmapFeatureStore

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5000, 24)).astype(dtype)
    f = tmp_path / "x" / "features.npy"
    f.parent.mkdir()
    np.save(f, x)
    store = MmapFeatureStore(f)
    reader = pread_rows_of(store, num_threads=2)
    assert reader is not None
    ids = torch.from_numpy(rng.integers(0, 5000, 3000))  # any order, repeats
    out = torch.empty((4000, 24), dtype=store.dtype)
    got = reader.gather(ids, out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (3000, 24)
    assert torch.equal(got, torch.from_numpy(x[ids.numpy()]))
    assert store.counters.rows["disk"] == 3000  # counted as the store counts its gathers
    assert _mapped_by_file([f.parent]).get("x/features.npy", 0) == 0  # nothing of it mapped
    assert reader.gather(ids[:0], out).shape == (0, 24)
    # straight into given rows of a batch (what the sharded store does with its host rows)
    at = torch.randperm(4000)[:3000]
    rows = torch.zeros((4000, 24), dtype=store.dtype)
    assert reader.gather(ids, rows, at=at).data_ptr() == rows.data_ptr()
    assert torch.equal(rows[at], torch.from_numpy(x[ids.numpy()]))
    with pytest.raises(IndexError):
        reader.gather(ids[:2], rows, at=torch.tensor([0, 4000]))


def test_pread_rows_of_a_truncated_file_is_one_line(tmp_path):
    from gnnio.distributed.hostrows import pread_rows_of
    from gnnio.errors import DatasetError
    from gnnio.features.stores.mmap import MmapFeatureStore

    f = tmp_path / "features.npy"
    np.save(f, np.ones((100, 8), dtype=np.float32))
    store = MmapFeatureStore(f)
    reader = pread_rows_of(store)
    os.truncate(f, os.path.getsize(f) - 64)  # the last two rows gone
    with pytest.raises(DatasetError, match="short read"):
        reader.gather(torch.tensor([3, 99]), torch.empty((2, 8)))


def test_pread_rows_only_for_a_mapped_store_itself(tmp_path):
    from gnnio.distributed.hostrows import pread_rows_of
    from gnnio.features import InMemoryFeatureStore
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.features.stores.mmap import MmapFeatureStore

    f = tmp_path / "features.npy"
    np.save(f, np.ones((100, 8), dtype=np.float32))
    assert pread_rows_of(InMemoryFeatureStore(np.ones((10, 2), np.float32))) is None
    # a cache's state depends on what it is asked: its reads stay its own
    assert pread_rows_of(FeatureCache(MmapFeatureStore(f), 10, "fifo", tier="cache")) is None


# ----------------------------------------------------------------------------------------------
# opening a dataset or a partition does not leave the whole graph mapped


def test_load_leaves_no_csr_pages_mapped(big):
    import gnnio
    from gnnio.distributed.memcheck import _mapped_by_file

    d, _ = big
    ds = gnnio.load(d)  # validation reads indptr, indices and labels whole
    mapped = _mapped_by_file([d])
    for f in ("indptr", "indices", "labels"):
        assert mapped.get(f"g/{f}.npy", 0) == 0, (f, mapped)
    assert int(ds.graph.indices[5]) >= 0  # the arrays still read


def test_a_rank_checks_only_the_shard_it_reads(big, tmp_path):
    import shutil

    from gnnio.errors import UsageError
    from gnnio.preprocess.partition import load_partition

    _, p = big
    q = tmp_path / "p"
    shutil.copytree(p, q)
    bad = q / "part1" / "indices.npy"
    idx = np.load(bad)
    idx[0] = 10**6  # out of range: the sampler's kernels would read out of bounds
    np.save(bad, idx)
    load_partition(q, shards=[0])  # rank 0 never reads part 1's files
    for shards in ([1], None):
        with pytest.raises(UsageError, match="part1/indices.npy"):
            load_partition(q, shards=shards)


# ----------------------------------------------------------------------------------------------
# a rank's labels: only its seeds', read by pread, looked up as the [N] array is


def test_seed_labels_are_the_arrays_labels_read_by_pread(tmp_path):
    from gnnio.distributed.labels import SeedLabels, read_seed_labels
    from gnnio.distributed.memcheck import _mapped_by_file
    from gnnio.pipeline.loader import _is_label_map

    rng = np.random.default_rng(1)
    lab = rng.integers(-1, 7, 50_000).astype(np.int64)
    f = tmp_path / "g" / "labels.npy"
    f.parent.mkdir()
    np.save(f, lab)
    mm = np.load(f, mmap_mode="r")
    train, valid = rng.choice(50_000, 900, replace=False), rng.choice(50_000, 300, replace=False)
    got = read_seed_labels(mm, train, valid, None)
    assert isinstance(got, SeedLabels) and _is_label_map(got)
    assert _mapped_by_file([f.parent]).get("g/labels.npy", 0) == 0  # read by pread, not mapped
    ids = np.union1d(train, valid)
    assert len(got) == ids.size and got.nbytes == 16 * ids.size  # sized by the seeds, not N
    ask = torch.from_numpy(rng.permutation(ids)[:500])
    assert torch.equal(got[ask], torch.from_numpy(lab[ask.numpy()]))
    assert np.array_equal(got.numpy_of(valid), lab[valid])
    assert got[ask[:0]].shape == (0,)
    # the same from an array in memory (no file)
    assert torch.equal(read_seed_labels(lab, train, valid)[ask], got[ask])
    # a node it does not hold is an error, never a made-up label
    missing = np.setdiff1d(np.arange(50_000), ids)[:1]
    with pytest.raises(KeyError, match=str(int(missing[0]))):
        got[torch.from_numpy(missing)]


def test_seed_labels_of_a_truncated_file_is_one_line(tmp_path):
    from gnnio.distributed.labels import read_seed_labels
    from gnnio.errors import DatasetError

    f = tmp_path / "labels.npy"
    np.save(f, np.arange(1000, dtype=np.int64))
    mm = np.load(f, mmap_mode="r")
    os.truncate(f, os.path.getsize(f) - 80)  # the last ten labels gone
    assert int(read_seed_labels(mm, np.array([5]))[torch.tensor([5])][0]) == 5
    with pytest.raises(DatasetError, match="short read"):
        read_seed_labels(mm, np.array([3, 995]))


def test_pread_feature_store_gathers_as_the_mapped_store(tmp_path):
    """A rank's cache reads its misses through this store: the mapped store's rows, checks and
    counts, nothing of the file mapped."""
    from gnnio.distributed.hostrows import PreadFeatureStore
    from gnnio.distributed.memcheck import _mapped_by_file
    from gnnio.features import InMemoryFeatureStore
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.features.stores.mmap import MmapFeatureStore

    rng = np.random.default_rng(2)
    x = rng.standard_normal((3000, 12)).astype(np.float32)
    f = tmp_path / "x" / "features.npy"
    f.parent.mkdir()
    np.save(f, x)
    base = MmapFeatureStore(f)
    st = PreadFeatureStore(base, num_threads=2)
    ids = torch.from_numpy(rng.integers(0, 3000, 2000))
    assert torch.equal(st.gather(ids), torch.from_numpy(x[ids.numpy()]))
    out = torch.empty((2500, 12))
    assert st.gather(ids[:7], out=out).data_ptr() == out.data_ptr()
    cache = FeatureCache(st, 300, "lru", tier="cache")
    assert torch.equal(cache.gather(ids), torch.from_numpy(x[ids.numpy()]))
    assert _mapped_by_file([f.parent]).get("x/features.npy", 0) == 0
    mapped = MmapFeatureStore(f)  # counted as the mapped store counts its own gathers
    mapped.gather(ids), mapped.gather(ids[:7])
    st.counters.reset()
    st.gather(ids), st.gather(ids[:7])
    assert st.counters.snapshot() == base.counters.snapshot() == mapped.counters.snapshot()
    with pytest.raises(IndexError):
        st.gather(torch.tensor([3000]))
    with pytest.raises(TypeError):
        PreadFeatureStore(InMemoryFeatureStore(x))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seed_labels_on_a_gpu_look_up_as_on_the_cpu():
    """The loader moves a rank's labels to its GPU and looks seeds up there (no host sync)."""
    from gnnio.distributed.labels import read_seed_labels

    rng = np.random.default_rng(3)
    lab = rng.integers(-1, 5, 10_000).astype(np.int64)
    held = read_seed_labels(lab, rng.choice(10_000, 700, replace=False))
    gpu = held.to("cuda")
    ask = held.ids[torch.from_numpy(rng.integers(0, 700, 300))]
    assert gpu.device.type == "cuda"
    assert torch.equal(gpu[ask.cuda()].cpu(), held[ask])
    # (a seed it does not hold fails a device assertion: not tried here, it would leave the
    # CUDA context unusable for the tests after this one)


def test_batch_ids_grow_when_the_estimate_falls_short():
    """A hop of repeats (no new id: the estimate for the next is 0) then a hop of new ids: the
    table doubles (rehashing) until they fit, numbered in order; and it stays sized by the
    batch: a hop of one id repeated 10,000 times adds no slot beyond the estimate."""
    from gnnio.distributed._ids import BatchIds

    ids = BatchIds(np.array([7], dtype=np.int64))
    assert ids.add(np.full(50, 7, dtype=np.int64)).tolist() == [0] * 50 and ids.rate == 0
    small = ids.cap
    new = np.arange(100, 1100, dtype=np.int64)
    assert ids.add(new).tolist() == list(range(1, 1001))
    assert ids.cap > small and ids.n == 1001 <= ids.limit == ids.cap // 2
    assert ids.add(new[::-1]).tolist() == list(range(1000, 0, -1)) and ids.rate == 0
    cap = ids.cap
    assert ids.add(np.full(10_000, 5, dtype=np.int64)).tolist() == [1001] * 10_000
    assert ids.cap == cap and ids.ids()[-1] == 5
    # where the last hop's rate holds, the table grows once before the hop (a rehash of the ids
    # so far), not by doubling six times within it
    grow = BatchIds(np.arange(64, dtype=np.int64))
    assert grow.cap == 128  # (twice the seeds, a power of two already: not doubled again)
    assert grow.add(np.arange(64, 4096, dtype=np.int64)).tolist() == list(range(64, 4096))
    assert grow.rehashes == 1 and grow.add(np.arange(4096, 20_000)).size and grow.rehashes == 2
