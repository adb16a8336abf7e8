"""Accuracy of the samplers of issue 19 (node-wise uniform, LABOR-0, LADIES) and of Song &
Jiang's locality-aware LADIES (Eq. 8 on the layer distribution) against its scale ``s``.

For every dataset, variant and seed, one ``gnnio.train.train`` run through the public API, with
the settings of ``gnnio train DIR --sampler S [--layer-size K] --epochs E --seed N`` (GraphSAGE,
fanouts 15,10,5, batch 1024, hidden 256, dropout 0.5, Adam lr 0.003; the CLI defaults).
Variants (``--variants``, comma list):

* ``uniform``: node-wise neighbour sampling (the default sampler);
* ``labor``: LABOR-0 with the same fanouts (``--sampler labor``); ``laborI``: LABOR-I
  (``--sampler labor --importance-sampling I``);
* ``ladiesK``: LADIES with ``K`` nodes per layer (``--sampler ladies --layer-size K``);
* ``ladiesK-sS``: locality-aware LADIES with a fixed scale ``S``
  (``--sampler ladies --layer-size K --locality-scale S``);
* ``ladiesK-auto``: the same with Algorithm 2 (``--locality-scale auto``: lt 0.15, ut 0.2,
  MAXS 8) on the *modeled* loading share with the measured CPU compute time;
* ``ladiesK-autogpu``: Algorithm 2 with a *modeled GPU* compute time per epoch ``C`` chosen so that
  the modeled loading share of the ``ladiesK-s1`` run of the lowest seed is ``--target-share``
  (``--locality-compute-s C``; as ``auto_gpu`` of ``benchmarks/las_accuracy.py``).

With ``--gpu-cache-fraction F`` every run keeps the top ``F`` of the rows by ``wrpr`` in a
(simulated) GPU tier; that set is Eq. 8's ``B``, and the host bytes per epoch are the feature
bytes read outside it (counted). The tier returns exactly the stored rows, so it changes nothing
else in the training. The locality variants need it.

Reported per (dataset, variant): mean +- sample std over seeds of the test accuracy at the
best-validation epoch, the last-epoch test accuracy, the best epoch, host MB per epoch and the
scales Algorithm 2 chose. Presets: ``cora`` (public split, 140 training nodes: 1 batch/epoch),
``facebook`` (10 % train, 3 batches/epoch, ``eval=full``), ``synthetic``
(``gnnio.train.defaults.default_dataset()``: 30,000 nodes, 3,000 training nodes, 3
batches/epoch). The commands behind docs/benchmarks.md, "Samplers that read fewer rows"::

    .venv/bin/python benchmarks/sampler_accuracy.py --torch-threads 1 --threads 1 \\
        --cora-dir /tmp/d/cora --facebook-dir /tmp/d/fb \\
        --datasets cora,synthetic,facebook --variants uniform,labor,ladies512,ladies2048 \\
        --epochs cora=50,synthetic=30,facebook=10 --out-json /tmp/h19/acc.json
    .venv/bin/python benchmarks/sampler_accuracy.py --torch-threads 1 --threads 1 \\
        --cora-dir /tmp/d/cora --datasets cora,synthetic --gpu-cache-fraction 0.1 \\
        --epochs cora=50,synthetic=30 \\
        --variants ladies512-s1,ladies512-s2,ladies512-s4,ladies512-s8,ladies512-auto,ladies512-autogpu \\
        --out-json /tmp/h19/las.json
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from _accuracy_common import (
    DEFAULT_DIRS,
    comma_list,
    dataset_dir,
    dataset_line,
    mean_std,
    per_dataset,
    run_record,
    timed_train,
    write_json,
)

DATASETS = ("cora", "synthetic", "facebook")
PRESETS = {
    "cora": {"batch_size": 1024, "epochs": 50, "hidden": 256, "seeds": 3},
    "synthetic": {"batch_size": 1024, "epochs": 50, "hidden": 256, "seeds": 3},
    "facebook": {"batch_size": 1024, "epochs": 10, "hidden": 256, "seeds": 3},
}
EVAL = {"cora": "sampled", "synthetic": "sampled", "facebook": "full"}
VARIANT_RE = re.compile(r"^(uniform|labor(\d*)|ladies(\d+)(?:-(s[0-9.]+|auto|autogpu))?)$")


def parse_variant(name: str) -> dict:
    """``"ladies512-s2"`` -> ``{"sampler": "ladies", "layer_size": 512, "scale": 2.0}``;
    ``scale`` is None (no locality), a float, ``"auto"`` or ``"autogpu"``."""
    m = VARIANT_RE.match(name)
    if not m:
        raise ValueError(name)
    if not m.group(1).startswith("ladies"):  # uniform, labor, laborI
        kind = "uniform" if m.group(1) == "uniform" else "labor"
        imp = int(m.group(2) or 0)
        return {"sampler": kind, "layer_size": None, "scale": None, "importance_sampling": imp}
    tail = m.group(4)
    scale = None if tail is None else (tail if tail in ("auto", "autogpu") else float(tail[1:]))
    if isinstance(scale, float) and scale < 1:
        raise ValueError(name)
    return {"sampler": "ladies", "layer_size": int(m.group(3)), "scale": scale}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sampler_accuracy",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma list")
    p.add_argument(
        "--variants",
        default="uniform,labor,ladies512,ladies2048",
        help="comma list: uniform, labor, laborI, ladiesK, ladiesK-sS, ladiesK-auto, ladiesK-autogpu",
    )
    p.add_argument("--seeds", default=None, help="number of seeds, 'N' or 'cora=3,facebook=2'")
    p.add_argument("--epochs", default=None, help="epochs, 'N' or per dataset")
    p.add_argument("--fanouts", default="15,10,5", help="per-hop fanouts (hop 1 first)")
    p.add_argument("--gpu-cache-fraction", type=float, default=None, help="GPU tier = B")
    p.add_argument("--score", default="wrpr", help="hotness score choosing B")
    p.add_argument("--max-scale", type=float, default=8.0, help="MAXS of the auto variants")
    p.add_argument(
        "--target-share",
        type=float,
        default=0.4,
        help="autogpu: modeled loading share of the s = 1 run that fixes C",
    )
    p.add_argument("--threads", type=int, default=1, help="sampler / gather threads")
    p.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--cora-dir", default=DEFAULT_DIRS["cora"])
    p.add_argument("--facebook-dir", default=DEFAULT_DIRS["facebook"])
    p.add_argument(
        "--synthetic-dir", default=None, help="default: gnnio.train.defaults.default_dataset()"
    )
    p.add_argument("--out-json", default=None, help="write all runs and the summary here")
    p.add_argument("--progress", action="store_true", help="gnnio's per-batch progress bars")
    a = p.parse_args(argv)
    a.datasets = comma_list(p, a.datasets, DATASETS, "datasets", "dataset")
    a.variants = [t.strip() for t in a.variants.split(",") if t.strip()]
    try:
        a.specs = {v: parse_variant(v) for v in a.variants}
    except ValueError as e:
        p.error(f"--variants: unknown variant '{e}' (uniform, labor, ladiesK[-sS|-auto|-autogpu])")
    if any(s["scale"] is not None for s in a.specs.values()) and not a.gpu_cache_fraction:
        p.error("--variants: the locality variants need --gpu-cache-fraction")
    try:
        a.fanouts = tuple(int(x) for x in a.fanouts.split(","))
    except ValueError:
        p.error("--fanouts: integers")
    if not 0 < a.target_share < 1:
        p.error(f"--target-share: must be in (0, 1), got {a.target_share}")
    a.seeds = per_dataset(a.seeds, "seeds", PRESETS, "sampler_accuracy")
    a.epochs = per_dataset(a.epochs, "epochs", PRESETS, "sampler_accuracy")
    a.batch_size = {d: PRESETS[d]["batch_size"] for d in DATASETS}
    a.hidden = {d: PRESETS[d]["hidden"] for d in DATASETS}
    return a


def config_for(name: str, variant: str, seed: int, args, compute_s: float | None):
    from gnnio.train import TrainConfig

    spec = args.specs[variant]
    kw: dict = {"sampler": spec["sampler"]}
    if spec["layer_size"] is not None:
        kw["layer_size"] = spec["layer_size"]
    if spec.get("importance_sampling"):
        kw["importance_sampling"] = spec["importance_sampling"]
    scale = spec["scale"]
    if scale is not None:
        kw["locality_scale"] = "auto" if scale in ("auto", "autogpu") else scale
        kw["locality_max_scale"] = args.max_scale
        if scale == "autogpu":
            kw["locality_compute_s"] = compute_s
    if args.gpu_cache_fraction:
        kw["gpu_cache_fraction"] = args.gpu_cache_fraction
        kw["score"] = args.score
    return TrainConfig(
        model="sage",
        fanouts=args.fanouts,
        batch_size=args.batch_size[name],
        epochs=args.epochs[name],
        hidden=args.hidden[name],
        seed=seed,
        eval=EVAL[name],
        threads=args.threads,
        progress=args.progress,
        **kw,
    )


def run_one(path: str, name: str, variant: str, seed: int, args, compute_s=None) -> dict:
    s, wall, cpu, warns = timed_train(path, config_for(name, variant, seed, args, compute_s))
    return run_record(s, name, variant, seed, compute_s, wall, cpu, warns)


def summarize(runs: list[dict]) -> dict:
    out: dict = {}
    for name in dict.fromkeys(r["dataset"] for r in runs):
        per: dict = {}
        for variant in dict.fromkeys(r["variant"] for r in runs if r["dataset"] == name):
            rv = sorted((r for r in runs if r["dataset"] == name and r["variant"] == variant),
                        key=lambda r: r["seed"])  # fmt: skip
            m, s = mean_std(100 * r["test_acc"] for r in rv)
            lm, ls = mean_std(100 * r["last_test_acc"] for r in rv)
            d = {
                "seeds": [r["seed"] for r in rv],
                "test_acc": [r["test_acc"] for r in rv],
                "test_acc_mean": m,
                "test_acc_std": s,
                "last_test_acc_mean": lm,
                "last_test_acc_std": ls,
                "best_epochs": [r["best_epoch"] for r in rv],
                "host_mb_per_epoch_mean": mean_std(r["host_bytes_per_epoch"] / 2**20 for r in rv)[
                    0
                ],
                "mb_per_epoch_mean": mean_std(r["bytes_per_epoch"] / 2**20 for r in rv)[0],
                "rows_per_batch_mean": mean_std(r["rows_per_batch"] for r in rv)[0],
                "cpu_s": float(sum(r["cpu_s"] for r in rv)),
                "wall_s": float(sum(r["wall_s"] for r in rv)),
            }
            if rv[0]["sampling"] and "scale_per_epoch" in rv[0]["sampling"]:
                d["scale_per_epoch"] = [r["sampling"]["scale_per_epoch"] for r in rv]
            per[variant] = d
        out[name] = per
    return out


def print_table(summary: dict) -> None:
    print(
        "\ndataset    variant            test acc % (best valid)  last-epoch %    best epochs"
        "   MiB/epoch (host)    rows/batch"
    )
    for name, per in summary.items():
        for variant, o in per.items():
            print(
                f"{name:10s} {variant:18s} {o['test_acc_mean']:6.2f} +- {o['test_acc_std']:4.2f}"
                f"            {o['last_test_acc_mean']:6.2f} +- {o['last_test_acc_std']:4.2f}"
                f"   {str(o['best_epochs']):12s}  {o['mb_per_epoch_mean']:8.1f} "
                f"({o['host_mb_per_epoch_mean']:.1f})   {o['rows_per_batch_mean']:9.0f}"
            )
            if "scale_per_epoch" in o:
                for sc in o["scale_per_epoch"]:
                    print(f"{'':30s}s per epoch {sc}")


def autogpu_compute_s(runs: list[dict], name: str, variant: str, args) -> tuple[float, float]:
    """``C`` of ``ladiesK-autogpu`` from the ``ladiesK-s1`` run of the lowest seed."""
    from las_accuracy import modeled_compute_s

    base_name = variant.rsplit("-", 1)[0] + "-s1"
    base = [
        r for r in runs if r["dataset"] == name and r["variant"] in (base_name, base_name + ".0")
    ]
    if not base:
        raise SystemExit(f"sampler_accuracy: error: {variant} needs {base_name} before it")
    return modeled_compute_s(min(base, key=lambda r: r["seed"]), args.target_share)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    import gnnio

    runs: list[dict] = []
    compute: dict = {}
    t_all, c_all = time.perf_counter(), time.process_time()
    for name in args.datasets:
        path = dataset_dir(name, args)
        ds = gnnio.load(path)
        extra = f", eval {EVAL[name]}"
        if args.gpu_cache_fraction:
            extra += f", GPU set {args.gpu_cache_fraction:g} by {args.score}"
        print(dataset_line(name, path, ds, args, extra), flush=True)
        for variant in args.variants:
            c_s = None
            if args.specs[variant]["scale"] == "autogpu":
                c_s, t_load = autogpu_compute_s(runs, name, variant, args)
                compute[f"{name}:{variant}"] = {"compute_s": c_s, "s1_t_load_s": t_load,
                                                "target_share": args.target_share}  # fmt: skip
                print(f"   {variant}: modeled compute C = {c_s:.6g} s/epoch (s = 1 modeled "
                      f"loading {t_load:.6g} s/epoch -> share {args.target_share:g})", flush=True)  # fmt: skip
            for seed in range(args.seeds[name]):
                r = run_one(path, name, variant, seed, args, c_s)
                runs.append(r)
                sc = ""
                if r["sampling"] and "scale_per_epoch" in r["sampling"]:
                    sc = f", s per epoch {r['sampling']['scale_per_epoch']}"
                print(
                    f"   {name} {variant:16s} seed {seed}: test {100 * r['test_acc']:.2f} % "
                    f"(best epoch {r['best_epoch']}, last {100 * r['last_test_acc']:.2f} %), "
                    f"host {r['host_bytes_per_epoch'] / 2**20:.2f} of "
                    f"{r['bytes_per_epoch'] / 2**20:.2f} MiB/epoch, {r['rows_per_batch']:.0f} "
                    f"rows/batch{sc}, {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU",
                    flush=True,
                )
    summary = summarize(runs)
    print_table(summary)
    total = {"wall_s": time.perf_counter() - t_all, "cpu_s": time.process_time() - c_all}
    print(f"\ntotal: {total['wall_s']:.0f} s wall, {total['cpu_s']:.0f} s CPU (this process)")
    if args.out_json:
        cfg = {k: v for k, v in vars(args).items() if k not in ("out_json", "progress", "specs")}
        write_json(args.out_json, config=cfg, modeled_compute=compute, summary=summary,
                   runs=runs, total=total)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
