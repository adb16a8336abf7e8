"""The row kernel's variants and the measured choice among them (issue 24: the GPU-tier gather at
>= 0.8 of a device-to-device copy; :mod:`gnnio.features._row_variants`).

Every variant writes the same bytes as ``index_select`` (Triton's interpreter, CPU tensors); every
variant compiles to an sm_90 cubin with 16-byte loads (Triton's compiler, no GPU needed); the
tuner keeps the fastest candidate once its timings are in, never waits for the GPU to get them,
and the choice shows in the ``kernels`` report."""

from __future__ import annotations

import re

import pytest
import torch

from gnnio.features import _row_variants as rv
from gnnio.utils import triton_kernels
from tests.fake_cuda import fake_events
from tests.helpers import KERNEL_SPY, run_in_triton_interpreter

# Each variant, forced, on the grid of the row kernel's own test: dtypes and row widths (every word
# width, rows that are not a power of two), int32 and int64 indices, gathers into a larger output,
# scatters, and scatters that skip negative destinations.
EVERY_VARIANT = (
    KERNEL_SPY
    + r"""
import warnings
import torch
from gnnio.features._row_variants import VARIANTS
from gnnio.features._triton_rows import copy_rows_triton

warnings.simplefilter("error", RuntimeWarning)
launches = spy("_rows", lambda a, kw: (kw["BR"], kw["num_warps"], kw["STREAM"], kw["I32"]))
g = torch.Generator().manual_seed(5)
for v in VARIANTS:
    n0 = len(launches)
    for dtype, dim in ((torch.float32, 128), (torch.float32, 512), (torch.float32, 3),
                       (torch.float16, 3), (torch.uint8, 5), (torch.float64, 1)):
        src = (torch.rand(300, dim, generator=g) * 100).to(dtype)
        for idt in (torch.int64, torch.int32):
            ids = torch.randint(0, 300, (77,), generator=g).to(idt)
            out = torch.full((90, dim), 7, dtype=dtype)
            assert copy_rows_triton(src, ids, out, None, variant=v)
            assert torch.equal(out[:77], src[ids.long()]) and (out[77:] == 7).all(), (v, dtype)
            pos = torch.randperm(90, generator=g)[:77].to(idt)
            out = torch.full((90, dim), 7, dtype=dtype)
            assert copy_rows_triton(src, ids, out, pos, variant=v)
            want = torch.full((90, dim), 7, dtype=dtype)
            want[pos.long()] = src[ids.long()]
            assert torch.equal(out, want), (v, dtype, dim, "scatter")
            pos[::3] = -1
            out = torch.full((90, dim), 7, dtype=dtype)
            assert copy_rows_triton(src, ids, out, pos, skip=True, variant=v)
            keep = pos >= 0
            want = torch.full((90, dim), 7, dtype=dtype)
            want[pos[keep].long()] = src[ids[keep].long()]
            assert torch.equal(out, want), (v, dtype, dim, "skip")
    got = set(launches[n0:])
    assert {(nw, st, i32) for _, nw, st, i32 in got} == {(v.num_warps, v.stream, v.i32)}, got
    assert (v.rows_per_program(8, 64), v.num_warps, v.stream, v.i32) in got, (v, got)
print("ok")
"""
)


