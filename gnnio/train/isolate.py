"""``gnnio train --isolation auto``: profile the run's own stages, solve BGL's allocation
(:mod:`gnnio.pipeline.isolation`) and give each stage its threads.

The stages and the knob each one has:

* ``sample``: the sampler's thread pool (``sampler.num_threads``; batches do not depend on it);
* ``gather``: the gather kernel's threads of every store in the ``backing`` chain that has one
  (``num_threads`` of the in-memory / memory-mapped store). It is profiled on the innermost such
  store: a cache or reuse wrapper above it keeps its state (profiling must not warm a cache);
  without one, the gather stage enters the objective as a constant;
* ``compute``: torch's intra-op threads (``torch.set_num_threads``, process-wide: the user asked
  for it with ``--isolation auto``; :func:`restore` puts the old value back after the run). On a
  GPU the model step uses no CPU threads: it enters the objective as a constant, and its
  launching thread keeps one core (:func:`solve_keeping_cores`).

Profiling runs each stage alone on the first few batches of epoch 0 (sampled with keys the
training run does not use), after one warm-up call per thread count; the model step is profiled
on a copy of the model, and torch's generators are put back after it, so training starts from
the same weights and draws the same dropout masks either way.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import torch
import torch.nn.functional as F

from ..pipeline.affinity import (
    activate,
    available_cores,
    core_sets,
    deactivate,
    native_pinned,
    pin_current_thread,
    pin_native_threads,
)
from ..pipeline.isolation import Allocation, profile_stages, solve, thread_candidates
from ..utils.torch_threads import set_torch_threads

__all__ = ["isolate", "restore"]

_PROFILE_KEY = 1 << 62  # epoch_seed base of profiling batches: far from every training key


def gather_targets(store) -> list:
    """Stores in the ``backing`` chain whose gather kernel takes a thread count."""
    out, seen = [], set()
    s = store
    while s is not None and id(s) not in seen:
        seen.add(id(s))
        if hasattr(s, "num_threads") and hasattr(s, "gather"):
            out.append(s)
        s = getattr(s, "backing", None)
    return out


def _set_sampler_threads(sampler, c: int) -> None:
    if hasattr(sampler, "num_threads"):
        if hasattr(sampler, "close"):
            sampler.close()  # the pool restarts with the new size on the next call
        sampler.num_threads = int(c)


def _timed(fn, n: int) -> float:
    fn(0)  # warm-up (pool start, numba dispatch, allocator)
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n


def isolate(sampler, store, model, order, labels, device: torch.device, batches: int = 4):
    """Profile, solve and apply; returns ``(allocation, undo)`` where ``undo`` is the state
    :func:`restore` puts back."""
    cores = len(available_cores())
    seeds = []
    for s in order.batches(0):
        seeds.append(s)
        if len(seeds) == batches:
            break
    if not seeds:
        raise ValueError("--isolation auto: the seed order has no batches to profile")
    n = len(seeds)
    mbs = [sampler.sample(seeds[i], epoch_seed=_PROFILE_KEY + i) for i in range(n)]
    targets = gather_targets(store)
    undo: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "sampler": getattr(sampler, "num_threads", None),
        "gather": [t.num_threads for t in targets],
        "affinity": available_cores(),
    }

    def sample(c: int) -> float:
        _set_sampler_threads(sampler, c)
        return _timed(lambda i: sampler.sample(seeds[i % n], epoch_seed=_PROFILE_KEY + i), n)

    base = targets[-1] if targets else store

    def gather(c: int) -> float:
        for t in targets:
            t.num_threads = int(c)
        return _timed(lambda i: base.gather(mbs[i % n].input_nodes), n)

    twin = copy.deepcopy(model).to(device)
    xs = [base.gather(mb.input_nodes).to(device) for mb in mbs]
    ys = [torch.as_tensor(labels)[mb.seeds.cpu()].to(device) for mb in mbs]
    blocks = [[b.to(device) for b in mb.blocks] for mb in mbs]

    def step(i: int) -> None:
        k = i % n
        twin.zero_grad(set_to_none=True)
        F.cross_entropy(twin(xs[k], blocks[k]), ys[k], ignore_index=-1).backward()
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # profiling only, before training

    def compute(c: int) -> float:
        set_torch_threads(int(c))
        return _timed(step, n)

    stages = {"sample": sample}
    fixed = {}
    if targets:
        stages["gather"] = gather
    else:
        fixed["gather"] = _timed(lambda i: base.gather(mbs[i % n].input_nodes), n)
    # the twin's dropout draws from torch's generators: put them back, or the run's masks move
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if device.type == "cpu":
            stages["compute"] = compute
        else:
            fixed["compute"] = _timed(step, n)
        try:
            fits = profile_stages(stages, thread_candidates(cores))
        finally:
            base.counters.reset()  # the run's counters must not count profiling reads
            set_torch_threads(undo["torch_threads"])
    alloc = solve_keeping_cores(fits, cores, fixed)
    apply(alloc, sampler, targets)
    return alloc, undo


def solve_keeping_cores(fits, cores: int, fixed: dict[str, float]) -> Allocation:
    """BGL's min-max (:func:`solve`) over the cores left after one for the training thread when
    the model step is fixed (on a GPU: no thread knob, yet :func:`apply` pins its launching
    thread to ``compute``'s core), so that the stages' core sets fit. Solved over every core, a
    sampler that scales took all of them and nothing could be pinned. Over all the cores only
    when too few are left for one per CPU stage; ``Allocation.cores`` is all of them either way.
    A fixed gather (its store has no thread knob) keeps no core and its thread is not pinned: it
    may run a pool of its own (the disk store's copy kernel) that one core would crowd."""
    keep = int("compute" in fixed)
    if keep and cores - keep >= len(fits):
        alloc = solve(fits, cores - keep, fixed)
        alloc.cores = cores
        return alloc
    return solve(fits, cores, fixed)


def apply(alloc: Allocation, sampler, targets: list) -> dict[str, list[int]] | None:
    """Set each stage's threads and, where the stages fit the cores without sharing, pin them to
    disjoint core sets (:mod:`gnnio.pipeline.affinity`; the training thread here, with torch's
    intra-op threads when training on the CPU; the loader's and the sampler's threads when they
    start). Returns the core sets (None: not pinned)."""
    th = alloc.threads
    _set_sampler_threads(sampler, th["sample"])
    for t in targets:
        t.num_threads = th.get("gather", t.num_threads)
    if "compute" in th:
        set_torch_threads(th["compute"])
    plan = core_sets({**th, "compute": th.get("compute", 1)}, available_cores())
    activate(plan)
    pin_current_thread("compute")
    if "compute" in th:  # torch's intra-op threads (started before): as many as compute's cores
        pin_native_threads("compute")
    # (on a GPU compute keeps one core for the launching thread and torch's thread count is not
    # set: its OpenMP team pinned there would crowd that core in any CPU op of the step)
    alloc.cores_by_stage = plan
    return plan


def restore(undo: dict[str, Any], sampler, store) -> None:
    """Put back the thread settings :func:`isolate` changed (torch's is process-wide) and the
    training thread's cores (and torch's intra-op threads'); later threads are not pinned."""
    native = native_pinned()
    deactivate()
    if undo.get("affinity") is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, undo["affinity"])
        for tid in native:
            try:
                os.sched_setaffinity(tid, undo["affinity"])
            except OSError:  # ended meanwhile
                pass
    set_torch_threads(undo["torch_threads"])
    if undo["sampler"] is not None:
        _set_sampler_threads(sampler, undo["sampler"])
    for t, c in zip(gather_targets(store), undo["gather"]):
        t.num_threads = c
