"""Rules of gnnio's small utilities found by a mutation pass over gnnio/utils (outputs, interrupts,
thread_pool, streams, syncs) and gnnio/pipeline/affinity: an output path is refused up front with
the reason that applies (a directory, a parent that is a file), written complete and fsync-ed
before the rename, a killed writer's temporaries are removed but a symlink named like one is not;
the Ctrl-C deferral raises exactly once at the end of the outermost compile of the main thread
only and leaves an ignored SIGINT ignored; a pool grows to the threads asked for; a stage of zero
threads still counts as a core; the fake streams keep CUDA's ordering rules (an event covers the
work before it, a copy is the copying stream's, the host waits for the copy reading a buffer); the
op counter counts every operation and the host-device copies and scalars that sync."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from gnnio.errors import UsageError
from gnnio.utils.outputs import check_figure_path, check_output_path, save_figure, write_atomic
from tests.helpers import write_tiny_dataset
from tests.test_bad_input_prepare import dead_pid

# ---- outputs ------------------------------------------------------------------------------------


def test_an_output_path_that_is_a_directory_or_below_a_file_is_refused_up_front(tmp_path):
    """Each case is its own one line before any work (``--log`` is checked before training)."""
    with pytest.raises(UsageError, match="--log .*: is a directory; give a file path"):
        check_output_path(tmp_path, "--log")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="--log .*f is a file, not a directory"):
        check_output_path(tmp_path / "f" / "sub" / "log.json", "--log")


@pytest.mark.parametrize("pair", [("--summary", "--log"), ("--log", "--checkpoint"),
                                  ("--summary", "--checkpoint")])  # fmt: skip
def test_two_outputs_of_gnnio_train_naming_one_file_are_refused_up_front(pair, tmp_path, capsys):
    """``gnnio train --summary F --log F`` trained and left only the summary in F (the log was
    overwritten at the end), also through another spelling or a symlink: one line, nothing run."""
    from gnnio.cli.main import main

    d = write_tiny_dataset(tmp_path / "d", num_nodes=30, num_edges=90)
    (tmp_path / "link.json").symlink_to(tmp_path / "out.json")
    argv = ["train", str(d), "--epochs", "1", "--fanouts", "2", "--hidden", "4", "--quiet",
            pair[0], str(tmp_path / "out.json"), pair[1], str(tmp_path / "x" / ".." / "link.json")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{pair[1]} " in err and f"the file {pair[0]} writes" in err
    assert not (tmp_path / "out.json").exists()


def test_a_figure_is_written_to_exactly_its_path_in_the_format_its_suffix_names(tmp_path):
    """matplotlib would write ``plot`` as ``plot.png`` and raise on ``.xyz`` after the run; a
    figure's path is checked up front, written under its own name, and a failed write is one
    line naming the option (no temporary left)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for bad in ("plot", "plot.xyz"):
        with pytest.raises(UsageError, match=rf"^--plot .*{bad}: name the image format by"):
            check_figure_path(tmp_path / bad)
    fig = plt.figure()
    try:
        save_figure(fig, tmp_path / "f.svg")
        real = fig.savefig

        def full_disk(f, **kw):
            real(f, **kw)
            raise OSError(28, "No space left on device")

        fig.savefig = full_disk
        with pytest.raises(UsageError, match=r"^--out .*f\.png: cannot write it \(No space"):
            save_figure(fig, tmp_path / "sub" / "f.png", "--out", dpi=10)
    finally:
        plt.close(fig)
    assert (tmp_path / "f.svg").read_text().startswith("<?xml")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["f.svg", "sub"]


def test_a_relative_path_inside_a_dataset_is_refused_without_a_symlink_named(tmp_path, monkeypatch):
    ds = write_tiny_dataset(tmp_path / "ds")
    (ds / "runs").mkdir()
    monkeypatch.chdir(ds / "runs")
    with pytest.raises(UsageError, match="inside the dataset directory") as e:
        check_output_path("log.json", "--log")
    assert "symlink" not in str(e.value)


def test_a_symlink_named_like_a_dead_writers_temporary_is_left(tmp_path):
    """Only regular files a killed writer left go; a link with such a name is someone's."""
    target = tmp_path / "keep.bin"
    target.write_bytes(b"data")
    link = tmp_path / f".s.json.tmp-{dead_pid()}-0a1b2c3d"
    link.symlink_to(target)
    write_atomic(tmp_path / "s.json", lambda f: f.write(b"{}"), "--summary")
    assert link.is_symlink() and target.read_bytes() == b"data"


def test_an_atomic_write_is_on_disk_before_it_replaces_the_target(tmp_path, monkeypatch):
    """``fsync`` of the complete temporary, then the rename: a crash never leaves an empty file
    under the target's name."""
    seen = []

    def fsync(fd):
        seen.append((os.fstat(fd).st_size, (tmp_path / "s.json").exists()))

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "s.json", lambda f: f.write(b"{}"), "--summary")
    assert seen == [(2, False)] and (tmp_path / "s.json").read_bytes() == b"{}"


