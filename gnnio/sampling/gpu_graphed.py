"""The GPU sampler's batch replayed as one CUDA graph (``gnnio train --cuda-graph``; issue 24).

Why: on a GPU the loop is paced by the host (docs/benchmarks.md, "Measured on an H200": the
sampling thread's ~2 ms of host work per batch competes with the training step for the
interpreter). The bounded batch (:mod:`gnnio.sampling.gpu_bounded`) already has fixed sizes and
reads the device once, at its end: its 22 torch ops and 11 Triton launches depend on the batch
only through the seeds and the hop keys. Here those two live in a static device buffer per
buffer set (``inp``: the seeds, then each hop's key), the Triton hop kernel reads its key there
(``KEY_PTR``), and the batch's launches -- seeds, hops, relabelling, and the scratch's reset by
the device-held node count -- are captured once and replayed. A batch is then one host-to-device
copy of its seeds and keys (from pinned memory, queued), one replay, the one host read of the
counts and one ``cat`` of its arrays: the same batches as the eager bounded path (tests compare
them), with about 21 operations of host work instead of 33 -- the upload's ~4 torch ops, the
replay and the arrays' 16 (slices, ``cat``, ``split``, views), counted on the CPU.

When: CUDA, Triton's hop and relabelling kernels available, every fanout ``>= 1`` and the
bounds within :data:`~gnnio.sampling.gpu_bounded.MAX_EDGE_SLOTS`; otherwise the eager path runs
(same batches). A buffer set's first batch runs its launches eagerly (it compiles the kernels);
the second captures them (:func:`gnnio.utils.capture.capture`: thread-local, so the training
thread goes on meanwhile, and never beside another capture or a device-wide wait). A capture
that fails warns once and nothing is captured after it: the buffer sets without a graph sample
eagerly, those captured before go on replaying (:func:`graphed_report` says why).
Each buffer set -- per scratch (one per sampling thread) and batch size -- has its own graph and
memory pool. On a CPU (``capture=False``) the same launches run eagerly from the static buffers:
how the tests check them.

LABOR-0 (:class:`~gnnio.sampling.labor_torch.TorchLaborSampler` with ``cuda_graph``) takes the
same path with its own hop, bound slack and hop keys (its count and select kernels read their
key from ``inp`` as well); a Poisson batch past its bound comes back None
(:func:`graphable` tells that from "not applicable") and is sampled by the synced path.
The locality-aware sampler (:class:`~gnnio.sampling.locality_torch.TorchLocalitySampler`,
:func:`~gnnio.sampling.locality_torch.las_hop`) uploads the scale's float64 constants with the
keys (``extra``: more slots of ``inp``, :attr:`GraphState.extra`), which its LAS kernel reads, and
its kernel's edge weights stay in the buffer set until the batch's end copies them out. A buffer
set holds one graph per kind of hop (:func:`hop_name`: a locality-aware batch at ``s = 1`` draws
uniform hops), each captured at its own second batch.

Not measured on a GPU yet (written after the H200 run of 2026-11-26): opt-in until a GPU run
shows it faster.
"""

from __future__ import annotations

import threading

import torch

from ..utils.capture import capture as capture_graph
from ..utils.triton_kernels import kernel_ran, triton_available
from ..utils.warnings_at import warn
from .gpu_bounded import buffers, finish, launch, plan
from .gpu_hop import _s64
from .threaded import hop_key

__all__ = ["GraphState", "graphable", "graphed_report", "hop_name", "not_replayed",
           "reset_graphed_report",
           "sample_graphed"]  # fmt: skip

_LOCK = threading.Lock()
_STATS: dict = {"captured": 0, "replayed": 0, "eager": 0, "failed": None, "by_sampler": {}}


class GraphState:
    """One buffer set's static inputs and graph for one kind of hop: ``inp`` (int64
    ``[b + L + X]``): the seeds, then each hop's key bits, then ``X`` float64 values' bits
    (the locality-aware hop's constants, its scale first); ``seeds``, ``keys[h]`` and
    ``extra`` (float64 ``[X]``) its views. ``runs``: its batches run eagerly so far (the
    first compiles the kernels: a capture comes after)."""

    def __init__(self, b: int, L: int, dev: torch.device, n_extra: int = 0):
        self.inp = torch.zeros(b + L + n_extra, dtype=torch.int64, device=dev)
        self.seeds = self.inp[:b]
        self.keys = [self.inp[b + h : b + h + 1] for h in range(L)]
        self.extra = self.inp[b + L :].view(torch.float64)
        self.graph = None
        self.hop_edges = None
        self.runs = 0


