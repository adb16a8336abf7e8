"""The CPU training step's kernels on a real batch: the block SpMM (numba) against
``torch.sparse.mm``, and the step's training-thread CPU time per part.

    python benchmarks/step_kernels.py DATA_DIR [--threads 1] [--steps 12]

Reports, for the layer-0 block of a sampled batch (batch 1024, fanouts 15,10,5): ms of the numba
kernel and of ``torch.sparse.mm`` for ``A @ x`` and ``A^T @ g`` (median, training-thread CPU time,
which a loaded machine moves less than wall time), whether the forward results are bit-identical;
then forward / backward / optimizer ms of the GraphSAGE step (hidden 256) with the numba SpMM and
with ``GNNIO_SPMM=torch``. Used for docs/benchmarks.md, "The training step on the CPU".
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F


def _median_ms(fn, n: int) -> float:
    fn()
    ts = []
    for _ in range(n):
        t0 = time.thread_time()
        fn()
        ts.append(time.thread_time() - t0)
    return float(np.median(ts) * 1e3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import gnnio
    from gnnio.sampling import UniformSampler
    from gnnio.train import TrainConfig
    from gnnio.train.build import make_optimizer
    from gnnio.train.models import build_model
    from gnnio.train.spmm import block_csr

    ds = gnnio.load(args.data)
    s = UniformSampler(ds.graph, [15, 10, 5], seed=0, num_threads=2)
    feats, labels = np.asarray(ds.features), np.asarray(ds.labels)
    batches = []
    for i in range(4):
        seeds = torch.from_numpy(np.asarray(ds.train_idx[i * 1024 : (i + 1) * 1024], np.int64))
        b = s.sample(seeds, epoch_seed=i)
        b.x = torch.from_numpy(feats[b.input_nodes.numpy()]).float()
        b.labels = torch.from_numpy(labels[b.seeds.numpy()])
        batches.append(b)
    blk = batches[0].blocks[0]
    x = torch.randn(blk.num_src, ds.feat_dim)
    g = torch.randn(blk.num_dst, ds.feat_dim)
    adj = block_csr(blk, "mean", torch.float32, torch.device("cpu"))
    sp = torch.sparse_csr_tensor(adj.ptr, adj.col, adj.val, adj.shape)
    spt = torch.sparse_csr_tensor(adj.t().ptr, adj.t().col, adj.t().val, adj.t().shape)
    out = {
        "block": {"num_dst": blk.num_dst, "num_src": blk.num_src, "edges": blk.num_edges},
        "numba_forward_ms": _median_ms(lambda: adj.matmul(x), args.steps),
        "torch_forward_ms": _median_ms(lambda: torch.sparse.mm(sp, x), args.steps),
        "numba_transpose_ms": _median_ms(lambda: adj.t().matmul(g), args.steps),
        "torch_transpose_ms": _median_ms(lambda: torch.sparse.mm(spt, g), args.steps),
    }
    ours, ref = adj.matmul(x), torch.sparse.mm(sp, x)  # (MKL may fuse the multiply-add: last bits)
    out["forward_bit_identical"] = bool(torch.equal(ours, ref))
    out["forward_max_abs_diff"] = float((ours - ref).abs().max()) if ours.numel() else 0.0
    for impl in ("numba", "torch"):
        os.environ["GNNIO_SPMM"] = "" if impl == "numba" else "torch"
        torch.manual_seed(0)
        m = build_model("sage", ds.feat_dim, 256, ds.num_classes, 3)
        opt = make_optimizer(m, TrainConfig(lr=0.003))
        parts = []
        for i in range(args.steps + 4):
            b = batches[i % 4]
            t0 = time.thread_time()
            loss = F.cross_entropy(m(b.x, b.blocks), b.labels)
            t1 = time.thread_time()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t2 = time.thread_time()
            opt.step()
            t3 = time.thread_time()
            if i >= 4:
                parts.append((t1 - t0, t2 - t1, t3 - t2))
        med = np.median(np.array(parts), axis=0) * 1e3
        out[f"step_{impl}_ms"] = {"forward": med[0], "backward": med[1], "optimizer": med[2],
                                  "total": float(med.sum())}  # fmt: skip
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
