"""The FIFO and static caches' batch as Triton kernels (gnnio.features.caches._triton_cache; issue
24, items 2 and 5), run in Triton's interpreter: batch by batch the host path's rows, maps,
cursors, clock, stats and tier counters (the cache's and the backing's), over every backing that
says where its rows lie (an in-memory store, tiered stores in prefix and lookup mode, 0 % to 100 %
hot); few host operations per batch and no sync; a kernel that cannot build leaves the cache as
it was and the batch runs in torch ops; and the kernels build for a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import COUNTING_SPY, run_in_triton_interpreter

#: a script fragment: ``pair(kind, hot, policy, cap)`` -> (fused cache, host-path cache, the
#: fused cache's backing, the host one's), ``same(a, b, sa, sb)`` compares everything a batch
#: changes, ``feats`` the rows
PAIRS = r"""
import warnings
import numpy as np, torch
from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.cache import FeatureCache
from gnnio.features.tiers.simdevice import SimulatedDevice
from gnnio.features.tiers.tiered import TieredFeatureStore
from gnnio.utils import triton_kernels
from gnnio.utils.syncs import OpCounter

warnings.simplefilter("error", RuntimeWarning)
N = 240
g = torch.Generator().manual_seed(11)
feats = torch.randn(N, 5, generator=g)
hot_ids = torch.randperm(N, generator=g)
COUNTS = ("batches", "queries", "unique_queries", "hits", "misses", "insertions", "evictions",
          "fetched_bytes", "hit_bytes")


def backing(kind, hot):
    if kind == "memory":
        return InMemoryFeatureStore(feats)
    if kind == "prefix":
        return TieredFeatureStore(feats, hot, simulate=SimulatedDevice())
    return TieredFeatureStore(feats, hot_ids=hot_ids[-hot:] if hot else hot_ids[:0],
                              simulate=SimulatedDevice())


def pair(kind, hot, policy, cap):
    sa, sb = backing(kind, hot), backing(kind, hot)
    mk = lambda s, free: FeatureCache(s, cap, policy, hot_ids=hot_ids.numpy(), sync_free=free)
    return mk(sa, True), mk(sb, False), sa, sb


def same(a, b, sa, sb):
    assert torch.equal(a.policy.slot_of, b.policy.slot_of)
    assert torch.equal(a.policy.key_of, b.policy.key_of)
    if a.policy.dynamic:
        assert a.state_dict()["clock"] == b.state_dict()["clock"]
        a.policy.sync_cursors()
        assert (a.policy.head, a.policy.filled) == (b.policy.head, b.policy.filled)
        held = b.policy.key_of >= 0
        assert torch.equal(a.buffer[held], b.buffer[held])  # the rows behind the maps
    da, db = a.stats.as_dict(), b.stats.as_dict()
    assert {k: da[k] for k in COUNTS} == {k: db[k] for k in COUNTS}, (da, db)
    assert abs(da["hit_ratio_sum"] - db["hit_ratio_sum"]) <= 1e-12 * max(1, db["hit_ratio_sum"])
    assert a.counters.snapshot() == b.counters.snapshot()
    assert sa.counters.snapshot() == sb.counters.snapshot()
"""

REPLAY = (
    PAIRS
    + r"""
rng = np.random.default_rng(3)
cases = [("memory", 0), ("prefix", 0), ("prefix", 90), ("prefix", N), ("lookup", 90),
         ("lookup", N)]