def hop_name(hop) -> str:
    """The sampler a hop function draws for (``graph_name``: ``"labor"``, ``"locality"``;
    default ``"uniform"``): a buffer set's graph per name, and :func:`graphed_report`'s."""
    return getattr(hop, "graph_name", "uniform")


def _kernels(sampler, hop) -> tuple:
    """The Triton kernels ``hop`` launches for ``sampler``: its ``triton_kernel`` (a name, or
    a function of the sampler giving names; default the uniform ``sample_hop``)."""
    names = getattr(hop, "triton_kernel", "sample_hop")
    if callable(names):
        names = names(sampler)
    return (names,) if isinstance(names, str) else tuple(names)


def _usable(sampler, hop=None) -> bool:
    """Every fanout ``>= 1`` and the Triton kernels of ``hop`` (:func:`_kernels`) and of the
    relabelling available."""
    dev = sampler.device
    return (
        min(sampler.fanouts, default=0) >= 1
        and all(triton_available(dev, k) for k in _kernels(sampler, hop))
        and triton_available(dev, "relabel")
    )


def _ran(sampler, hop) -> None:
    """A replay's kernels in the run's ``kernels`` record (as a launch records itself: the
    record may have been reset since the capture, after ``--isolation auto``'s profiling)."""
    for name in _kernels(sampler, hop):
        kernel_ran({"sample_hop": "hop"}.get(name, name), "triton")
    kernel_ran("relabel", "triton")


def graphable(sampler, b: int, hop=None, slack: int = 1) -> tuple[list, list] | None:
    """The bounds of a batch of ``b`` seeds where :func:`sample_graphed` samples it, else None
    (its caller samples eagerly; a None from :func:`sample_graphed` where this is not None is a
    batch past its bound: LABOR-0's Poisson rows)."""
    bounded = plan(sampler, b, slack) if b else None
    return bounded if bounded is not None and _usable(sampler, hop) else None


def not_replayed(sampler, what: str, b: int) -> None:
    """Warn once per sampler that its batches are not replayed although ``cuda_graph`` asked for
    it (:func:`graphable` said no: a fanout of -1, a hop past ``MAX_EDGE_SLOTS`` edges, or a
    Triton kernel the batch needs cannot run): no silent slow path (issue 24, item 7). Nothing
    for an empty batch (``b == 0``: nothing to replay)."""
    if b == 0 or getattr(sampler, "_not_replayed_said", False):
        return
    sampler._not_replayed_said = True
    warn(f"--cuda-graph: {what}'s batches on {sampler.device} are not replayed as CUDA "
         "graphs (a fanout of -1, a hop past MAX_EDGE_SLOTS edges, or a Triton kernel "
         "the batch needs cannot run); they launch eagerly (the same batches)",
         RuntimeWarning)  # fmt: skip


def _upload(st: GraphState, seeds: torch.Tensor, keys: list, extra=()) -> None:
    """The batch's seeds, hop keys (ints) and ``extra`` floats into ``st.inp``: one queued copy
    from pinned memory."""
    L = len(keys) + len(extra)
    kt = torch.tensor([_s64(k) for k in keys], dtype=torch.int64)
    if len(extra):  # (float64 bits as int64: one buffer, one copy)
        kt = torch.cat([kt, torch.tensor(extra, dtype=torch.float64).view(torch.int64)])
    if seeds.device == st.inp.device:
        st.seeds.copy_(seeds)
        host = kt
        dst = st.inp.narrow(0, int(seeds.shape[0]), L)
    else:
        host, dst = torch.cat([seeds.to(torch.int64), kt]), st.inp
    if dst.is_cuda:  # pinned: queued, not waited for (torch keeps the page until it is read)
        host = host.pin_memory()
    dst.copy_(host, non_blocking=True)


