"""The dataset writer's pass over a new feature file: two passes (``sha256_file``, then
``count_nonfinite`` through a mapping, as ``DatasetWriter._finish`` did before issue 25's
follow-up) against ``sha256_and_nonfinite`` (one pass).

    python benchmarks/writer_pass.py DATA_DIR/features.npy [--rounds 2] [--feat-dtype float32]

Before every timed pass the file's pages are evicted from the page cache (``posix_fadvise
DONTNEED`` on this file only), so each starts from the device. ``two, evicted`` also evicts
between its two passes: what happens to a file larger than RAM, whose first pages are gone when
the second pass starts. Prints wall and CPU seconds and the device bytes (``/proc/self/io``
``read_bytes``) of each, and checks that all give the same sha256 and count. Used for
docs/benchmarks.md, "Follow-ups: the writer's one pass, sub-page O_DIRECT blocks".
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from gnnio.graph.integrity import count_nonfinite, sha256_and_nonfinite, sha256_file


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(ln for ln in f if ln.startswith("read_bytes:")).split()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("features", help="a feature .npy file")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--feat-dtype", default="float32")
    a = ap.parse_args()
    path, fdt = a.features, a.feat_dtype

    def two(evict_between: bool):
        h = sha256_file(path)
        if evict_between:
            evict(path)
        return h, count_nonfinite(np.load(path, mmap_mode="r"), drop=True, feat_dtype=fdt)

    passes = {
        "two": lambda: two(False),
        "two, evicted": lambda: two(True),
        "one": lambda: sha256_and_nonfinite(path, fdt),
    }
    seen = set()
    for r in range(a.rounds):
        for name, fn in passes.items():
            evict(path)
            b0, t0, c0 = read_bytes(), time.perf_counter(), time.process_time()
            out = fn()
            t, c = time.perf_counter() - t0, time.process_time() - c0
            seen.add(out)
            print(f"round {r + 1} {name:13s} wall {t:6.1f} s  cpu {c:6.1f} s  "
                  f"device {(read_bytes() - b0) / 1e9:6.2f} GB", flush=True)  # fmt: skip
    assert len(seen) == 1, f"the passes disagree: {seen}"
    print("same sha256 and count:", seen.pop())


if __name__ == "__main__":
    main()