sizes = [60, 1, 60, 0, 200, 60, 7, 150]  # an empty batch; one bigger than any cache below
for policy in ("fifo", "static"):
    for kind, hot in cases:
        for cap in (0, 1, 25, 100, N):
            a, b, sa, sb = pair(kind, hot, policy, cap)
            for i, size in enumerate(sizes):
                ids = torch.from_numpy(rng.integers(0, N // (1 + i % 3), size))
                if size > 20:
                    ids[:10] = ids[10:20]  # repeats
                if i == 5:
                    ids = ids.to(torch.int32)
                out = torch.full((size + 3, 5), 7.0)
                with OpCounter() as c:
                    got = a.gather(ids, out=out)
                assert c.syncs == 0, dict(c.sync_ops)
                assert torch.equal(got, feats[ids.long()]) and (out[size:] == 7).all()
                assert torch.equal(b.gather(ids), got)
                same(a, b, sa, sb)
# other dtypes and a power-of-two width (no padded lanes)
for dtype, dim in ((torch.float16, 8), (torch.bfloat16, 16), (torch.int64, 3)):
    f2 = (100 * torch.randn(N, dim, generator=g)).to(dtype)
    for policy in ("fifo", "static"):
        mk = lambda free: FeatureCache(TieredFeatureStore(f2, 40, simulate=SimulatedDevice()), 30,
                                       policy, hot_ids=hot_ids.numpy(), sync_free=free)
        a, b = mk(True), mk(False)
        for i in range(4):
            ids = torch.from_numpy(rng.integers(0, N, 70))
            got = a.gather(ids)
            assert torch.equal(got, f2[ids]) and torch.equal(b.gather(ids), got)
            same(a, b, a.backing, b.backing)
rep = triton_kernels.kernels_report()
assert rep["cache"] == "triton" and rep["fallbacks"] == 0, rep
print("ok")
"""
)


def test_the_fused_batch_equals_the_host_path():
    """FIFO and static, capacities 0 to all rows, batches empty to larger than the cache (only
    the last ``capacity`` misses inserted), repeats, int32 ids, ``out=``, float16, bfloat16 and
    int64 rows: everything equal after every batch. Fails when a kernel's lookup, copy,
    admission (e.g. the new id's ``slot_of`` entry not written), cursor, clock or count is
    wrong."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(REPLAY)


OPS = (
    COUNTING_SPY
    + PAIRS
    + r"""
from gnnio.features.caches import _triton_cache as tc

for name in ("_claim", "_flags", "_serve", "_admit", "_static", "_book_static"):
    setattr(tc, name, Spy(name, getattr(tc, name)))
# Before (the sync-free path in torch ops over this backing, main at ac1c3cf): FIFO 166 torch
# ops and 4 launches, static 77 and 2; after: FIFO 7 ops (3 of them the CPU ids' conversion,
# ids_on) and 4 launches plus one scan, static 4 ops and 2 launches
for policy, most_ops, want in (("fifo", 10, {"_claim": 1, "_flags": 1, "_serve": 1, "_admit": 1}),
                               ("static", 6, {"_static": 1, "_book_static": 1})):
    a, b, sa, sb = pair("prefix", 0, policy, 60)
    for i in range(4):
        ids = torch.randint(0, N, (300,), generator=g)
        launches.clear()
        c = state["c"] = OpCounter()
        with c:
            got = a.gather(ids)
        state["c"] = None
        assert torch.equal(got, b.gather(ids))
        if i:  # warm (the scratch, cursors and accumulators exist)
            assert c.syncs == 0 and c.ops <= most_ops, (policy, c.ops, dict(c.sync_ops))
            assert dict(launches) == want, (policy, launches)
    same(a, b, sa, sb)
print("ok")
"""
)


def test_host_ops_per_batch_as_a_gpu_runs_it():
    """The fused batch dispatches few torch ops and the launches above, no sync: held to the
    counts measured when it was built (a regression of a few ops fails)."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(OPS)


OTHERS = (
    PAIRS
    + r"""
from gnnio.features.caches.cache import static_plus_dynamic

# the cache's tier is its backing's (one accumulator would be booked twice): torch ops
a = FeatureCache(InMemoryFeatureStore(feats), 30, "fifo", tier="host", sync_free=True)
b = FeatureCache(InMemoryFeatureStore(feats), 30, "fifo", tier="host", sync_free=False)
for i in range(3):
    ids = torch.randint(0, N, (80,), generator=g)
    assert torch.equal(a.gather(ids), b.gather(ids))
    same(a, b, a.backing, b.backing)
assert triton_kernels.kernels_report()["cache"] == "torch"
# a static part over a FIFO part: the static one's backing is a cache (torch ops), the FIFO
# one's an in-memory store (the kernels)
triton_kernels.reset_kernel_record()
mk = lambda free: static_plus_dynamic(InMemoryFeatureStore(feats), 20, 30, hot_ids.numpy())
a, b = mk(True), mk(False)
a.sync_free = a.backing.sync_free = True
b.sync_free = b.backing.sync_free = False
for i in range(4):
    ids = torch.randint(0, N, (80,), generator=g)
    assert torch.equal(a.gather(ids), feats[ids]) and torch.equal(b.gather(ids), feats[ids])
    same(a, b, a.backing, b.backing)
    same(a.backing, b.backing, a.backing.backing, b.backing.backing)
assert triton_kernels.kernels_report()["cache"] == "torch+triton"
# a batch too large for the FIFO kernels' int32 offsets (5 n >= 2^31 - 1; the bound made small
# here): torch ops, and the kernels again after it (the torch ops' sentinel writes unread)
from gnnio.features.caches import _triton_cache as tc

tc._I32_MAX = 5 * 100
a, b, sa, sb = pair("prefix", 0, "fifo", 30)
for size, impl in ((99, "triton"), (100, "torch"), (60, "triton")):
    triton_kernels.reset_kernel_record()
    ids = torch.randint(0, N, (size,), generator=g)
    assert torch.equal(a.gather(ids), feats[ids]) and torch.equal(b.gather(ids), feats[ids])
    same(a, b, sa, sb)
    assert triton_kernels.kernels_report()["cache"] == impl, (size, impl)
print("ok")
"""
)


def test_where_the_kernels_do_not_apply_torch_ops_serve():
    """A cache whose tier is its backing's, a cache over a cache (no ``device_rows``), and a FIFO
    batch past the kernels' int32 offsets run the torch ops; stacked over a fused one, every
    level still equals the host path, and a fused batch after a torch one too."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(OTHERS)


FAIL = (
    PAIRS
    + r"""
BROKEN = "@KERNEL@"
from gnnio.features.caches import _triton_cache as tc

warnings.simplefilter("default", RuntimeWarning)


class Broken:  # the last kernel of the batch fails to launch, as a build error would
    def __getitem__(self, grid):
        def run(*a, **k):
            raise RuntimeError("no such instruction")
        return run


a, b, sa, sb = pair("prefix", 0, "fifo", 40)
for i in range(5):
    if i == 2:
        setattr(tc, BROKEN, Broken())
    ids = torch.randint(0, N, (90,), generator=g)
    ids[:10] = ids[10:20]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = a.gather(ids)
    msgs = [str(x.message) for x in w if "cache_batch" in str(x.message)]
    assert len(msgs) == (1 if i == 2 else 0), msgs
    assert torch.equal(got, feats[ids]) and torch.equal(b.gather(ids), got)
    same(a, b, sa, sb)
    assert bool((a._dedup.pos == 2**31 - 1).all())
rep = triton_kernels.kernels_report()
assert rep["cache"] == "torch+triton" and rep["fallbacks"] == 1, rep
print("ok")
"""
)


@pytest.mark.parametrize("kernel", ["_serve", "_admit"])
def test_a_kernel_that_fails_leaves_the_cache_as_it_was_and_torch_ops_serve(kernel):
    """A kernel failing to launch (``_serve``: after the dedup claimed its scratch; ``_admit``:
    the one that changes the cache): one warning, that batch and the later ones in torch ops,
    every state equal to the host path's, the dedup scratch at rest. Fails when the failed batch
    is half-applied or the scratch is left dirty."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(FAIL.replace("@KERNEL@", kernel))


def test_the_kernels_build_for_a_gpu_on_this_machine():
    """Every kernel compiles to an sm_90 cubin (no GPU needed; the interpreter accepts code a GPU
    compiler refuses), with and without the backing's lookup table, int32 and int64 maps; the
    hit ratio's float64 division is the correctly rounded one, as the host path's."""
    pytest.importorskip("triton")
    from gnnio.features.caches import _triton_cache as T
    from tests.helpers import compile_for_sm90

    def sig(fn, i64: str, i32: str = "", scalars: str = "") -> dict:
        types = {k: "*i64" for k in i64.split()} | {k: "*i32" for k in i32.split()}
        types |= {k: "i64" for k in scalars.split()} | {"stats": "*fp64"}
        types |= {k: "*fp32" for k in ("buf", "hot", "cold", "dst")}
        return {a: types.get(a, "constexpr") for a in fn.arg_names}

    rows = {"W": 100, "WP": 128, "BR": 32}
    books = "scr c_tier c_bh c_bc b_bh b_bc"
    cases = [(T._claim, sig(T._claim, "ids", "pos", "n"), {"BLOCK": 1024})]
    for maps in ("i32", "i64"):
        m32 = "slot_of" if maps == "i32" else ""
        m64 = "" if m32 else "slot_of"
        cases += [
            (T._flags, sig(T._flags, f"ids ws {m64}", f"pos {m32}", "n"), {"BLOCK": 1024}),
            (
                T._admit,
                sig(T._admit, f"ids ws ranks key_of cur clock {books} {m64}", m32, "n cap rb"),
                rows,
            ),
            *(
                (
                    T._static,
                    sig(T._static, f"ids scr {m64}", f"table {m32}", "prefix n"),
                    rows | {"HAS_TABLE": t},
                )
                for t in (False, True)
            ),
        ]
    cases += [
        *(
            (
                T._serve,
                sig(T._serve, "ids ws ranks key_of cur scr", "pos table", "prefix n cap"),
                rows | {"HAS_TABLE": t},
            )
            for t in (False, True)
        ),
        (T._book_static, sig(T._book_static, books, "", "n rb"), {}),
    ]
    for fn, types, const in cases:
        k = compile_for_sm90(fn, types, const)
        if fn in (T._admit, T._book_static):
            assert "div.rn.f64" in k.asm["ptx"], fn.fn.__name__
        if fn is T._book_static:  # the books' read-then-write is one thread's: every store of
            # a scalar is predicated (thread 0), else a lagging warp would load the new value
            # and store it again with the batch added twice
            stores = [ln.strip() for ln in k.asm["ptx"].splitlines() if "st.global" in ln]
            assert stores and all(ln.startswith("@%p") for ln in stores), stores


#: the replay on a real GPU: compiled kernels on many threads, where the ordering within a
#: program that the kernels rely on (each value's store owned by one thread; no kernel reads an
#: element it writes) is real, not the interpreter's sequential one; rows zero-copy from pinned
#: host memory (tiered) or in GPU memory (in-memory store on the device). Also what only a GPU
#: shows: a capacity of 1 (Triton compiles an int argument equal to 1 as a constant), every
#: other batch on a side stream (the loader's gather stream: the launches and the torch ops
#: between them must share the caller's current stream), batches of many programs in several
#: waves over other dtypes and widths (one row per program past 4096 elements), no sync by CUDA's
#: own sync check, and the float64 hit-ratio sum bit for bit the host path's. Without CUDA (the
#: interpreter dry-run below) the same script runs on the CPU, smaller.
ON_CUDA = (
    PAIRS.replace("simulate=SimulatedDevice()", "**ON").replace(
        "InMemoryFeatureStore(feats)", "InMemoryFeatureStore(feats.to(DEV))"
    )
    + r"""
import contextlib
from gnnio.features.base import ids_in_range

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
ON = {"device": "cuda"} if CUDA else {"simulate": SimulatedDevice()}
SIDE = torch.cuda.Stream() if CUDA else None
MANY, BIG = (4000, 200_000) if CUDA else (300, 600)  # ids in a batch of many programs
CAPS = (0, 1, 25, 100, N) if CUDA else (1, 25)  # (the interpreter's replay above has them all)


@contextlib.contextmanager
def side(on):
    # as the loader's gather thread: the batch queued on another stream, read after its event
    if not (CUDA and on):
        yield
        return
    SIDE.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(SIDE):
        yield
    torch.cuda.current_stream().wait_stream(SIDE)


@contextlib.contextmanager
def no_sync():
    if CUDA:  # CUDA's own check: a synchronizing call raises
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        with OpCounter() as c:
            yield
        assert c.syncs == 0, dict(c.sync_ops)


rng = np.random.default_rng(5)
for policy in ("fifo", "static"):
    for kind, hot in (("memory", 0), ("prefix", 0), ("prefix", 90), ("lookup", 90), ("lookup", N)):
        for cap in CAPS:
            a, b, sa, sb = pair(kind, hot, policy, cap)
            assert a.device.type == DEV
            for i, size in enumerate((60, 1, 0, 200, 60, 150, MANY)):  # the last: many programs
                ids = torch.from_numpy(rng.integers(0, N // (1 + i % 3), size)).to(DEV)
                with side(i % 2):
                    got = a.gather(ids)
                assert torch.equal(got.cpu(), feats[ids.cpu()])
                assert torch.equal(b.gather(ids), got)
                same(a, b, sa, sb)

# several waves of programs, other dtypes and widths; two fused caches and the host path fed the
# same batches, the stats read once at the end: equal bit for bit (hit-ratio sum included)
for dtype, rows, dim, kind in ((torch.float32, 100_000, 100, "prefix"),
                               (torch.float16, 20_000, 8, "lookup"),
                               (torch.int64, 20_000, 3, "memory"),
                               (torch.float32, 2_000, 4100, "lookup")):  # fmt: skip
    n_ids = BIG if dim < 4096 else BIG // 60
    f2 = (100 * torch.randn(rows, dim, generator=g)).to(dtype)
    hot2 = torch.randperm(rows, generator=g)[: rows // 4]
    for policy in ("fifo", "static"):
        def mk(free):
            if kind == "memory":
                s = InMemoryFeatureStore(f2.to(DEV))
            elif kind == "prefix":
                s = TieredFeatureStore(f2, rows // 4, **ON)
            else:
                s = TieredFeatureStore(f2, hot_ids=hot2, **ON)
            return FeatureCache(s, rows // 20, policy, hot_ids=hot2.flip(0).numpy(),
                                sync_free=free)
        a1, a2, b = mk(True), mk(True), mk(False)
        p = 1.0 / np.arange(1, rows + 1) ** 1.1  # Zipf-like: hits, misses and repeats
        for i in range(4):
            ids = torch.from_numpy(rng.choice(rows, n_ids, p=p / p.sum())).to(DEV)
            with ids_in_range():  # (else the ids' range check reads min and max back)
                with side(i % 2):
                    got = a1.gather(ids)
                if i:  # warm: the cursors, scratch and accumulators exist
                    with side(i % 2), no_sync():
                        got2 = a2.gather(ids)
                else:
                    got2 = a2.gather(ids)
            want = b.gather(ids)
            assert torch.equal(got, want) and torch.equal(got2, want), (dtype, dim, policy, i)
        same(a1, b, a1.backing, b.backing)
        same(a2, b, a2.backing, b.backing)
        assert a1.stats.hit_ratio_sum == a2.stats.hit_ratio_sum == b.stats.hit_ratio_sum
rep = triton_kernels.kernels_report()
assert rep["cache"] == "triton" and rep["fallbacks"] == 0, rep
print("ok")
"""
)


def test_the_cuda_replay_runs_in_the_interpreter():
    """ON_CUDA's script itself, on the CPU in Triton's interpreter (smaller): a fault in the
    script is found here, not in the GPU session's few minutes."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(ON_CUDA)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_fused_batch_equals_the_host_path_on_cuda():  # pragma: no cover - GPU only
    """ON_CUDA's replay: after every batch the fused cache's rows, maps, cursors and counts equal
    the host path's on the same GPU; a side stream, several waves of programs, other dtypes and
    widths, no sync (CUDA's sync check), the hit-ratio sum bit for bit."""
    import warnings

    pytest.importorskip("triton")
    from gnnio.utils import triton_kernels

    triton_kernels.reset_kernel_record()
    with warnings.catch_warnings():
        exec(compile(ON_CUDA, "ON_CUDA", "exec"), {})
