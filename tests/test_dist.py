"""Distributed training and the sharded feature store (gnnio.distributed) on gloo, CPU processes.

Multi-process tests are few and small (a 3,000-node synthetic graph, Cora when ../shared has it),
each bounded by a timeout: a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.distributed.context import infer_topology_spec
from gnnio.distributed.launch import failure_line
from gnnio.errors import UsageError
from gnnio.ordering import RandomOrder
from gnnio.train import TrainConfig
from gnnio.utils.ports import reserved_port
from tests.helpers import run_gnnio_in_process

ROOT = Path(__file__).resolve().parents[1]
GNNIO = [sys.executable, "-m", "gnnio"]
CORA_RAW = ROOT.parent / "shared" / "datasets" / "cora"


def free_port() -> int:
    """A port for processes started afterwards to bind (``MASTER_PORT``), kept from every other
    socket meanwhile (:func:`gnnio.utils.ports.reserved_port`)."""
    return reserved_port()


def run_cli(args, timeout=240, env=None, **kw):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(
        [*GNNIO, *args], capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT, **kw
    )


@pytest.fixture(scope="module")
def syn(tmp_path_factory) -> Path:
    from gnnio.importers.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("dist") / "syn"
    prepare_synthetic(
        out, num_nodes=3000, avg_degree=8, feat_dim=16, num_classes=4, seed=1, progress=False
    )
    return out


# ----------------------------------------------------------------------------------------------
# seeds: every training node exactly once per epoch, the same batch count on every rank


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    world=st.integers(1, 6),
    bs=st.integers(1, 64),
    epoch=st.integers(0, 3),
)
def test_equal_batches_cover_every_seed_once(n, world, bs, epoch):
    if n < world or (bs == 1 and n % world):
        with pytest.raises(ValueError):
            RandomOrder(np.arange(n), bs, rank=0, world_size=world, equal_batches=True)
        return
    seeds = np.arange(1000, 1000 + n)
    got, counts = [], set()
    for r in range(world):
        o = RandomOrder(seeds, bs, seed=3, rank=r, world_size=world, equal_batches=True)
        batches = list(o.batches(epoch))
        counts.add(len(batches))
        assert len(batches) == o.num_batches
        sizes = [len(b) for b in batches]
        assert max(sizes) <= bs and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        got.extend(int(x) for b in batches for x in b)
    assert len(counts) == 1
    assert sorted(got) == list(seeds)


def test_equal_batches_excludes_drop_last():
    with pytest.raises(ValueError):
        RandomOrder(np.arange(10), 3, drop_last=True, equal_batches=True)


def test_infer_topology_spec():
    assert infer_topology_spec([0, 0]) == "2"
    assert infer_topology_spec([0, 1]) == "1*2"
    assert infer_topology_spec([0, 0, 1, 1]) == "2*2"
    assert infer_topology_spec([0, 0, 0, 1]) == "3+1"


# ----------------------------------------------------------------------------------------------
# refusals: one line, naming the option


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"gpu_cache_fraction": 0.1}, "--gpu-cache-fraction"),
        ({"eval": "full"}, "--eval full"),
        ({"placement": "p.npz", "placement_strategy": "alg1"}, "exclude each other"),
        ({"placement_strategy": "pagraph"}, "--placement-strategy"),
        ({"dist_timeout": 0.0}, "--dist-timeout"),
    ],
)
def test_validate_dist_refuses(kw, words):
    with pytest.raises(UsageError, match=words):
        TrainConfig(**kw).validate_dist(2)


def test_single_process_refuses_dist_only_options():
    with pytest.raises(UsageError, match="--local-seeds"):
        TrainConfig(local_seeds=True).validate_dist(1)
    TrainConfig().validate_dist(1)


def test_placement_for_other_devices_or_dataset_is_refused(tmp_path, syn):
    import gnnio
    from gnnio.distributed.train import get_placement
    from gnnio.placement import PlacementRequest, place, save_placement
    from gnnio.placement.topology import load_topology

    ds = gnnio.load(syn)
    n = ds.num_nodes
    req = PlacementRequest(probs=np.ones(n), topology=load_topology("4"), buffer_rows=n // 10)
    pl = place("alg1", req)
    pl.params.update(dataset=ds.name, dataset_fingerprint=ds.fingerprint)
    path = save_placement(pl, tmp_path / "p.npz")
    cfg = TrainConfig(placement=str(path))
    ctx = SimpleNamespace(world_size=2, is_main=True)
    with pytest.raises(UsageError, match="made for 4 devices, the run has 2 ranks"):
        get_placement(ds, cfg, ctx)
    pl.params["dataset_fingerprint"] = "0123456789abcdef"
    save_placement(pl, path)
    ctx.world_size = 4
    with pytest.raises(UsageError, match="made for dataset"):
        get_placement(ds, cfg, ctx)
    small = place("alg1", PlacementRequest(np.ones(10), load_topology("4"), 2))
    save_placement(small, path)
    with pytest.raises(UsageError, match="made for a dataset of 10 nodes"):
        get_placement(ds, cfg, ctx)


def test_failure_line_prefers_the_killed_rank():
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    def failure(rank, pid, code, msg, ts):
        f = ProcessFailure(local_rank=rank, pid=pid, exitcode=code, error_file="<N/A>")
        f.message, f.timestamp = msg, ts
        return f

    err = SimpleNamespace(
        failures={
            0: failure(0, 10, 1, {"message": "RuntimeError: Connection closed by peer"}, 1),
            1: failure(1, 11, -9, "Signal 9 (SIGKILL) received by PID 11", 2),
        }
    )
    line = failure_line(err)
    assert line.startswith("rank 1 (pid 11) was killed by SIGKILL")
    assert "\n" not in line
    err.failures = {0: failure(0, 10, 1, {"message": "Traceback...\nValueError: bad"}, 1)}
    assert failure_line(err) == "rank 0 (pid 10) failed: ValueError: bad"
    # a rank that raised, reported after its peer's gloo error (seen once in CI): the cause first
    gloo = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
            "[127.0.0.1]:41234: This is typically caused by a remote worker crashing.")  # fmt: skip
    err.failures = {
        0: failure(0, 10, 1, {"message": gloo}, 1),
        1: failure(1, 11, 1, {"message": "Traceback...\nRuntimeError: injected fault"}, 2),
    }
    assert failure_line(err).startswith("rank 1 (pid 11) failed: RuntimeError: injected fault")
    # a SIGKILLed rank and its peer, aborted by gloo (SIGABRT) in the same poll (seen once in CI):
    # the killed one is the cause, whatever the ranks' order; an abort also follows a real error
    for ts in ((1, 1), (2, 1)):
        err.failures = {
            0: failure(0, 10, -6, "Signal 6 (SIGABRT) received by PID 10", ts[1]),
            1: failure(1, 11, -9, "Signal 9 (SIGKILL) received by PID 11", ts[0]),
        }
        assert failure_line(err).startswith("rank 1 (pid 11) was killed by SIGKILL")
    err.failures = {
        0: failure(0, 10, -6, "Signal 6 (SIGABRT) received by PID 10", 1),
        1: failure(1, 11, 1, {"message": "Traceback...\nRuntimeError: injected fault"}, 2),
    }
    assert failure_line(err).startswith("rank 1 (pid 11) failed: RuntimeError: injected fault")


# ----------------------------------------------------------------------------------------------
# the sharded store on real gloo processes: rows bit-identical to a single-process read, bytes per
# link equal to the cost model's counts


STRATEGIES = ("alg1", "interleaved", "mod", "rule1", "naive", "random")


def _store_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    from gnnio.distributed.context import init, shutdown
    from gnnio.distributed.store import ShardedFeatureStore
    from gnnio.features import InMemoryFeatureStore
    from gnnio.placement import PlacementRequest, place
    from tests.helpers import random_graph

    ctx = init(timeout_s=60)
    n, dim = 600, 5
    feats = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    probs = np.random.default_rng(1).pareto(1.2, n)
    graph = random_graph(n, 3000, seed=2)
    results = {}
    for strategy in STRATEGIES:
        req = PlacementRequest(
            probs=probs, topology=ctx.topology, buffer_rows=n // 5, graph=graph, seed=0
        )
        pl = place(strategy, req)
        for reuse in (False, True):
            store = ShardedFeatureStore(InMemoryFeatureStore(feats), pl, ctx, reuse=reuse)
            rng = np.random.default_rng(100 + rank)
            ok = True
            reuse_ref, prev = 0, set()  # rows a reusing store must take from the last batch
            for b in range(5):
                m = int(rng.integers(0, 300)) if b != 2 else 0  # an empty batch takes part too
                ids = rng.integers(0, n, m)
                got = store.gather(torch.from_numpy(ids))
                ok &= bool(torch.equal(got, torch.from_numpy(feats[ids])))
                remote = {int(i) for i in ids if int(store.dev_num[i]) != rank}
                reuse_ref += len(remote & prev)
                prev = remote
            results[f"{strategy}/{reuse}"] = {
                "ok": ok,
                "rows": dict(store.counters.rows),
                "modeled": store.modeled_rows(),
                "reuse_ref": reuse_ref,
            }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    shutdown()


def _spawn(fn, world: int, args: tuple, timeout: float = 120.0) -> None:
    """``world`` processes running ``fn(rank, world, *args)``, each with its share of the cores
    as ``gnnio train --nproc`` gives its ranks (gnnio.distributed.launch): numba's and OpenMP's
    default of one thread per core in each of 2-4 processes on a 2-core machine made every
    parallel kernel call of a small batch wait ~20 ms for its threads (4 ranks: 4 s of 12)."""
    import torch.multiprocessing as mp

    per_rank = str(max(1, (os.cpu_count() or 1) // world))
    added = [k for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS") if k not in os.environ]
    os.environ.update({k: per_rank for k in added})  # inherited by the processes started now
    try:
        ctx = mp.start_processes(
            fn, args=(world, *args), nprocs=world, join=False, start_method="spawn"
        )
    finally:  # (left set, numba in this process would refuse to compile with another count)
        for k in added:
            os.environ.pop(k, None)
    deadline = time.time() + timeout
    while not ctx.join(timeout=1):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} processes did not finish within {timeout:g} s")


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_store_rows_and_links(world, tmp_path):
    _spawn(_store_worker, world, (free_port(), str(tmp_path)))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for key in ranks[0]:
        strategy, reuse = key.split("/")
        for r in ranks:
            res = r[key]
            assert res["ok"], f"{key}: rows differ from the features"
            rows = {t: res["rows"].get(t, 0) for t in ("local", "peer", "host", "network")}
            if reuse == "False":
                for t in ("local", "peer", "host", "network"):
                    assert rows[t] == pytest.approx(res["modeled"][t]), (key, t)
            else:  # reused rows come out of the peer/host reads, never out of the local ones
                reused = res["rows"].get("reuse", 0)
                # exactly the non-local rows of the batch before (a simple set reference), and
                # consecutive batches here do overlap: a store that never reuses fails this
                assert reused == res["reuse_ref"] > 0, (key, reused, res["reuse_ref"])
                assert rows["local"] == pytest.approx(res["modeled"]["local"])
                assert rows["peer"] + rows["host"] + reused == pytest.approx(
                    res["modeled"]["peer"] + res["modeled"]["host"]
                )
        if strategy in ("alg1", "interleaved", "mod") and reuse == "False":
            assert sum(r[key]["rows"].get("peer", 0) for r in ranks) > 0, key


# ----------------------------------------------------------------------------------------------
# training through the CLI: gnnio train --nproc, torchrun on two "machines", failures


def _summary(path: Path) -> dict:
    return json.loads(path.read_text())


def test_train_nproc2_summary(syn, tmp_path):
    s_path = tmp_path / "s.json"
    r = run_cli(
        [
            "train",
            str(syn),
            "--nproc",
            "2",
            "--epochs",
            "3",
            "--batch-size",
            "128",
            "--hidden",
            "32",
            "--quiet",
            "--summary",
            str(s_path),
            "--placement-strategy",
            "alg1",
            "--buffer",
            "0.2",
        ]  # fmt: skip
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s = _summary(s_path)
    import gnnio

    ds = gnnio.load(syn)
    assert s["world_size"] == 2 and s["placement"] == "alg1"
    for key in ("bytes_by_link", "modeled_bytes_by_link", "feature_bytes_by_link"):
        assert set(s[key]) >= {"local", "peer", "host", "network", "per_rank"}
        assert len(s[key]["per_rank"]) == 2
    assert s["feature_bytes_by_link"]["peer"] > 0
    assert s["params_identical"] is True
    assert all(h["params_identical"] for h in s["history"])
    # every training node is a seed exactly once per epoch, across the ranks
    assert sum(s["seeds_per_epoch_per_rank"]) == ds.train_idx.size
    assert 0.0 <= s["test_acc"] <= 1.0  # accuracy: the Cora test below (3 epochs learn little)


@pytest.mark.skipif(not CORA_RAW.is_dir(), reason="../shared/datasets/cora not present")
def test_train_nproc2_cora_accuracy(tmp_path, monkeypatch):
    d = tmp_path / "cora"
    ran = run_gnnio_in_process(monkeypatch)  # (the dataset only: prepared in this process)
    r = run_cli(["prepare", "planetoid", "--name", "cora", "--root", str(CORA_RAW),
                 "--out", str(d)])  # fmt: skip
    assert r.returncode == 0 and len(ran) == 1, r.stderr[-2000:]
    monkeypatch.undo()  # the training: a launcher and its ranks, processes of their own
    s_path = tmp_path / "s.json"
    # 10 epochs: runs are deterministic, and the best validation accuracy of a 50-epoch run is
    # reached at epoch 7 (test accuracy 0.815 there; 0.32 after epoch 0, 0.77 after epoch 4)
    r = run_cli(["train", str(d), "--nproc", "2", "--epochs", "10", "--model", "sage",
                 "--summary", str(s_path), "--quiet"])  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    s = _summary(s_path)
    assert s["world_size"] == 2 and s["test_acc"] >= 0.78
    assert set(s["bytes_by_link"]) >= {"local", "peer", "host", "network"}


def test_the_launcher_does_not_import_the_models(syn):
    """``--nproc N`` checks the options and starts the ranks: importing PyG there (and
    ``torch._dynamo`` with it, ~2.5 s of CPU) only delayed every rank's start."""
    script = (
        "import sys\n"
        "from gnnio.distributed import launch\n"
        "seen = []\n"
        "launch.launch = lambda *a, **k: seen.append(sorted(m for m in sys.modules if m.startswith"
        "(('torch_geometric', 'torch._dynamo', 'gnnio.train.models', 'gnnio.train.loop'))))\n"
        "from gnnio.cli.main import main\n"
        f"assert main(['train', {str(syn)!r}, '--nproc', '2', '--quiet']) == 0\n"
        "assert seen == [[]], seen[0][:10]\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]


def test_two_machines_with_torchrun(syn, tmp_path):
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
               str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
               str(port), "-m", "gnnio", "train", str(syn), "--epochs", "2", "--batch-size",
               "256", "--hidden", "32", "--quiet", "--summary", str(tmp_path / "s.json")]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    s = _summary(tmp_path / "s.json")
    assert s["num_machines"] == 2 and s["topology"] == "1*2"
    assert s["bytes_by_link"]["network"] > 0
    assert s["params_identical"] is True


