"""``gnnio partition DIR --parts M [--method M] --out PDIR``: split the topology over ranks."""

from __future__ import annotations

import json

from ..errors import UsageError
from . import COMMANDS, HelpFormatter, refuse_without_effect


def register(sub) -> None:
    from ..preprocess.partition import BASES, METHODS

    p = sub.add_parser(
        "partition",
        help=COMMANDS["partition"],
        description=(
            "Split the nodes of a dataset into parts, write the node -> part map, the replicated "
            "set and one CSR shard per part to PDIR (atomically), and report the quality: edge "
            "cut, node and training-node balance, replication memory and remote_fraction, the "
            "share of neighbour-list reads that cross parts in one sampled epoch (each part "
            "sampling its own training nodes)."
        ),
        formatter_class=HelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="dataset directory")
    p.add_argument("--parts", type=int, required=True, metavar="M", help="number of parts")
    p.add_argument(
        "--method",
        default="metis",
        choices=list(METHODS),
        help="partitioner (default: metis, DistDGL's: the fewest cut edges and remote reads in "
        "docs/benchmarks.md, and the slowest to run: random or hdr split a large graph in "
        "seconds)",
    )
    p.add_argument(
        "--base",
        default=None,
        choices=list(BASES),
        help="--method hdr: how non-replicated nodes are assigned (default: greedy, HyDRA "
        "Algorithm 1)",
    )
    p.add_argument(
        "--replicate",
        type=float,
        default=0.0,
        metavar="P_R",
        help="fraction of nodes (top by degree) whose neighbour lists every part stores",
    )
    p.add_argument(
        "--hops",
        type=int,
        default=None,
        metavar="J",
        help="bfs-block (--method, or --base of hdr): the j-hop term (default: 2; BGL names no value)",
    )
    p.add_argument(
        "--refine",
        type=int,
        default=0,
        metavar="R",
        help="after the method, R rounds of size-constrained label propagation (not in the "
        "papers; 0 = off, the algorithms as printed)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--fanouts", default="15,10,5", help="fanouts of the remote_fraction epoch")
    p.add_argument("--batch-size", type=int, default=1024, help="batch of that epoch")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="sampler threads for the epoch (default: min(8, the CPU cores))",
    )
    p.add_argument("--out", required=True, metavar="PDIR", help="partition directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace PDIR if it is a partition")
    p.add_argument(
        "--memory-budget",
        metavar="BYTES",
        default=None,
        help="keep what this process allocates within BYTES (e.g. 4GiB; the CSR, the per-node "
        "arrays and one chunk count, the interpreter does not): random, range and hdr over them "
        "or greedy run in chunks, metis and bfs-block stay in memory and are refused when they "
        "would not fit; the same files (default: half the available RAM for the chunked "
        "methods, in RAM for metis, bfs-block and --refine; 'none': in RAM)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (last line)")
    p.add_argument("--quiet", action="store_true", help="no summary line")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (the other output stays; also: GNNIO_NO_PROGRESS=1)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..graph.dataset import load
    from ..preprocess.partition import partition_dataset, save_partition
    from ..sampling import parse_fanouts

    try:
        fanouts = parse_fanouts(args.fanouts)
    except ValueError as e:
        raise UsageError(f"--fanouts: {e}") from None
    if args.batch_size < 1:
        raise UsageError(f"--batch-size: must be >= 1, got {args.batch_size}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads: must be >= 1, got {args.threads}")
    from ..preprocess.chunked import resolve_budget
    from ..preprocess.partition.bounded import IN_MEMORY, check_budget

    # an option the method would ignore is one line (README: "an option that would have no
    # effect with the others given"), then the defaults
    refuse_without_effect([
        ("--base", args.base, args.method == "hdr", "--method hdr"),
        ("--hops", args.hops, "bfs-block" in (args.method, args.base), "bfs-block (--method or --base)"),
    ])  # fmt: skip
    args.base = "greedy" if args.base is None else args.base
    args.hops = 2 if args.hops is None else args.hops
    which = args.base if args.method == "hdr" else args.method
    budget = resolve_budget(args.memory_budget, which not in IN_MEMORY and not args.refine)
    ds = load(args.dir)

    chunk = check_budget(budget, ds.graph, args.method, args.base)
    part = partition_dataset(
        ds,
        args.parts,
        args.method,
        replicate=args.replicate,
        base=args.base,
        hops=args.hops,
        seed=args.seed,
        fanouts=fanouts,
        batch_size=args.batch_size,
        threads=args.threads,
        refine=args.refine,
        memory_budget=budget,
    )
    out = save_partition(part, ds.graph, args.out, overwrite=args.overwrite, chunk_bytes=chunk)
    q = dict(part.quality)
    report = {
        "dataset": ds.name,
        "out": str(out),
        "method": part.method,
        "params": part.params,
        **q,
    }
    if args.json:
        print(json.dumps(report))
    elif not args.quiet:
        rf = q.get("remote_fraction")
        print(
            f"wrote {out}: {part.num_parts} parts by {part.method} in {part.prep_s:.2f} s; "
            f"edge cut {q['edge_cut']:.3f}, node balance {q['node_balance']:.3f}, train "
            f"balance {q['train_balance']:.3f}, memory x{q['memory_increase']:.3f}, remote "
            f"reads {'n/a' if rf is None else f'{rf:.3f}'}"
        )
    return 0
