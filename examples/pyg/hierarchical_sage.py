"""Hierarchical neighbourhood sampling (``trim_to_layer``), in the style of PyG's
examples/hierarchical_sampling.py, on Planetoid, with an evaluation added.

A PyG script: change ``from torch_geometric.loader import NeighborLoader`` to
``from gnnio.pyg import NeighborLoader`` to run it on gnnio. Prints one JSON object last.

    python examples/pyg/hierarchical_sage.py --root /tmp/planetoid --epochs 10
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch_geometric.datasets import Planetoid
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn.models.basic_gnn import GraphSAGE

parser = argparse.ArgumentParser()
parser.add_argument("--root", default="data/Planetoid")
parser.add_argument("--name", default="Cora")
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dataset = Planetoid(args.root, args.name)
data = dataset[0].to(device, "x", "y")

kwargs = {"batch_size": 64, "num_workers": 2, "persistent_workers": True}
loader = NeighborLoader(
    data, input_nodes=data.train_mask, num_neighbors=[20, 10, 5], shuffle=True, **kwargs
)
val_loader = NeighborLoader(data, input_nodes=data.val_mask, num_neighbors=[20, 10, 5], **kwargs)
test_loader = NeighborLoader(data, input_nodes=data.test_mask, num_neighbors=[20, 10, 5], **kwargs)

model = GraphSAGE(
    dataset.num_features,
    hidden_channels=64,
    out_channels=dataset.num_classes,
    num_layers=3,
    dropout=0.5,
).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)


def run(batch):
    # trim_to_layer: layer i only computes what the remaining layers need
    return model(
        batch.x,
        batch.edge_index,
        num_sampled_nodes_per_hop=batch.num_sampled_nodes,
        num_sampled_edges_per_hop=batch.num_sampled_edges,
    )


def train(trim):
    model.train()
    for batch in loader:
        optimizer.zero_grad()
        batch = batch.to(device)
        out = run(batch) if trim else model(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[: batch.batch_size], batch.y[: batch.batch_size])
        loss.backward()
        optimizer.step()


@torch.no_grad()
def test(loader):
    model.eval()
    correct = total = 0
    for batch in loader:
        batch = batch.to(device)
        pred = run(batch)[: batch.batch_size].argmax(dim=-1)
        correct += int((pred == batch.y[: batch.batch_size]).sum())
        total += batch.batch_size
    return correct / total


start = time.perf_counter()
best_val = test_at_best = 0.0
for epoch in range(1, args.epochs + 1):
    train(trim=epoch % 2 == 0)  # with and without hierarchical sampling
    val_acc = test(val_loader)
    if val_acc > best_val:
        best_val, test_at_best = val_acc, test(test_loader)
    print(f"Epoch {epoch:02d}, Val: {val_acc:.4f}")
print(
    json.dumps(
        {
            "script": "hierarchical_sage",
            "val_acc": best_val,
            "test_acc": test_at_best,
            "seconds": time.perf_counter() - start,
        }
    )
)
