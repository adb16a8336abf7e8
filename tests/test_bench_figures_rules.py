"""The figures ``gnnio bench step|loader|sampling|placement`` print, checked with fake timers or
recounted from the same run: per-batch denominators, warm-up left untimed, the fastest repetition
as a device's rate, ``floor_ms`` from the batch's own FLOPs and bytes. A mutation pass over
gnnio/bench/{step,loader,sampling,placement,disk,tier_bandwidth}.py found each of these rules
unguarded (tests/test_bench_arithmetic_rules.py does the same for the other benches); the second
pass over ``bench disk`` and ``tier_bandwidth`` is in tests/test_bench_disk_rules.py."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import torch

from gnnio.bench import step as bstep
from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("fig") / "d", num_nodes=40, num_edges=160)


class _Ticks:
    """A fake ``time`` module whose ``perf_counter`` advances one millisecond per call."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        self.t += 1e-3
        return self.t


class _Script:
    """A fake ``time`` module reading the given instants in order."""

    def __init__(self, instants):
        self.it = iter(instants)

    def perf_counter(self):
        return next(self.it)


# ---- bench step ------------------------------------------------------------------------------------


def test_step_device_rates_take_the_fastest_repetition_and_count_read_plus_write(monkeypatch):
    """Matmul: 2 n^3 FLOPs over the fastest of the timed repetitions; copy: the bytes read and
    written (2x the buffer) over the fastest copy. The untimed first call is not a repetition."""
    mm, cp = [3.0, 1.0, 2.0, 5.0, 4.0], [2.0, 2.0, 1.5, 3.0, 9.0]
    instants = [x for i, d in enumerate(mm + cp) for x in (10.0 * i, 10.0 * i + d)]
    monkeypatch.setattr(bstep, "time", _Script(instants))
    r = bstep.device_rates(torch.device("cpu"))
    assert r["matmul_tflops"] == pytest.approx(2.0 * 1024**3 / 1.0 / 1e12)
    assert r["bandwidth_gb_per_s"] == pytest.approx(2.0 * (64 << 20) / 1.5 / 1e9)


@pytest.mark.parametrize("warmup, graphed", [(1, None), (0, 1)])
def test_step_pipelined_times_only_the_batches_after_the_warmup(warmup, graphed, monkeypatch):
    """``ms_per_batch`` and ``step_ms`` are the k timed batches' time / k; the warm-up batches
    (100 s each here) are in neither. A graphed step (``--cuda-graph``: its eager batches and the
    capture, ``step.warmup + 2``) stays untimed whatever ``--warmup`` says."""
    from gnnio.train import timing

    clock = SimpleNamespace(t=0.0)
    clock.perf_counter = lambda: clock.t
    monkeypatch.setattr(bstep, "time", clock)
    monkeypatch.setattr(timing, "time", clock)

    def step(net, opt, seconds, timer=None):
        if timer is not None:
            timer.start()
        clock.t += seconds
        if timer is not None:
            timer.stop()

    untimed = warmup if graphed is None else graphed + 2
    if graphed is not None:
        step.warmup = graphed
    loader = SimpleNamespace(epoch=lambda e: iter([100.0] * untimed + [1.0, 2.0]))
    parts = SimpleNamespace(net=torch.nn.Linear(1, 1), opt=None, step=step, train_loader=loader)
    r = bstep.pipelined(parts, torch.device("cpu"), warmup=warmup, k=2, progress=False)
    assert r == {"ms_per_batch": pytest.approx(1500.0), "step_ms": pytest.approx(1500.0)}


