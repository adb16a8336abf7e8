"""The training loop, the summary/log/checkpoint files, the ``gnnio train`` CLI and the default dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnio import load
from gnnio.errors import UsageError
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.train import TrainConfig, evaluate_full, evaluate_sampled, load_checkpoint, train
from gnnio.train.models import build_model

SUMMARY_KEYS = {
    "dataset",
    "model",
    "config",
    "best_valid_acc",
    "test_acc",
    "best_epoch",
    "epochs",
    "epoch_time_s",
    "eval_time_s",
    "breakdown_s",
    "bytes_by_tier",
    "seeds_per_s",
    "device",
    "history",
}


@pytest.fixture(scope="module")
def easy(tmp_path_factory):
    """A small homophilous synthetic graph, 4 classes (chance = 0.25), half the nodes training."""
    out = tmp_path_factory.mktemp("data") / "easy"
    prepare_synthetic(
        out,
        num_nodes=1500,
        avg_degree=8,
        feat_dim=16,
        num_classes=4,
        seed=0,
        split=(0.5, 0.2, 0.3),
        progress=False,
    )
    return out


def small_config(**kw) -> TrainConfig:
    base = dict(
        fanouts=(5, 5), batch_size=128, epochs=4, hidden=32, lr=0.01, progress=False, seed=0
    )
    base.update(kw)
    return TrainConfig(**base)


def test_training_learns_and_writes_files(easy, tmp_path):
    cfg = small_config(
        summary=str(tmp_path / "s.json"),
        log=str(tmp_path / "log.jsonl"),
        checkpoint=str(tmp_path / "best.pt"),
    )
    s = train(easy, cfg)
    assert SUMMARY_KEYS <= set(s)
    assert s["test_acc"] >= 0.6, s["test_acc"]  # chance is 0.25
    assert s["best_valid_acc"] >= 0.6
    assert set(s["breakdown_s"]) >= {"sample", "gather", "transfer", "compute"}
    assert s["breakdown_s"]["compute"] > 0 and s["breakdown_s"]["sample"] > 0
    ds = load(easy)
    # feature bytes of the training passes only: at least one row per training seed per epoch
    total = sum(s["bytes_by_tier"].values())
    assert total >= s["epochs"] * ds.train_idx.size * ds.feat_dim * 4
    assert s["epochs"] == 4 and len(s["history"]) == 4
    on_disk = json.loads((tmp_path / "s.json").read_text())
    assert on_disk["test_acc"] == s["test_acc"] and on_disk["config"]["fanouts"] == [5, 5]
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0, 1, 2, 3]
    assert s["test_acc"] == s["history"][s["best_epoch"]]["test_acc"]

    # the checkpoint holds the best-valid model: reloaded, it reproduces the best valid accuracy
    # on the very same evaluation batches (eval sampler seed = seed + 1, keyed by the epoch)
    from gnnio.features import open_store
    from gnnio.sampling import UniformSampler
    from gnnio.train import make_node_loader

    model = build_model("sage", ds.feat_dim, 32, ds.num_classes, num_layers=2)
    load_checkpoint(tmp_path / "best.pt", model)
    state = torch.load(tmp_path / "best.pt", weights_only=True)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    store = open_store(ds, "memory", "cpu", progress=False)
    labels = torch.from_numpy(np.asarray(ds.labels))
    sampler = UniformSampler(ds.graph, [5, 5], seed=cfg.seed + 1)
    ld = make_node_loader(sampler, store, ds.valid_idx, labels, 4096, cfg.seed, "cpu", 2)
    assert evaluate_sampled(model, ld, epoch=s["best_epoch"]) == s["best_valid_acc"]


@pytest.mark.parametrize("name", ["gcn", "gat", "gin"])
def test_other_models_train(easy, name):
    s = train(easy, small_config(model=name, epochs=2, heads=2))
    assert s["best_valid_acc"] > 0.6, (name, s["best_valid_acc"])  # chance is 0.25


def test_full_eval_and_mmap_store(easy):
    s = train(easy, small_config(eval="full", store="mmap", epochs=2))
    assert s["best_valid_acc"] >= 0.5
    assert s["config"]["eval"] == "full"
    assert set(s["bytes_by_tier"]) == {"disk"}


def test_sampled_eval_with_all_neighbours_equals_full_eval(easy):
    from gnnio.features import open_store
    from gnnio.train import make_node_loader

    ds = load(easy)
    torch.manual_seed(0)
    model = build_model("sage", ds.feat_dim, 16, ds.num_classes, num_layers=2)
    from gnnio.sampling import UniformSampler

    store = open_store(ds, "memory", "cpu", progress=False)
    labels = torch.from_numpy(np.asarray(ds.labels))
    ld = make_node_loader(
        UniformSampler(ds.graph, [-1, -1]), store, ds.valid_idx, labels, 256, 0, "cpu", 2
    )
    sampled = evaluate_sampled(model, ld)
    full = evaluate_full(model, ds, {"valid": ds.valid_idx}, 300, torch.device("cpu"), False)
    assert sampled == pytest.approx(full["valid"], abs=1e-12)


def test_early_stopping_invariant(easy):
    s = train(easy, small_config(epochs=30, patience=2, lr=0.05))
    assert s["epochs"] <= s["best_epoch"] + 3
    if s["stopped_early"]:
        assert s["epochs"] - 1 - s["best_epoch"] == 2
    assert s["stopped_early"], "an easy graph should plateau within 30 epochs"


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"model": "mlp"}, "--model"),
        ({"fanouts": ()}, "fanouts"),
        ({"batch_size": 0}, "--batch-size"),
        ({"eval": "exact"}, "--eval"),
        ({"store": "ssd"}, "--store"),
        ({"lr": -1.0}, "--lr"),
        ({"patience": 0}, "--patience"),
        ({"device": "tpu"}, "--device"),
    ],
)
def test_config_errors(kw, match):
    with pytest.raises(UsageError, match=match):
        small_config(**kw).validate()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_training_on_cuda(easy):
    # --sampler-device cpu: no planned layout, so the loader copies the host rows to the GPU (with
    # no layout option the planner puts this small graph's rows and CSR on the GPU: nothing left
    # to transfer, test_training_on_cuda_matches_cpu[planned])
    s = train(easy, small_config(device="cuda", epochs=2, sampler_device="cpu"))
    assert s["device"].startswith("cuda") and s["best_valid_acc"] > 0.6
    assert s["breakdown_s"]["transfer"] > 0 and s["simulated"] is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("data", ["planned", "tiered", "planned_locality"])
def test_training_on_cuda_matches_cpu(easy, data):
    """The same run on the CPU and on CUDA: the same rows per tier (the sampler and the seed
    order are the same), and losses that differ only by floating-point order (no dropout).
    ``planned``: no layout option, so on CUDA gnnio plans it (this small graph fits: every row on
    the GPU, the GPU sampler); the CPU run is given that layout (``gpu_cache_fraction=1``,
    simulated) -- the CPU's own default, a plain host store, books its rows as ``host``.
    ``planned_locality``: the same with ``--locality-scale 2``, whose set B is the planned rows."""
    kw: dict = dict(epochs=2, dropout=0.0)
    if data == "tiered":
        kw["gpu_cache_fraction"] = 0.25
    if data == "planned_locality":
        kw["locality_scale"] = 2.0
    cpu_kw = dict(kw, gpu_cache_fraction=1.0) if data.startswith("planned") else kw
    cpu = train(easy, small_config(device="cpu", **cpu_kw))
    gpu = train(easy, small_config(device="cuda", **kw))
    if data.startswith("planned"):
        assert gpu["plan"]["planned"] and gpu["plan"]["gpu_cache_fraction"] == 1.0, gpu["plan"]
        assert ("locality" in gpu["plan"]) == (data == "planned_locality"), gpu["plan"]
    assert gpu["bytes_by_tier"] == cpu["bytes_by_tier"]
    assert gpu["rows_by_tier"] == cpu["rows_by_tier"]
    for a, b in zip(cpu["history"], gpu["history"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-2)
    assert cpu["simulated"] is True and gpu["simulated"] is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_cli_cuda_without_cuda_is_one_line_error(easy, capsys):
    from gnnio.cli.main import main

    rc = main(["train", str(easy), "--device", "cuda", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("gnnio: error: --device cuda") and "\n" not in err


def test_cli_train_writes_summary(easy, tmp_path, capsys):
    from gnnio.cli.main import main

    f = tmp_path / "out" / "s.json"
    rc = main(
        [
            "train",
            str(easy),
            "--epochs",
            "2",
            "--fanouts",
            "4,4",
            "--batch-size",
            "256",
            "--hidden",
            "16",
            "--summary",
            str(f),
            "--quiet",
        ]  # fmt: skip
    )
    assert rc == 0
    s = json.loads(f.read_text())
    assert SUMMARY_KEYS <= set(s) and s["epochs"] == 2
    out = capsys.readouterr().out
    assert "test acc" in out and "gather" in out
    assert "simulated" not in out  # (nothing but the device, which its line names)


@pytest.mark.parametrize(
    ("argv", "part"),
    [(["--gpu-cache-fraction", "0.1"], "tiering: the GPU tier is held in CPU memory"),
     (["--cache-policy", "fifo"], "cache: held in host memory")],
)  # fmt: skip
def test_cli_train_says_which_gpu_structure_was_simulated(easy, capsys, argv, part):
    """Without a GPU, a GPU tier or cache lives in host memory: the text summary says so on a
    ``simulated:`` line (as the JSON's ``simulated_parts``), not only the summary file."""
    from gnnio.cli.main import main

    argv = ["train", str(easy), "--epochs", "1", "--fanouts", "4,4", "--hidden", "8", *argv]
    assert main([*argv, "--device", "cpu", "--quiet"]) == 0
    sim = [x for x in capsys.readouterr().out.splitlines() if x.startswith("simulated: ")]
    assert len(sim) == 1 and part in sim[0], sim


def test_cli_bad_fanouts(easy, capsys):
    from gnnio.cli.main import main

    assert main(["train", str(easy), "--fanouts", "5,x", "--quiet"]) == 2
    assert "--fanouts" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["bad-json", "no-meta"])