def test_a_log_resumed_with_earlier_lines_keeps_them_and_the_file_until_the_first_record(tmp_path):
    from gnnio.utils.outputs import AtomicLog

    p = tmp_path / "log.jsonl"
    p.write_text("old\n")
    log = AtomicLog(p, lines=[{"epoch": 0}])
    assert p.read_text() == "old\n"
    log.append({"epoch": 1})
    log.append({"epoch": 2})
    assert p.read_text() == '{"epoch": 0}\n{"epoch": 1}\n{"epoch": 2}\n'


def test_a_folder_that_cannot_be_listed_has_no_stale_temporaries(tmp_path, monkeypatch):
    """Cleaning up after killed writers never fails the write itself."""
    from pathlib import Path

    from gnnio.utils.outputs import remove_stale_files

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", refuse)
    assert remove_stale_files(tmp_path, ".s.json") == []


# ---- interrupts ---------------------------------------------------------------------------------


def _deferral():
    from gnnio.utils.interrupts import _listener_class

    return _listener_class()()


def _quiet(call, *args):
    """``call(*args)``, which must not raise KeyboardInterrupt (a test failure, not pytest's
    own interrupt)."""
    try:
        call(*args)
    except KeyboardInterrupt:
        pytest.fail(f"{call.__name__} raised KeyboardInterrupt")


def test_sigint_in_a_compile_is_raised_once_at_the_end_of_the_outermost_hold():
    d = _deferral()
    with pytest.raises(KeyboardInterrupt):
        d.handle_sigint(signal.SIGINT, None)  # no compile running: Python's behaviour
    d.on_start(None)
    _quiet(d.handle_sigint, signal.SIGINT, None)  # one hold: recorded, not raised
    d.on_start(None)
    _quiet(d.on_end, None)  # the inner hold ends: the kernel of the outer one is still half built
    with pytest.raises(KeyboardInterrupt):
        d.on_end(None)
    d.on_start(None)
    _quiet(d.on_end, None)  # raised once: the next compile runs on
    assert (d.depth, d.pending) == (0, False)


def test_the_deferral_counts_only_the_main_threads_holds():
    d = _deferral()
    _quiet(d.on_end, None)  # installed inside a hold: its end is not counted below zero
    t = threading.Thread(target=d.on_start, args=(None,))  # a compile in another thread
    t.start()
    t.join()
    assert d.depth == 0
    with pytest.raises(KeyboardInterrupt):
        d.handle_sigint(signal.SIGINT, None)
    d.on_start(None)
    _quiet(d.handle_sigint, signal.SIGINT, None)
    assert d.pending


def test_an_ignored_sigint_stays_ignored(monkeypatch):
    """A background job's SIG_IGN is not replaced by the deferral's handler."""
    from gnnio.utils import interrupts

    monkeypatch.setattr(interrupts, "_installed", None)
    prev = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupts.defer_sigint_while_compiling()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert interrupts._installed is None
    finally:
        signal.signal(signal.SIGINT, prev)


# ---- thread_pool --------------------------------------------------------------------------------


def test_a_lazy_pool_grows_to_the_threads_asked_for():
    from gnnio.utils.thread_pool import LazyPool

    p = LazyPool("gnnio-test-pool")
    assert not p.made
    two = p.get(2)
    assert p.get(1) is two and p.get(2) is two and p.made
    three = p.get(3)
    assert three is not two and three._max_workers >= 3
    for ex in (two, three):
        ex.shutdown()


# ---- affinity -----------------------------------------------------------------------------------


def test_available_cores_are_the_processs_own_in_order(monkeypatch):
    from gnnio.pipeline import affinity

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7, 3, 5})
    assert affinity.available_cores() == [3, 5, 7]


def test_a_stage_of_zero_threads_still_takes_a_core_in_the_fit():
    """Every stage gets at least one core, so the check of the fit counts it too: otherwise the
    last stage got fewer cores than it asked for."""
    from gnnio.pipeline.affinity import core_sets

    assert core_sets({"sample": 0, "gather": 2, "compute": 2}, [0, 1, 2, 3]) is None
    assert core_sets({"sample": 0, "gather": 2, "compute": 1}, [0, 1, 2, 3]) == {
        "sample": [0],
        "gather": [1, 2],
        "compute": [3],
    }


# ---- streams ------------------------------------------------------------------------------------