def test_every_row_variant_writes_what_index_select_writes():
    """Fails when a variant's flags change the bytes written (an ``I32`` path that truncates the
    destination offsets, a ``STREAM`` path that stores the wrong tile) or are not passed on."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(EVERY_VARIANT)


class _Fake:
    """A pending measurement, complete once ``gpu["done"]`` is set."""

    def __init__(self, seconds: float, gpu: dict):
        self.s, self.gpu = seconds, gpu

    def ready(self) -> bool:
        return self.gpu["done"]

    def seconds(self) -> float:
        return self.s


def _fake_trials(times: dict, runs_seen: list, gpu: dict | None = None):
    gpu = {"done": True} if gpu is None else gpu

    def trials(runs):
        runs_seen.extend(name for name, _ in runs)
        for _, run in runs:
            run()
        return {n: (t if isinstance(t, str) else _Fake(t, gpu)) for n, t in times.items()}

    return trials


@pytest.fixture
def clean_record(monkeypatch):
    monkeypatch.setattr(triton_kernels, "_CONFIGS", {})


def test_the_fastest_variant_is_kept_once_its_timings_are_in(clean_record):
    """A fake timer says ``t8k_w2`` is fastest (``t32k_w8`` failed to build): the gathers before
    the timings are in run the default, every later one the fastest, the small gather before
    the first big one starts nothing, and ``kernels_report()`` names the choice. Fails when the
    slowest is kept, when the tuner waits (no pending poll) or when the choice is not recorded."""
    times = {"t16k_w4": 3e-5, "t4k_w4": 2e-5, "t8k_w2": 1e-5, "t32k_w8": "PTXASError: no"}
    seen: list = []
    launched: list = []
    gpu = {"done": False}
    tuner = rv.RowTuner(_fake_trials(times, seen, gpu), devices=("cpu",), min_bytes=1000)
    cpu = torch.device("cpu")
    cands = [v for v in rv.VARIANTS if v.name in times]

    def pick(nbytes: int):
        return tuner.pick("512B", nbytes, cpu, launched.append, cands).name

    assert pick(999) == "t16k_w4" and not seen  # too small to time
    assert pick(10**6) == "t16k_w4"  # starts the trials, does not wait for them
    assert seen == [v.name for v in cands] and launched == cands
    assert pick(10) == "t16k_w4"  # the GPU has not run them yet
    gpu["done"] = True
    assert pick(10) == "t8k_w2" and pick(10**6) == "t8k_w2"
    assert len(launched) == len(cands)  # nothing measured twice
    assert tuner.report() == {
        "512B": {
            "chosen": "t8k_w2",
            "us": {"t16k_w4": 30.0, "t4k_w4": 20.0, "t8k_w2": 10.0, "t32k_w8": "PTXASError: no"},
        }  # fmt: skip
    }
    assert triton_kernels.kernels_report()["configs"] == {"rows": {"512B": "t8k_w2"}}
    triton_kernels.reset_kernel_record()  # a choice holds for the process
    assert triton_kernels.kernels_report()["configs"] == {"rows": {"512B": "t8k_w2"}}
    # another row width is chosen on its own; a CUDA tuner never times CPU gathers
    assert tuner.pick("2048B", 10**6, cpu, launched.append, cands).name == "t16k_w4"
    assert "2048B" not in tuner.chosen
    assert rv.RowTuner(_fake_trials(times, seen)).pick("512B", 10**9, cpu, launched.append) == (
        rv.DEFAULT
    )
    # timing that cannot start (no events, say) keeps the default, reported, without raising

    def no_events(runs):
        raise RuntimeError("no events here")

    t = rv.RowTuner(no_events, devices=("cpu",), min_bytes=0)
    assert t.pick("8B", 10, cpu, launched.append).name == "t16k_w4"
    assert t.pick("8B", 10, cpu, launched.append).name == "t16k_w4"
    assert t.report() == {
        "8B": {"chosen": "t16k_w4", "us": {"error": "RuntimeError: no events here"}}
    }


def test_cuda_trials_time_launches_behind_a_sleep_and_never_wait(monkeypatch):
    """The CUDA timer (fake events): each candidate runs once to compile, then its timed
    launches sit between events queued behind one GPU sleep; no event or device is synchronised.
    A candidate that raises is reported with its error and not timed."""
    log = fake_events(monkeypatch)
    sleeps: list = []
    monkeypatch.setattr(torch.cuda, "_sleep", sleeps.append, raising=False)
    calls: list = []

    def broken():
        raise RuntimeError("no kernel")

    runs = [("a", lambda: calls.append("a")), ("bad", broken), ("b", lambda: calls.append("b"))]
    got = rv.cuda_trials(runs, calls=3, reps=2)
    assert calls == ["a", "b"] + ["a"] * 6 + ["b"] * 6 and sleeps == [rv.SLEEP_CYCLES]
    assert got["bad"] == "RuntimeError: no kernel"
    assert not any(op == "synchronize" for op, *_ in log)
    assert not got["a"].ready()
    from tests.fake_cuda import FakeEvent

    FakeEvent.synced_upto = FakeEvent._next  # the GPU got there
    assert got["a"].ready() and got["a"].seconds() == pytest.approx(1e-3 / 3)


# Through copy_rows with the process's tuner replaced by one whose fake timer makes t4k_w4 the
# fastest: the first big gather launches every candidate (and its own copy), later ones launch
# t4k_w4 only, the rows are right throughout, and the kernels report names the choice.
THROUGH_COPY_ROWS = (
    KERNEL_SPY
    + r"""
import torch
from gnnio.features import _row_variants as rv
from gnnio.features._gather import copy_rows
from gnnio.utils.triton_kernels import kernels_report

class Done:
    def __init__(self, s): self.s = s
    def ready(self): return True
    def seconds(self): return self.s
