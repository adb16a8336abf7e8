"""Compile Triton kernels for an H100/H200 (sm_90) on a machine without a GPU.

:class:`FakeDriver` stands in for Triton's CUDA driver with the target ``GPUTarget("cuda", 90,
32)``, so ``kernel.warmup(..., grid=(1,))`` runs Triton's real compiler down to a cubin (its
wheel brings ptxas) and launches nothing: what the interpreter, which the CPU tests run, never
checks. ``python -m tests.triton_sm90 PREFIX [--widths 1,3,100]`` compiles every launch of a gnnio
kernel :mod:`tests.triton_record` wrote to ``PREFIX.*`` -- each twice where it has integer arguments:
as recorded and with each one above 2^31 (Triton specializes on both) -- prints a line per
kernel and each distinct failure, and exits 1 on any failure (2: nothing recorded).
``--widths``: also each launch with ``W``/``WP``/``BR`` constexprs (row gathers) at those
widths in words. Used by ``scripts/triton-compile-check.sh``."""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import sys
import time

ARCH = 90


class FakeDriver:
    """What ``JITFunction.warmup`` asks the active driver for; no CUDA anywhere."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", ARCH, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):  # noqa: ARG002 - the driver's signature
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


@contextlib.contextmanager
def sm90_driver():
    """Triton's active driver is the fake one inside the block, the one before after it."""
    from triton.runtime.driver import driver

    before = getattr(driver, "_active", None)  # (None until first asked for; reset_active()
    driver.set_active(FakeDriver())  # would make the CUDA driver, which fails without a GPU)
    try:
        yield
    finally:
        driver._active = before


def _arg(s: list, wide: bool):
    import torch

    if s[0] == "T":
        t = torch.zeros(64, dtype=getattr(torch, s[1]))
        return t if s[2] else t[1:]  # (one element in: not 16-byte aligned)
    if s[0] == "I":
        return s[1] + (1 << 33) if wide and s[1] not in (0, 1) and s[1] < 2**31 else s[1]
    if s[0] == "C":
        return s[1]
    raise ValueError(f"an argument that was not recorded: {s[1]}")


def launches(prefix: str, widths: list[int]) -> list[list]:
    recs = set()
    for f in sorted(glob.glob(glob.escape(prefix) + ".*")):
        with open(f) as fh:
            recs.update(line.strip() for line in fh if line.startswith('["gnnio.'))
    for line in list(recs):
        mod, name, args, kw = json.loads(line)
        if {"W", "WP", "BR"} <= set(kw):
            for w in widths:
                wp = 1 << (w - 1).bit_length()
                br = max(1, min(64, 4096 // wp))  # (the caches' rows per program)
                k2 = {**kw, "W": ["C", w], "WP": ["C", wp], "BR": ["C", br]}
                recs.add(json.dumps([mod, name, args, k2], sort_keys=True))
    return [json.loads(r) for r in sorted(recs)]


def compile_all(recs: list[list]) -> dict:
    """``{(module, kernel): [compiled, failed, {message: first failing case}]}``."""
    out: dict = {}
    with sm90_driver():
        for mod, name, args, kw in recs:
            row = out.setdefault((mod, name), [0, 0, {}])
            for wide in (False, True) if any(a[0] == "I" and a[1] > 1 for a in args) else (False,):
                try:
                    fn = getattr(importlib.import_module(mod), name)
                    a = [_arg(s, wide) for s in args]
                    fn.warmup(*a, grid=(1,), **{k: _arg(s, False) for k, s in kw.items()})
                    row[0] += 1
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    row[1] += 1
                    msg = f"{type(e).__name__}: {e}".strip()[:1200]
                    row[2].setdefault(msg, (args, kw, "ints > 2^31" if wide else "as recorded"))
    return out


def main(argv: list[str]) -> int:
    import triton

    prefix, widths = argv[0], []
    if len(argv) > 2 and argv[1] == "--widths":
        widths = [int(x) for x in argv[2].split(",") if x]
    recs = launches(prefix, widths)
    if not recs:
        print(f"triton-compile-check: no launches recorded under {prefix}.*", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    res = compile_all(recs)
    bad = 0
    for (mod, name), (ok, failed, msgs) in sorted(res.items()):
        print(f"{'FAIL' if failed else 'ok  '} {mod}.{name}: {ok} compiled, {failed} failed")
        for msg, (args, kw, how) in msgs.items():
            print(f"     {how}: args {json.dumps(args)} constexprs {json.dumps(kw)}")
            print("     " + msg.replace("\n", "\n     "))
        bad += failed
    n = sum(r[0] + r[1] for r in res.values())
    print(
        f"triton-compile-check: Triton {triton.__version__}, sm_{ARCH}: {len(res)} kernels, "
        f"{len(recs)} recorded launches, {n} compiles, {bad} failed "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
