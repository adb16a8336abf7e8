"""Small builders shared by tests (plain functions, no fixtures)."""

from __future__ import annotations

import itertools
from math import comb
from pathlib import Path

import numpy as np
import torch

from gnnio.graph import DatasetWriter, edges_to_csr
from gnnio.graph.csr import CSRGraph
from gnnio.train.checkpoint import checkpoint_files


def write_tiny_dataset(
    out: Path,
    num_nodes: int = 12,
    num_edges: int = 40,
    feat_dim: int = 4,
    num_classes: int = 3,
    seed: int = 0,
    feat_dtype=np.float32,
) -> Path:
    """A small random valid dataset with labels and disjoint splits."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    indptr, indices = edges_to_csr(src, dst, num_nodes)
    perm = rng.permutation(num_nodes)
    n_tr, n_va = max(1, num_nodes // 4), max(1, num_nodes // 6)
    with DatasetWriter(out, name="tiny") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", rng.standard_normal((num_nodes, feat_dim)).astype(feat_dtype))
        labels = rng.integers(0, num_classes, num_nodes).astype(np.int64)
        labels[perm[-1]] = -1
        w.save_array("labels", labels)
        w.save_array("train_idx", np.sort(perm[:n_tr]).astype(np.int64))
        w.save_array("valid_idx", np.sort(perm[n_tr : n_tr + n_va]).astype(np.int64))
        w.save_array("test_idx", np.sort(perm[n_tr + n_va : -1]).astype(np.int64))
        w.meta["num_classes"] = num_classes
    return out


def flip_unsampled_byte(f: Path) -> None:
    """Flip one byte of ``f`` between the first two blocks that opening a dataset samples
    (``gnnio.graph.integrity.SAMPLE_BLOCK``): only a full ``--verify`` finds it."""
    from gnnio.graph.integrity import SAMPLE_BLOCK

    size = f.stat().st_size
    gap = SAMPLE_BLOCK + ((size - SAMPLE_BLOCK) // 7 - SAMPLE_BLOCK) // 2  # between blocks 0 and 1
    assert SAMPLE_BLOCK < gap < (size - SAMPLE_BLOCK) // 7
    with open(f, "r+b") as fh:
        fh.seek(gap)
        b = fh.read(1)
        fh.seek(gap)
        fh.write(bytes([b[0] ^ 0xFF]))


def random_graph(n: int, m: int, seed: int) -> CSRGraph:
    """``n`` nodes, ``m`` uniformly random directed edges (repeats and self-loops possible)."""
    rng = np.random.default_rng(seed)
    return CSRGraph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n)


def shared_neighbourhood_graph(num_rows: int, deg: int, extra: int = 0) -> CSRGraph:
    """Nodes ``deg .. deg + num_rows - 1`` all have in-neighbours ``0 .. deg - 1`` (in that CSR
    order); ``extra`` isolated nodes after them (they lower the average degree)."""
    dst = np.repeat(np.arange(deg, deg + num_rows), deg)
    src = np.tile(np.arange(deg), num_rows)
    return CSRGraph.from_edges(src, dst, deg + num_rows + extra)


def subset_counts(picks: np.ndarray, deg: int) -> np.ndarray:
    """Counts of each k-subset (rows of ``picks``, neighbour ids ``0..deg-1``)."""
    k = picks.shape[1]
    index = {c: i for i, c in enumerate(itertools.combinations(range(deg), k))}
    counts = np.zeros(comb(deg, k), dtype=np.int64)
    for row in np.sort(picks, axis=1).tolist():
        counts[index[tuple(row)]] += 1
    return counts


#: defines ``spy(name, note)`` in a script for :func:`run_in_triton_interpreter`: wraps the Triton
#: kernel ``gnnio.features._triton_rows.<name>`` and returns a list that gets ``note(args,
#: kwargs)`` of every launch that ran
KERNEL_SPY = r"""
from gnnio.features import _triton_rows

def spy(name, note):
    seen, real = [], getattr(_triton_rows, name)
    class Spy:
        def __getitem__(self, grid):
            launch = real[grid]
            def run(*a, **kw):
                out = launch(*a, **kw)
                seen.append(note(a, kw))
                return out
            return run
    setattr(_triton_rows, name, Spy())
    return seen
