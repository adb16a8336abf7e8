"""Rules of a run's control side that a mutation pass over gnnio/distributed/{context,commcheck,
memcheck,ddp}.py, gnnio/train/{checkpoint_checks,rng_state}.py and gnnio/ordering/shuffle.py found
unguarded (or guarded only by multi-process runs):

* a checkpoint is trusted only when every field agrees with its name and with itself, and the
  checkpoints of another world size are refused, also in a directory holding several sizes;
* a resumed run restores Python's, NumPy's (its position too, not only its cached Gaussian) and
  torch's generators exactly;
* the seed order is a permutation of the seeds from ``(seed, epoch)`` only, that the ranks share
  without overlap; bad ranks, seeds and epochs are refused;
* a rank joins with its node rank and timeout, and refuses in one line a launch without its
  variables, a topology of another size or across machines, ``--device cuda`` without a device
  for every local rank, and a rendezvous that fails; an exchange receives ``recv_splits`` rows;
* the communication check reports two threads on one group at once (not one after another),
  checks every tensor of a list once per call, and ``shutdown`` writes its record and removes it;
* the memory census sees every array sized by the graph and tells the kept and the mapped ones;
* the gradient hook sums every bucket's seconds; the model digest depends on the names too.

One process, no process group joined (torch.distributed's joining stood in for), ~10 s in all.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnio.errors import UsageError
from gnnio.ordering import RandomOrder
from gnnio.train import checkpoint_checks as cc

# -- checkpoint contents ------------------------------------------------------------------------


def _raw(epoch: int = 2, batch: int = 0, **kw) -> dict:
    """A checkpoint's contents as :func:`check_contents` accepts them (at ``epoch``, ``batch``)."""
    raw = {
        "format": "gnnio-train-checkpoint", "format_version": 1,
        "binding": {k: "x" for k in cc._BINDING}, "epoch": epoch, "batch": batch,
        "model": {"w": torch.zeros(2)}, "optimizer": {}, "rng": {}, "stores": [], "run": {},
        "sampler_scale": None, "adaptive": None, "best_valid": 0.5, "best_epoch": 0,
        "stopped": False, "history": json.dumps([{"epoch": i} for i in range(epoch)]),
        "partial": json.dumps({"loss": 1.0}) if batch else None,
    }  # fmt: skip
    raw.update(kw)
    return raw


def _check(raw, pos=None):
    pos = (raw["epoch"], raw["batch"]) if pos is None else pos
    cc.check_contents(raw, Path("c/ckpt-e000002-b000000000.pt"), Path("c"), pos)


def test_a_consistent_checkpoint_passes():
    _check(_raw())
    _check(_raw(epoch=1, batch=3))


@pytest.mark.parametrize(
    "raw, pos, words",
    [
        (_raw(epoch=True), (1, 0), "'epoch' is a bool"),  # a bool is an int to isinstance
        ({**_raw(), "binding": {"dataset": "x"}}, None, "incomplete binding"),
        (_raw(batch=3), (2, 4), "its name says epoch 2 batch 4"),
        (_raw(history=json.dumps([{"epoch": 0}, {"epoch": 1}, {"epoch": 2}])), None,
         "a history of 3 epochs at epoch 2"),
        (_raw(history=json.dumps([{"epoch": 0}, {"epoch": 0}])), None,
         "history record 1 is not epoch 1's"),
        (_raw(batch=3, partial=None), None, "its partial sums"),
        (_raw(partial=json.dumps({"loss": 1.0})), None, "its partial sums"),
        (_raw(format="other-tool"), None, "is not a gnnio training checkpoint"),
        (_raw(history="5"), None, "a history of int epochs at epoch 2"),  # (no len: not a list)
        (_raw(history="[" * 100_000), None, "malformed JSON: RecursionError"),
    ],
)  # fmt: skip
def test_a_checkpoint_that_disagrees_with_itself_is_one_line(raw, pos, words):
    with pytest.raises(UsageError, match=words):
        _check(raw, pos)


def test_a_mid_epoch_checkpoint_of_the_last_epoch_is_past_it():
    cc.check_within(_raw(epoch=2, batch=0), Path("p"), Path("c"), 2)  # a finished run: fine
    with pytest.raises(UsageError, match="past --epochs 2; give --epochs 3"):
        cc.check_within(_raw(epoch=2, batch=5), Path("p"), Path("c"), 2)


