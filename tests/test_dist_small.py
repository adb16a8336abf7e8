"""Small pieces of a distributed run, checked alone: the DDP communication hook averages the
gradients over the ranks and counts their bytes (the gloo training tests check that every rank
ends with the same parameters, which a summing hook keeps too); partition-local seeds refuse a
partition too small for the batches every rank takes; the launcher's one line names the rank
that caused a failure, never one that only lost its peer; a split smaller than the ranks is
refused before they start."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnio.distributed.ddp import GradCounter, counting_allreduce
from gnnio.distributed.launch import failure_line


class _OtherRank:
    """A context whose all-reduce adds the other rank's bucket, as it would hand it over."""

    def __init__(self, other: torch.Tensor, world: int) -> None:
        self.other, self.world = other, world

    def all_reduce(self, t, group="default", async_op=False):
        assert group == "default" and async_op
        t.add_(self.other / self.world)  # the other rank divided its bucket as this one did
        fut = torch.futures.Future()
        fut.set_result([t])
        return SimpleNamespace(get_future=lambda: fut)


def test_the_hook_averages_gradients_and_counts_their_bytes():
    mine = torch.tensor([2.0, 4.0, 6.0])
    other = torch.tensor([4.0, 0.0, -2.0])
    state = GradCounter(2, _OtherRank(other, 2))
    out = counting_allreduce(state, SimpleNamespace(buffer=lambda: mine)).wait()
    assert torch.equal(out, torch.tensor([3.0, 2.0, 2.0]))  # the mean over both ranks
    assert state.bytes == 3 * 4 and state.seconds >= 0.0
    state.ctx = _OtherRank(torch.zeros(5, dtype=torch.float64), 2)
    counting_allreduce(state, SimpleNamespace(buffer=lambda: torch.zeros(5, dtype=torch.float64)))
    assert state.bytes == 3 * 4 + 5 * 8


def test_local_seeds_refuse_fewer_seeds_than_batches():
    """Every rank takes the same number of batches: a partition with fewer training nodes than
    that would give a rank an empty batch."""
    from gnnio.distributed.plan import LocalSeedsOrder
    from gnnio.errors import UsageError

    order = LocalSeedsOrder(np.arange(4), 2, 4)
    assert [len(b) for b in order.batches(0)] == [1, 1, 1, 1]
    with pytest.raises(UsageError, match="3 training nodes, fewer than the 4 batches"):
        LocalSeedsOrder(np.arange(3), 2, 4)


def _failure(pid: int, message: str, timestamp: int):
    return SimpleNamespace(
        exitcode=1, pid=pid, message={"message": message}, timestamp=timestamp,
        signal_name=lambda: "",
    )  # fmt: skip


@pytest.mark.parametrize(
    "lost",
    [
        "RuntimeError: ProcessGroupGloo: lost its peer 1 during all_to_all",
        "RuntimeError: Connection reset by remote end: broken pipe",
        "RuntimeError: [gloo] socket closed while receiving",
    ],
)
def test_a_rank_that_lost_its_peer_is_not_the_cause(lost):
    err = SimpleNamespace(
        failures={
            0: _failure(10, lost, 1),  # reported first
            1: _failure(11, "Traceback...\nValueError: bad batch", 2),
        }
    )
    assert (
        failure_line(err) == "rank 1 (pid 11) failed: ValueError: bad batch; stopped rank(s) 0 too"
    )


def test_evaluation_and_means_are_over_all_ranks(monkeypatch):
    """Accuracy is correct / total summed over the ranks (not each rank's own), and a value
    every rank must agree on (the locality scale) is the mean over ranks."""
    import gnnio.distributed.train as dtrain
    from gnnio.placement.topology import load_topology
    from tests.fake_dist import run_ranks

    counts = {"a": (3, 4), "b": (1, 4)}  # rank 0 ("a"): 3 of 4 right; rank 1: 1 of 4
    monkeypatch.setattr(dtrain, "evaluate_sampled_counts", lambda m, loader, e, bar: counts[loader])

    def body(ctx):
        run = dtrain.DistRun(ctx)
        loader = "a" if ctx.rank == 0 else "b"
        return run.evaluate(None, {"valid": loader}, 0), run.mean_over_ranks(ctx.rank + 1.0)

    for acc, mean in run_ranks(2, body, load_topology("2")):
        assert acc == {"valid": 0.5} and mean == 1.5