def test_default_dataset_regenerated_when_its_meta_json_is_damaged(tmp_path, monkeypatch, damage):
    """The module's promise, 'a cached directory that no longer opens as a valid dataset is
    regenerated in place', also when ``meta.json`` itself is damaged or gone (it was one error
    line on every run: the writer replaces only a directory whose meta.json names a dataset); a
    directory holding files a dataset does not is left as it is, with one line saying so."""
    from gnnio.errors import DatasetError
    from gnnio.train import defaults

    monkeypatch.setenv("GNNIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(defaults, "DEFAULT_DATASET", {"num_nodes": 300, "avg_degree": 4,
                        "feat_dim": 4, "num_classes": 3, "seed": 0})  # fmt: skip
    path = defaults.default_dataset(progress=False).path
    meta = path / "meta.json"
    meta.write_text("{") if damage == "bad-json" else meta.unlink()
    assert defaults.default_dataset(progress=False).num_nodes == 300  # regenerated
    (path / "notes.txt").write_text("mine")
    meta.unlink()
    with pytest.raises(DatasetError, match="holds other files: remove it"):
        defaults.default_dataset(progress=False)
    assert (path / "notes.txt").read_text() == "mine"


def test_default_dataset_generated_once_and_regenerated_when_broken(tmp_path, monkeypatch, capsys):
    from gnnio.cli.main import main
    from gnnio.train import defaults

    monkeypatch.setenv("GNNIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        defaults,
        "DEFAULT_DATASET",
        {"num_nodes": 600, "avg_degree": 6, "feat_dim": 8, "num_classes": 3, "seed": 0},
    )
    monkeypatch.setattr(defaults, "DEFAULT_TRAIN_EPOCHS", 1)
    path = defaults.default_dataset_path()
    assert path.parent == tmp_path / "cache" and "n600" in path.name
    ds = defaults.default_dataset(progress=False)
    assert ds.path == path and ds.num_nodes == 600
    stamp = (path / "meta.json").stat().st_mtime_ns
    assert defaults.default_dataset(progress=False).num_nodes == 600
    assert (path / "meta.json").stat().st_mtime_ns == stamp  # reused, not regenerated
    (path / "indptr.npy").write_bytes(b"broken")
    assert defaults.default_dataset(progress=False).num_nodes == 600  # regenerated

    f = tmp_path / "s.json"
    rc = main(["train", "--fanouts", "3,3", "--hidden", "8", "--summary", str(f), "--quiet"])
    assert rc == 0
    s = json.loads(f.read_text())
    assert s["epochs"] == 1 and s["dataset_path"] == str(path)
    assert "built-in synthetic dataset" in capsys.readouterr().out