def test_checkpoints_of_another_world_size_are_refused_whatever_their_ranks(tmp_path):
    for r in range(3):
        (tmp_path / f"ckpt-e000001-b000000000-r{r}of3.pt").write_bytes(b"")
    (tmp_path / "ckpt-e000001-b000000000.pt.bak").write_bytes(b"")  # not a checkpoint's name
    cc.check_world_size(tmp_path, 3)
    (tmp_path / "ckpt-e000000-b000000000.pt").write_bytes(b"")  # one process's, before them
    cc.check_world_size(tmp_path, 3)
    cc.check_world_size(tmp_path, 1)  # (one process resumes its own, not the newest size's)
    for world in (2, 4):  # 2: the rank of one of them
        with pytest.raises(UsageError, match="written by 3 ranks"):
            cc.check_world_size(tmp_path, world)
    held = [f"ckpt-e000001-b000000000-r{r}of3.pt" for r in range(3)]
    assert cc.held_checkpoints(tmp_path) == ["ckpt-e000000-b000000000.pt", *held]


def test_a_run_resumed_into_its_directory_spelled_otherwise_continues_it(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "ckpt-e000001-b000000000.pt").write_bytes(b"")
    cc.check_fresh_dir(f"{tmp_path}/c/", resume=str(tmp_path / "c"))
    with pytest.raises(UsageError, match="already holds checkpoints of another run") as e:
        cc.check_fresh_dir(str(tmp_path / "c"))
    assert f"continue that run with --resume {tmp_path / 'c'}," in str(e.value)  # (no resume)
    with pytest.raises(
        UsageError, match="checkpoint-dir to keep checkpointing to --resume old, or"
    ):
        cc.check_fresh_dir(str(tmp_path / "c"), resume="old")


def test_a_checkpoint_dir_not_made_yet_holds_none(tmp_path):
    """A new ``--checkpoint-dir`` is checked before any rank makes it (``gnnio train --nproc``'s
    launcher): it holds no checkpoints, and checking it makes nothing."""
    new = tmp_path / "new" / "c"
    assert cc.held_checkpoints(new) == []
    cc.check_fresh_dir(str(new))
    cc.check_fresh_dir(str(new), resume=str(tmp_path / "old"))
    assert not (tmp_path / "new").exists()


# -- random states ------------------------------------------------------------------------------


def _draws() -> tuple:
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_restored_generators_draw_what_they_drew_before():
    from gnnio.train.rng_state import capture_rng, restore_rng

    np.random.standard_normal()  # a cached Gaussian in NumPy's state
    state = capture_rng()
    first = (*_draws(), float(np.random.standard_normal()))
    _draws()
    buf = __import__("io").BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    restore_rng(torch.load(buf, weights_only=True))
    assert (*_draws(), float(np.random.standard_normal())) == first


# -- seed order ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n, world", [(10, 3), (7, 7), (5, 1), (11, 4)])
def test_the_ranks_shards_are_the_epochs_permutation_cut_in_order(n, world):
    seeds = np.arange(100, 100 + n)
    orders = [RandomOrder(seeds, 2, seed=5, rank=r, world_size=world) for r in range(world)]
    whole = np.concatenate([o.shard(3) for o in orders])
    assert np.array_equal(whole, orders[0].epoch_order(3))
    assert sorted(whole.tolist()) == seeds.tolist()  # the seeds themselves, each once
    sizes = [o.shard_size for o in orders]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n


def test_the_order_is_reproducible_from_seed_and_epoch_alone():
    seeds = np.arange(50)
    a, b = RandomOrder(seeds, 4, seed=1), RandomOrder(seeds, 4, seed=1)
    assert np.array_equal(a.epoch_order(2), b.epoch_order(2))
    assert not np.array_equal(a.epoch_order(2), a.epoch_order(3))  # a new order each epoch
    assert not np.array_equal(a.epoch_order(2), RandomOrder(seeds, 4, seed=2).epoch_order(2))