"""

#: a script fragment for :func:`run_in_triton_interpreter`: ``Spy(name, kernel)`` wraps a Triton
#: kernel so its launches are counted in ``launches`` and, by ``(name, how its key came)``, in
#: ``keyed`` (``KEY_PTR``: the key read from device memory, a CUDA graph's launch; else
#: ``HAS_CNT``, the reset kernel's device-held count; None where the launch passed neither), while
#: ``state["on"]`` (default True); while ``state["c"]`` holds an ``OpCounter``, the interpreter's
#: own torch ops inside a launch are not counted as the host's
COUNTING_SPY = r"""
import collections

state, launches, keyed = {"c": None, "on": True}, collections.Counter(), collections.Counter()


class Spy:
    def __init__(self, name, real):
        self.name, self.real = name, real

    def __getitem__(self, grid):
        launch = self.real[grid]

        def run(*a, **k):
            if not state["on"]:
                return launch(*a, **k)
            c = state["c"]
            before = c.ops if c is not None else 0
            out = launch(*a, **k)
            if c is not None:
                c.ops = before
            launches[self.name] += 1
            keyed[(self.name, k.get("KEY_PTR", k.get("HAS_CNT")))] += 1
            return out
        return run
"""

#: the start of a script for :func:`run_in_triton_interpreter` that checks the tiered row kernel:
#: imports, RuntimeWarnings as errors, :data:`KERNEL_SPY`, and ``launches``: the ``SKIP`` flag of
#: every launch
TIERED_SPY = (
    KERNEL_SPY
    + r"""
import warnings
import numpy as np, torch
from gnnio.features.tiers.simdevice import SimulatedDevice
from gnnio.features.tiers.tiered import TieredFeatureStore
from gnnio.utils import triton_kernels
from gnnio.utils.syncs import OpCounter

