"""Test accuracy and bytes moved with compressed feature rows (issue 25, item 4): float16,
bfloat16 and int8 against float32.

For every dataset the float32 dataset and one copy per dtype are prepared with ``gnnio prepare ...
--feature-dtype D`` (the same importer and seed, so graph, labels and splits are identical and
only the stored rows differ), then trained with ``gnnio.train.train`` for every seed (GraphSAGE,
fanouts 15,10,5, batch 1024, hidden 256, the CLI defaults otherwise; the presets of
``benchmarks/sampler_accuracy.py``). Reported per (dataset, dtype): mean +- sample std over seeds
of the test accuracy at the best-validation epoch, the difference of the means to float32 with the
paired per-seed differences, and the feature bytes per epoch of every tier relative to float32
(the same rows are read, so the ratio is the row size's: 0.5 / 0.25, issue 25's goal). Then one
epoch per dtype with the rows on disk under a 10 % host cache (``store="disk"``) and one with a
10 % (simulated) GPU tier: the disk tier's bytes, the bytes read from the device (4 KiB pages,
O_DIRECT) and the host-to-GPU bytes, each relative to float32. The int8 codec's scale and zero
point (``8 * F`` bytes) move once per run (``feature_codec_bytes``). Command behind
docs/benchmarks.md, "Compressed feature rows"::

    .venv/bin/python benchmarks/feature_dtype_accuracy.py --torch-threads 1 \\
        --datasets cora,facebook,synthetic --out-json /tmp/i25c/acc.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from _accuracy_common import SHARED, comma_list, mean_std, paired_diff, timed_train, write_json

DTYPES = ("float32", "float16", "bfloat16", "int8")
PRESETS = {  # as benchmarks/sampler_accuracy.py
    "cora": {"epochs": 50, "eval": "sampled"},
    "facebook": {"epochs": 10, "eval": "full"},
    "synthetic": {"epochs": 30, "eval": "sampled"},
}
GOAL = {"float16": 0.5, "bfloat16": 0.5, "int8": 1.0}  # points; bfloat16 held to float16's goal


def prepare(name: str, dtype: str, root: Path) -> str:
    out = root / f"{name}-{dtype}"
    if (out / "meta.json").exists():
        return str(out)
    if name == "cora":
        src = ["planetoid", "--name", "cora", "--root", str(SHARED / "cora")]
    elif name == "facebook":
        src = ["facebook", "--root", str(SHARED / "facebook_page_page")]
    else:  # the default dataset of `gnnio train` (gnnio.train.defaults.DEFAULT_DATASET)
        from gnnio.train.defaults import DEFAULT_DATASET as d

        src = ["synthetic", *(f"--{k.replace('_', '-')}={v}" for k, v in d.items())]
    cmd = [sys.executable, "-m", "gnnio", "prepare", *src, "--feature-dtype", dtype, "--quiet"]
    print("preparing:", " ".join(cmd), "--out", out, flush=True)
    subprocess.run([*cmd, "--out", str(out)], check=True)
    return str(out)


def per_epoch(s: dict, key: str = "bytes_by_tier") -> dict:
    return {t: v / max(s["epochs"], 1) for t, v in s[key].items()}


def _positive(text: str) -> int:
    """An argparse type: a whole number >= 1 (else argparse's one-line error)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"need a whole number >= 1, got '{text}'")
    return int(text)


def main() -> int:
    p = argparse.ArgumentParser(prog="feature_dtype_accuracy", description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="cora,facebook,synthetic")
    p.add_argument(
        "--dtypes",
        default=",".join(DTYPES),
        help="without float32: accuracies only, no differences or byte ratios",
    )
    p.add_argument("--seeds", type=_positive, default=3)
    p.add_argument("--epochs", type=_positive, default=None, help="override every preset's epochs")
    p.add_argument("--root", default="/tmp/i25c/data", help="where the datasets are prepared")
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--out-json", default=None)
    a = p.parse_args()
    datasets = comma_list(p, a.datasets, PRESETS, "datasets", "dataset")
    dtypes = comma_list(p, a.dtypes, DTYPES, "dtypes", "dtype")
    traffic_runs = "float32" in dtypes  # the reference of every ratio
    if a.torch_threads:
        import torch

        torch.set_num_threads(a.torch_threads)
    from gnnio.train import TrainConfig

    root = Path(a.root)
    root.mkdir(parents=True, exist_ok=True)
    runs, table, traffic = [], [], []
    for name in datasets:
        epochs = a.epochs or PRESETS[name]["epochs"]
        acc: dict[str, list[float]] = {}
        bytes_ep: dict[str, dict] = {}
        for dt in dtypes:
            path = prepare(name, dt, root)
            for seed in range(a.seeds):
                cfg = TrainConfig(epochs=epochs, seed=seed, eval=PRESETS[name]["eval"],
                                  progress=False)  # fmt: skip
                s, wall, _, _ = timed_train(path, cfg)
                acc.setdefault(dt, []).append(100 * s["test_acc"])
                bytes_ep[dt] = per_epoch(s)
                runs.append({"dataset": name, "dtype": dt, "seed": seed, "test_acc": s["test_acc"],
                             "best_epoch": s["best_epoch"], "bytes_per_epoch": bytes_ep[dt],
                             "feature_codec_bytes": s["feature_codec_bytes"], "wall_s": wall})  # fmt: skip
                print(f"{name} {dt} seed {seed}: test {100 * s['test_acc']:.2f} "
                      f"({wall:.1f} s)", flush=True)  # fmt: skip
        if not traffic_runs:  # accuracies only (the float32 runs made elsewhere)
            for dt in dtypes:
                m, sd = mean_std(acc[dt])
                table.append({"dataset": name, "dtype": dt, "test_acc_mean": m,
                              "test_acc_std": sd, "epochs": epochs, "seeds": a.seeds})  # fmt: skip
                print(f"  {name:9s} {dt:8s} {m:6.2f} +- {sd:.2f}")
            continue
        ref = acc["float32"]
        for dt in dtypes:
            m, sd = mean_std(acc[dt])
            row = {"dataset": name, "dtype": dt, "test_acc_mean": m, "test_acc_std": sd,
                   "epochs": epochs, "seeds": a.seeds}  # fmt: skip
            base = sum(bytes_ep["float32"].values())
            row["bytes_ratio"] = sum(bytes_ep[dt].values()) / base if base else None
            if dt != "float32":
                row.update(paired_diff(m - mean_std(ref)[0],
                                       [x - y for x, y in zip(acc[dt], ref)], GOAL[dt]))  # fmt: skip
            table.append(row)
            diff = f" diff {row['diff_points']:+.2f} pts" if dt != "float32" else ""
            print(f"  {name:9s} {dt:8s} {m:6.2f} +- {sd:.2f}{diff} bytes x{row['bytes_ratio']:.3f}")
        # one epoch with the rows on disk under a 10 % host cache, and with a 10 % GPU tier
        for kw, what in (({"store": "disk", "host_cache_size": 0.1}, "disk"),
                         ({"gpu_cache_fraction": 0.1}, "tiered")):  # fmt: skip
            got = {}
            for dt in dtypes:
                s, _, _, _ = timed_train(root / f"{name}-{dt}",
                                         TrainConfig(epochs=1, seed=0, progress=False, **kw))  # fmt: skip
                got[dt] = {**s["bytes_by_tier"], "feature_codec_bytes": s["feature_codec_bytes"]}
                if what == "disk":
                    got[dt]["device_bytes_read"] = s["disk"]["bytes_read"]
            for dt in dtypes:
                ratios = {k: (v / got["float32"][k] if got["float32"].get(k) else None)
                          for k, v in got[dt].items() if k != "feature_codec_bytes"}  # fmt: skip
                traffic.append({"dataset": name, "setup": what, "dtype": dt, "bytes": got[dt],
                                "ratio_to_float32": ratios})  # fmt: skip
                print(f"  {name:9s} {what:6s} {dt:8s} " + " ".join(
                    f"{k} x{r:.3f}" for k, r in ratios.items() if r is not None))  # fmt: skip
    if a.out_json:
        write_json(a.out_json, table=table, traffic=traffic, runs=runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