def trials(runs):
    for _, run in runs:
        run()
    return {n: Done(1.0 if n != "t4k_w4" else 0.5) for n, _ in runs}
rv.TUNER = rv.RowTuner(trials, devices=("cpu",), min_bytes=64 * 512)
launches = spy("_rows", lambda a, kw: (kw["BR"], kw["num_warps"]))
g = torch.Generator().manual_seed(6)
src = torch.randn(500, 128, generator=g)
for b in range(3):
    ids = torch.randint(0, 500, (70,), generator=g)
    out = torch.zeros(70, 128)
    n0 = len(launches)
    copy_rows(src, ids, out)
    assert torch.equal(out, src[ids]), b
    if b == 0:
        assert len(launches) - n0 == len(rv.VARIANTS) + 1, launches[n0:]
    else:
        assert launches[n0:] == [(8, 4)], launches[n0:]
rep = kernels_report()
assert rep["rows"] == "triton" and rep["configs"] == {"rows": {"512B": "t4k_w4"}}, rep
print("ok")
"""
)


def test_copy_rows_runs_the_measured_choice():
    pytest.importorskip("triton")
    run_in_triton_interpreter(THROUGH_COPY_ROWS)


def test_every_row_variant_builds_for_a_gpu_here():
    """Each variant compiles to an sm_90 cubin (H100/H200) with Triton's own compiler, no GPU
    needed, for 512-byte and 2 KiB rows, gathered and scattered, with the 16-byte word loads and
    stores (``v2.b64``) and, where asked, the streaming hints: a variant the interpreter runs but
    the compiler refuses (``.cg`` with ``evict_first``: ptxas refuses) would be skipped on every
    GPU. Pointers as Triton specializes them at launch (16-byte aligned)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gnnio.features import _triton_rows as tr

    fn = tr._rows
    ptrs = ("src", "src_idx", "dst", "dst_idx")
    types = {a: "*i64" if a in ptrs else "i32" if a == "n" else "constexpr" for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ptrs}
    for words, scatter in ((64, False), (256, False), (64, True)):
        for v in rv.VARIANTS:
            const = {"W": words, "WP": words, "BR": v.rows_per_program(8, words),
                     "SCATTER": scatter, "SKIP": scatter, "STREAM": v.stream, "I32": v.i32}  # fmt: skip
            src = ASTSource(
                fn, types, constexprs={(fn.arg_names.index(k),): c for k, c in const.items()},
                attrs=attrs,
            )  # fmt: skip
            try:
                k = triton.compile(
                    src, target=GPUTarget("cuda", 90, 32), options={"num_warps": v.num_warps}
                )
            except Exception as e:
                if "ptxas" in str(e).lower() and "not found" in str(e).lower():
                    pytest.skip(f"no ptxas here: {e}")
                raise AssertionError(f"{v.name}, {words} words: {str(e)[:500]}") from e
            assert k.asm.get("cubin"), v.name
            ptx = k.asm["ptx"]
            loads = re.findall(r"ld\.global[.\w:]*\.v2\.b64", ptx)
            stores = re.findall(r"st\.global[.\w:]*\.v2\.b64", ptx)
            assert loads and stores, (v.name, words)
            assert all(("evict_first" in x) == v.stream for x in loads), (v.name, loads[:2])
            assert all((".cs" in x) == v.stream for x in stores), (v.name, stores[:2])