def test_the_seed_array_is_the_orders_own():
    seeds = np.arange(20)
    o = RandomOrder(seeds, 4)
    seeds[:] = 0
    assert sorted(o.epoch_order(0).tolist()) == list(range(20))


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(rank=2, world_size=2), "rank: must be in"),
        (dict(seed=-1), "seed: must be >= 0"),
        (dict(equal_batches=True, rank=0, world_size=3, seeds=np.arange(3), batch_size=1), None),
        (dict(equal_batches=True, world_size=3, seeds=np.arange(2)), "cannot give each of 3"),
        (dict(equal_batches=True, world_size=2, seeds=np.arange(5), batch_size=1), "divisible"),
        (dict(seeds=np.array([0.5, 1.5])), "integer node ids"),
    ],
)  # fmt: skip
def test_bad_shares_are_refused(kw, words):
    kw = {"seeds": np.arange(10), "batch_size": 2, **kw}
    if words is None:
        RandomOrder(**kw)
        return
    with pytest.raises(ValueError, match=words):
        RandomOrder(**kw)


def test_a_negative_epoch_is_refused():
    with pytest.raises(ValueError, match="epoch: must be >= 0"):
        RandomOrder(np.arange(4), 2).epoch_order(-1)


def test_equal_batches_give_every_rank_the_largest_shares_batch_count():
    orders = [RandomOrder(np.arange(10), 3, rank=r, world_size=3, equal_batches=True)
              for r in range(3)]  # fmt: skip
    assert [o.num_batches for o in orders] == [2, 2, 2]  # shares 3, 3, 4: ceil(4 / 3)
    got = [b for o in orders for b in o.batches(0)]
    assert len(got) == 6 and sorted(torch.cat(got).tolist()) == list(range(10))
    last = RandomOrder(np.arange(10), 4, drop_last=True)
    assert last.num_batches == 2 and [len(b) for b in last.batches(0)] == [4, 4]


# -- the rank context ---------------------------------------------------------------------------


def test_a_rank_names_the_link_to_every_other_rank():
    from tests.fake_dist import FakeCtx

    ctx = FakeCtx(1, 4, None, None, machine_of=[0, 0, 1, 1])
    assert [ctx.link_to(k) for k in range(4)] == ["peer", "local", "network", "network"]
    assert (ctx.machine, ctx.num_machines) == (0, 2)


def test_a_world_size_that_is_not_a_number_is_one_line(monkeypatch):
    from gnnio.distributed.context import env_world_size

    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(UsageError, match="WORLD_SIZE: not an integer: 'two'"):
        env_world_size()


_ENV = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1"}  # fmt: skip


def test_a_launch_without_its_variables_is_one_line(monkeypatch):
    from gnnio.distributed.context import init

    for k, v in _ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(UsageError, match="MASTER_PORT is not set"):
        init(timeout_s=5)


@pytest.fixture
def joined(monkeypatch):
    """``init`` of rank 0 of a launch whose ranks run on ``nodes``, torch.distributed's joining
    and gathering stood in for (what they were asked: ``seen``)."""
    import torch.distributed as dist

    seen: dict = {}

    def join(nodes, fail=None, **kw):
        from gnnio.distributed.context import init

        env = {**_ENV, "WORLD_SIZE": str(len(nodes)), "MASTER_PORT": "29999", "GROUP_RANK": "1"}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("GNNIO_COMM_CHECK", raising=False)

        def init_process_group(backend, init_method, timeout):
            seen["timeout"] = timeout.total_seconds()
            if fail:
                raise RuntimeError(fail)

        def all_gather_object(out, obj, group=None):
            seen["node"] = obj
            out[:] = nodes

        monkeypatch.setattr(dist, "init_process_group", init_process_group)
        monkeypatch.setattr(dist, "new_group", lambda **kw: object())
        monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
        return init(**kw)

    return join, seen


def test_a_rank_learns_every_ranks_machine_and_infers_the_topology(joined):
    join, seen = joined
    ctx = join([0, 0, 1, 1], timeout_s=7)
    assert (seen["node"], seen["timeout"]) == (1, 7.0)  # GROUP_RANK: torchrun's node rank
    assert (ctx.machine_of, ctx.topology_spec, ctx.topo.num_gpus) == ([0, 0, 1, 1], "2*2", 4)
    assert [ctx.link_to(k) for k in range(4)] == ["local", "peer", "network", "network"]


@pytest.mark.parametrize(
    "nodes, kw, words",
    [
        ([0], {"topology": "2"}, "describes 2 devices but the run has 1 ranks"),
        ([0, 1], {"topology": "2"}, r"NVLink group \[0, 1\] spans several machines"),
        ([0, 0], {"fail": "no peer came\nthe trace"}, "could not join the process group at "
         "127.0.0.1:29999 within 120 s \\(--dist-timeout\\): no peer came$"),
    ],
)  # fmt: skip
def test_a_launch_that_cannot_be_this_topology_or_join_is_one_line(joined, nodes, kw, words):
    join, _ = joined
    with pytest.raises(UsageError, match=words):
        join(nodes, **kw)


