"""A PyG training loop fed by gnnio: PyG's own GraphSAGE with ``trim_to_layer``, on
NeighborLoader-format batches from :class:`gnnio.pyg.PyGLoader`.

    python -c "from torch_geometric.datasets import Planetoid; Planetoid('datasets', 'Cora')"
    gnnio prepare planetoid --name cora --root datasets/Cora --out data/cora
    python examples/pyg_training_loop.py --data data/cora --epochs 50

(the first line downloads Cora's original files into ``datasets/Cora/raw``; any folder holding
``ind.cora.*`` will do as ``--root``). A ``--data`` that is not a prepared dataset ends with one
line naming the problem and how to prepare one (exit status 2).

The loop is the one a PyG user writes around ``NeighborLoader``; only the two loader lines
differ (see docs/pyg.md). It prints a progress line per epoch (stderr) and, last, one JSON object
(stdout) with ``test_acc`` (accuracy of the epoch with the best validation accuracy), ``val_acc``,
the rows and bytes the feature store served per tier, and the loader's stage times.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GraphSAGE

from gnnio.errors import DatasetError
from gnnio.graph import load
from gnnio.pyg import PyGLoader

PREPARE = "gnnio prepare planetoid --name cora --root datasets/Cora --out data/cora"


def fanouts(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a prepared gnnio dataset directory")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--fanouts", type=fanouts, default=[10, 10], help="training num_neighbors")
    p.add_argument("--eval-fanouts", type=fanouts, default=[-1, -1], help="evaluation fanouts")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--expand", choices=("new", "all"), default="new",
                   help="sampling semantics: PyG's (new) or gnnio's (all)")  # fmt: skip
    p.add_argument("--store", choices=("memory", "mmap"), default="memory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """PyG's ``NormalizeFeatures``: each row divided by its sum (per batch, on the fly)."""
    return x / x.sum(dim=1, keepdim=True).clamp_min(1.0)


def forward(model, batch) -> torch.Tensor:
    # the seeds are the first batch_size nodes; trim_to_layer drops, layer by layer, the nodes
    # and edges the remaining layers no longer need
    out = model(
        normalize(batch.x),
        batch.edge_index,
        num_sampled_nodes_per_hop=batch.num_sampled_nodes,
        num_sampled_edges_per_hop=batch.num_sampled_edges,
    )
    return out[: batch.batch_size]


@torch.no_grad()
def accuracy(model, loader) -> float:
    model.eval()
    correct = total = 0
    for batch in loader:
        pred = forward(model, batch).argmax(dim=-1)
        y = batch.y[: batch.batch_size]
        correct += int((pred == y).sum())
        total += int(y.numel())
    return correct / max(total, 1)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    try:
        data = load(args.data)
    except DatasetError as e:  # one line, not a traceback: a new user's first run
        print(f"pyg_training_loop.py: error: --data {e}; prepare a dataset first, e.g. {PREPARE} (docs/pyg.md)",
              file=sys.stderr)  # fmt: skip
        return 2

    # --- the two lines that replace NeighborLoader(data, num_neighbors=..., input_nodes=...) ---
    common = dict(store=args.store, expand=args.expand, device=device, seed=args.seed)
    train_loader = PyGLoader(data, args.fanouts, input_nodes="train",
                             batch_size=args.batch_size, shuffle=True, **common)  # fmt: skip
    val_loader = PyGLoader(data, args.eval_fanouts, input_nodes="valid",
                           batch_size=512, **common)  # fmt: skip
    test_loader = PyGLoader(data, args.eval_fanouts, input_nodes="test",
                            batch_size=512, **common)  # fmt: skip
    ds = train_loader.dataset

    model = GraphSAGE(
        ds.feat_dim, args.hidden, num_layers=len(args.fanouts), out_channels=ds.num_classes,
        dropout=args.dropout,
    ).to(device)  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    best_val, test_at_best, best_epoch = -1.0, 0.0, -1
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        total_loss = 0.0
        for batch in train_loader:
            opt.zero_grad()
            out = forward(model, batch)
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
            total_loss += loss.item() * batch.batch_size
        val_acc = accuracy(model, val_loader)
        if val_acc > best_val:
            best_val, best_epoch = val_acc, epoch
            test_at_best = accuracy(model, test_loader)
        print(
            f"epoch {epoch:3d}  loss {total_loss / train_loader.order.num_seeds:.4f}  "
            f"val {val_acc:.4f}",
            file=sys.stderr,
        )
    stats = train_loader.stats
    summary = {
        "dataset": ds.name,
        "epochs": args.epochs,
        "expand": args.expand,
        "fanouts": args.fanouts,
        "best_epoch": best_epoch,
        "val_acc": best_val,
        "test_acc": test_at_best,
        "train_s": time.perf_counter() - t0,
        "train_store": train_loader.store.counters.snapshot(),
        "last_epoch_stages_s": {
            k: getattr(stats, k) for k in ("sample_s", "gather_s", "wait_s", "epoch_s")
        },
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