warnings.simplefilter("error", RuntimeWarning)
launches = spy("_tiered", lambda a, kw: kw["SKIP"])
"""
)


def run_in_triton_interpreter(script: str, timeout: float = 600) -> None:
    """Run ``script`` in a fresh Python with ``TRITON_INTERPRET=1`` (it must be set before Triton
    is imported) and the checkout on the path -- a child forked by :mod:`tests.interpreter_fork`
    where it runs; it must exit 0 and print ``ok`` last."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    env.pop("GNNIO_TRITON", None)
    # (tests.interpreter_speedup first: the interpreter's per-call patching, listed once)
    script = "import tests.interpreter_speedup  # noqa: F401\n" + script
    from tests import interpreter_fork  # (a child of a Python that imported torch and Triton)

    r = interpreter_fork.run(script, env, str(root), timeout)
    if r is None:
        r = subprocess.run(
            [sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    if r.returncode != 0 and _INDEX_BUG in r.stderr and _interpreter_lacks_index_fix():
        import pytest
        import triton

        pytest.skip(
            f"Triton {triton.__version__}'s interpreter cannot use a reduction's result as a loop "
            "bound (its tensors' __index__ is int() of a 1-element array, which NumPy refuses; "
            "Triton 3.9's squeezes it first); the compiled kernels are not affected"
        )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "ok"


_INDEX_BUG = "only 0-dimensional arrays can be converted to Python scalars"


def _interpreter_lacks_index_fix() -> bool:
    """Whether Triton's interpreter turns a tensor into an index by ``int(data)`` without
    squeezing it first (Triton 3.6, the GPU image's: a reduction's result there is a 1-element
    array, and ``range(0, tl.max(x, 0), C)`` fails under NumPy 2.4 and newer)."""
    import inspect

    from triton.runtime import interpreter

    src = inspect.getsource(interpreter)
    return '"__index__", lambda self: int(self.handle.data))' in src


def compile_for_sm90(fn, types: dict, const: dict):
    """``fn`` (a ``triton.jit`` kernel) compiled ahead of time for an H100/H200 (sm_90) here,
    without a GPU (Triton's wheel brings its compiler and ptxas): ``types`` maps every argument
    to its Triton type, ``"constexpr"`` for exactly the keys of ``const`` (their values). Skips
    the test where ptxas is missing; a kernel the compiler refuses fails it. Returns the
    compiled kernel (``.asm``: ``ttir``, ``ptx``, ``cubin``)."""
    import pytest
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = fn.fn.__name__
    assert {a for a, t in types.items() if t == "constexpr"} == set(const), name
    src = ASTSource(fn, types, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    except Exception as e:
        if "ptxas" in str(e).lower() and "not found" in str(e).lower():
            pytest.skip(f"no ptxas here: {e}")
        raise AssertionError(f"{name}: {e}") from e
    assert k.asm.get("cubin"), name
    return k


def in_forked_child(fn, timeout: float = 60) -> bool | None:
    """Run ``fn()`` (returns a bool) in a child made by ``os.fork()`` and return its answer, or
    None if the child hung past ``timeout`` seconds (then killed) or died before answering."""
    import os
    import select
    import signal

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one byte, or nothing written
        code = 1
        try:
            os.write(w, b"1" if fn() else b"0")
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    got = b""
    try:
        ready, _, _ = select.select([r], [], [], timeout)
        got = os.read(r, 1) if ready else b""
    finally:
        os.close(r)
        if not got:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return None if not got else got == b"1"


def op_names():
    """A ``TorchDispatchMode`` whose ``names`` collects the ATen ops run inside its block
    (``aten.index_add``, ...): for tests that an op is, or is not, on a path."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    return OpNames()


# ---- what two training runs must share (checkpoint and resume) -------------------------------

#: per-epoch fields that are wall-clock measurements (they differ between any two runs)
TIMED = {"epoch_time_s", "seeds_per_s", "breakdown_s", "hidden_fraction", "eval_s", "rss_mb"}


def final_params(ckdir) -> dict[str, torch.Tensor]:
    *_, path = checkpoint_files(ckdir)[-1]
    return torch.load(path, weights_only=True)["model"]


def same_params(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def results(summary: dict) -> dict:
    """What must be identical between runs: everything but the wall-clock times."""
    hist = [{k: v for k, v in h.items() if k not in TIMED} for h in summary["history"]]
    keep = ("loss_history", "test_acc", "best_valid_acc", "best_epoch", "epochs",
            "bytes_by_tier", "rows_by_tier", "stopped_early")  # fmt: skip
    return {"history": hist, **{k: summary[k] for k in keep}}


def run_gnnio_in_process(monkeypatch) -> list:
    """Make ``subprocess.run([sys.executable, "-m", "gnnio", ...])`` and ``subprocess.run(
    [sys.executable, "SCRIPT.py", ...])`` run in this process (``gnnio.cli.main.main``, the
    script's ``main``), returning the ``CompletedProcess`` a child would (its exit status, its
    stdout and stderr): the caller's plumbing (exit status, last JSON line, error tails) runs as
    it would, without the seconds of a fresh interpreter's imports per call. For tests about
    what the calls report, not about the process boundary; any other command runs for real.
    A call's ``env`` and ``cwd`` are in effect while it runs (variables read at import time,
    ``OMP_NUM_THREADS`` say, are not: the modules are this process's); the torch thread count
    is kept across calls. Returns the list of commands run in process."""
    import contextlib
    import io
    import os
    import runpy
    import subprocess
    import sys
    import traceback
    import warnings

    real = subprocess.run
    ran: list = []

    def run(cmd, *a, **k):
        argv = [str(x) for x in cmd] if isinstance(cmd, (list, tuple)) else None
        if not argv or argv[0] != sys.executable or len(argv) < 2:
            return real(cmd, *a, **k)
        if argv[1:3] == ["-m", "gnnio"]:
            from gnnio.cli.main import main

            def call():
                return main(argv[3:])
        elif argv[1].endswith(".py"):

            def call():
                old = sys.argv
                sys.argv = argv[1:]
                try:
                    runpy.run_path(argv[1], run_name="__main__")
                finally:
                    sys.argv = old
                return 0
        else:
            return real(cmd, *a, **k)
        ran.append(argv[1:])
        out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
        env, cwd = k.get("env"), k.get("cwd")
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.ExitStack() as back:
            back.callback(os.chdir, saved_cwd)
            if env is not None:
                back.callback(lambda: (os.environ.clear(), os.environ.update(saved_env)))
            back.enter_context(contextlib.redirect_stdout(out))
            back.enter_context(contextlib.redirect_stderr(err))
            with warnings.catch_warnings(record=True) as said:  # (a child's: on its stderr)
                warnings.resetwarnings()  # then a fresh interpreter's filters, lowest first
                for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning,
                                 DeprecationWarning):  # fmt: skip
                    warnings.simplefilter("ignore", category)
                warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
                try:
                    rc = call()
                except SystemExit as e:
                    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except Exception:  # noqa: BLE001 - as a child: its traceback, exit status 1
                    traceback.print_exc()
                    rc = 1
                finally:
                    torch.set_num_threads(threads)
            for w in said:
                print(warnings.formatwarning(w.message, w.category, w.filename, w.lineno), file=err)
        return subprocess.CompletedProcess(argv, rc or 0, out.getvalue(), err.getvalue())

    monkeypatch.setattr(subprocess, "run", run)
    return ran