def _note(what: str, err: str | None = None, name: str = "uniform") -> None:
    with _LOCK:
        if what == "failed":
            first = _STATS["failed"] is None
            _STATS["failed"] = err
            if first:
                warn(f"--cuda-graph: capturing the sampler failed, sampling eagerly "
                     f"({err})", RuntimeWarning)  # fmt: skip
        else:
            _STATS[what] += 1
            per = _STATS["by_sampler"].setdefault(name, {"captured": 0, "replayed": 0,
                                                         "eager": 0})  # fmt: skip
            per[what] += 1


def sample_graphed(sampler, seeds: torch.Tensor, key: int, capture: bool | None = None,
                   hop=None, slack: int = 1, keys=None, extra=(), weighted=None):  # fmt: skip
    """One batch of ``sampler`` (a :class:`~gnnio.sampling.gpu.TorchUniformSampler`) around
    int64 ``seeds`` (host or device) as a CUDA graph's replay (module docstring); None where
    this path does not apply (the caller samples eagerly) or a hop drew past its bound.
    ``capture``: None captures on CUDA, False runs the launches eagerly from the static
    buffers. ``hop``, ``slack``, ``keys`` (ints, uploaded as their bits): another sampler's
    draws, bounds and hop keys, as :func:`~gnnio.sampling.gpu_bounded.sample_bounded`'s
    (LABOR-0: :class:`~gnnio.sampling.labor_torch.TorchLaborSampler`); ``extra``: floats
    uploaded with them, which the hop reads from :attr:`GraphState.extra` (the locality-aware
    hop's scale and constants: :class:`~gnnio.sampling.locality_torch.TorchLocalitySampler`);
    ``weighted``: the hops that write edge weights (:func:`~gnnio.sampling.gpu_bounded.
    finish`). Raises ValueError for bad seeds."""
    b, L, dev = int(seeds.shape[0]), len(sampler.fanouts), sampler.device
    bounded = graphable(sampler, b, hop, slack)
    if bounded is None:
        return None
    if capture is None:
        capture = dev.type == "cuda"
    rows, edges = bounded
    loc, first, cache = sampler._take(cache=True)
    buf = buffers(cache, b, rows, edges, dev)
    name = hop_name(hop)
    st = buf.graph.get(name)
    if st is None:  # (one per kind of hop: a locality-aware sampler at s = 1 draws uniformly)
        st = buf.graph[name] = GraphState(b, L, dev, len(extra))
    if weighted is not None:
        buf.weights()  # (made before any capture)
    if keys is None:
        keys = [hop_key(key, h) for h in range(L)]
    _upload(st, seeds, keys, extra)

    def run() -> list:
        return launch(sampler, buf, rows, st.seeds, st.keys, loc, first, reset=rows[-1],
                      mark=False, hop=hop)  # (no phase marks: a replay is one step)  # fmt: skip

    failed = _STATS["failed"] is not None
    if st.graph is not None:
        st.graph.replay()
        _note("replayed", name=name)
        _ran(sampler, hop)
    elif capture and st.runs > 0 and not failed:  # the first batch compiled the kernels
        try:
            g = torch.cuda.CUDAGraph()
            with capture_graph(g, dev):  # (one capture at a time, no device-wide wait meanwhile)
                st.hop_edges = run()
            st.graph = g
            _note("captured", name=name)
            g.replay()
            _note("replayed", name=name)
        except Exception as e:  # noqa: BLE001 - one warning, then every batch eagerly
            _note("failed", f"{type(e).__name__}: {e}"[:300])
            st.hop_edges = run()
            _note("eager", name=name)
    else:
        st.hop_edges = run()
        st.runs += 1
        _note("eager", name=name)
    return finish(sampler, buf, rows, edges, st.seeds, st.hop_edges, loc, first, cache,
                  reset=False, weighted=weighted)  # fmt: skip


def graphed_report() -> dict:
    """For the run's summary (``cuda_graph.sampler``): batches replayed, captured graphs, batches
    run eagerly on this path, why capturing failed (None if it did not), and ``by_sampler``:
    the same counts per sampler that ran here (``uniform`` -- HyDRA's pruned one and the
    locality-aware one at ``s = 1`` included --, ``labor``, ``locality``)."""
    with _LOCK:
        out = dict(_STATS)
        out["by_sampler"] = {k: dict(v) for k, v in _STATS["by_sampler"].items()}
        return out


def reset_graphed_report() -> None:
    with _LOCK:
        _STATS.update(captured=0, replayed=0, eager=0, failed=None, by_sampler={})
