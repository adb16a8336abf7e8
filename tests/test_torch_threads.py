"""torch's thread count, once gnnio sets it, survives numba's thread pool starting
(gnnio/utils/torch_threads.py): torch and numba share one OpenMP runtime here, and starting
numba's pool set the count of the thread starting it back to all the cores. Each case runs in a
fresh interpreter, where numba's pool has not started yet."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    (os.cpu_count() or 1) < 2, reason="one core: 1 thread is already the default"
)

KERNEL = """
import numpy as np
from gnnio.features import InMemoryFeatureStore
s = InMemoryFeatureStore(np.ones((4000, 8), np.float32))
s.gather(torch.arange(3000))  # gnnio's first parallel kernel: numba's pool starts
"""


def _run(body: str, tmp_path) -> str:
    code = "import torch\ntorch.get_num_threads()  # torch's count read (set up) first\n"
    code += textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_set_torch_threads_stays_after_numbas_pool_starts(tmp_path):
    body = "from gnnio.utils.torch_threads import set_torch_threads\nset_torch_threads(1)\n"
    assert _run(body + KERNEL + "print(torch.get_num_threads())", tmp_path) == "1"


def test_bench_loader_threads_reach_torch(tmp_path):
    body = f"""
    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset
    d = write_tiny_dataset(__import__("pathlib").Path({str(tmp_path)!r}) / "d", num_nodes=40,
                           num_edges=160)
    main(["bench", "loader", str(d), "--batch-size", "4", "--batches", "2", "--passes", "1",
          "--warmup", "0", "--threads", "1", "--quiet", "--json"])
    print(torch.get_num_threads())
    """
    env_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert _run(f"import sys\nsys.path.insert(0, {env_root!r})\n" + textwrap.dedent(body),
                tmp_path) == "1"  # fmt: skip


def test_an_isolation_allocation_keeps_its_compute_threads(tmp_path):
    body = """
    from gnnio.pipeline.affinity import deactivate
    from gnnio.pipeline.isolation import Allocation
    from gnnio.train.isolate import apply
    alloc = Allocation(threads={"sample": 1, "compute": 1}, predicted_s={}, bottleneck_s=0.0,
                       cores=2, fits={})
    apply(alloc, None, [])
    deactivate()
    """
    assert _run(textwrap.dedent(body) + KERNEL + "print(torch.get_num_threads())", tmp_path) == "1"


def test_a_threading_layer_that_cannot_load_still_sets_torchs_threads(monkeypatch):
    import warnings

    import numba
    import torch

    import gnnio.utils.torch_threads as tt

    def broken():
        raise ValueError("No threading layer could be loaded.")

    monkeypatch.setattr(numba, "get_num_threads", broken)
    monkeypatch.setattr(tt, "_warned", False)
    before = torch.get_num_threads()
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            tt.set_torch_threads(1)
            tt.set_torch_threads(1)
        assert torch.get_num_threads() == 1
        assert [str(x.message) for x in w] == [
            "gnnio: numba's thread pool did not start (No threading layer could be loaded.)"
        ]
    finally:
        torch.set_num_threads(before)
