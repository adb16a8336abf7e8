"""The scripts under ``benchmarks/`` still run against today's API, on tiny data: docs/benchmarks.md
quotes their figures, and a user reproducing one runs the script with the command given there.

Each script runs in this process (``runpy``, as ``python benchmarks/NAME.py ...`` would run it;
one interpreter start for all) on a 400-node synthetic graph with the fewest batches, epochs and
seeds its options allow, and must exit 0 and print what it promises (``cache_syncs.py
--interpret`` in a process of its own). Too slow for this file, and stubbed: the example runs of
``pyg_examples/compare.py`` (ten epochs each, a process each; tests/test_pyg_neighbor_loader.py
runs them shortened) and the steps of ``larger_than_ram.sh`` (its ``gnnio`` calls are checked
against the CLI's parser instead).
``gpu_gather_variants.py`` is GPU only: without CUDA it must refuse in one line.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnio.graph.feature_dtype import writing_as
from gnnio.importers.synthetic import prepare_synthetic

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
TRAIN = ["--seeds", "1", "--epochs", "1", "--torch-threads", "1"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "syn"
    prepare_synthetic(out, num_nodes=400, avg_degree=6, feat_dim=8, num_classes=4,
                      split=(0.2, 0.1, 0.1), progress=False)  # fmt: skip
    return out


@pytest.fixture
def run(monkeypatch, capsys):
    """``run(NAME, *args)``: ``python benchmarks/NAME args`` in this process -> its stdout. The
    state a script changes (threads, ``GNNIO_SPMM``, ``cache.ids_on``) is put back after it."""
    from gnnio.features.caches import cache as cache_mod

    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import _accuracy_common from there
    _restored_env(monkeypatch, "GNNIO_SPMM")
    monkeypatch.delenv("GNNIO_SPMM", raising=False)  # (a script starts without it)
    monkeypatch.setattr(cache_mod, "ids_on", cache_mod.ids_on)
    threads = torch.get_num_threads()

    def go(name: str, *args: str) -> str:
        monkeypatch.setattr(sys, "argv", [str(BENCH / name), *map(str, args)])
        try:
            runpy.run_path(str(BENCH / name), run_name="__main__")
        except SystemExit as e:
            assert e.code in (0, None), f"{name} exited {e.code!r}"
        finally:
            torch.set_num_threads(threads)
        return capsys.readouterr().out

    return go


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_cache_overhead(run, tiny):
    out = _last_json(run("cache_overhead.py", tiny, "--rounds", "1", "--batches", "2",
                         "--warmup", "1", "--batch-size", "16", "--fanouts", "3,2", "--json"))  # fmt: skip
    pols = ["static", "fifo", "lru", "lfu", "lookahead"]
    for key in ("manage_ms_median", "manage_ms_min", "wall_ms_median", "hit_ratio"):
        assert sorted(out[key]) == sorted(pols), key
    assert all(0 <= h <= 1 for h in out["hit_ratio"].values())


def test_lookahead_fallback(run, tiny):
    out = _last_json(run("lookahead_fallback.py", tiny, "--batch-size", "16", "--fanouts", "3,2",
                         "--batches", "3", "--warmup", "1", "--json"))  # fmt: skip
    assert out["batches"] == 3
    rows = out["rows_fetched"]
    assert set(rows) >= {"lookahead (wrpr)", "lookahead (epoch counts)", "optimal"}
    assert all(set(r) == {"0.1", "0.2"} and min(r.values()) > 0 for r in rows.values())


def test_cache_syncs_torch_path(run):
    lines = run("cache_syncs.py", "--rows", "2048", "--dim", "4", "--batch", "500").splitlines()
    assert [ln.split()[:2] for ln in lines] == [
        [p, f] for p in ("fifo", "static", "lookahead") for f in ("host", "sync_free")
    ]
    for ln in lines:  # the sync-free path waits for the host in no batch
        assert "syncs/batch" in ln and "hit ratio" in ln
        if ln.split()[1] == "sync_free":
            assert float(ln.split("syncs/batch")[1].split()[0]) == 0.0, ln


def test_cache_syncs_interpreted():
    """``--interpret``: the Triton branches in Triton's interpreter (a process of its own: the
    variable is read when the kernels are defined)."""
    pytest.importorskip("triton")
    r = subprocess.run([sys.executable, str(BENCH / "cache_syncs.py"), "--interpret", "--rows",
                        "1024", "--dim", "4", "--batch", "200"],
                       env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 6, r.stdout
    for ln in lines:
        if ln.split()[1] == "sync_free":  # its batch as Triton kernels, no host wait
            assert float(ln.split("launches/batch")[1].split()[0]) > 0, ln
            assert float(ln.split("syncs/batch")[1].split()[0]) == 0.0, ln


def test_step_kernels(run, tiny):
    out = _last_json(run("step_kernels.py", tiny, "--steps", "1"))
    # equal to torch's product within float rounding; bit for bit only where MKL does not fuse
    # the multiply-add (AVX-512 Intel VMs do: the last bits differ there, tests/test_spmm.py)
    assert out["block"]["edges"] > 0 and isinstance(out["forward_bit_identical"], bool)
    assert out["forward_max_abs_diff"] < 1e-4
    for impl in ("numba", "torch"):
        assert set(out[f"step_{impl}_ms"]) == {"forward", "backward", "optimizer", "total"}


def test_step_profile(run, tiny, tmp_path):
    dest = tmp_path / "profile.json"
    run("step_profile.py", tiny, "--device", "cpu", "--batches", "1", "--profile-batches", "1",
        "--warmup", "0", "--batch-size", "16", "--fanouts", "3,2", "--out", dest)  # fmt: skip
    out = json.loads(dest.read_text())
    parts = ("batch", "isolated", "graphed", "aggregation", "profile_isolated", "profile_pipelined")
    for part in parts:  # a part that fails is recorded as {"error": ...} and the script goes on
        assert isinstance(out.get(part), dict) and "error" not in out[part], (part, out.get(part))
    assert out["isolated"]["isolated_step_ms"] > 0


def test_writer_pass(run, tiny):
    out = run("writer_pass.py", tiny / "features.npy", "--rounds", "1")
    assert [ln.split("wall")[0].split()[2:] for ln in out.splitlines()[:3]] == [
        ["two"],
        ["two,", "evicted"],
        ["one"],
    ]
    assert out.splitlines()[-1].startswith("same sha256 and count: (")


def test_las_accuracy(run, tiny, tmp_path):
    run("las_accuracy.py", *TRAIN, "--datasets", "synthetic", "--synthetic-dir", tiny,
        "--hidden", "8", "--out-json", tmp_path / "las.json")  # fmt: skip
    out = json.loads((tmp_path / "las.json").read_text())
    got = {(r["dataset"], r["variant"]) for r in out["runs"]}
    assert got == {("synthetic", v) for v in ("uniform", "las8", "auto", "auto_gpu", "prune")}


def test_po_convergence(run, tiny, tmp_path):
    run("po_convergence.py", *TRAIN, "--datasets", "synthetic", "--synthetic-dir", tiny,
        "--hidden", "8", "--out-json", tmp_path / "po.json")  # fmt: skip
    out = json.loads((tmp_path / "po.json").read_text())
    assert {(r["dataset"], r["order"]) for r in out["runs"]} == {
        ("synthetic", "random"),
        ("synthetic", "po"),
    }


def test_sampler_accuracy(run, tiny, tmp_path):
    variants = "uniform,labor,ladies64,ladies64-s1,ladies64-s2,ladies64-auto,ladies64-autogpu"
    run("sampler_accuracy.py", *TRAIN, "--threads", "1", "--datasets", "synthetic",
        "--synthetic-dir", tiny, "--variants", variants, "--gpu-cache-fraction", "0.1",
        "--out-json", tmp_path / "sa.json")  # fmt: skip
    out = json.loads((tmp_path / "sa.json").read_text())
    assert {r["variant"] for r in out["runs"]} == set(variants.split(","))


def test_feature_dtype_accuracy(run, tmp_path):
    root = tmp_path / "data"
    for dt in ("float32", "float16", "bfloat16", "int8"):  # prepared: the script reuses them
        with writing_as(dt):
            prepare_synthetic(root / f"cora-{dt}", num_nodes=300, avg_degree=6, feat_dim=8,
                              num_classes=4, split=(0.2, 0.1, 0.1), progress=False)  # fmt: skip
    out = run("feature_dtype_accuracy.py", "--datasets", "cora", "--seeds", "1", "--epochs", "1",
              "--root", root, "--torch-threads", "1", "--out-json", tmp_path / "fdt.json")  # fmt: skip
    res = json.loads((tmp_path / "fdt.json").read_text())
    ratio = {r["dtype"]: r["bytes_ratio"] for r in res["table"]}
    assert ratio == {"float32": 1.0, "float16": 0.5, "bfloat16": 0.5, "int8": 0.25}, out
    assert {(t["setup"], t["dtype"]) for t in res["traffic"]} == {
        (s, d) for s in ("disk", "tiered") for d in ratio
    }


@pytest.mark.skipif(shutil.which("bash") is None or not Path("/usr/bin/time").exists(),
                    reason="needs bash and /usr/bin/time")  # fmt: skip
def test_larger_than_ram_calls_parse(tmp_path):
    """The script's three ``gnnio`` calls (a stub records them) parse with today's CLI."""
    from gnnio.cli.main import build_parser, normalise_argv

    calls = tmp_path / "calls"
    stub = tmp_path / "gnnio"
    stub.write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\t" "$a"; done >>{calls}\necho >>{calls}\n'
    )
    stub.chmod(0o755)
    r = subprocess.run(["bash", str(BENCH / "larger_than_ram.sh"), str(tmp_path / "w"), "2048",
                        "16", "--budget", "64MiB"], env={**os.environ, "GNNIO": str(stub)},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    argvs = [ln.rstrip("\n").split("\t")[:-1] for ln in calls.read_text().splitlines()]
    assert [a[0] for a in argvs] == ["prepare", "reorder", "train"]
    for argv in argvs:
        build_parser().parse_args(normalise_argv(argv))  # an unknown option exits 2
    tsv = (tmp_path / "w" / "results.tsv").read_text().splitlines()
    assert [ln.split("\t")[0] for ln in tsv[1:]] == ["prepare", "reorder", "train"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_gpu_gather_variants_refuses_without_cuda(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_gather_variants.py", "--rows", "8"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(BENCH / "gpu_gather_variants.py"), run_name="__main__")
    assert str(e.value.code).startswith("gpu_gather_variants.py: error: needs a CUDA device")
    assert "\n" not in str(e.value.code)


@pytest.mark.parametrize("text", ["abc", "cora=2.5"])
def test_per_dataset_refuses_a_non_number_in_one_line(monkeypatch, text):
    monkeypatch.syspath_prepend(str(BENCH))
    from _accuracy_common import per_dataset

    with pytest.raises(SystemExit) as e:
        per_dataset(text, "batch_size", {"cora": {"batch_size": 16}}, "las_accuracy")
    assert str(e.value.code).startswith("las_accuracy: error: --batch-size: not a number")


@pytest.mark.parametrize("bad", [["--epochs", "abc"], ["--epochs", "0"], ["--seeds", "0"]])
def test_feature_dtype_accuracy_refuses_in_one_line(monkeypatch, capsys, tmp_path, bad):
    """Before any dataset is prepared, not a traceback from int() or the first training run."""
    monkeypatch.setattr(sys, "argv", ["feature_dtype_accuracy.py", "--root", str(tmp_path), *bad])
    monkeypatch.syspath_prepend(str(BENCH))
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(BENCH / "feature_dtype_accuracy.py"), run_name="__main__")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"feature_dtype_accuracy: error: argument {bad[0]}: need a whole")
    assert not any(tmp_path.iterdir())


def _restored_env(monkeypatch, name: str) -> None:
    """Have ``monkeypatch`` put ``name`` back as it is now after the test, also when a script
    sets it with ``os.environ[...] =`` (``delenv`` of an unset variable records nothing to undo:
    ``GNNIO_SPMM=torch`` leaked into the next test of the worker)."""
    monkeypatch.setenv(name, os.environ.get(name, ""))
    if name not in os.environ or not os.environ[name]:
        monkeypatch.delenv(name)


def _compare(monkeypatch):
    """benchmarks/pyg_examples/compare.py as a module, its example runs stubbed (each is ten
    epochs in a process of its own; tests/test_pyg_neighbor_loader.py runs them for real)."""
    pytest.importorskip("torch_geometric")
    monkeypatch.syspath_prepend(str(BENCH / "pyg_examples"))
    _restored_env(monkeypatch, "GNNIO_CACHE")  # (kept_batches points it at its work folder)
    import compare

    def run_one(script, args, loader, work, root):
        acc = {"pyg": 0.5, "gnnio": 0.52}[loader]
        return {"script": script.name, "loader": loader, "edits_beyond_import": 0, "rc": 0,
                "test_acc": acc, "args": args}  # fmt: skip

    monkeypatch.setattr(compare, "run_one", run_one)
    return compare


@pytest.mark.skipif(not Path("/work/shared/datasets/cora").is_dir(), reason="no Cora")
def test_pyg_compare_summary_and_kept_batches(monkeypatch, capsys):
    compare = _compare(monkeypatch)
    assert compare.main(["--scripts", "reddit_sage.py", "--repeats", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(out["scripts"]) == ["reddit_sage.py"]
    row = out["scripts"]["reddit_sage.py"]
    assert row["pyg"]["runs"] == row["gnnio"]["runs"] == 2 and row["gnnio_minus_pyg_points"] == 2.0
    kept = out["kept_batches"]  # Cora's 2708 nodes in batches of 64; the copies are the rows
    assert kept["NeighborLoader"] == kept["PyGLoader"] == {"batches": 43, "differ": 0}


@pytest.mark.parametrize("bad", [["--scripts", "reddit_sage"], ["--repeats", "0"]])
def test_pyg_compare_refuses_before_running(monkeypatch, capsys, bad):
    """A misspelt --scripts ran nothing and reported an empty "scripts"; --repeats 0 crashed in
    max() after the work."""
    compare = _compare(monkeypatch)
    monkeypatch.setattr(compare, "planetoid_root", lambda *a: pytest.fail("ran"))
    with pytest.raises(SystemExit) as e:
        compare.main(bad)
    assert e.value.code == 2
    assert f": error: {bad[0]}: " in capsys.readouterr().err.splitlines()[-1]