def test_cli_help_states_each_default_once():
    import argparse

    from gnnio.cli import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--a", default=None, help="unset = automatic")
    p.add_argument("--b", default=3, help="three")
    p.add_argument("--c", default=5, help="five (default: the fifth)")
    text = p.format_help()
    assert "(default: None)" not in text
    assert "three (default: 3)" in text
    assert text.count("(default") == 2


def test_every_cli_option_has_help():
    """README: 'gnnio --help and gnnio COMMAND --help document every option' (--model had none)."""
    import argparse

    from gnnio.cli.main import build_parser

    def options(parser, name):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for k, sub in a.choices.items():
                    yield from options(sub, f"{name} {k}")
            elif a.option_strings:
                yield f"{name} {a.option_strings[0]}", a.help

    assert [name for name, text in options(build_parser(), "gnnio") if not text] == []


def test_bench_help_is_plain_text():
    """The bench descriptions are module docstrings: their Sphinx markup is not shown in --help."""
    from gnnio.cli.bench import BENCHES, plain
    from gnnio.cli.main import build_parser

    assert plain(":func:`~gnnio.train.build.train_step` and ``--warmup``, **bold**") == (
        "train_step and --warmup, bold"
    )
    for kind in BENCHES:
        sub = build_parser()._subparsers._group_actions[0].choices["bench"]
        text = sub._subparsers._group_actions[0].choices[kind].format_help()
        assert not any(m in text for m in ("``", ":func:`", ":class:`", ":mod:`", "**")), kind


