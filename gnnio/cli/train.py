"""``gnnio train [DIR] [--model ...] [--fanouts 15,10,5] ...``: train a GNN, print accuracy and time."""

from __future__ import annotations

from ..errors import UsageError
from ..utils.heap import HEAP_MODES
from . import COMMANDS, HelpFormatter, refuse_without_effect
from .train_config import config_from_args
from .train_disk import add_disk_arguments
from .train_dist import add_dist_arguments, launch_ranks, train_rank


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help=COMMANDS["train"],
        description=(
            "Train a node classifier on a prepared dataset with uniform neighbour sampling. Every "
            "epoch trains on all training nodes, evaluates valid and test accuracy, logs the time "
            "spent sampling, gathering features, transferring and computing, and keeps the best "
            "model (by valid accuracy). Without DIR a small built-in synthetic dataset is generated "
            "on first use into $GNNIO_CACHE (default ~/.cache/gnnio) and trained on."
        ),
        formatter_class=HelpFormatter,
    )
    add_train_arguments(p)
    p.set_defaults(func=run)


def add_train_arguments(p) -> None:
    """Every option of ``gnnio train`` (``gnnio bench step`` takes the same ones)."""
    p.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        default=None,
        help="dataset directory written by 'gnnio prepare' (default: the built-in synthetic one)",
    )
    p.add_argument(
        "--model",
        default="sage",
        choices=["sage", "gcn", "gat", "gin"],
        help="GraphSAGE, GCN, GAT or GIN (default: sage)",
    )
    p.add_argument(
        "--fanouts",
        default="15,10,5",
        help="neighbours sampled per hop, seeds' hop first; the number of layers is their count "
        "(-1 = all neighbours)",
    )
    p.add_argument("--batch-size", type=int, default=1024, help="training seeds per mini-batch")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="maximum epochs (default: 20, or 10 for the built-in dataset)",
    )
    p.add_argument("--lr", type=float, default=0.003, help="Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=0.0, help="Adam L2 weight decay")
    p.add_argument("--hidden", type=int, default=256, help="hidden channels")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout on every layer's input")
    p.add_argument("--heads", type=int, default=None, help="GAT attention heads (default: 4)")
    p.add_argument(
        "--feature-norm",
        default="none",
        choices=["none", "row"],
        help="'row' divides each feature row by its L1 norm (bag-of-words features)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda (cuda:N) or auto: cuda when a GPU is present, else cpu; on a GPU with no "
        "layout option, rows and topology are placed from free GPU memory (the summary's "
        "'plan') (default: auto)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (init, order, sampling)")
    p.add_argument(
        "--eval",
        default="sampled",
        choices=["sampled", "full"],
        help="evaluation on sampled neighbourhoods (the uniform sampler with --fanouts, whatever "
        "--sampler: with ladies the values count here; cheap on big graphs) or exact layer-wise "
        "full-neighbour inference (O(edges x layers) per epoch)",
    )
    p.add_argument(
        "--eval-batch-size",
        type=int,
        default=None,
        help="seeds / nodes per evaluation batch (default: max(--batch-size, 4096))",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=None,
        help="stop after N epochs without better valid acc (default: never)",
    )
    p.add_argument(
        "--store",
        default=None,
        choices=["memory", "mmap"],
        help="feature store: rows read into memory, or read from the memory-mapped file "
        "(default: memory; with several ranks mmap, one page-cache copy per machine)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of the sampler and the feature gather (default: min(8, the CPU cores) "
        "for the sampler, all cores for the gather; with several ranks the cores / local ranks)",
    )
    p.add_argument(
        "--heap",
        choices=HEAP_MODES,
        default="auto",
        help="keep: glibc keeps freed memory for the next batch (no page faults on a batch's "
        "large tensors; peak memory a little higher); system: glibc's defaults; auto: keep when "
        "the model trains on the CPU in one process, features not on disk (default: auto)",
    )
    p.add_argument(
        "--isolation",
        choices=["auto", "off"],
        default="off",
        help="auto: BGL's resource isolation: profile sample, gather and compute against their "
        "threads, give each stage the share that minimizes the slowest (printed, and in the "
        "summary under 'isolation'); off: every stage uses its default threads (default: off)",
    )
    p.add_argument(
        "--cuda-graph",
        nargs="?",
        const="all",
        default="off",
        choices=("off", "step", "sampler", "all"),
        help="replay as CUDA graphs: 'step' the training step (batches padded to fixed sizes; "
        "one process; dropout masks differ from an eager run's), 'sampler' the GPU sampler's "
        "batch (the same batches), 'all' (the flag alone) both; default off: not yet measured "
        "on a GPU. The summary's 'cuda_graph' says how many batches each replayed",
    )
    g = p.add_argument_group(
        "feature placement and caching",
        "where feature rows live during training (README: 'Where feature rows live during "
        "training')",
    )
    g.add_argument(
        "--gpu-cache-fraction",
        type=float,
        metavar="F",
        default=None,
        help="tiered store (Data Tiering): keep the hottest F of the feature rows (0..1) in GPU "
        "memory and read the rest zero-copy from pinned host memory; simulated without a GPU "
        "(bytes_by_tier gets 'gpu' and 'host') (default: no tiering)",
    )
    g.add_argument(
        "--gpu-budget",
        metavar="BYTES",
        default=None,
        help="most bytes the GPU tier may take (e.g. 4GiB, 1e9); hot rows are clamped to fit "
        "(default: no cap)",
    )
    g.add_argument(
        "--score",
        default=None,
        help="hotness score ranking rows for --gpu-cache-fraction and --cache-policy static: "
        "degree (= out_degree), in_degree, rpr, wrpr, sj, sj_fanout, presample (default: wrpr)",
    )
    g.add_argument(
        "--placement",
        metavar="FILE",
        default=None,
        help="multi-GPU placement written by 'gnnio plan --save FILE'; features are read as GPU "
        "--reader of it (tiers local/peer/host; simulated devices without enough GPUs)",
    )
    g.add_argument(
        "--reader",
        type=int,
        default=None,
        help="which GPU of --placement this single-process run trains on (default 0; with "
        "several ranks each rank reads as its own GPU)",
    )
    g.add_argument(
        "--cache-policy",
        default="none",
        choices=["none", "static", "fifo", "lru", "lfu", "lookahead", "sieve", "s3fifo"],
        help="feature cache in front of the store (BGL): static rows by --score, a dynamic "
        "FIFO/LRU/LFU cache updated every batch, or lookahead: Belady's MIN over the next "
        "--lookahead batches the loader has sampled; with --features-on disk the host cache's "
        "policy, also sieve or s3fifo (default there: sieve)",
    )
    add_disk_arguments(g)  # --features-on disk, --host-cache-size (issue 25)
    g.add_argument(
        "--lookahead",
        type=int,
        metavar="K",
        default=None,
        help="--cache-policy lookahead: batches sampled and announced to the cache ahead "
        "(default: 8; memory: K batches of ids)",
    )
    g.add_argument(
        "--cache-size",
        type=float,
        metavar="F",
        default=None,
        help="cache rows as a fraction of the nodes (default: 0.1)",
    )
    g.add_argument(
        "--cpu-cache-size",
        type=float,
        metavar="F",
        default=None,
        help="BGL's two-level cache: a second level of this fraction of the nodes in host "
        "memory below the --cache-policy cache (which lives on the GPU when training on one)",
    )
    g.add_argument(
        "--order",
        default="random",
        choices=["random", "po"],
        help="training seed order: random shuffle, or BGL's proximity-aware order (po), which "
        "raises the hit ratio of dynamic caches",
    )
    g.add_argument(
        "--po-sequences",
        type=int,
        default=None,
        help="BFS sequences of --order po (default: the fewest meeting the shuffling-error bound)",
    )
    g = p.add_argument_group(
        "sampling",
        "the sampler (node-wise uniform, LABOR-0, LADIES), locality-aware sampling (Song & Jiang) "
        "and threshold pruning (HyDRA); default: uniform",
    )
    g.add_argument(
        "--sampler",
        default="uniform",
        choices=["uniform", "labor", "ladies"],
        help="uniform: node-wise (GraphSAGE); labor: LABOR-0, same fanouts, one shared random "
        "number per node so far fewer distinct input nodes; ladies: layer-wise importance "
        "sampling, --layer-size nodes per hop, as many hops as --fanouts has values",
    )
    g.add_argument(
        "--importance-sampling",
        type=int,
        default=None,
        metavar="I",
        help="--sampler labor: LABOR-I, I fixed-point steps on per-node importances so that "
        "destinations share still more sampled neighbours (each node's estimate at neighbour "
        "sampling's variance, the paper's target: fewer input nodes, more edges; "
        "0 = LABOR-0, the default)",
    )
    g.add_argument(
        "--sampler-device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the sampler (any of them: uniform, labor, ladies; --prune-threshold and "
        "--locality-scale included) runs: cpu (numba kernels), cuda (the training GPU, inside the "
        "loader on its own stream; needs --device cuda), or auto: cuda when training on a GPU "
        "and the graph fits (CSR, with --locality-scale its member index too, <= 1/4 of "
        "the free GPU memory), else cpu (default: auto)",
    )
    g.add_argument(
        "--graph-in",
        choices=["host", "gpu", "auto"],
        default="auto",
        help="with --sampler-device cuda: the CSR on the GPU (gpu), or pinned in host memory and "
        "read zero-copy by the GPU sampler, never copied (host: UVA sampling); auto: gpu when it "
        "(with --locality-scale its member index too) takes at most a quarter of the free GPU "
        "memory (default: auto)",
    )
    g.add_argument(
        "--layer-size",
        type=int,
        default=None,
        metavar="K",
        help="LADIES: nodes drawn per layer (expected; Song & Jiang use 8192) (default: 8192)",
    )
    g.add_argument(
        "--locality-scale",
        metavar="S|auto",
        default=None,
        help="favour neighbours whose features are on the GPU by the factor S (1 to 1e200) "
        "(probabilities renormalized, Horvitz-Thompson aggregation weights 1/q: see --edge-weight-norm); 'auto' "
        "adapts S after each epoch with Algorithm 2 (lt 0.15, ut 0.2, MAXS --locality-max-scale). Needs "
        "--gpu-cache-fraction, --placement or --cache-policy static",
    )
    g.add_argument(
        "--locality-max-scale",
        type=float,
        default=None,
        help="MAXS of --locality-scale auto, at most 5e199 (default: 8.0)",
    )
    g.add_argument(
        "--locality-compute-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="without a GPU, --locality-scale auto uses a modeled loading share; this sets the "
        "compute seconds per epoch it assumes (default: the measured CPU compute time)",
    )
    g.add_argument(
        "--edge-weight-norm",
        choices=["mean", "sum"],
        default="mean",
        help="how SAGE combines the edge weights of --sampler labor|ladies and --locality-scale: "
        "mean = sum_j w_j x_j / sum_j w_j (Hajek: consistent, not unbiased; default), sum = "
        "sum_j x_j / (deg q_j) (Horvitz-Thompson: an unbiased estimate of the neighbour mean)",
    )
    g.add_argument(
        "--prune-threshold",
        metavar="ALPHA,BETA",
        nargs="?",
        const="1,1",
        default=None,
        help="HyDRA threshold pruning: nodes with more than ALPHA*avg_degree + BETA*fanout "
        "neighbours sample from a random window of that length (flag alone: 1,1)",
    )
    add_dist_arguments(p)
    p.add_argument("--summary", metavar="F", default=None, help="write the summary JSON to F")
    p.add_argument("--log", metavar="F", default=None, help="write one JSON line per epoch to F")
    p.add_argument(
        "--checkpoint", metavar="F", default=None, help="save the best model's state_dict to F"
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="C",
        default=None,
        help="write a resumable checkpoint to C at the end of every epoch (model, optimizer, "
        "position, random states, caches, the record so far; atomic, the newest two kept; "
        "with several ranks one file per rank); a C that already holds checkpoints is refused "
        "unless this run continues them (--resume C)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        metavar="K",
        default=None,
        help="with --checkpoint-dir: also every K batches within an epoch",
    )
    p.add_argument(
        "--resume",
        metavar="C",
        default=None,
        help="continue from the newest complete checkpoint in C (same dataset, model, "
        "options and number of ranks; ends exactly as the uninterrupted run); keeps "
        "checkpointing to C",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        default=600.0,
        help="end the run with one line naming the stuck loader stage when no batch arrives "
        "for this long (a sampler or store call that never returns)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="recompute every array's sha256 before training (reads the whole dataset); "
        "without it the open checks file sizes and a sampled hash (a few MiB)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (the other output stays; also: GNNIO_NO_PROGRESS=1)")  # fmt: skip


def refuse_ignored(args, ranks: int) -> None:
    """One line for an option that would do nothing with the others given (issue 16, item 10)."""
    refuse_without_effect((
        ("--cache-size", args.cache_size, args.cache_policy != "none" and args.features_on
         != "disk", "--cache-policy (with --features-on disk: --host-cache-size)"),
        ("--cpu-cache-size", args.cpu_cache_size, args.cache_policy != "none", "--cache-policy"),
        ("--lookahead", args.lookahead, args.cache_policy == "lookahead",
         "--cache-policy lookahead"),
        ("--reader", args.reader, args.placement or ranks > 1, "--placement FILE"),
        ("--host-cache-size", args.host_cache_size, args.features_on == "disk",
         "--features-on disk"),
        ("--gpu-budget", args.gpu_budget, args.gpu_cache_fraction is not None,
         "--gpu-cache-fraction"),
        ("--score", args.score, args.gpu_cache_fraction is not None or args.cache_policy
         == "static", "--gpu-cache-fraction or --cache-policy static (the rows it ranks)"),
        ("--heads", args.heads, args.model == "gat", "--model gat"),
        ("--po-sequences", args.po_sequences, args.order == "po", "--order po"),
        ("--layer-size", args.layer_size, args.sampler == "ladies", "--sampler ladies"),
        ("--importance-sampling", args.importance_sampling, args.sampler == "labor",
         "--sampler labor"),
        ("--locality-max-scale", args.locality_max_scale, args.locality_scale == "auto",
         "--locality-scale auto"),
        ("--locality-compute-s", args.locality_compute_s, args.locality_scale == "auto",
         "--locality-scale auto"),
        ("--sampling-mode", args.sampling_mode, args.partition, "--partition PDIR"),
    ))  # fmt: skip
    reuse = None if args.reuse is None else "--reuse" if args.reuse else "--no-reuse"
    if args.reuse is False and args.reuse_level is not None:
        raise UsageError("--reuse-level: has no effect with --no-reuse")
    for option, given in (("--buffer", args.buffer), (reuse, args.reuse),
                          ("--reuse-level", args.reuse_level),
                          ("--dist-timeout", args.dist_timeout)):  # fmt: skip
        if given is not None and ranks <= 1:  # read by the ranks' placement, store and group
            raise UsageError(f"{option}: needs several ranks (--nproc N or torchrun)")
    if args.buffer is not None and args.placement:
        raise UsageError("--buffer: has no effect with --placement FILE (the file's buffers)")


#: gnnio train's options that only its epochs read (stopping, evaluation, output files): bench step
#: times --batches training steps and runs no epoch, so each is refused in one line when given
EPOCH_ONLY = ("epochs", "patience", "eval", "eval_batch_size", "summary", "log", "checkpoint",
              "checkpoint_dir", "checkpoint_every", "resume")  # fmt: skip


def refuse_epoch_options(args) -> None:
    """One line for an epoch-only option of ``gnnio train`` given to ``gnnio bench step``."""
    for dest in EPOCH_ONLY:
        value = getattr(args, dest)
        if value is not None and not (dest == "eval" and value == "sampled"):
            raise UsageError(
                f"--{dest.replace('_', '-')}: has no effect in bench step (it times --batches "
                "training steps and runs no epoch; gnnio train takes it)"
            )


def run(args) -> int:
    from ..distributed.context import env_world_size
    from ..train import check_device
    from ..train.defaults import DEFAULT_TRAIN_EPOCHS, default_dataset

    world = env_world_size()
    ranks = max(world, args.nproc)
    refuse_ignored(args, ranks)
    cfg = config_from_args(args, ranks)
    check_device(cfg.device)  # fail fast, before generating or loading anything
    cfg.validate(ranks)
    cfg.validate_dist(ranks)
    if ranks > 1 and args.reader is not None:
        raise UsageError("--reader: single-process only; with several ranks rank k reads as GPU k")
    if args.dir is None:
        if args.epochs is None:
            cfg.epochs = DEFAULT_TRAIN_EPOCHS
        ds = default_dataset(progress=not args.quiet)
        if world <= 1:
            print(f"no DIR given: training on the built-in synthetic dataset at {ds.path}")
        dataset = ds
    else:
        dataset = args.dir
    if args.verify and world <= 1:  # every byte against its sha256, before any rank starts
        from ..graph.dataset import Dataset, load

        dataset = load(dataset.path if isinstance(dataset, Dataset) else dataset, verify=True)
    if world <= 1 and args.nproc > 1:
        return launch_ranks(args, cfg, dataset)
    if world > 1:
        s = train_rank(dataset, cfg)
        if s is None:
            return 0
    else:
        from ..train import train  # (not in a --nproc launcher: it imports the models)

        s = train(dataset, cfg)
    bd = s["breakdown_s"]
    tiers = ", ".join(f"{t} {b / 2**20:,.1f} MiB" for t, b in sorted(s["bytes_by_tier"].items()))
    lines = [
        f"{s['model']} on {s['dataset']}: test acc {s['test_acc']:.4f} at best valid acc "
        f"{s['best_valid_acc']:.4f} (epoch {s['best_epoch']}, {s['epochs']} epochs run"
        f"{', stopped early' if s['stopped_early'] else ''})",
        f"epoch time {s['epoch_time_s']:.2f} s mean ({s['seeds_per_s']:,.0f} seeds/s), "
        f"eval {s['eval_time_s']:.2f} s ({cfg.eval}), device {s['device']}",
        f"per epoch: sample {bd['sample']:.2f} s, gather {bd['gather']:.2f} s, transfer "
        f"{bd['transfer']:.2f} s, compute {bd['compute']:.2f} s, waiting for data {bd['wait']:.2f} s"
        " (loader stages run in background threads and overlap)",
        f"features gathered in training: {tiers or 'none'}",
    ]
    sim = [p for p in s.get("simulated_parts", ()) if not p.startswith("device:")]
    if sim:  # (the device line says cpu already) a GPU-side structure held in host memory
        lines.append("simulated: " + "; ".join(sim))
    if s.get("disk"):  # --features-on disk
        from ..train.setup_disk import disk_line

        lines.append(disk_line(s))
    smp = s.get("sampling")
    if smp and "scale_per_epoch" in smp:
        kind = smp.get("loading_share_kind")
        lines.append(
            f"locality-aware sampling: scale per epoch {smp['scale_per_epoch']}"
            + (f" (Algorithm 2 on the {kind} loading share)" if kind else "")
        )
    if "world_size" in s:
        bl = s["bytes_by_link"]
        links = ", ".join(
            f"{t} {bl[t] / 2**20:,.1f} MiB" for t in ("local", "peer", "host", "network")
        )
        lines.append(
            f"{s['world_size']} ranks ({s['topology']}, placement {s['placement']}, "
            f"{'simulated devices on gloo' if s['simulated_devices'] else s['backend']}): {links} "
            "(features + gradients, all ranks)"
        )
    if s["checkpoint"]:
        lines.append(f"best model saved to {s['checkpoint']}")
    if s.get("resumed_from"):
        lines.append(f"resumed from {s['resumed_from']}")
    if cfg.summary:
        lines.append(f"summary written to {cfg.summary}")
    print("\n".join(lines))
    return 0