def test_bench_step_figures_recount_from_its_own_timed_batches(tiny, monkeypatch, capsys):
    """With a clock that ticks 1 ms per reading: each bracketed part is one tick per timed batch
    (a warm-up batch counts in no part and no denominator); the per-batch sizes, FLOPs and bytes
    are the timed batches' own (``batch_work`` of exactly those batches) / k; ``floor_ms`` is
    FLOPs at the measured matmul rate plus bytes at the measured bandwidth, and the ratio is the
    pipelined ``ms_per_batch`` over it."""
    seen = []
    real = bstep.batch_work

    def spy(model, mb, row_bytes):
        f, m = real(model, mb, row_bytes)
        seen.append((mb.seeds.tolist(), int(mb.input_nodes.shape[0]),
                     sum(b.num_edges for b in mb.blocks), f, m))  # fmt: skip
        return f, m

    monkeypatch.setattr(bstep, "batch_work", spy)
    monkeypatch.setattr(bstep, "time", _Ticks())
    k = 2
    argv = ["bench", "step", str(tiny), "--device", "cpu", "--fanouts", "3", "--batch-size", "8",
            "--hidden", "4", "--batches", str(k), "--warmup", "1", "--quiet", "--json"]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    timed = seen[:k]  # (then the untimed counted pass's batches)
    assert len(seen) == k + min(5, k)
    assert timed[0][0] != seen[k][0]  # the timed pass starts after its warm-up batch
    assert r["input_nodes_per_batch"] == pytest.approx(sum(s[1] for s in timed) / k)
    assert r["edges_per_batch"] == pytest.approx(sum(s[2] for s in timed) / k)
    assert r["flops_per_batch"] == pytest.approx(sum(s[3] for s in timed) / k)
    assert r["bytes_per_batch"] == pytest.approx(sum(s[4] for s in timed) / k)
    b = r["breakdown"]
    assert b["forward"] == b["backward"] == b["optimizer"] == pytest.approx(1.0)
    assert sum(b.values()) == pytest.approx(r["sequential_ms_per_batch"])
    fl = r["floor"]
    compute_ms = r["flops_per_batch"] / (fl["matmul_tflops"] * 1e12) * 1e3
    memory_ms = r["bytes_per_batch"] / (fl["bandwidth_gb_per_s"] * 1e9) * 1e3
    assert fl["compute_ms"] == pytest.approx(compute_ms)
    assert fl["memory_ms"] == pytest.approx(memory_ms)
    assert r["floor_ms"] == pytest.approx(compute_ms + memory_ms)
    assert r["ms_per_batch"] == pytest.approx(1.0 / k)  # (one tick over the k timed batches)
    assert r["ms_per_batch_over_floor"] == pytest.approx(r["ms_per_batch"] / r["floor_ms"])