def test_cuda_asked_for_without_a_device_for_every_local_rank_is_one_line(joined, monkeypatch):
    join, _ = joined
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(torch.cuda.device_count() + 1))
    with pytest.raises(
        UsageError, match="--device cuda: .* rank\\(s\\) on this machine need as many"
    ):
        join([0], device="cuda")


def test_an_exchange_receives_what_the_others_send_not_what_it_sends(monkeypatch):
    import torch.distributed as dist

    from gnnio.distributed.context import DistContext

    ctx = DistContext(rank=0, world_size=2, local_rank=0, machine_of=[0, 0], backend="gloo",
                      device=torch.device("cpu"), simulated=True, timeout_s=5.0,
                      groups={"fetch": None})  # fmt: skip
    shapes = []
    monkeypatch.setattr(dist, "all_to_all_single", lambda out, send, r, s, group: shapes.append(
        (tuple(out.shape), r, s)))  # fmt: skip
    got = ctx.all_to_all_single(torch.zeros(3, 4), recv_splits=[1, 4], send_splits=[2, 1])
    assert tuple(got.shape) == (5, 4) and shapes == [((5, 4), [1, 4], [2, 1])]


# -- the communication check --------------------------------------------------------------------


@pytest.fixture
def check(tmp_path):
    from types import SimpleNamespace

    from gnnio.distributed.commcheck import CommCheck

    group = object()
    ctx = SimpleNamespace(backend="gloo", local_rank=0, rank=0, groups={"fetch": group},
                          comm_device=torch.device("cpu"), _extra={})  # fmt: skip
    return CommCheck(ctx, tmp_path / "out"), group


def test_two_threads_on_one_group_at_once_are_reported(check):
    chk, group = check
    inside, go = threading.Event(), threading.Event()

    def slow(group=None):
        inside.set()
        assert go.wait(10)

    barrier = chk._wrap("barrier", slow)
    first = threading.Thread(target=barrier, kwargs={"group": group}, name="first")
    first.start()
    assert inside.wait(10)
    fast = chk._wrap("barrier", lambda group=None: None)
    threading.Thread(target=fast, kwargs={"group": group}, name="second").start()
    go.set()
    first.join(10)
    v = chk.violations
    assert len(v) == 1 and "from thread second while thread(s) ['first']" in v[0]


def test_calls_one_after_another_are_not_in_flight_together(check):
    chk, group = check
    fn = chk._wrap("barrier", lambda group=None: None)
    called, leave = threading.Event(), threading.Event()

    def first():  # stays alive after its call, so the second thread cannot take its id
        fn(group=group)
        called.set()
        assert leave.wait(10)

    a = threading.Thread(target=first, name="a")
    a.start()
    assert called.wait(10)
    b = threading.Thread(target=fn, kwargs={"group": group}, name="b")
    b.start()
    b.join(10)
    leave.set()
    a.join(10)
    assert chk.violations == []  # but one group, two threads: the record says so
    assert chk.record()["violations"] == ["threads: group fetch used by threads ['a', 'b']"]


def test_every_tensor_of_a_list_is_checked_and_object_collectives_once(check):
    chk, group = check
    placed = torch.zeros(1)
    chk.placed(placed)
    gather = chk._wrap("all_gather", lambda out, t, group=None: None)
    gather([placed], placed, group=group)
    assert chk.violations == []
    gather([torch.zeros(1), placed], placed, group=group)
    assert (
        len(chk.violations) == 1
        and "all_gather on group fetch got a tensor on cpu" in (chk.violations[0])
    )
    chk.violations.clear()
    objects = chk._wrap("all_gather_object", lambda out, obj, group=None: gather(
        [torch.zeros(1)], torch.zeros(1), group=group))  # fmt: skip
    objects([None], 1, group=group)
    assert chk.violations == []  # its pickles are torch's business
    assert chk.calls[("all_gather_object", "fetch", "MainThread")] == 1
    assert ("all_gather", "fetch", "MainThread") in chk.calls  # (the two direct calls)
    assert chk.calls[("all_gather", "fetch", "MainThread")] == 2


