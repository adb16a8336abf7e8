"""The training step as one CUDA graph replay (``gnnio train --cuda-graph``; issue 24, item 2).

Why: on a GPU the eager step is paced by the host. An H200 ran gnnio's default step (GraphSAGE,
3 layers, ~100k input rows) in 4.9 ms of wall time with 1.2 ms of kernels: ~150 torch operations,
each tens of microseconds of Python, autograd and launch on the host (docs/benchmarks.md, "Measured
on an H200"). A CUDA graph replays the whole step -- forward, loss, backward, optimizer -- with one
launch.

A graph needs fixed shapes, and batches differ in size. So each batch is copied into static
buffers sized once, from the largest of the first ``warmup`` batches (trained eagerly) times
``margin``, rounded up (:attr:`GraphedStep.caps`), and padded:

* level ``k`` (``k = 0`` the input rows, ``L`` the seeds) holds ``C_k`` rows, the batch's real rows
  first; every level past the input keeps at least one padding row, the last (``C_k - 1``);
* block ``k`` holds ``E_k`` edge slots: the real edges first, then padding edges from source 0
  into that last padding row, weight 0 where the batch has weights; its CSR pointer gives the
  real rows their edges, the padding rows none but the last, which takes every padding edge;
* the seeds' labels are padded with ``-1``, which the loss ignores.

So padded rows read real ones but no real row reads a padded one, and a padded row's loss
gradient is 0, which then flows back as exact zeros: the real rows' values and the gradients are
those of the unpadded step up to float rounding (dense products over more rows may sum in another
order; ``tests/test_graphed.py`` checks the losses and parameters against the eager step). With
dropout the masks differ from the eager run's (another shape draws other random numbers: same
distribution, not the same stream), so a graphed run is not bit-identical to an eager one; two
graphed runs are.

A batch larger than the buffers, or one whose blocks lack the sampler's CSR pointer (edges in
any order: LADIES), runs eagerly (:func:`gnnio.train.build.train_step`; counted in
``eager``). The first batch that fits runs padded on the capture stream (eagerly: libraries
make their per-stream workspaces there, not inside the capture) and the next is captured and
replayed. If capturing fails, the run warns once, says why in the summary and stays eager. The
optimizer is switched to ``capturable=True`` (Adam's step count then lives on the GPU) before the
first step. On a CPU (or with ``capture=False``) the padded step runs eagerly: what the tests use
to check the padding. One process only (DDP's hooks are not captured here).

Not measured on a GPU yet (written after the H200 run of 2026-11-26): default off until a GPU run
shows it faster.
"""

from __future__ import annotations

import math
from typing import cast

import torch

from ..sampling.base import Block
from ..utils.capture import CAPTURE_LOCK, capture, capture_stream
from ..utils.warnings_at import warn
from .step import seed_loss, train_step

__all__ = ["CUDA_GRAPH_MODES", "GraphedStep", "graph_mode", "graph_report"]

#: ``--cuda-graph``: what replays as CUDA graphs (``all``: the step and the GPU sampler,
#: :mod:`gnnio.sampling.gpu_graphed`)
CUDA_GRAPH_MODES = ("off", "step", "sampler", "all")

#: capacities are rounded up to a multiple of this (rows and edge slots)
ROUND = 256


def _round(n: float) -> int:
    return int(math.ceil(max(n, 1) / ROUND) * ROUND)


