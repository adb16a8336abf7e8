"""GPU-tier row gather: ``index_select`` against the same rows read through wider element
types and a Triton kernel, next to the device-to-device copy ceiling (issue 15's
``gpu_tier_gather`` goal). GPU only::

    python benchmarks/gpu_gather_variants.py [--rows 1000000 --dim 128 --batch 200000]

Prints one JSON line: GB/s of useful row bytes (median of passes) per variant, and each variant's
ratio to the copy of the same number of bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def _time(fn, passes: int) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(passes):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=200_000)
    p.add_argument("--passes", type=int, default=20)
    a = p.parse_args()
    if not torch.cuda.is_available():  # one line, not torch's traceback from the first tensor
        sys.exit(f"{p.prog}: error: needs a CUDA device (GPU only); this torch sees none")
    dev = torch.device("cuda")
    x = torch.randn(a.rows, a.dim, device=dev)
    idx = torch.randint(0, a.rows, (a.batch,), device=dev)
    useful = a.batch * a.dim * 4
    flat = x.view(-1)[: a.batch * a.dim]
    dst = torch.empty_like(flat)
    res = {"copy": useful / _time(lambda: dst.copy_(flat), a.passes) / 1e9}
    out = torch.empty(a.batch, a.dim, device=dev)
    res["index_select"] = (
        useful / _time(lambda: torch.index_select(x, 0, idx, out=out), a.passes) / 1e9
    )
    for name, dt, w in (("as_int64", torch.int64, 2), ("as_complex128", torch.complex128, 4)):
        if a.dim % w == 0:
            xv, ov = x.view(dt), out.view(dt)
            res[name] = (
                useful
                / _time(lambda xv=xv, ov=ov: torch.index_select(xv, 0, idx, out=ov), a.passes)
                / 1e9
            )
    res["advanced_index"] = useful / _time(lambda: x[idx], a.passes) / 1e9
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _rows(src, ids, dst, n, D: tl.constexpr, BR: tl.constexpr):
            r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
            rm = r < n
            i = tl.load(ids + r, mask=rm, other=0)
            c = tl.arange(0, D)
            v = tl.load(src + i[:, None] * D + c[None, :], mask=rm[:, None])
            tl.store(dst + r[:, None] * D + c[None, :], v, mask=rm[:, None])

        for br in (8, 32):

            def run(br=br):
                _rows[(triton.cdiv(a.batch, br),)](x, idx, out, a.batch, D=a.dim, BR=br)

            res[f"triton_br{br}"] = useful / _time(run, a.passes) / 1e9
            assert torch.equal(out, x[idx])
    except ImportError as e:
        res["triton"] = f"not run: {e}"
    ratio = {k: v / res["copy"] for k, v in res.items() if isinstance(v, float) and k != "copy"}
    print(json.dumps({"device": torch.cuda.get_device_name(0), "rows": a.rows, "dim": a.dim,
                      "batch": a.batch, "gbps": res, "ratio_to_copy": ratio}))  # fmt: skip


if __name__ == "__main__":
    main()