@pytest.mark.parametrize("kind", ["kill", "raise"])
def test_a_failing_rank_ends_the_run_with_one_line(syn, kind):
    t0 = time.time()
    r = run_cli(
        ["train", str(syn), "--nproc", "2", "--epochs", "100", "--batch-size", "64", "--quiet"],
        env={"GNNIO_FAULT": f"1:5:{kind}"},
        timeout=120,
    )
    took = time.time() - t0
    assert r.returncode != 0
    assert took < 60 + 30  # start-up included; the failure itself ends the run at once
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gnnio:")]
    assert len(lines) == 1, r.stderr[-3000:]
    if kind == "kill":
        assert "rank 1" in lines[0] and "SIGKILL" in lines[0]
    else:
        assert "rank 1" in lines[0] and "injected fault" in lines[0]


def test_rendezvous_that_cannot_complete_times_out(syn):
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}  # fmt: skip
    t0 = time.time()
    r = run_cli(["train", str(syn), "--dist-timeout", "3", "--quiet"], env=env, timeout=60)
    assert r.returncode == 2
    assert time.time() - t0 < 45
    assert "could not join the process group" in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1


def test_interrupting_the_launcher_stops_every_rank(syn, tmp_path):
    marker = str(tmp_path / "interrupted.json")  # in every rank's command line
    log = tmp_path / "epochs.jsonl"  # rank 0 writes a line per epoch: the ranks are training
    p = subprocess.Popen([*GNNIO, "train", str(syn), "--nproc", "2", "--epochs", "1000",
                          "--quiet", "--summary", marker, "--log", str(log)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    t0 = time.monotonic()
    while not (log.is_file() and log.read_text().strip()) and p.poll() is None:
        assert time.monotonic() - t0 < 120, "no epoch ended within 120 s"
        time.sleep(0.1)
    assert p.poll() is None, p.communicate()[1][-2000:]
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("the launcher did not stop within 60 s of SIGINT")
    assert p.returncode != 0
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == [], f"ranks left running: {left}"
