"""Convergence of BGL's proximity-aware order (PO) against a random shuffle (issue #6).

For every dataset, order (``random``, ``po``) and seed, one ``gnnio.train.train`` run through the
public API; the script reports per (dataset, order) the mean +- std over seeds of the final test
accuracy (``summary["test_acc"]``: test accuracy at the best-validation epoch) and of the
last-epoch test accuracy, the PO - random difference (in accuracy points, also paired by seed:
the same seed gives the same model initialisation in both orders), and whether it is within
``--tolerance`` points. For PO it records the number of BFS sequences chosen and the estimated
shuffling error against the bound it had to meet (rebuilt with exactly the arguments
``gnnio.train.setup.build_order`` uses, so the same k), plus the measured shuffling error of the
epochs actually trained, for both orders.

A FIFO feature cache of ``--cache-size`` (default 10 % of the nodes) sits in front of the feature
store in every run (``--cache-policy none`` turns it off). A cache returns exactly the backing
store's rows, so it changes no number of the training (checked: identical loss/accuracy
histories with and without it); it only adds the ``cache`` tier to ``bytes_by_tier``, from which
the cache hit share of the training bytes, ``cache / (all tiers)``, is reported per order -- the
reason PO exists. Evaluation is ``full`` (exact full-neighbour inference from the feature array,
not through the cache), so the cache sees training batches only.

Presets (override per dataset with ``--epochs``, ``--batch-size``, ``--hidden``, ``--seeds``):

* ``cora``: Planetoid Cora, public split (140 training nodes): batch 16 (9 batches/epoch),
  50 epochs, 5 seeds.
* ``facebook``: Facebook page-page (MUSAE), 10 % train (2,248 nodes): batch 64 (36 batches/epoch),
  10 epochs, hidden 64 (its 4,714-dim input layer dominates the CPU time), 3 seeds.
* ``synthetic``: gnnio's built-in default dataset (``gnnio.train.defaults.default_dataset()``: R-MAT
  power law with planted classes, 30,000 nodes, ~300,000 directed edges, 64 features, 8 classes,
  homophily 0.75, 3,000 training nodes): batch 64 (47 batches/epoch), 10 epochs, 5 seeds.

All use a 2-layer GraphSAGE with fanouts 10,5 (``--fanouts``), Adam lr 0.003, dropout 0.5.

Example (the command behind docs/benchmarks.md, "PO against random shuffle")::

    .venv/bin/python benchmarks/po_convergence.py --torch-threads 1 \\
        --out-json /tmp/po_convergence.json --plot docs/img/po_convergence.png
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

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
    save_figure,
    timed_train,
    write_json,
)

DATASETS = ("cora", "facebook", "synthetic")

#: per-dataset defaults: (batch size, epochs, hidden, number of seeds)
PRESETS = {
    "cora": {"batch_size": 16, "epochs": 50, "hidden": 256, "seeds": 5},
    "facebook": {"batch_size": 64, "epochs": 10, "hidden": 64, "seeds": 3},
    "synthetic": {"batch_size": 64, "epochs": 10, "hidden": 256, "seeds": 5},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="po_convergence",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--datasets", default=",".join(DATASETS), help="comma list of " + "/".join(DATASETS)
    )
    p.add_argument("--orders", default="random,po", help="comma list of random/po")
    p.add_argument(
        "--seeds",
        default=None,
        help="number of seeds (0..N-1), for all datasets ('5') or per dataset "
        "('cora=5,facebook=3'); default: cora 5, facebook 3, synthetic 5",
    )
    p.add_argument("--epochs", default=None, help="epochs, 'N' or 'cora=50,facebook=10,...'")
    p.add_argument("--batch-size", default=None, help="batch size, 'N' or per dataset")
    p.add_argument("--hidden", default=None, help="hidden width, 'N' or per dataset")
    p.add_argument("--fanouts", default="10,5", help="per-hop fanouts (hop 1 first)")
    p.add_argument("--po-sequences", type=int, default=None, help="fix PO's k (default: auto)")
    p.add_argument("--cache-policy", default="fifo", help="none/static/fifo/lru/lfu")
    p.add_argument("--cache-size", type=float, default=0.1, help="cache rows / nodes")
    p.add_argument("--tolerance", type=float, default=1.0, help="accuracy points")
    p.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--cora-dir", default=DEFAULT_DIRS["cora"], help="prepared on first use")
    p.add_argument("--facebook-dir", default=DEFAULT_DIRS["facebook"], help="prepared on first use")
    p.add_argument(
        "--synthetic-dir",
        default=None,
        help="default: gnnio.train.defaults.default_dataset()'s path",
    )
    p.add_argument("--out-json", default=None, help="write all runs and the summary here")
    p.add_argument("--plot", default=None, help="PNG: accuracy and loss per epoch, per dataset")
    p.add_argument(
        "--k-draws",
        type=int,
        default=0,
        help="also check PO's choice of k with errors averaged over this many draws (0 = off)",
    )
    p.add_argument("--no-train", action="store_true", help="only the order facts, no training")
    p.add_argument("--progress", action="store_true", help="gnnio's per-batch progress bars")
    a = p.parse_args(argv)
    a.datasets = comma_list(p, a.datasets, DATASETS, "datasets", "dataset")
    a.orders = [o.strip() for o in a.orders.split(",") if o.strip()]
    for o in a.orders:
        if o not in ("random", "po"):
            p.error(f"--orders: unknown order '{o}' (random or po)")
    try:
        a.fanouts = tuple(int(x) for x in a.fanouts.split(","))
    except ValueError:
        p.error(f"--fanouts: need comma-separated integers, got '{a.fanouts}'")
    a.seeds = per_dataset(a.seeds, "seeds", PRESETS, "po_convergence")
    a.epochs = per_dataset(a.epochs, "epochs", PRESETS, "po_convergence")
    a.batch_size = per_dataset(a.batch_size, "batch_size", PRESETS, "po_convergence")
    a.hidden = per_dataset(a.hidden, "hidden", PRESETS, "po_convergence")
    return a


def order_facts(
    ds, batch_size: int, seed: int, epochs: int, po_sequences, k_draws: int = 0
) -> dict:
    """Shuffling-error facts of both orders for one seed: PO's k, its estimated error at k and the
    bound (the ProximityOrder ``train`` builds: same arguments as ``build_order``), the literal
    paper bound sqrt(b M)/n, and the measured error of every trained epoch of both orders.

    With ``k_draws > 0`` also the multi-draw check of the automatic choice: the random order's
    and PO's (at the chosen k) errors averaged over ``k_draws`` independent draws, and the k that
    the same rule (smallest k with error <= (1 + slack) x random error, slack 0.25) picks when
    both sides are ``k_draws``-draw means instead of single draws."""
    from gnnio.ordering import RandomOrder
    from gnnio.ordering.po import ProximityOrder, paper_bound, shuffling_error

    labels = np.asarray(ds.labels, dtype=np.int64)
    seeds = np.asarray(ds.train_idx, dtype=np.int64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        po = ProximityOrder(
            ds.graph, seeds, labels, batch_size, seed=seed, num_sequences=po_sequences
        )
    rnd = RandomOrder(seeds, batch_size, seed=seed)
    k = int(po.num_sequences)
    check = _k_check(po, labels[seeds], batch_size, seed, k, k_draws) if k_draws > 0 else None
    return {
        "k_check": check,
        "num_sequences": k,
        "num_blocks": int(po.regions.num_regions),
        "estimated_error": float(po.errors[k]) if k in po.errors else None,
        "bound": None if po.bound_value is None else float(po.bound_value),
        "bound_met": bool(po.bound_met),
        "paper_bound": paper_bound(batch_size, 1, seeds.size),
        "warnings": [str(w.message) for w in caught],
        "po_epoch_error": [po.shuffling_error(e) for e in range(epochs)],
        "random_epoch_error": [
            shuffling_error(labels[rnd.epoch_order(e)], batch_size) for e in range(epochs)
        ],
    }


def _k_check(po, seed_labels, batch_size: int, seed: int, k: int, draws: int) -> dict:
    """Multi-draw estimates for :func:`order_facts` (draw seeds independent of training's)."""
    from gnnio.ordering.po import combine_regions, shuffling_error

    n = seed_labels.shape[0]

    def rnd_err() -> float:
        return float(
            np.mean(
                [
                    shuffling_error(
                        seed_labels[np.random.default_rng([seed, 0xC0, d]).permutation(n)],
                        batch_size,
                    )
                    for d in range(draws)
                ]
            )
        )

    def po_err(kk: int) -> float:
        errs = [
            shuffling_error(
                po.labels[
                    combine_regions(po.regions, kk, np.random.default_rng([seed, 0xC1, kk, d]))
                ],
                batch_size,
            )
            for d in range(draws)
        ]
        return float(np.mean(errs))

    r = rnd_err()
    top = min(po.max_sequences, po.regions.num_regions)
    k_mean = None
    for kk in range(1, top + 1):
        if po_err(kk) <= 1.25 * r:
            k_mean = kk
            break
    return {
        "draws": draws,
        "random_error_mean": r,
        "bound_mean": 1.25 * r,
        "po_error_mean_at_k": po_err(k),
        "k_by_means": k_mean,
    }


def run_one(path: str, name: str, order: str, seed: int, args) -> dict:
    from gnnio.train import TrainConfig

    cfg = TrainConfig(
        model="sage",
        fanouts=args.fanouts,
        batch_size=args.batch_size[name],
        epochs=args.epochs[name],
        hidden=args.hidden[name],
        seed=seed,
        eval="full",
        order=order,
        po_sequences=args.po_sequences,
        cache_policy=args.cache_policy,
        cache_size=args.cache_size,
        progress=args.progress,
    )
    s, wall, cpu, warns = timed_train(path, cfg)
    tiers = s["bytes_by_tier"]
    total = sum(tiers.values())
    return {
        "dataset": name,
        "order": order,
        "seed": seed,
        "test_acc": s["test_acc"],
        "best_valid_acc": s["best_valid_acc"],
        "best_epoch": s["best_epoch"],
        "last_test_acc": s["history"][-1]["test_acc"],
        "order_info": s["order"],
        "batches_per_epoch": s["batches_per_epoch"],
        "bytes_by_tier": tiers,
        "cache_hit_share": tiers.get("cache", 0) / total if total else 0.0,
        "epoch_time_s": s["epoch_time_s"],
        "wall_s": wall,
        "cpu_s": cpu,
        "warnings": warns,
        "history": [
            {k: h[k] for k in ("epoch", "loss", "train_acc", "valid_acc", "test_acc")}
            for h in s["history"]
        ],
    }


def summarize(runs: list[dict], facts: dict, tolerance: float) -> dict:
    """Per dataset: mean/std per order, PO - random (points), paired by seed, within tolerance."""
    out = {}
    for name in dict.fromkeys([r["dataset"] for r in runs] + list(facts)):
        rs = [r for r in runs if r["dataset"] == name]
        per = {}
        for order in dict.fromkeys(r["order"] for r in rs):
            ro = sorted((r for r in rs if r["order"] == order), key=lambda r: r["seed"])
            m, s = mean_std(100 * r["test_acc"] for r in ro)
            lm, ls = mean_std(100 * r["last_test_acc"] for r in ro)
            hm, hs = mean_std(100 * r["cache_hit_share"] for r in ro)
            per[order] = {
                "seeds": [r["seed"] for r in ro],
                "test_acc_mean": m,
                "test_acc_std": s,
                "last_test_acc_mean": lm,
                "last_test_acc_std": ls,
                "cache_hit_share_pct_mean": hm,
                "cache_hit_share_pct_std": hs,
                "cpu_s": float(sum(r["cpu_s"] for r in ro)),
            }
        d: dict = {"orders": per}
        if "random" in per and "po" in per:
            by = {(r["order"], r["seed"]): r for r in rs}
            common = sorted(set(per["random"]["seeds"]) & set(per["po"]["seeds"]))
            paired = [100 * (by["po", s]["test_acc"] - by["random", s]["test_acc"]) for s in common]
            diff = per["po"]["test_acc_mean"] - per["random"]["test_acc_mean"]
            d.update(paired_diff(diff, paired, tolerance), po_not_worse=diff >= -tolerance)
        fs = facts.get(name, [])
        if fs:
            d["po_order"] = {
                "num_sequences": [f["num_sequences"] for f in fs],
                "estimated_error": [f["estimated_error"] for f in fs],
                "bound": [f["bound"] for f in fs],
                "bound_met": [f["bound_met"] for f in fs],
                "paper_bound": fs[0]["paper_bound"],
                "k_check": [f["k_check"] for f in fs],
                "po_epoch_error_mean": float(np.mean([np.mean(f["po_epoch_error"]) for f in fs])),
                "random_epoch_error_mean": float(
                    np.mean([np.mean(f["random_epoch_error"]) for f in fs])
                ),
            }
        out[name] = d
    return out


def plot(runs: list[dict], path: str) -> None:
    """Two rows (test/valid accuracy; training loss) x one column per dataset; mean over seeds,
    band = +-1 std."""
    plt = pyplot()
    names = list(dict.fromkeys(r["dataset"] for r in runs))
    fig, axes = plt.subplots(2, len(names), figsize=(4.6 * len(names), 6.4), squeeze=False)
    colors = {"random": "tab:blue", "po": "tab:orange"}
    for j, name in enumerate(names):
        for order in ("random", "po"):
            ro = [r for r in runs if r["dataset"] == name and r["order"] == order]
            if not ro:
                continue
            n_ep = min(len(r["history"]) for r in ro)
            ep = np.arange(1, n_ep + 1)
            label = f"{order} ({len(ro)} seeds)"
            for i, (key, style) in enumerate((("test_acc", "-"), ("loss", "-"))):
                v = np.array([[h[key] for h in r["history"][:n_ep]] for r in ro])
                if key == "test_acc":
                    v = 100 * v
                m, s = v.mean(0), v.std(0)
                ax = axes[i][j]
                ax.plot(
                    ep,
                    m,
                    style,
                    marker=".",
                    color=colors[order],
                    label=f"{label} test" if i == 0 else label,
                )
                ax.fill_between(ep, m - s, m + s, color=colors[order], alpha=0.15)
                if key == "test_acc":
                    va = 100 * np.array([[h["valid_acc"] for h in r["history"][:n_ep]] for r in ro])
                    ax.plot(ep, va.mean(0), ":", color=colors[order], label=f"{order} valid")
        bs = ro[0]["batches_per_epoch"] if ro else "?"
        axes[0][j].set_title(f"{name} ({bs} batches/epoch)")
        axes[0][j].set_ylabel("accuracy (%)")
        axes[1][j].set_ylabel("training loss")
        axes[1][j].set_xlabel("epoch")
        axes[1][j].set_yscale("log")
        axes[0][j].legend(fontsize=8)
        axes[1][j].legend(fontsize=8)
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
    fig.suptitle("Proximity-aware order (PO) vs random shuffle: GraphSAGE, mean over seeds +-1 std")
    save_figure(fig, path)


def print_table(summary: dict, tolerance: float) -> None:
    if not any(d["orders"] for d in summary.values()):
        return
    print(
        "\ndataset     order   test acc % (best valid)  last-epoch %    cache hit share %  k (PO)"
    )
    for name, d in summary.items():
        for order, o in d["orders"].items():
            k = ""
            if order == "po" and "po_order" in d:
                k = ",".join(str(x) for x in d["po_order"]["num_sequences"])
            print(
                f"{name:11s} {order:7s} {o['test_acc_mean']:6.2f} +- {o['test_acc_std']:4.2f}"
                f"          {o['last_test_acc_mean']:6.2f} +- {o['last_test_acc_std']:4.2f}"
                f"   {o['cache_hit_share_pct_mean']:6.2f} +- {o['cache_hit_share_pct_std']:4.2f}"
                f"    {k}"
            )
        if "diff_points" in d:
            print(
                f"{name:11s} PO - random = {d['diff_points']:+.2f} points (paired by seed "
                f"{d['paired_diff_mean']:+.2f} +- {d['paired_diff_sem']:.2f} s.e.); within "
                f"{tolerance:g} point: {'yes' if d['within_tolerance'] else 'NO'}"
            )


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    import gnnio

    runs: list[dict] = []
    facts: dict[str, list[dict]] = {}
    t_all, c_all = time.perf_counter(), time.process_time()
    for name in args.datasets:
        path = dataset_dir(name, args)
        ds = gnnio.load(path)
        b, ep, ns = args.batch_size[name], args.epochs[name], args.seeds[name]
        print(dataset_line(name, path, ds, args), flush=True)
        if "po" in args.orders:
            facts[name] = []
            for seed in range(ns):
                f = order_facts(ds, b, seed, ep, args.po_sequences, args.k_draws)
                facts[name].append(f)
                est = "-" if f["estimated_error"] is None else f"{f['estimated_error']:.4f}"
                bnd = "-" if f["bound"] is None else f"{f['bound']:.4f}"
                print(
                    f"   PO seed {seed}: k = {f['num_sequences']} of {f['num_blocks']} blocks, "
                    f"estimated error {est} vs bound {bnd} (paper sqrt(bM)/n = "
                    f"{f['paper_bound']:.4f}); trained epochs: PO "
                    f"{np.mean(f['po_epoch_error']):.4f}, random "
                    f"{np.mean(f['random_epoch_error']):.4f}",
                    flush=True,
                )
                if f["k_check"]:
                    c = f["k_check"]
                    print(
                        f"      {c['draws']}-draw means: random {c['random_error_mean']:.4f} "
                        f"(bound {c['bound_mean']:.4f}), PO at k = {f['num_sequences']}: "
                        f"{c['po_error_mean_at_k']:.4f}; k chosen from means: {c['k_by_means']}",
                        flush=True,
                    )
        if args.no_train:
            continue
        for seed in range(ns):
            for order in args.orders:
                r = run_one(path, name, order, seed, args)
                if order == "po" and name in facts:
                    k_run = r["order_info"].get("num_sequences")
                    if k_run != facts[name][seed]["num_sequences"]:
                        print(
                            f"   note: train used k = {k_run}, rebuilt order k = "
                            f"{facts[name][seed]['num_sequences']}",
                            flush=True,
                        )
                runs.append(r)
                print(
                    f"   {name} {order:6s} seed {seed}: test {100 * r['test_acc']:.2f} % "
                    f"(best epoch {r['best_epoch']}, last {100 * r['last_test_acc']:.2f} %), "
                    f"cache hit share {100 * r['cache_hit_share']:.1f} %, "
                    f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU",
                    flush=True,
                )
    summary = summarize(runs, facts, args.tolerance)
    print_table(summary, args.tolerance)
    total = {"wall_s": time.perf_counter() - t_all, "cpu_s": time.process_time() - c_all}
    print(f"\ntotal: {total['wall_s']:.0f} s wall, {total['cpu_s']:.0f} s CPU (this process)")
    if args.out_json:
        cfg = {k: v for k, v in vars(args).items() if k not in ("out_json", "plot", "progress")}
        write_json(
            args.out_json, config=cfg, summary=summary, order_facts=facts, runs=runs, total=total
        )
    if args.plot and runs:
        plot(runs, args.plot)
        print("wrote", args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