class GATLayer(torch.nn.Module):
    """Named as gnnio's: ``batch_work`` counts its linear on the source rows."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)


def test_step_batch_work_by_hand():
    """FLOPs: 2 * rows * in * out per linear, x3 (forward + backward), on the destination rows
    (a GAT layer: the source rows); bytes: the gathered rows read and written, and each layer's
    edge + destination rows of float32 at its input width, forward and backward."""
    model = SimpleNamespace(layers=[GATLayer(), torch.nn.Linear(3, 2)])
    blocks = [SimpleNamespace(num_src=10, num_dst=5, num_edges=20),
              SimpleNamespace(num_src=5, num_dst=2, num_edges=6)]  # fmt: skip
    mb = SimpleNamespace(input_nodes=torch.zeros(10), blocks=blocks)
    flops, nbytes = bstep.batch_work(model, mb, row_bytes=16)
    assert flops == 3 * 2.0 * (10 * 4 * 3 + 2 * 3 * 2)
    assert nbytes == 2.0 * 10 * 16 + 2 * 4.0 * ((20 + 5) * 4 + (6 + 2) * 3)


# ---- bench loader / bench sampling: the median pass, warm-up untimed ------------------------------


def _fake_time_passes(scripts, calls):
    """A ``time_passes`` that runs ``fn`` (warm-up included) and reports the next scripted times."""
    it = iter(scripts)

    def fake(fn, warmup, passes, sync=None):
        calls.append(warmup)
        for _ in range(warmup + passes):
            fn()
        return next(it)

    return fake


def test_bench_loader_reports_the_median_pass_and_leaves_warmup_stats_out(tiny, monkeypatch):
    """``ms_per_batch``/``seeds_per_s`` from the median loader pass, ``sequential_ms_per_batch``
    from the median sequential pass, both after the same warm-up; the per-stage figures are
    medians of the timed passes' own stats (not the warm-up's)."""
    import gnnio.pipeline.loader as pl
    from gnnio.bench import loader as bl

    epochs = []

    class Recording(pl.NodeLoader):
        def epoch(self, epoch):
            yield from super().epoch(epoch)
            epochs.append(self.stats)

    calls = []
    monkeypatch.setattr(pl, "NodeLoader", Recording)
    monkeypatch.setattr(bl, "time_passes", _fake_time_passes([[1.0, 4.0, 2.0], [8.0] * 3], calls))
    p = argparse.ArgumentParser()
    bl.add_arguments(p)
    args = [str(tiny), "--batch-size", "4", "--batches", "2", "--passes", "3", "--warmup", "1",
            "--fanouts", "3", "--no-progress"]  # fmt: skip
    r = bl.run(p.parse_args(args))
    nb = r["batches"]
    assert calls == [1, 1]
    assert r["ms_per_batch"] == pytest.approx(2.0 / nb * 1e3)
    assert r["seeds_per_s"] == pytest.approx(epochs[-1].num_seeds / 2.0)
    assert r["sequential_ms_per_batch"] == pytest.approx(8.0 / nb * 1e3)
    timed = sorted(s.sample_s for s in epochs[1:])
    assert len(epochs) == 4 and r["sample_ms_per_batch"] == pytest.approx(timed[1] / nb * 1e3)


def test_bench_sampling_rates_use_the_median_pass_and_cpu_time_skips_warmup(tiny, monkeypatch):
    """``ms_per_batch``, ``seeds_per_s``, ``edges_per_s`` divide by the median pass time;
    ``cpu_ms_per_batch`` is the median of the timed passes' CPU time (the warm-up's 100 s left
    out); ``feature_bytes_per_batch`` counts bytes of a row, not its elements."""
    from gnnio.bench import sampling as bsm

    cpu = iter([0.0, 100.0, 100.0, 101.0, 101.0, 104.0, 104.0, 109.0])  # warm-up, then 1, 3, 5 s
    monkeypatch.setattr(bsm, "time", SimpleNamespace(process_time=lambda: next(cpu)))
    calls = []
    monkeypatch.setattr(bsm, "time_passes", _fake_time_passes([[1.0, 4.0, 2.0]], calls))
    p = argparse.ArgumentParser()
    bsm.add_arguments(p)
    r = bsm.run(p.parse_args([str(tiny), "--batch-size", "4", "--batches", "2", "--passes", "3",
                              "--warmup", "1", "--fanouts", "3,2", "--no-progress"]))  # fmt: skip
    nb = r["batches"]
    assert calls == [1] and nb == 2
    assert r["ms_per_batch"] == pytest.approx(2.0 / nb * 1e3)
    assert r["seeds_per_s"] == pytest.approx(4 * nb / 2.0)
    assert r["edges_per_s"] == pytest.approx(r["edges_per_batch"] * nb / 2.0, rel=1e-3)
    assert r["cpu_ms_per_batch"] == pytest.approx(3.0 / nb * 1e3)
    assert r["feature_bytes_per_batch"] == pytest.approx(r["input_nodes_per_batch"] * 4 * 4, 1e-3)


# ---- bench placement --------------------------------------------------------------------------------


def test_bench_placement_times_after_a_warmup_and_rates_alg1_over_its_whole_time(monkeypatch):
    """Every timing has its one warm-up pass; ``alg1_nodes_per_s`` is nodes over the whole
    ``alg1_s`` (not its loop alone)."""
    from gnnio.bench import placement as bp

    calls = []
    times = iter([[3.0], [0.5], [1.0], [7.0], [2.0]])

    def fake(fn, warmup, passes, sync=None):
        calls.append(warmup)
        fn()
        return next(times)

    monkeypatch.setattr(bp, "time_passes", fake)
    p = argparse.ArgumentParser()
    bp.add_arguments(p)
    r = bp.run(p.parse_args(["--num-nodes", "500", "--strategies", "alg1,mod", "--passes", "1",
                             "--no-progress"]))  # fmt: skip
    assert calls == [1] * 5
    assert r["alg1_s"] == 3.0 and r["mod_s"] == 0.5
    assert r["alg1_nodes_per_s"] == pytest.approx(500 / 3.0)


# ---- bench disk: the steady epochs (the first one left out), the best policy as the yardstick -----


def test_disk_epochs_steady_figures_leave_the_first_epoch_out(monkeypatch):
    """``steady_epoch_s`` and ``disk_bytes`` are medians of the epochs after the first (which
    fills the caches), ``host_cache_hit_ratio`` the hits over the rows of those epochs."""
    from gnnio.bench import disk as bd

    per_epoch = [(10.0, 1000, 0), (1.0, 10, 50), (3.0, 30, 50), (2.0, 20, 50)]  # s, bytes, hits
    starts = [20.0 * e for e in range(len(per_epoch))]
    monkeypatch.setattr(bd, "time", _Script([x for s, (d, _, _) in zip(starts, per_epoch, strict=True)
                                             for x in (s, s + d)]))  # fmt: skip
    disk = SimpleNamespace(stats=SimpleNamespace(bytes_read=0))
    rows = {"host_cache": 0, "disk": 0}
    store = SimpleNamespace(counters=SimpleNamespace(snapshot=lambda: {"rows": dict(rows)}))

    def epoch(e):
        _, b, h = per_epoch[e]
        disk.stats.bytes_read += b
        rows["host_cache"] += h
        rows["disk"] += 100 - h
        yield from ()

    r = bd._epochs(SimpleNamespace(epoch=epoch), store, disk, len(per_epoch))
    assert r["first_epoch_s"] == 10.0 and r["epoch_s"] == [10.0, 1.0, 3.0, 2.0]
    assert r["steady_epoch_s"] == 2.0
    assert r["disk_bytes"] == 20 and r["disk_bytes_per_epoch"] == [1000, 10, 30, 20]
    assert r["host_cache_hit_ratio"] == pytest.approx(0.5)


def test_disk_versus_divides_by_optimal_and_by_the_best_other_policy():
    from gnnio.bench.disk import _versus

    configs = [{"host_cache": 0.1, "policy": p, "disk_bytes": b}
               for p, b in (("static", 300), ("sieve", 200), ("lookahead", 100), ("optimal", 50))]  # fmt: skip
    v = _versus(configs)
    assert v["lookahead_over_best"] == {"0.1": pytest.approx(0.5)}
    assert v["disk_bytes_over_optimal"]["0.1"] == pytest.approx(
        {"static": 6.0, "sieve": 4.0, "lookahead": 2.0, "optimal": 1.0}
    )


def test_bench_sampling_refuses_a_negative_warmup_and_closes_its_sampler(tiny, monkeypatch):
    from gnnio.bench import sampling as bsm
    from gnnio.errors import UsageError

    p = argparse.ArgumentParser()
    bsm.add_arguments(p)
    with pytest.raises(UsageError, match="--warmup must be >= 0, got -1"):  # (run's own check)
        bsm.run(p.parse_args([str(tiny), "--warmup", "-1", "--no-progress"]))
    closed, real = [], bsm.make_sampler

    def make(*a, **kw):
        s = real(*a, **kw)
        close = s.close
        s.close = lambda: (closed.append(1), close())
        return s

    monkeypatch.setattr(bsm, "make_sampler", make)
    argv = ["bench", "sampling", str(tiny), "--batches", "1", "--batch-size", "4", "--passes", "1",
            "--warmup", "0", "--fanouts", "2", "--quiet", "--json"]  # fmt: skip
    assert main(argv) == 0 and closed == [1]


@pytest.mark.parametrize("extra", [["--buffer", "1.5"], ["--buffer", "0"], ["--num-nodes", "0"]])
def test_bench_placement_refuses_a_buffer_outside_0_1_and_no_nodes(extra):
    from gnnio.bench import placement as bp
    from gnnio.errors import UsageError

    p = argparse.ArgumentParser()
    bp.add_arguments(p)
    with pytest.raises(UsageError, match=extra[0]):
        bp.run(p.parse_args(["--num-nodes", "100", "--passes", "1", "--no-progress", *extra]))


def test_bench_placement_grid_table_by_hand():
    """``bench placement --dataset``'s printed table from hand-made rows: costs in ms, the
    best (smallest) partitioning's cost over alg1's, a skipped strategy as n/a, and the shares
    in percent."""
    from gnnio.bench.placement import grid_markdown

    def row(strategy, cost, local=0.5, peer=0.25, host=0.25, **kw):
        return {"topology": "2+2", "buffer": 0.1, "strategy": strategy, "max_cost_s": cost,
                "local": local, "peer": peer, "host": host, "prep_s": 0.5, **kw}  # fmt: skip

    out = {"dataset": "d", "num_nodes": 100, "row_bytes": 512, "score": "sj", "prob_s": 0.1,
           "trace": {"epochs": 1, "batch_size": 8, "fanouts": [2]}, "grid_alpha": "auto",
           "local_seeds": False,
           "rows": [row("alg1", 0.002), row("naive", 0.008), row("metis", 0.004),
                    row("random", 0.002, skipped="no room")]}  # fmt: skip
    table = grid_markdown(out).splitlines()
    cost = next(x for x in table if x.startswith("| 2+2 | 0.1N |"))
    assert cost == "| 2+2 | 0.1N | 2 | 8 | 4 | n/a | 2.00x |"  # metis' 4 ms over alg1's 2
    shares = [x for x in table if x.startswith("| 2+2 | 0.1N |")][1]
    assert shares == "| 2+2 | 0.1N | 50/25/25 | 50/25/25 | 50/25/25 | n/a |"
