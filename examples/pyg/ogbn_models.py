"""GraphSAGE or SGFormer (disjoint subgraphs per seed), in the style of PyG's
examples/ogbn_train.py, on Planetoid.

A PyG script: change ``from torch_geometric.loader import NeighborLoader`` to
``from gnnio.pyg import NeighborLoader`` to run it on gnnio. Prints one JSON object last.

    python examples/pyg/ogbn_models.py --root /tmp/planetoid --model sgformer --epochs 20
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch_geometric import seed_everything
from torch_geometric.datasets import Planetoid
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn.models import GraphSAGE, SGFormer
from torch_geometric.utils import to_undirected

parser = argparse.ArgumentParser()
parser.add_argument("--root", default="data/Planetoid")
parser.add_argument("--name", default="Cora")
parser.add_argument("--model", default="sgformer", choices=["sage", "sgformer"])
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--num_layers", type=int, default=2)
parser.add_argument("--fan_out", type=int, default=10)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--num_workers", type=int, default=2)
parser.add_argument("--seed", type=int, default=123)
args = parser.parse_args()

seed_everything(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dataset = Planetoid(args.root, args.name)
data = dataset[0]
data.edge_index = to_undirected(data.edge_index)
split_idx = {k: data[f"{k}_mask"].nonzero().view(-1) for k in ("train", "val", "test")}
data.to(device, "x", "y")


def get_loader(input_nodes):
    return NeighborLoader(
        data,
        input_nodes=input_nodes,
        num_neighbors=[args.fan_out] * args.num_layers,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        disjoint=args.model == "sgformer",
    )


train_loader = get_loader(split_idx["train"])
val_loader = get_loader(split_idx["val"])
test_loader = get_loader(split_idx["test"])

if args.model == "sage":
    model = GraphSAGE(dataset.num_features, 128, args.num_layers, dataset.num_classes, dropout=0.5)
else:
    model = SGFormer(
        dataset.num_features,
        64,
        dataset.num_classes,
        gnn_num_layers=args.num_layers,
        trans_dropout=0.5,
        gnn_dropout=0.5,
    )
model = model.to(device)
model.reset_parameters()
optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)


def forward(batch):
    if args.model == "sgformer":  # attention within each seed's own subgraph
        return model(batch.x, batch.edge_index.to(device), batch.batch.to(device))
    return model(batch.x, batch.edge_index.to(device))


def train():
    model.train()
    total_loss = 0.0
    for batch in train_loader:
        optimizer.zero_grad()
        out = forward(batch)[: batch.batch_size]
        y = batch.y[: batch.batch_size].view(-1).to(torch.long)
        loss = F.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
    return total_loss / len(train_loader)


@torch.no_grad()
def test(loader):
    model.eval()
    correct = total = 0
    for batch in loader:
        batch = batch.to(device)
        batch_size = batch.num_sampled_nodes[0]
        pred = forward(batch)[:batch_size].argmax(dim=-1)
        y = batch.y[:batch_size].view(-1).to(torch.long)
        correct += int((pred == y).sum())
        total += y.size(0)
    return correct / total


start = time.perf_counter()
best_val = test_at_best = 0.0
for epoch in range(1, args.epochs + 1):
    loss = train()
    val_acc = test(val_loader)
    if val_acc > best_val:
        best_val, test_at_best = val_acc, test(test_loader)
    print(f"Epoch {epoch:02d}, Loss: {loss:.4f}, Val: {val_acc:.4f}")
print(
    json.dumps(
        {
            "script": f"ogbn_models:{args.model}",
            "val_acc": best_val,
            "test_acc": test_at_best,
            "seconds": time.perf_counter() - start,
        }
    )
)
