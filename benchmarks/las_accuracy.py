"""Accuracy and training loss of locality-aware sampling (LAS) and threshold pruning against
uniform neighbour sampling (issue #7).

For every dataset, variant and seed, one ``gnnio.train.train`` run through the public API. Variants:

* ``uniform``: :class:`gnnio.sampling.UniformSampler` (the baseline; also "no pruning");
* ``las8``: Song & Jiang's LAS with a fixed scale ``s = --scale`` (default 8 = their MAXS);
* ``auto``: LAS with Algorithm 2 (lt 0.15, ut 0.2, MAXS 8) driven by the *modeled* loading share
  with the **measured CPU compute time** per epoch (``locality_compute_s=None``);
* ``auto_gpu``: the same, but with ``locality_compute_s`` = a *modeled GPU* compute time ``C`` per
  epoch, chosen so that the modeled loading share of uniform sampling is ``--target-share``
  (default 0.4, Song & Jiang's Figure 1): ``C = t_load * (1 - r) / r`` with ``t_load`` =
  :func:`gnnio.sampling.modeled_loading_time` of the host and GPU feature bytes per epoch of the
  ``uniform`` run with the lowest seed (mean over its epochs). ``--compute-s`` fixes ``C`` instead;
* ``prune``: HyDRA threshold pruning ``(alpha, beta) = --prune`` (default 1,1) with uniform
  sampling inside the window.

Every run keeps the top ``--gpu-cache-fraction`` (default 0.1) of the rows by ``wrpr`` in the
(simulated) GPU tier of a tiered store, so ``bytes_by_tier`` has ``gpu`` and ``host`` bytes for
every variant (counted; the tier returns exactly the stored rows, so it changes nothing in the
training). That set is LAS's ``B``. Evaluation is ``eval="full"`` (exact full-neighbour inference).

Reported per (dataset, variant): mean +- sample std over seeds of the test accuracy at the
best-validation epoch and of the last-epoch test accuracy, the difference to ``uniform`` in points
(also paired by seed: the same seed gives the same initial weights and seed order), whether it is
within ``--tolerance`` points, the host MB per epoch, and for ``auto``/``auto_gpu`` the scale per
epoch and the modeled loading shares Algorithm 2 saw.

Presets (2-layer GraphSAGE, fanouts 10,5, Adam lr 0.003, dropout 0.5, as
benchmarks/po_convergence.py):

* ``cora``: public split (140 training nodes), batch 16 (9 batches/epoch), 50 epochs, hidden 256;
* ``synthetic``: ``gnnio.train.defaults.default_dataset()`` (30,000 nodes, 3,000 training nodes),
  batch 64 (47 batches/epoch), 10 epochs, hidden 256;
* ``facebook``: 10 % train (2,248 nodes), batch 64 (36 batches/epoch), 10 epochs, hidden 64.

The command behind docs/benchmarks.md, "Locality-aware sampling and threshold pruning" (Facebook at 5 epochs and without ``auto`` to fit a
25-minute CPU budget on 2 cores; about 13 min CPU)::

    .venv/bin/python benchmarks/las_accuracy.py --torch-threads 1 \\
        --seeds 3,facebook:auto_gpu=1 --epochs cora=50,synthetic=10,facebook=5 \\
        --skip facebook:auto --out-json /tmp/las_accuracy.json \\
        --plot docs/img/las_loss.png --plot-prune docs/img/prune_loss.png

``--replot JSON`` redraws both figures from a saved ``--out-json`` without training.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from _accuracy_common import (
    DEFAULT_DIRS,
    comma_list,
    dataset_dir,
    dataset_line,
    mean_std,
    paired_diff,
    per_dataset,
    pyplot,
    run_record,
    save_figure,
    timed_train,
    write_json,
)

DATASETS = ("cora", "synthetic", "facebook")
VARIANTS = ("uniform", "las8", "auto", "auto_gpu", "prune")

#: per-dataset defaults
PRESETS = {
    "cora": {"batch_size": 16, "epochs": 50, "hidden": 256, "seeds": 3},
    "synthetic": {"batch_size": 64, "epochs": 10, "hidden": 256, "seeds": 3},
    "facebook": {"batch_size": 64, "epochs": 10, "hidden": 64, "seeds": 3},
}
COLORS = {
    "uniform": "tab:blue",
    "las8": "tab:red",
    "auto": "tab:green",
    "auto_gpu": "tab:purple",
    "prune": "tab:orange",
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="las_accuracy",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma list")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list")
    p.add_argument(
        "--skip",
        default="",
        help="comma list of DATASET:VARIANT pairs not to run (e.g. 'facebook:auto')",
    )
    p.add_argument(
        "--seeds",
        default=None,
        help="number of seeds, 'N' or 'cora=3,facebook=2'; 'facebook:auto_gpu=1' overrides one "
        "variant",
    )
    p.add_argument("--epochs", default=None, help="epochs, 'N' or per dataset")
    p.add_argument("--batch-size", default=None, help="batch size, 'N' or per dataset")
    p.add_argument("--hidden", default=None, help="hidden width, 'N' or per dataset")
    p.add_argument("--fanouts", default="10,5", help="per-hop fanouts (hop 1 first)")
    p.add_argument("--gpu-cache-fraction", type=float, default=0.1, help="GPU tier = B")
    p.add_argument("--score", default="wrpr", help="hotness score choosing B")
    p.add_argument("--scale", type=float, default=8.0, help="fixed s of variant las8")
    p.add_argument("--max-scale", type=float, default=8.0, help="MAXS of the auto variants")
    p.add_argument("--prune", default="1,1", help="ALPHA,BETA of variant prune")
    p.add_argument(
        "--target-share",
        type=float,
        default=0.4,
        help="auto_gpu: modeled loading share of uniform sampling that fixes C",
    )
    p.add_argument(
        "--compute-s",
        default=None,
        help="auto_gpu: fixed C seconds per epoch, 'X' or 'cora=X,...' (default: from "
        "--target-share and the uniform run)",
    )
    p.add_argument("--tolerance", type=float, default=1.0, help="accuracy points")
    p.add_argument("--threads", type=int, default=1, help="sampler / gather threads")
    p.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--cora-dir", default=DEFAULT_DIRS["cora"])
    p.add_argument("--facebook-dir", default=DEFAULT_DIRS["facebook"])
    p.add_argument(
        "--synthetic-dir",
        default=None,
        help="default: gnnio.train.defaults.default_dataset()'s path",
    )
    p.add_argument("--out-json", default=None, help="write all runs and the summary here")
    p.add_argument("--plot", default=None, help="PNG: loss / accuracy, LAS variants vs uniform")
    p.add_argument("--plot-prune", default=None, help="PNG: loss / accuracy, prune vs uniform")
    p.add_argument(
        "--replot", default=None, metavar="JSON", help="only redraw the plots from an --out-json"
    )
    p.add_argument("--progress", action="store_true", help="gnnio's per-batch progress bars")
    a = p.parse_args(argv)
    a.datasets = comma_list(p, a.datasets, DATASETS, "datasets", "dataset")
    a.variants = comma_list(p, a.variants, VARIANTS, "variants", "variant")
    a.skip = {tuple(s.strip().split(":", 1)) for s in a.skip.split(",") if ":" in s}
    try:
        a.fanouts = tuple(int(x) for x in a.fanouts.split(","))
        a.prune = tuple(float(x) for x in a.prune.split(","))
        if len(a.prune) != 2:
            raise ValueError
    except ValueError:
        p.error("--fanouts: integers, --prune: ALPHA,BETA")
    if not 0 < a.target_share < 1:
        p.error(f"--target-share: must be in (0, 1), got {a.target_share}")
    a.seed_override = {}
    if a.seeds:  # 'DATASET:VARIANT=N' entries override the per-dataset count for one variant
        parts = [t.strip() for t in a.seeds.split(",")]
        for t in parts:
            if ":" in t:
                key, _, val = t.partition("=")
                if not val.strip().isdigit():
                    p.error(f"--seeds: '{t}': DATASET:VARIANT=N takes a whole number N")
                a.seed_override[tuple(key.split(":", 1))] = int(val)
        a.seeds = ",".join(t for t in parts if ":" not in t)
    a.seeds = per_dataset(a.seeds, "seeds", PRESETS, "las_accuracy")
    a.epochs = per_dataset(a.epochs, "epochs", PRESETS, "las_accuracy")
    a.batch_size = per_dataset(a.batch_size, "batch_size", PRESETS, "las_accuracy")
    a.hidden = per_dataset(a.hidden, "hidden", PRESETS, "las_accuracy")
    a.compute_s = _compute_s(a.compute_s, p)
    return a


def _compute_s(text: str | None, p) -> dict[str, float]:
    out: dict[str, float] = {}
    if not text:
        return out
    for part in text.split(","):
        name, _, val = part.rpartition("=")
        try:
            v = float(val)
        except ValueError:
            p.error(f"--compute-s: expected seconds, got '{part}'")
        if not v > 0:
            p.error(f"--compute-s: must be > 0, got {v}")
        if name:
            out[name] = v
        else:
            out = {d: v for d in DATASETS}
    return out


def modeled_compute_s(uniform_run: dict, target: float) -> tuple[float, float]:
    """``(C, t_load)``: the compute seconds per epoch that make the modeled loading share of the
    uniform run equal ``target``, and the modeled loading seconds per epoch it is based on."""
    from gnnio.sampling import modeled_loading_time

    t = float(
        np.mean(
            [modeled_loading_time(h["host_bytes"], h["gpu_bytes"]) for h in uniform_run["history"]]
        )
    )
    return t * (1.0 - target) / target, t


def config_for(name: str, variant: str, seed: int, args, compute_s: float | None):
    from gnnio.train import TrainConfig

    kw: dict = {}
    if variant == "las8":
        kw["locality_scale"] = args.scale
    elif variant in ("auto", "auto_gpu"):
        kw["locality_scale"] = "auto"
        kw["locality_max_scale"] = args.max_scale
        if variant == "auto_gpu":
            kw["locality_compute_s"] = compute_s
    elif variant == "prune":
        kw["prune_threshold"] = args.prune
    return TrainConfig(
        model="sage",
        fanouts=args.fanouts,
        batch_size=args.batch_size[name],
        epochs=args.epochs[name],
        hidden=args.hidden[name],
        seed=seed,
        eval="full",
        gpu_cache_fraction=args.gpu_cache_fraction,
        score=args.score,
        threads=args.threads,
        progress=args.progress,
        **kw,
    )


def run_one(path: str, name: str, variant: str, seed: int, args, compute_s=None) -> dict:
    s, wall, cpu, warns = timed_train(path, config_for(name, variant, seed, args, compute_s))
    return run_record(s, name, variant, seed, compute_s, wall, cpu, warns)


def summarize(runs: list[dict], tolerance: float) -> dict:
    """Per dataset and variant: accuracy mean/std, difference to uniform (also paired by seed),
    host MB per epoch, scale trajectories."""
    out: dict = {}
    for name in dict.fromkeys(r["dataset"] for r in runs):
        rs = [r for r in runs if r["dataset"] == name]
        by = {(r["variant"], r["seed"]): r for r in rs}
        per: dict = {}
        for variant in dict.fromkeys(r["variant"] for r in rs):
            rv = sorted((r for r in rs if r["variant"] == variant), key=lambda r: r["seed"])
            m, s = mean_std(100 * r["test_acc"] for r in rv)
            lm, ls = mean_std(100 * r["last_test_acc"] for r in rv)
            hm, hs = mean_std(r["host_bytes_per_epoch"] / 1e6 for r in rv)
            d = {
                "seeds": [r["seed"] for r in rv],
                "test_acc_mean": m,
                "test_acc_std": s,
                "last_test_acc_mean": lm,
                "last_test_acc_std": ls,
                "host_mb_per_epoch_mean": hm,
                "host_mb_per_epoch_std": hs,
                "final_loss_mean": mean_std(r["history"][-1]["loss"] for r in rv)[0],
                "cpu_s": float(sum(r["cpu_s"] for r in rv)),
            }
            if variant != "uniform" and any(("uniform", r["seed"]) in by for r in rv):
                u = per.get("uniform")
                common = [r["seed"] for r in rv if ("uniform", r["seed"]) in by]
                paired = [100 * (by[variant, k]["test_acc"] - by["uniform", k]["test_acc"])
                          for k in common]  # fmt: skip
                diff = m - u["test_acc_mean"] if u else float("nan")
                d.update(paired_diff(diff, paired, tolerance))
            if variant in ("auto", "auto_gpu", "las8"):
                d["scale_per_epoch"] = [r["sampling"]["scale_per_epoch"] for r in rv]
            if variant in ("auto", "auto_gpu"):
                d["modeled_share_per_epoch"] = [
                    [round(h.get("loading_share", float("nan")), 4) for h in r["history"]]
                    for r in rv
                ]
                d["locality_compute_s"] = rv[0]["locality_compute_s"]
            per[variant] = d
        out[name] = per
    return out


def print_table(summary: dict, tolerance: float) -> None:
    print(
        "\ndataset    variant    test acc % (best valid)  last-epoch %     host MB/epoch"
        "   diff vs uniform (paired +- s.e.)"
    )
    for name, per in summary.items():
        for variant, o in per.items():
            diff = ""
            if "diff_points" in o:
                ok = "yes" if o["within_tolerance"] else "NO"
                diff = (
                    f"{o['diff_points']:+.2f} ({o['paired_diff_mean']:+.2f} +- "
                    f"{o['paired_diff_sem']:.2f}), within {tolerance:g}: {ok}"
                )
            print(
                f"{name:10s} {variant:9s}  {o['test_acc_mean']:6.2f} +- {o['test_acc_std']:4.2f}"
                f"           {o['last_test_acc_mean']:6.2f} +- {o['last_test_acc_std']:4.2f}"
                f"   {o['host_mb_per_epoch_mean']:10.2f}      {diff}"
            )
            if "modeled_share_per_epoch" in o:
                for sc, sh in zip(o["scale_per_epoch"], o["modeled_share_per_epoch"]):
                    print(f"{'':21s}s per epoch {sc}; modeled shares {sh}")


def plot(runs: list[dict], path: str, variants: tuple[str, ...], title: str) -> None:
    """Two rows (training loss, log scale: geometric mean over seeds, band = x/ exp(std of log);
    test accuracy: mean, band = +-1 std) x one column per dataset."""
    plt = pyplot()
    names = list(dict.fromkeys(r["dataset"] for r in runs))
    fig, axes = plt.subplots(2, len(names), figsize=(4.8 * len(names), 6.6), squeeze=False)
    for j, name in enumerate(names):
        bs = "?"
        for variant in variants:
            rv = [r for r in runs if r["dataset"] == name and r["variant"] == variant]
            if not rv:
                continue
            bs = rv[0]["batches_per_epoch"]
            n_ep = min(len(r["history"]) for r in rv)
            ep = np.arange(1, n_ep + 1)
            for i, key in enumerate(("loss", "test_acc")):
                v = np.array([[h[key] for h in r["history"][:n_ep]] for r in rv], dtype=float)
                if key == "test_acc":
                    v *= 100
                    m, s = v.mean(0), v.std(0)
                    lo, hi = m - s, m + s
                else:  # geometric mean and band: the loss axis is logarithmic
                    lv = np.log(np.maximum(v, 1e-12))
                    m, s = np.exp(lv.mean(0)), lv.std(0)
                    lo, hi = m * np.exp(-s), m * np.exp(s)
                ax = axes[i][j]
                label = f"{variant} ({len(rv)} seed{'s' if len(rv) > 1 else ''})"
                # auto often stays at s = 1, i.e. on top of uniform: draw it dashed and wider
                style, lw = ("--", 2.2) if variant == "auto" else ("-", 1.2)
                ax.plot(ep, m, style, marker=".", ms=3, color=COLORS[variant], label=label, lw=lw,
                        zorder=1 if variant == "auto" else 2)  # fmt: skip
                ax.fill_between(ep, lo, hi, color=COLORS[variant], alpha=0.12)
        axes[0][j].set_title(f"{name} ({bs} batches/epoch)")
        axes[0][j].set_ylabel("training loss (geometric mean)")
        axes[0][j].set_yscale("log")
        axes[1][j].set_ylabel("test accuracy (%)")
        axes[1][j].set_xlabel("epoch")
        for ax in axes[:, j]:
            ax.xaxis.get_major_locator().set_params(integer=True)
        axes[0][j].legend(fontsize=8)
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, path)


def draw_plots(runs: list[dict], args) -> None:
    if args.plot:
        plot(
            runs,
            args.plot,
            ("uniform", "las8", "auto", "auto_gpu"),
            "Locality-aware sampling vs uniform: GraphSAGE, 10 % GPU set; bands +-1 std over seeds",
        )
        print("wrote", args.plot)
    if args.plot_prune:
        plot(
            runs,
            args.plot_prune,
            ("uniform", "prune"),
            "HyDRA threshold pruning (alpha = beta = 1) vs none: GraphSAGE; bands +-1 std over seeds",
        )
        print("wrote", args.plot_prune)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        runs = json.loads(Path(args.replot).read_text())["runs"]
        draw_plots(runs, args)
        return 0
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    import gnnio

    runs: list[dict] = []
    compute: dict[str, dict] = {}
    t_all, c_all = time.perf_counter(), time.process_time()
    for name in args.datasets:
        path = dataset_dir(name, args)
        ds = gnnio.load(path)
        ns = args.seeds[name]
        extra = f", GPU set {args.gpu_cache_fraction:g} by {args.score}"
        print(dataset_line(name, path, ds, args, extra), flush=True)
        # uniform first: auto_gpu derives its modeled compute time from it
        order = sorted(args.variants, key=lambda v: VARIANTS.index(v))
        for variant in order:
            if (name, variant) in args.skip:
                continue
            c_s = None
            if variant == "auto_gpu":
                if name in args.compute_s:
                    c_s, t_load = args.compute_s[name], None
                else:
                    base = [r for r in runs if r["dataset"] == name and r["variant"] == "uniform"]
                    if not base:
                        raise SystemExit(
                            "las_accuracy: error: auto_gpu needs the uniform variant or "
                            f"--compute-s for {name}"
                        )
                    c_s, t_load = modeled_compute_s(min(base, key=lambda r: r["seed"]),
                                                    args.target_share)  # fmt: skip
                compute[name] = {"compute_s": c_s, "uniform_t_load_s": t_load,
                                 "target_share": args.target_share}  # fmt: skip
                print(
                    f"   auto_gpu: modeled compute C = {c_s:.6g} s/epoch"
                    + (
                        f" (uniform modeled loading {t_load:.6g} s/epoch -> share "
                        f"{args.target_share:g} at s = 1)"
                        if t_load is not None
                        else " (given)"
                    ),
                    flush=True,
                )
            for seed in range(args.seed_override.get((name, variant), ns)):
                r = run_one(path, name, variant, seed, args, c_s)
                runs.append(r)
                sc = ""
                if r["sampling"] and "scale_per_epoch" in r["sampling"]:
                    sc = f", s per epoch {r['sampling']['scale_per_epoch']}"
                print(
                    f"   {name} {variant:8s} seed {seed}: test {100 * r['test_acc']:.2f} % "
                    f"(best epoch {r['best_epoch']}, last {100 * r['last_test_acc']:.2f} %), "
                    f"final loss {r['history'][-1]['loss']:.4f}, host "
                    f"{r['host_bytes_per_epoch'] / 1e6:.2f} MB/epoch{sc}, "
                    f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU",
                    flush=True,
                )
    summary = summarize(runs, args.tolerance)
    print_table(summary, args.tolerance)
    total = {"wall_s": time.perf_counter() - t_all, "cpu_s": time.process_time() - c_all}
    print(f"\ntotal: {total['wall_s']:.0f} s wall, {total['cpu_s']:.0f} s CPU (this process)")
    if args.out_json:
        cfg = {k: v for k, v in vars(args).items() if k not in ("out_json", "progress", "replot")}
        cfg["skip"] = sorted(":".join(s) for s in args.skip)
        cfg["seed_override"] = {":".join(k): v for k, v in args.seed_override.items()}
        write_json(
            args.out_json,
            config=cfg,
            modeled_compute=compute,
            summary=summary,
            runs=runs,
            total=total,
        )
    if runs:
        draw_plots(runs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