# gpu-check's bandwidth step on the GPU tier (gnnio.bench.tier_bandwidth._gpu_tier), its plumbing
# on the CPU: Triton's interpreter runs the kernels, a fake GPU clock times a call by the launch it
# made (2 warps: twice as fast; no launch: the copy's time), the fake tuner chooses t4k_w4. Every
# variant is reported for both row widths with its GB/s, the best one's ratio to the copy, the
# store's path with the choice, and report.md's line.
GPU_TIER = (
    KERNEL_SPY
    + r"""
import torch
from gnnio.bench import tier_bandwidth as tb
from gnnio.bench.gpu_check_report import _gpu_tier_line
from gnnio.features import _row_variants as rv

class Done:
    def __init__(self, s): self.s = s
    def ready(self): return True
    def seconds(self): return self.s
def trials(runs):
    return {n: Done(0.5 if n == "t4k_w4" else 1.0) for n, _ in runs}
rv.TUNER = rv.RowTuner(trials, devices=("cpu",), min_bytes=0)
torch.cuda.synchronize = lambda *a: None
launches = spy("_rows", lambda a, kw: kw["num_warps"])
def fake_gpu_seconds(fn, calls=5, passes=5):
    n0 = len(launches)
    fn()
    nw = launches[n0:]
    return (1e-3 / 2 if nw == [2] else 1e-3), 2e-5
tb._gpu_seconds = fake_gpu_seconds
g = torch.Generator().manual_seed(7)
feat = torch.randn(1001, 128, generator=g)
ids = torch.randint(0, 1001, (402,), generator=g)
out = torch.empty(402, 128)
r = tb._gpu_tier(feat, ids, out, lambda fn: 1.0)
assert torch.equal(out[:400].view(100, 512), feat[:1000].view(250, 512)[ids[:100] % 250])
names = [v.name for v in rv.VARIANTS]
for key, useful in (("512B", 402 * 512), ("2048B", 100 * 2048)):
    vs = r["variants"][key]
    assert list(vs) == names, vs
    assert vs["t8k_w2"] == 2 * useful / 1e-3 / 1e9 and vs["t16k_w4"] == useful / 1e-3 / 1e9, vs
    assert r["best_variant"][key] == "t8k_w2" and r["choice"][key]["chosen"] == "t4k_w4"
assert r["ratio"]["best_variant_512B/d2d_copy"] == 2.0, r["ratio"]
assert r["ratio"]["ids_in_order/d2d_copy"] == 1.0 and r["wall"]["gpu_resident"] == 1.0
assert r["gpu_resident"]["host_us_per_call"] == 20.0
line = _gpu_tier_line(r)
assert "512B: chosen t4k_w4; t16k_w4 1.00, t4k_w4 1.00, t8k_w2 2.00" in line, line
print("ok")
"""
)


def test_the_bandwidth_step_reports_every_variant_and_the_best_against_the_copy():
    pytest.importorskip("triton")
    run_in_triton_interpreter(GPU_TIER)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_every_variant_and_the_choice_equal_index_select():
    """On a real GPU: each variant compiles, launches and writes ``index_select``'s rows (512-byte
    and 2 KiB rows, gathered and scattered); the store's path measures them on its first big
    gather, chooses without waiting, and records the choice."""
    pytest.importorskip("triton")
    from gnnio.features._gather import copy_rows
    from gnnio.features._triton_rows import copy_rows_triton

    g = torch.Generator(device="cuda").manual_seed(8)
    for dim in (128, 512):
        src = torch.randn(200_000, dim, device="cuda", generator=g)
        ids = torch.randint(0, 200_000, (20_000,), device="cuda", generator=g)
        want = src[ids]
        pos = torch.randperm(30_000, device="cuda", generator=g)[:20_000]
        for v in rv.VARIANTS:
            out = torch.zeros(20_000, dim, device="cuda")
            assert copy_rows_triton(src, ids, out, None, variant=v)
            assert torch.equal(out, want), v
            out = torch.zeros(30_000, dim, device="cuda")
            assert copy_rows_triton(src, ids, out, pos, variant=v)
            assert torch.equal(out[pos], want) and out.count_nonzero() == want.count_nonzero()
        out = torch.zeros(20_000, dim, device="cuda")
        key = f"{dim * 4}B"
        for _ in range(3):
            copy_rows(src, ids, out)
            torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert key in rv.TUNER.chosen, rv.TUNER.report()
        assert all(isinstance(t, float) for t in rv.TUNER.timings[key].values()), rv.TUNER.report()
        assert triton_kernels.kernels_report()["configs"]["rows"][key] == rv.TUNER.chosen[key].name


def test_nothing_is_timed_or_queried_while_a_cuda_graph_is_captured(monkeypatch, clean_record):
    """Launches with events, or an event query, inside a stream capture would break it: while
    the thread captures, the tuner starts no trials and polls none; outside, it goes on. Fails
    when either capture check is removed."""
    capturing = {"now": True}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["now"])
    seen: list = []
    gpu = {"done": True}
    tuner = rv.RowTuner(_fake_trials({"t16k_w4": 2.0, "t4k_w4": 1.0}, seen, gpu), min_bytes=0)
    cuda = torch.device("cuda", 0)

    def pick() -> str:
        return tuner.pick("512B", 10, cuda, lambda v: None, rv.VARIANTS[:2]).name

    assert pick() == "t16k_w4" and not seen  # capturing: no trials
    capturing["now"] = False
    assert pick() == "t16k_w4" and seen == ["t16k_w4", "t4k_w4"]
    capturing["now"] = True
    gpu["done"] = "queried while capturing"  # truthy: a poll would choose now
    assert pick() == "t16k_w4" and "512B" not in tuner.chosen
    capturing["now"] = False
    assert pick() == "t4k_w4"