def test_local_seeds_take_the_batch_count_of_the_largest_part():
    """Every rank takes as many batches as the rank with the most seeds needs: no batch is
    larger than the batch size, and every rank's own seeds are covered."""
    import gnnio.distributed.train as dtrain
    from gnnio.placement.topology import load_topology
    from tests.fake_dist import run_ranks

    parts = np.array([0] * 10 + [1] * 3, dtype=np.int16)
    cfg = SimpleNamespace(local_seeds=True, order="random")

    def body(ctx):
        run = dtrain.DistRun(ctx)
        run.placement = SimpleNamespace(parts=parts, strategy="naive")
        order = run.build_order(None, cfg, np.arange(13), None, 4, seed=0)
        return order.num_batches, [b.tolist() for b in order.batches(0)]

    (n0, b0), (n1, b1) = run_ranks(2, body, load_topology("2"))
    assert n0 == n1 == 3 and len(b0) == len(b1) == 3
    assert max(len(b) for b in b0 + b1) <= 4
    assert sorted(sum(b0, [])) == list(range(10)) and sorted(sum(b1, [])) == [10, 11, 12]


@pytest.mark.parametrize(
    ("sizes", "argv", "words"),
    [
        ((6, 1, 4), [], "the valid split has 1 node, fewer than the 2 ranks"),
        ((6, 4, 3), ["--nproc", "4"], "the test split has 3 nodes, fewer than the 4 ranks"),
        ((1, 4, 4), [], "the training split has 1 node, fewer than the 2 ranks"),
        ((5, 4, 4), ["--batch-size", "1"], "--batch-size 1: the training split's 5 nodes"),
        ((6, 3, 4), ["--eval-batch-size", "1"], "--eval-batch-size 1: the valid split's 3"),
    ],
)
def test_a_split_smaller_than_the_ranks_is_refused_before_they_start(
    tmp_path, capsys, monkeypatch, sizes, argv, words
):
    """Each rank needs a batch of every split it walks: the launcher refuses in one line naming
    the split (not a rank's error naming the default --eval-batch-size), and starts no rank; a
    rank started by torchrun refuses the same before it builds anything."""
    from gnnio.cli.main import main
    from gnnio.distributed import launch as launch_mod
    from gnnio.errors import UsageError
    from gnnio.graph import DatasetWriter, edges_to_csr
    from gnnio.train import TrainConfig, train

    n_tr, n_va, n_te = sizes
    n = n_tr + n_va + n_te
    indptr, indices = edges_to_csr(np.arange(n), (np.arange(n) + 1) % n, n)
    with DatasetWriter(tmp_path / "d", name="d") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", np.ones((n, 2), dtype=np.float32))
        w.save_array("labels", (np.arange(n) % 2).astype(np.int64))
        w.save_array("train_idx", np.arange(n_tr))
        w.save_array("valid_idx", np.arange(n_tr, n_tr + n_va))
        w.save_array("test_idx", np.arange(n_tr + n_va, n))
        w.meta["num_classes"] = 2
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("a rank started"))
    assert main(["train", str(tmp_path / "d"), "--nproc", "2", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: ") and "\n" not in err and words in err, err
    ranks = int(argv[argv.index("--nproc") + 1]) if "--nproc" in argv else 2
    bs = {k: int(argv[argv.index(o) + 1]) for k, o in (("batch_size", "--batch-size"),
          ("eval_batch_size", "--eval-batch-size")) if o in argv}  # fmt: skip
    with pytest.raises(UsageError, match=words.replace("-", r"\-")):  # only the world size given
        train(tmp_path / "d", TrainConfig(epochs=1, progress=False, **bs),
              run=SimpleNamespace(world_size=ranks))  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "words"),
    [
        ("bogus", "--topology: 'bogus' is not a preset"),
        ("2+2", "--topology 2+2: describes 4 devices but the run has 2 ranks"),
        ("missing.toml", "--topology missing.toml: topology file not found"),
    ],
)
@pytest.mark.parametrize("command", ["train", "bench dist"])
def test_a_topology_that_is_not_this_run_is_refused_before_the_ranks_start(
    tmp_path, capsys, monkeypatch, command, topology, words
):
    """``--topology`` is checked by the launcher (once, naming the option once), not by every
    rank after it started."""
    from gnnio.cli.main import main
    from gnnio.distributed import launch as launch_mod
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "d")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("a rank started"))
    argv = [*command.split(), str(d), "--nproc", "2", "--topology", topology, "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gnnio: error: {words}") and "\n" not in err, err
