"""Where the training step's time goes, op by op: torch's profiler over the step alone and over
the real pipelined loop (issue 24, item 1's follow-up: ``gnnio bench step`` says *which part* is
slow; this says *which operations* and whether the device or the host paces them).

    python benchmarks/step_profile.py DIR --device cuda [train options] [--out FILE.json]

(``PYTHONPATH=.`` in a checkout where gnnio is not installed, as on a lent GPU machine.)

It builds the run as ``gnnio train`` does (``gnnio bench step``'s options), draws ``--batches``
batches from the loader onto the device (cloned, so the loader's reused buffers cannot change
them), then measures:

* ``isolated_step_ms``: :func:`gnnio.train.build.train_step` alone over those batches, no loader
  thread running, the device synchronised once at the end;
* ``device_busy_ms``: the same steps' kernel time per batch from the profiler -- far below
  ``isolated_step_ms`` means the host (Python, launches) paces the step, not the device;
* the profiler's top operations by self CPU and by self device time (``isolated`` and
  ``pipelined``: the real loop, its loader threads competing for the interpreter);
* ``graphed``: the same batches through ``--cuda-graph``'s step (captured once, replayed):
  ``graphed_step_ms`` against ``isolated_step_ms``;
* ``aggregation``: one layer-0 aggregation forward + backward, as built now (CSR from the
  sampler's pointer, ``torch.sparse.mm``) against ``index_add_`` of gathered rows, ms each.

Each part that fails is recorded as ``{"error": ...}`` and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _table(prof, key: str, rows: int = 25) -> str:
    try:
        return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)
    except Exception as e:  # noqa: BLE001 - a torch without that key
        return f"({key}: {e})"


def _device_us(prof) -> float:
    """Kernel time (us) in the profile, as the table's "Self CUDA time total" sums it: over the
    host-side ops (each kernel's time is also listed under its own name: counted once)."""
    from torch.autograd import DeviceType

    tot = 0.0
    for e in prof.key_averages():
        if getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU:
            continue
        v = getattr(e, "self_device_time_total", None)
        if v is None:
            v = getattr(e, "self_cuda_time_total", 0.0)
        tot += float(v or 0.0)
    return tot


def _part(out: dict, name: str, fn) -> None:
    t = time.perf_counter()
    try:
        out[name] = fn()
    except Exception as e:  # noqa: BLE001 - recorded, the next part runs
        out[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
    print(f"step_profile: {name} ({time.perf_counter() - t:.1f} s)", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    from gnnio.bench import step as S
    from gnnio.cli.train import config_from_args
    from gnnio.graph.dataset import load
    from gnnio.train import check_device
    from gnnio.train.build import build_training, train_step
    from gnnio.train.gpu_plan import apply_layout_plan
    from gnnio.train.loop import LocalRun

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    S.add_arguments(p)
    p.add_argument("--out", default=None, help="write the results here as JSON")
    p.add_argument("--profile-batches", type=int, default=8)
    args = p.parse_args(argv)
    cfg = config_from_args(args, 1)
    cfg.progress = False
    device = check_device(cfg.device)
    cfg.validate(1)
    ds = load(args.dir)
    from gnnio.utils.heap import apply_heap

    heap = apply_heap(cfg.heap, device.type, cfg.store)  # --heap, as gnnio train
    build_cfg, plan = apply_layout_plan(ds, cfg, device)
    parts = build_training(ds, build_cfg, LocalRun(), device)
    net, opt, k, pk = parts.net, parts.opt, args.batches, args.profile_batches
    res: dict = {"device": str(device), "plan": plan, "heap": heap, "batches": k}
    if device.type == "cuda":
        res["gpu"] = torch.cuda.get_device_name(device)
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    batches = []

    def draw():
        it = S._batches(parts.train_loader, 0)
        for _ in range(args.warmup + k):
            mb = next(it)
            mb.x = mb.x.clone()
            mb.labels = mb.labels.clone()
            batches.append(mb)
        it.close()
        _sync(device)
        mb = batches[-1]
        return {
            "input_nodes": int(mb.input_nodes.shape[0]),
            "blocks": [(b.num_src, b.num_dst, b.num_edges) for b in mb.blocks],
            "x": list(mb.x.shape),
            "x_device": str(mb.x.device),
            "block_device": str(mb.blocks[0].edge_index.device),
            "has_ptr": [getattr(b, "ptr", None) is not None for b in mb.blocks],
        }

    _part(res, "batch", draw)
    net.train()

    def isolated():
        for mb in batches[: args.warmup]:
            train_step(net, opt, mb)
        _sync(device)
        t0 = time.perf_counter()
        for mb in batches[args.warmup :]:
            train_step(net, opt, mb)
        _sync(device)
        ms = (time.perf_counter() - t0) / k * 1e3
        # the parts, each synchronised (host + device time of each)
        fwd = bwd = stp = 0.0
        for mb in batches[args.warmup :]:
            t0 = time.perf_counter()
            logits = net(mb.x, mb.blocks)
            loss = torch.nn.functional.cross_entropy(logits, mb.labels, ignore_index=-1)
            _sync(device)
            t1 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            _sync(device)
            t2 = time.perf_counter()
            opt.step()
            _sync(device)
            t3 = time.perf_counter()
            fwd, bwd, stp = fwd + t1 - t0, bwd + t2 - t1, stp + t3 - t2
        return {"isolated_step_ms": ms, "synced_forward_ms": fwd / k * 1e3,
                "synced_backward_ms": bwd / k * 1e3, "synced_optimizer_ms": stp / k * 1e3}  # fmt: skip

    _part(res, "isolated", isolated)

    def graphed():
        """The same batches through --cuda-graph's step (gnnio.train.graphed): two eager ones,
        the padded warm-up (eager, on the capture stream), the capture and its first replay,
        untimed; wall time per step over the rest (``timed_replays`` of them replayed)."""
        from gnnio.train.graphed import GraphedStep

        step = GraphedStep(device, warmup=2)
        untimed = step.warmup + 2  # (the capture inside the timed loop would count its ~ms)
        for mb in batches[:untimed]:
            step(net, opt, mb)
        _sync(device)
        before = step.graphed
        t0 = time.perf_counter()
        for mb in batches[untimed:]:
            step(net, opt, mb)
        _sync(device)
        ms = (time.perf_counter() - t0) / max(1, len(batches) - untimed) * 1e3
        return {"graphed_step_ms": ms, "timed_replays": step.graphed - before, **step.report()}

    def prof_isolated():
        sel = batches[args.warmup : args.warmup + pk]
        with profile(activities=acts) as prof:
            for mb in sel:
                train_step(net, opt, mb)
            _sync(device)
        launches = sum(1 for e in prof.events() if "LaunchKernel" in e.name)
        return {
            "device_busy_ms": _device_us(prof) / len(sel) / 1e3,
            "launches_per_step": launches / len(sel),
            "by_cpu": _table(prof, "self_cpu_time_total"),
            "by_device": _table(prof, "self_cuda_time_total") if device.type == "cuda" else None,
        }

    _part(res, "profile_isolated", prof_isolated)

    def prof_pipelined():
        it = S._batches(parts.train_loader, 1)
        for _ in range(3):
            train_step(net, opt, next(it))
        _sync(device)
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            for _ in range(pk):
                train_step(net, opt, next(it))
            _sync(device)
        wall = (time.perf_counter() - t0) / pk * 1e3
        it.close()
        return {
            "profiled_ms_per_batch": wall,
            "device_busy_ms": _device_us(prof) / pk / 1e3,
            "by_cpu": _table(prof, "self_cpu_time_total", 30),
            "by_device": _table(prof, "self_cuda_time_total", 30)
            if device.type == "cuda"
            else None,
        }

    _part(res, "profile_pipelined", prof_pipelined)
    # after the profiles: GraphedStep switches the shared optimizer to capturable=True, which
    # the eager steps profiled above must not run with
    _part(res, "graphed", graphed)

    def aggregation():
        from gnnio.train.models import aggregate

        mb = batches[-1]
        b = mb.blocks[0]
        x = mb.x.float()[: b.num_src].detach().requires_grad_(True)
        src = b.edge_index[0].to(device)
        dst = b.edge_index[1].to(device)
        deg = torch.zeros(b.num_dst, device=device).index_add_(
            0, dst, torch.ones_like(dst, dtype=torch.float)
        )
        out = {}

        def timeit(fn, reps=20):
            fn()
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            _sync(device)
            return (time.perf_counter() - t0) / reps * 1e3

        def csr():
            y = aggregate(x, b, "mean")
            y.sum().backward()

        def index_add():
            y = torch.zeros(b.num_dst, x.shape[1], device=device).index_add_(0, dst, x[src])
            (y / deg.clamp_min(1).unsqueeze(1)).sum().backward()

        def csr_fwd():
            with torch.no_grad():
                aggregate(x, b, "mean")

        out["csr_fwd_bwd_ms"] = timeit(csr)
        out["csr_fwd_ms"] = timeit(csr_fwd)
        out["index_add_fwd_bwd_ms"] = timeit(index_add)
        out["shape"] = [b.num_src, b.num_dst, b.num_edges, int(x.shape[1])]
        return out

    _part(res, "aggregation", aggregation)
    for ld in [parts.train_loader, *parts.eval_loaders.values()]:
        close = getattr(ld, "close", None)
        if callable(close):
            close()
    text = json.dumps(res, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    for key in ("profile_isolated", "profile_pipelined"):
        r = res.get(key, {})
        for t in ("by_cpu", "by_device"):
            if isinstance(r, dict) and r.get(t):
                print(f"==== {key} {t}\n{r[t]}")
    short = {k: v for k, v in res.items() if k not in ("profile_isolated", "profile_pipelined")}
    for key in ("profile_isolated", "profile_pipelined"):
        r = res.get(key, {})
        short[key] = {a: b for a, b in r.items() if a not in ("by_cpu", "by_device")}
    print(json.dumps(short, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