def test_the_record_is_written_whole_and_the_wrappers_removed(check, monkeypatch, tmp_path):
    import torch.distributed as dist

    from gnnio.distributed import commcheck
    from gnnio.distributed.context import shutdown

    chk, _ = check
    original = dist.all_reduce
    monkeypatch.setenv(commcheck.ENV, str(tmp_path / "out"))
    installed = commcheck.install_from_env(chk.ctx)
    try:
        assert dist.all_reduce is not original and installed is not None
    finally:
        shutdown()  # (no process group joined: only the check's record)
    assert dist.all_reduce is original
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["rank0.json"]
    assert json.loads((tmp_path / "out" / "rank0.json").read_text())["backend"] == "gloo"


# -- the memory census --------------------------------------------------------------------------


def test_the_census_sees_every_array_sized_by_the_graph(tmp_path):
    from gnnio.distributed.memcheck import census, node_arrays_of

    n, e = 1009, 3001
    f = tmp_path / "d" / "x.npy"
    f.parent.mkdir()
    np.save(f, np.ones(n, dtype=np.int8))

    class Holder:
        pass

    h = Holder()
    h.rows, h.ptr, h.cols, h.wide = np.zeros(n), np.zeros(n + 1), np.zeros(e), np.zeros((3, n))
    h.kept, h.small = torch.zeros(n, 2), np.zeros(7)
    h.mapped = np.load(f, mmap_mode="r")
    rows = census(n, e, [h.kept], [f.parent])["arrays"]
    shapes = sorted((r["shape"], r["allowed"], r["file"] is not None) for r in rows)
    assert shapes == [([3, n], False, False), ([n], False, False), ([n], False, True),
                      ([n, 2], True, False), ([n + 1], False, False), ([e], False, False)]  # fmt: skip
    held = node_arrays_of(h, n)
    assert sorted(tuple(a.shape) for a in held) == [(n,), (n, 2)]  # the mapping is not held


# -- the gradient hook and the model digest -----------------------------------------------------


def test_the_hook_adds_up_the_seconds_of_every_bucket(monkeypatch):
    from types import SimpleNamespace

    from gnnio.distributed import ddp
    from tests.test_dist_small import _OtherRank

    clock = iter(range(0, 100, 5))
    monkeypatch.setattr(ddp.time, "perf_counter", lambda: float(next(clock)))
    state = ddp.GradCounter(2, _OtherRank(torch.zeros(2), 2))
    for _ in range(2):
        ddp.counting_allreduce(state, SimpleNamespace(buffer=lambda: torch.ones(2))).wait()
    assert state.seconds == 10.0  # 5 s from hand-off to completion, each


def test_the_digest_tells_models_apart_by_names_and_bits():
    from gnnio.distributed.ddp import param_digest

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    b.load_state_dict(a.state_dict())
    assert param_digest(a) == param_digest(b)
    with torch.no_grad():
        b.bias[0] = torch.nextafter(b.bias[0], torch.tensor(9.0))  # one bit
    assert param_digest(a) != param_digest(b)
    moved = torch.nn.Module()
    moved.register_buffer("weight", a.bias.detach().clone())
    moved.register_buffer("bias", a.weight.detach().clone())
    other = torch.nn.Module()
    other.register_buffer("bias", a.bias.detach().clone())
    other.register_buffer("weight", a.weight.detach().clone())
    assert param_digest(moved) != param_digest(other)  # the same bytes under other names


def test_pread_rows_refuse_a_negative_position(tmp_path):
    from gnnio.distributed.hostrows import pread_rows_of
    from gnnio.features.stores.mmap import MmapFeatureStore

    f = tmp_path / "features.npy"
    np.save(f, np.arange(40, dtype=np.float32).reshape(10, 4))
    reader = pread_rows_of(MmapFeatureStore(f))
    rows = torch.zeros((3, 4))
    reader.gather(torch.tensor([7, 2]), rows, at=torch.tensor([2, 0]))
    assert rows[:, 0].tolist() == [8.0, 0.0, 28.0]
    with pytest.raises(IndexError, match="outside the 3 rows"):  # not the last row, silently
        reader.gather(torch.tensor([5]), rows, at=torch.tensor([-1]))
    with pytest.raises(ValueError, match="1 positions for 2 ids"):  # the kernel reads at[1]
        reader.gather(torch.tensor([5, 6]), rows, at=torch.tensor([0]))