class GraphedStep:
    """``step(net, opt, batch, timer=None) -> (logits, loss)``, as
    :func:`~gnnio.train.build.train_step` (module docstring).

    Args:
        device: the training device; the graph is captured on CUDA only.
        warmup: batches trained eagerly before the buffers are sized and the graph captured.
        margin: capacities = the warmup's largest sizes times this.
        capture: False: run the padded step eagerly (the CPU, the tests); None: capture on CUDA.
    """

    def __init__(self, device, warmup: int = 3, margin: float = 1.15, capture: bool | None = None):
        self.device = torch.device(device)
        if capture is None and self.device.type != "cuda":
            warn(f"--cuda-graph: no CUDA device ({self.device}): the padded step runs "
                 "eagerly (slower than the plain step; a check of the padding only)",
                 RuntimeWarning)  # fmt: skip
        self.capture = self.device.type == "cuda" if capture is None else bool(capture)
        self.warmup = max(1, int(warmup))
        self.margin = float(margin)
        self.caps: dict | None = None
        self.graphed = self.eager = 0
        self.failed: str | None = None
        self._seen: list[tuple] = []
        self._graph: torch.cuda.CUDAGraph | None = None
        self._sums = None
        self._warm = False  # the first padded batch ran on the capture stream

    # -- sizes ------------------------------------------------------------------------------------
    @staticmethod
    def _shape(batch) -> tuple:
        bl = batch.blocks
        rows = [bl[0].num_src] + [b.num_dst for b in bl]
        edges = [b.num_edges for b in bl]
        weighted = tuple(b.edge_weight is not None for b in bl)
        # a block without the sampler's CSR pointer may have its edges in any order: such
        # batches run eagerly (block_csr sorts them there)
        grouped = all(b.ptr is not None for b in bl)
        return rows, edges, weighted, tuple(batch.x.shape[1:]), batch.x.dtype, grouped

    def _fits(self, shape) -> bool:
        rows, edges, weighted, feat, dtype, grouped = shape
        c = self.caps
        assert c is not None  # step() sizes the buffers (_size) before it asks
        return (
            grouped
            and (weighted, feat, dtype) == (c["weighted"], c["feat"], c["dtype"])
            and rows[0] <= c["rows"][0]
            and all(r < cap for r, cap in zip(rows[1:], c["rows"][1:], strict=True))
            and all(e <= cap for e, cap in zip(edges, c["edges"], strict=True))
        )

    def _size(self) -> None:
        shapes = self._seen
        L = len(shapes[0][0]) - 1
        rows = [_round(max(s[0][k] for s in shapes) * self.margin + (k > 0)) for k in range(L + 1)]
        for k in range(L - 1, -1, -1):  # a level's rows are a prefix of the level below
            rows[k] = max(rows[k], rows[k + 1])
        edges = [_round(max(s[1][k] for s in shapes) * self.margin) for k in range(L)]
        first = shapes[-1]
        self.caps = {"rows": rows, "edges": edges, "weighted": first[2], "feat": first[3],
                     "dtype": first[4]}  # fmt: skip
        self._alloc()

    def _alloc(self) -> None:
        c, dev = self.caps, self.device
        assert c is not None  # (_size set it)
        rows, edges = c["rows"], c["edges"]
        self.x = torch.zeros((rows[0], *c["feat"]), dtype=c["dtype"], device=dev)
        self.labels = torch.full((rows[-1],), -1, dtype=torch.int64, device=dev)
        self.blocks, self._pad = [], []
        for k, e in enumerate(edges):
            nd = rows[k + 1]
            ei = torch.zeros((2, e), dtype=torch.int64, device=dev)
            pad = torch.zeros((2, e), dtype=torch.int64, device=dev)
            pad[1].fill_(nd - 1)  # padding edges: source 0 -> the last padding row
            ptr = torch.zeros(nd + 1, dtype=torch.int64, device=dev)
            ptr[nd:].fill_(e)
            w = torch.zeros(e, device=dev) if c["weighted"][k] else None
            self.blocks.append(Block(ei, rows[k], nd, w, ptr))
            self._pad.append(pad)

    def _load(self, batch) -> int:
        """Copy ``batch`` into the static buffers; returns its number of seeds."""
        s = batch.x.shape[0]
        self.x[:s].copy_(batch.x)
        b = int(batch.labels.shape[0])
        self.labels[:b].copy_(batch.labels)
        self.labels[b:].fill_(-1)
        for blk, sb, pad in zip(batch.blocks, self.blocks, self._pad, strict=True):
            e, n = blk.num_edges, blk.num_dst
            sb.edge_index[:, :e].copy_(blk.edge_index)
            sb.edge_index[:, e:].copy_(pad[:, e:])
            sp = cast(torch.Tensor, sb.ptr)  # _alloc gives every static block a ptr
            sp[: n + 1].copy_(blk.ptr)
            sp[n + 1 : sb.num_dst].fill_(e)  # empty padding rows; the last one takes the rest
            if sb.edge_weight is not None:
                sb.edge_weight[:e].copy_(blk.edge_weight)
                sb.edge_weight[e:].fill_(0)
        return b

    # -- the step ---------------------------------------------------------------------------------
    def _body(self, net, opt):
        logits = net(self.x, self.blocks)
        y = self.labels
        loss, lab, n = seed_loss(logits, y)  # (as train_step's; the padding is labelled -1)
        loss.backward()
        opt.step()
        # the loop's per-batch sums (gnnio.train.loop: loss x labelled seeds, correct
        # predictions, labelled seeds), here inside the graph instead of ~8 operations per batch
        # on the host
        with torch.no_grad():
            sums = (loss.double() * n, ((logits.argmax(dim=1) == y) & lab).sum(), n)
        return logits, loss, sums

    def _capture(self, net, opt) -> None:
        opt.zero_grad(set_to_none=True)  # the graph's backward allocates (and then reuses) grads
        g = torch.cuda.CUDAGraph()
        # thread_local: only this thread's unsafe calls break the capture -- the loader's
        # threads go on sampling and gathering (their syncs and allocations) meanwhile; never
        # beside the sampler's capture or a device-wide wait (gnnio.utils.capture)
        with capture(g, self.device):
            self._out = self._body(net, opt)
        self._graph = g

    def _warm_up(self, net, opt):
        """:meth:`_body` eagerly on :func:`~gnnio.utils.capture.capture_stream`, ordered after
        and before the current stream's work (and under the capture lock: a capture on that
        stream would take this work into its graph)."""
        with CAPTURE_LOCK:
            side, cur = capture_stream(self.device), torch.cuda.current_stream(self.device)
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                opt.zero_grad(set_to_none=True)
                out = self._body(net, opt)
            cur.wait_stream(side)
        logits, loss, sums = out
        for t in (logits, loss, *sums):  # made on ``side``, read on ``cur``
            t.record_stream(cur)
        return out

    def sums(self):
        """``(loss x labelled seeds, correct, labelled seeds)`` of the batch just trained, as 0-d
        device tensors, when it ran padded (computed inside the graph; overwritten by the next
        replay: add, do not keep), else None (the caller computes them from the logits)."""
        return self._sums

    def __call__(self, net, opt, batch, timer=None):
        self._sums = None
        shape = self._shape(batch)
        if self.caps is None and len(self._seen) < self.warmup:
            self._seen.append(shape)
            self.eager += 1
            if self.capture and self.device.type == "cuda":
                _capturable(opt)
            return train_step(net, opt, batch, timer)
        if self.caps is None:
            self._size()
        if self.failed is not None or not self._fits(shape):
            self.eager += 1
            return train_step(net, opt, batch, timer)
        if timer is not None:
            timer.start()
        b = self._load(batch)
        if not self.capture:
            opt.zero_grad(set_to_none=True)
            logits, loss, self._sums = self._body(net, opt)
        else:
            if self._graph is None:
                try:
                    if not self._warm:
                        # the first padded batch runs eagerly on the capture stream: cuBLAS and
                        # friends make their workspaces per (handle, stream) at first use, which
                        # must not happen inside a capture (torch's and NVIDIA's advice)
                        warm = self._warm_up(net, opt)
                    else:
                        self._capture(net, opt)
                except Exception as e:  # noqa: BLE001 - one warning, then the eager step
                    self.failed = f"{type(e).__name__}: {e}"[:300]
                    warn(f"--cuda-graph: capture failed, training eagerly ({self.failed})",
                         RuntimeWarning)  # fmt: skip
                    opt.zero_grad(set_to_none=True)
                    self.eager += 1
                    out = train_step(net, opt, batch)
                    if timer is not None:
                        timer.stop()
                    return out
            if not self._warm:
                self._warm = True
                logits, loss, self._sums = warm  # (captured at the next batch that fits)
                self.eager += 1  # (padded, but eager: not a replay)
                if timer is not None:
                    timer.stop()
                return logits[:b].detach(), loss.detach()
            else:
                assert self._graph is not None  # (captured above, or at an earlier batch)
                with CAPTURE_LOCK:  # its dropout draws: never beside a capture (utils.capture)
                    self._graph.replay()
                logits, loss, self._sums = self._out
        self.graphed += 1
        if timer is not None:
            timer.stop()
        return logits[:b].detach(), loss.detach()

    def report(self) -> dict:
        """For the run's summary (``cuda_graph``)."""
        c = self.caps or {}
        return {"captured": self._graph is not None, "graphed": self.graphed, "eager": self.eager,
                "failed": self.failed, "rows": c.get("rows"), "edges": c.get("edges")}  # fmt: skip