def test_an_event_marks_the_work_queued_before_it_only():
    """Work queued after ``record`` is not covered by the event: waiting on it and reading what
    that later work wrote is a missing wait."""
    from gnnio.utils.streams import RecordingStreams, StreamOrderError

    rs = RecordingStreams()
    side, main = rs.new_stream("side"), rs.new_stream("main")
    a, b = torch.ones(3), torch.ones(4)
    with rs.use(side):
        rs.produce(a)
        ev = rs.record()
        rs.produce(b)  # after the event
    assert rs.current() is rs.default  # ``use`` puts the previous stream back
    rs.wait(main, ev)
    with rs.use(main):
        rs.check_read(a)
        with pytest.raises(StreamOrderError, match="main#1 reads b written on side#0"):
            rs.check_read(b, what="b")
        rs.wait(main, rs.record(side))
        rs.check_read(b)


def test_the_host_may_overwrite_a_staging_buffer_only_after_the_copy_reading_it():
    """A sync on an event recorded before the copy does not cover it; one recorded after does."""
    from gnnio.sampling.base import MiniBatch
    from gnnio.utils.streams import RecordingStreams, StreamOrderError

    rs = RecordingStreams()
    side = rs.new_stream("side")
    staging = torch.ones(2, 3)
    mb = MiniBatch(seeds=torch.arange(2), input_nodes=torch.arange(2), blocks=[], x=staging)
    with rs.use(side):
        before = rs.record()
        rs.to_device(mb, torch.device("cpu"))
        after = rs.record()
    rs.synchronize(before)
    with pytest.raises(StreamOrderError, match="overwrites the slot that a copy queued on side"):
        rs.check_host_write(staging, what="the slot")
    rs.synchronize(after)
    rs.check_host_write(staging, what="the slot")


def test_a_copy_is_ready_for_the_copying_stream_only():
    """``to_device``'s copy is written on the copying stream: another stream waits for it."""
    from gnnio.sampling.base import MiniBatch
    from gnnio.utils.streams import RecordingStreams, StreamOrderError

    rs = RecordingStreams()
    side = rs.new_stream("side")
    mb = MiniBatch(seeds=torch.arange(2), input_nodes=torch.arange(2), blocks=[], x=torch.ones(2))
    with rs.use(side):
        moved = rs.to_device(mb, torch.device("cpu"))
        rs.check_read(moved.x)
    with pytest.raises(StreamOrderError, match="default reads x written on side#0"):
        rs.check_read(moved.x, what="x")
    rs.wait(rs.default, rs.record(side))
    rs.check_read(moved.x, what="x")


def test_streams_are_cuda_streams_only_for_a_cuda_device():
    from gnnio.utils.streams import CudaStreams, streams_for

    assert streams_for(None, "cpu", torch.device("cpu")) is None
    got = streams_for("cpu", "cuda:1")
    assert isinstance(got, CudaStreams) and got.device == torch.device("cuda", 1)


# ---- syncs --------------------------------------------------------------------------------------


def test_the_op_counter_counts_every_operation_and_names_the_syncs():
    from gnnio.utils.syncs import OpCounter

    t = torch.arange(6)
    with OpCounter() as c:
        u = t + 1
        u.mul_(2)
        torch.nonzero(u)
        torch.nonzero(u)
    assert c.ops == 4 and c.syncs == 2 and c.sync_ops == {"aten.nonzero": 2}


def test_a_copy_between_host_and_device_syncs_unless_non_blocking():
    """Decided from the devices alone, so checked here without a GPU."""
    from types import SimpleNamespace

    from gnnio.utils.syncs import _is_sync

    aten, host = torch.ops.aten, torch.ones(2)
    cuda = torch.device("cuda", 0)
    assert _is_sync(aten._to_copy.default, (host,), {"device": cuda})
    assert not _is_sync(aten._to_copy.default, (host,), {"device": cuda, "non_blocking": True})
    assert not _is_sync(aten._to_copy.default, (host,), {"device": torch.device("cpu")})
    on_gpu = SimpleNamespace(device=cuda)  # a copy_ destination on the device
    assert _is_sync(aten.copy_.default, (on_gpu, host), {})
    assert not _is_sync(aten.copy_.default, (on_gpu, host, True), {})


def test_only_the_python_scalar_itself_counts_as_a_host_value():
    """``t[i] = v`` of a tensor ``v`` made before (on the device, on CUDA) is no sync, also
    after a ``t[5] = -1`` that did sync."""
    from gnnio.utils.syncs import OpCounter

    t, i, v = torch.zeros(10, dtype=torch.int64), torch.tensor([1, 2]), torch.tensor(7)
    with OpCounter() as c:
        t[5] = -1
        t[i] = v
    assert c.syncs == 1, c.sync_ops


def test_sync_sites_name_gnnio_files_from_the_package_and_others_by_name():
    from gnnio.utils.syncs import _short

    assert _short("/x/gnnio/y/gnnio/utils/a.py") == "gnnio/utils/a.py"
    assert _short("/usr/lib/torch/_tensor.py") == "_tensor.py"
