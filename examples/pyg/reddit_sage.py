"""GraphSAGE with layer-wise inference, in the style of PyG's examples/reddit.py, on Planetoid.

A PyG script: it imports ``NeighborLoader`` from ``torch_geometric.loader``. To run it on gnnio,
change that one line to ``from gnnio.pyg import NeighborLoader``
(``benchmarks/pyg_examples/compare.py`` does exactly that and runs both). Prints one JSON object last.

    python examples/pyg/reddit_sage.py --root /tmp/planetoid --epochs 10
"""

import argparse
import copy
import json
import time

import torch
import torch.nn.functional as F
from torch_geometric.datasets import Planetoid
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import SAGEConv

parser = argparse.ArgumentParser()
parser.add_argument("--root", default="data/Planetoid")
parser.add_argument("--name", default="Cora")
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dataset = Planetoid(args.root, args.name)
data = dataset[0].to(device, "x", "y")  # features and labels where the model is

kwargs = {"batch_size": 64, "num_workers": 2, "persistent_workers": True}
train_loader = NeighborLoader(
    data, input_nodes=data.train_mask, num_neighbors=[25, 10], shuffle=True, **kwargs
)
subgraph_loader = NeighborLoader(
    copy.copy(data), input_nodes=None, num_neighbors=[-1], shuffle=False, **kwargs
)
# layer-wise inference reads x_all itself: the loader gathers no features or labels
del subgraph_loader.data.x, subgraph_loader.data.y
subgraph_loader.data.num_nodes = data.num_nodes
subgraph_loader.data.n_id = torch.arange(data.num_nodes)


class SAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [
                SAGEConv(in_channels, hidden_channels),
                SAGEConv(hidden_channels, out_channels),
            ]
        )

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), p=0.5, training=self.training)
        return x

    @torch.no_grad()
    def inference(self, x_all, loader):
        seen = 0
        for i, conv in enumerate(self.convs):  # one layer at a time, over all edges
            outs = []
            for batch in loader:
                x = x_all[batch.n_id.to(x_all.device)].to(device)
                x = conv(x, batch.edge_index.to(device))
                if i < len(self.convs) - 1:
                    x = x.relu()
                outs.append(x[: batch.batch_size].cpu())
                seen += batch.batch_size
            x_all = torch.cat(outs, dim=0)
        assert seen == len(loader.dataset) * len(self.convs)
        return x_all


model = SAGE(dataset.num_features, 128, dataset.num_classes).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)


def train():
    model.train()
    total_loss = total_examples = 0
    for batch in train_loader:
        optimizer.zero_grad()
        y = batch.y[: batch.batch_size]
        out = model(batch.x, batch.edge_index.to(device))[: batch.batch_size]
        loss = F.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * batch.batch_size
        total_examples += batch.batch_size
    assert total_examples == len(train_loader.dataset)
    return total_loss / total_examples


@torch.no_grad()
def test():
    model.eval()
    pred = model.inference(data.x, subgraph_loader).argmax(dim=-1)
    y = data.y.cpu()
    return [
        int((pred[m] == y[m]).sum()) / int(m.sum())
        for m in (data.train_mask.cpu(), data.val_mask.cpu(), data.test_mask.cpu())
    ]


best_val = test_at_best = 0.0
start = time.perf_counter()
for epoch in range(1, args.epochs + 1):
    loss = train()
    train_acc, val_acc, test_acc = test()
    if val_acc > best_val:
        best_val, test_at_best = val_acc, test_acc
    print(f"Epoch {epoch:02d}, Loss: {loss:.4f}, Val: {val_acc:.4f}, Test: {test_acc:.4f}")
print(
    json.dumps(
        {
            "script": "reddit_sage",
            "val_acc": best_val,
            "test_acc": test_at_best,
            "seconds": time.perf_counter() - start,
        }
    )
)
