"""Data-parallel GraphSAGE over ``torch.distributed`` ranks, in the style of PyG's
examples/multi_gpu/distributed_sampling.py, on Planetoid (gloo on CPUs, NCCL on GPUs).

A PyG script: change ``from torch_geometric.loader import NeighborLoader`` to
``from gnnio.pyg import NeighborLoader`` to run it on gnnio (every rank then converts the same
``Data`` at once; one does, the others wait for it). Rank 0 prints one JSON object last.

    python examples/pyg/distributed_sage.py --root /tmp/planetoid --world_size 2 --epochs 20
"""

import argparse
import json
import os
import time
from math import ceil

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.datasets import Planetoid
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import SAGEConv


class SAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = F.dropout(self.conv1(x, edge_index).relu(), p=0.5, training=self.training)
        return self.conv2(x, edge_index)


@torch.no_grad()
def test(loader, model, device):
    model.eval()
    correct = torch.tensor(0.0, device=device)
    total = torch.tensor(0.0, device=device)
    for batch in loader:
        pred = model(batch.x, batch.edge_index.to(device))[: batch.batch_size].argmax(-1)
        correct += (pred == batch.y[: batch.batch_size].to(device)).sum()
        total += batch.batch_size
    dist.all_reduce(correct)
    dist.all_reduce(total)
    return float(correct / total)


def split(mask, rank, world_size):
    idx = mask.nonzero(as_tuple=False).view(-1)
    return idx.split(ceil(idx.size(0) / world_size))[rank]


def run(rank, world_size, dataset, epochs, seed):
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    data = dataset[0].to(device, "x", "y")

    kwargs = dict(
        data=data,
        batch_size=32,
        num_neighbors=[25, 10],
        drop_last=True,
        num_workers=2,
        persistent_workers=True,
    )
    train_loader = NeighborLoader(
        input_nodes=split(data.train_mask, rank, world_size), shuffle=True, **kwargs
    )
    val_loader = NeighborLoader(input_nodes=split(data.val_mask, rank, world_size), **kwargs)
    test_loader = NeighborLoader(input_nodes=split(data.test_mask, rank, world_size), **kwargs)

    torch.manual_seed(seed)
    model = SAGE(dataset.num_features, 128, dataset.num_classes).to(device)
    model = DistributedDataParallel(model, device_ids=[rank] if gpu else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    start = time.perf_counter()
    best_val = test_at_best = 0.0
    for epoch in range(1, epochs + 1):
        model.train()
        for batch in train_loader:
            out = model(batch.x, batch.edge_index.to(device))[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        val_acc = test(val_loader, model, device)
        if val_acc > best_val:
            best_val, test_at_best = val_acc, test(test_loader, model, device)
        if rank == 0:
            print(f"Epoch {epoch:02d}: loss {loss.item():.4f}, val {val_acc:.4f}")
    if rank == 0:
        print(
            json.dumps(
                {
                    "script": "distributed_sage",
                    "world_size": world_size,
                    "val_acc": best_val,
                    "test_acc": test_at_best,
                    "seconds": time.perf_counter() - start,
                }
            )
        )
    # free DDP's reducer (it holds the process group) while every rank is still here: a gloo
    # group torn down after a peer has exited can wait forever in its destructor
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="data/Planetoid")
    parser.add_argument("--name", default="Cora")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12355")
    dataset = Planetoid(args.root, args.name)
    mp.spawn(
        run,
        args=(args.world_size, dataset, args.epochs, args.seed),
        nprocs=args.world_size,
        join=True,
    )