def _capturable(opt) -> None:
    """Adam's step count on the GPU, as capturing needs (the same update; set before its first
    step, so the state is made on the device)."""
    for group in opt.param_groups:
        if "capturable" in group:
            group["capturable"] = True


def graph_mode(cfg, part: str | None = None):
    """``cfg.cuda_graph`` as one of :data:`CUDA_GRAPH_MODES` (``True``: ``all``, ``False`` or
    None: ``off``; anything else as given, for :meth:`TrainConfig.validate` to refuse); with
    ``part`` (``"step"`` or ``"sampler"``) whether that part replays as a CUDA graph."""
    if part is not None:
        return graph_mode(cfg) in (part, "all")
    mode = getattr(cfg, "cuda_graph", "off")
    if mode is True:
        return "all"
    if mode is False or mode is None:
        return "off"
    return str(mode)


def graph_report(cfg, step) -> dict | None:
    """The summary's ``cuda_graph``: None when nothing replays as a graph; else ``mode``, the
    step's :meth:`GraphedStep.report` (its keys at the top) where the step is graphed, and
    ``sampler``: :func:`gnnio.sampling.gpu_graphed.graphed_report` where the sampler is."""
    mode = graph_mode(cfg)
    if mode == "off":
        return None
    out = {"mode": mode}
    if hasattr(step, "report"):
        out.update(step.report())
    if graph_mode(cfg, "sampler"):
        from ..sampling.gpu_graphed import graphed_report

        out["sampler"] = graphed_report()
    return out