def test_sampled_evaluation_shows_a_bar(tmp_path, capsys, monkeypatch):
    """Evaluation runs over the valid and test seeds (on Facebook's 80 % test split it took
    longer than the training epoch) and shows a bar as the epoch does; --quiet hides both."""
    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    monkeypatch.delenv("GNNIO_NO_PROGRESS", raising=False)
    d = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200, feat_dim=8)
    argv = ["train", str(d), "--device", "cpu", "--epochs", "1", "--fanouts", "3,2"]
    argv += ["--hidden", "8"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "epoch 0" in err and "eval valid" in err and "eval test" in err
    assert main([*argv, "--quiet"]) == 0
    assert "eval valid" not in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["train", "reorder"])
def test_no_progress_hides_the_bars_and_keeps_the_rest(cmd, tmp_path, capsys, monkeypatch):
    """``--no-progress`` (as the bench commands and ``plan`` take it): no progress bar, the
    per-epoch lines / summary kept, and ``GNNIO_NO_PROGRESS`` as it was after the command."""
    import os

    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    monkeypatch.delenv("GNNIO_NO_PROGRESS", raising=False)
    d = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200, feat_dim=8)
    if cmd == "train":
        argv = ["train", str(d), "--device", "cpu", "--epochs", "1", "--fanouts", "3,2",
                "--hidden", "8"]  # fmt: skip
        bar, kept = "eval valid", "epoch time"
    else:
        argv, bar, kept = ["reorder", str(d), "--by", "degree"], "%|", "reorder"
    assert main([*argv, *(["--out", str(tmp_path / "a")] if cmd == "reorder" else [])]) == 0
    out = capsys.readouterr()
    assert bar in out.err and kept in out.out + out.err
    assert main([*argv, *(["--out", str(tmp_path / "b")] if cmd == "reorder" else []),
                 "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert bar not in out.err and kept in out.out + out.err
    assert "GNNIO_NO_PROGRESS" not in os.environ
