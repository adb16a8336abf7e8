"""The command line's own rules, found by a mutation pass over ``gnnio/cli/main.py``,
``gnnio/cli/train_dist.py``, ``gnnio/cli/train_config.py``, ``gnnio/train/config_dist.py`` and
``gnnio/distributed/launch.py``: each test here failed on a mutation the other tests let pass.

- out of memory (numpy's MemoryError, torch's RuntimeError) is one ``gnnio: error:`` line and exit
  2, naming the first line of the message; any other RuntimeError stays a traceback (a bug);
- ``--prune-threshold`` takes exactly two numbers; ``--device auto`` is cuda only with a GPU for
  each rank;
- one rank (``rank_main``) fails the run when its command returns non-zero, and runs with SIGINT
  at its default action (the launcher prints the one line);
- what a distributed run refuses: ``--nproc 0``, one rank more than the cores allow (and not the
  last allowed one), ``--buffer`` outside [0, 1] or NaN (1.0 allowed), ``--heap``,
  ``--isolation``, an unknown ``--sampling-mode`` (the Python API has no argparse choices),
  ``--sampler`` with ``--partition``, the several-rank options with one process;
- the launcher: the failure line of a rank that exited (exit code 0 is not a signal), takes an
  error file's message, skips a traceback's caret lines, never names a rank that timed out
  waiting for its peer; Ctrl-C is gnnio's 130 line; the agent's directory is removed;
- ``gnnio train --nproc N`` hands ``--dist-timeout`` to the launcher, and the built-in dataset
  with its own default epochs to the ranks."""

from __future__ import annotations

import os
import signal
import warnings
from types import SimpleNamespace

import pytest

from gnnio.cli.main import OneLineParser, main, rank_main
from gnnio.errors import UsageError
from gnnio.train import TrainConfig
from tests.helpers import write_tiny_dataset
from tests.test_bad_input_prepare import one_line_error


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("d") / "tiny", num_nodes=60, num_edges=300)


# ----------------------------------------------------------------------------------------------
# main: out of memory


def _info_raises(monkeypatch, exc):
    import gnnio.cli.info as info

    def boom(args):
        raise exc

    monkeypatch.setattr(info, "run", boom)


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError("Unable to allocate 8.00 TiB for an array\nwith shape (1, 2)"),
        RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nsee the allocator's notes"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:114] can't allocate memory: 8 TiB\nmore"),
    ],
    ids=["numpy", "cuda", "torch-cpu"],
)
def test_out_of_memory_is_one_line_naming_the_first_line(tmp_path, monkeypatch, capsys, exc):
    _info_raises(monkeypatch, exc)
    assert main(["info", str(tmp_path)]) == 2
    err = one_line_error(capsys, "out of memory: ")
    assert err == f"gnnio: error: out of memory: {str(exc).splitlines()[0]}\n"


def test_another_runtime_error_is_not_called_out_of_memory(tmp_path, monkeypatch):
    """A RuntimeError that is not an allocation is a bug: its traceback, not a made-up line."""
    _info_raises(monkeypatch, RuntimeError("index 7 is out of bounds"))
    with pytest.raises(RuntimeError, match="out of bounds"):
        main(["info", str(tmp_path)])


@pytest.mark.parametrize("value", ["1,1,1", "1", "a,1"])
def test_prune_threshold_takes_exactly_two_numbers(tiny, capsys, value):
    """A third number was taken and ignored (only the first two were read)."""
    assert main(["train", str(tiny), "--prune-threshold", value, "--quiet"]) == 2
    one_line_error(capsys, f"--prune-threshold: needs ALPHA,BETA (e.g. 1,1), got '{value}'")


@pytest.mark.parametrize("gpus, ranks, want", [(1, 2, "cpu"), (2, 2, "cuda"), (1, 1, "cuda")])
def test_device_auto_is_cuda_only_with_a_gpu_for_each_rank(monkeypatch, gpus, ranks, want):
    """(stands in for the GPUs: the count of the ranks, not of one process, decides)"""
    import torch

    from tests.test_cli_options import _cfg

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert _cfg(f"--device auto --nproc {ranks}", ranks).device == want


# ----------------------------------------------------------------------------------------------
# one rank


@pytest.fixture
def rank_of(monkeypatch):
    """``rank_of(rc)``: ``rank_main`` running a stand-in command that returns ``rc``; returns
    what ``rank_main`` returned and the SIGINT handler the command ran with."""
    import gnnio.cli.main as cli_main

    seen = {}

    def func(args):
        seen["sigint"] = signal.getsignal(signal.SIGINT)
        return seen["rc"]

    parser = OneLineParser(prog="gnnio")
    parser.set_defaults(func=func)
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # (rank_main sets it)

    def go(rc):
        seen["rc"] = rc
        return rank_main([]), seen["sigint"]

    prev = signal.getsignal(signal.SIGINT)
    yield go
    signal.signal(signal.SIGINT, prev)


def test_a_rank_whose_command_fails_exits_with_its_code(rank_of):
    """The agent reads a rank's exit status: a command that returns 2 (its one-line refusal)
    must not be a rank that succeeded."""
    assert rank_of(0)[0] == 0
    with pytest.raises(SystemExit) as e:
        rank_of(2)
    assert e.value.code == 2


def test_a_rank_runs_with_sigint_at_its_default_action(rank_of):
    """Ctrl-C ends every rank by the signal (the launcher prints the one line), never with a
    KeyboardInterrupt traceback per rank."""
    assert rank_of(0)[1] is signal.SIG_DFL


# ----------------------------------------------------------------------------------------------
# what a distributed run refuses


def test_nproc_0_is_refused_not_run_in_one_process(tiny, capsys, monkeypatch):
    import gnnio.train as gtrain

    monkeypatch.setattr(gtrain, "train", lambda *a, **k: pytest.fail("trained"))
    assert main(["train", str(tiny), "--nproc", "0", "--epochs", "1", "--quiet"]) == 2
    one_line_error(capsys, "--nproc: must be >= 1, got 0")


def test_nproc_up_to_8_per_core_and_not_one_more(monkeypatch):
    from gnnio.train.config_dist import MAX_RANKS_PER_CORE

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    TrainConfig(nproc=2 * MAX_RANKS_PER_CORE).validate_dist(2 * MAX_RANKS_PER_CORE)
    with pytest.raises(UsageError, match=f"at most {2 * MAX_RANKS_PER_CORE}"):
        TrainConfig(nproc=2 * MAX_RANKS_PER_CORE + 1).validate_dist(2)


@pytest.mark.parametrize("buffer, ok", [(0.0, True), (1.0, True), (1.5, False), (-0.1, False),
                                        (float("nan"), False), (float("inf"), False)])  # fmt: skip
def test_buffer_is_a_fraction_in_0_1(buffer, ok):
    cfg = TrainConfig(buffer=buffer)
    if ok:
        cfg.validate_dist(2)
    else:
        with pytest.raises(UsageError, match="--buffer: must be a fraction in"):
            cfg.validate_dist(2)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"heap": "keep"}, "--heap keep: single-process only"),
        ({"isolation": "auto"}, "--isolation auto: single-process only"),
        ({"sampling_mode": "DSP"}, "--sampling-mode: dsp or shared, got 'DSP'"),
        ({"partition": "P", "sampler": "labor"}, "--sampler: not available with --partition"),
    ],
)
def test_refused_with_several_ranks(kw, words):
    with pytest.raises(UsageError, match=words):
        TrainConfig(**kw).validate_dist(2)
    if "partition" not in kw:  # (the partition's own check is about ranks)
        TrainConfig(**kw).validate_dist(1)  # one process takes them


@pytest.mark.parametrize(
    "kw, name",
    [({"partition": "P"}, "--partition"), ({"topology": "2"}, "--topology"),
     ({"placement_strategy": "mod"}, "--placement-strategy")],
)  # fmt: skip
def test_several_rank_options_need_several_ranks(kw, name):
    with pytest.raises(UsageError, match=f"{name}: needs several ranks"):
        TrainConfig(**kw).validate_dist(1)


# ----------------------------------------------------------------------------------------------
# the launcher


def _failure(rank, code, message, ts=1):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    f = ProcessFailure(local_rank=rank, pid=10 + rank, exitcode=code, error_file="<N/A>")
    f.message, f.timestamp = message, ts
    return f


def test_the_failure_line_of_a_rank_that_exited():
    from gnnio.distributed.launch import failure_line

    err = SimpleNamespace(failures={1: _failure(1, 0, "")})
    assert failure_line(err) == "rank 1 (pid 11) exited with code 0"
    err = SimpleNamespace(failures={0: _failure(0, 1, {"message": "ValueError: bad", "x": 1})})
    assert failure_line(err) == "rank 0 (pid 10) failed: ValueError: bad"
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
          "ValueError: bad row\n    ^^^^\n    ~~~~")  # fmt: skip
    err = SimpleNamespace(failures={0: _failure(0, 1, {"message": tb})})
    assert failure_line(err) == "rank 0 (pid 10) failed: ValueError: bad row"


def test_the_failure_line_of_a_gnnio_error_has_no_class_name():
    """A rank's one-line gnnio error reads as in one process (``--resume C: ...``), not
    ``failed: UsageError: --resume C: ...``; other exceptions keep their class name."""
    from gnnio.distributed.launch import failure_line

    for cls in ("UsageError", "DatasetError", "LoaderStall"):
        msg = {"message": f"{cls}: --resume c: no complete checkpoint in it"}
        err = SimpleNamespace(failures={0: _failure(0, 1, msg)})
        assert (
            failure_line(err) == "rank 0 (pid 10) failed: --resume c: no complete checkpoint in it"
        )
    err = SimpleNamespace(failures={0: _failure(0, 1, {"message": "KeyError: 'UsageError: x'"})})
    assert failure_line(err) == "rank 0 (pid 10) failed: KeyError: 'UsageError: x'"


@pytest.fixture
def agent(monkeypatch, tmp_path):
    """``launch`` with the elastic agent replaced by ``agent.then`` (what it raises or returns)
    and the temporary directory ``tmp_path`` (thread counts: test_peer_failures)."""
    import tempfile

    import torch.distributed.launcher.api as api

    a = SimpleNamespace(then=lambda: {0: 0, 1: 0}, seen={})

    def fake_launch(config, entry):
        def run(entrypoint, argv):  # (each rank runs entry(entrypoint, argv))
            a.seen["dirs"] = sorted(p.name[:12] for p in tmp_path.iterdir())
            return a.then()

        return run

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return a


def test_the_launcher_removes_the_agents_directory(agent, tmp_path):
    """torch's default is a new torchelastic_* directory per run, never removed."""
    from gnnio.distributed.launch import launch

    assert launch(2, print, ["train"]) == {0: 0, 1: 0}
    assert agent.seen["dirs"] == ["gnnio-ranks-"]  # the agent's directory, while it runs ...
    assert list(tmp_path.iterdir()) == []  # ... removed after it


def test_the_agent_stopped_by_ctrl_c_is_gnnios_interrupt(agent, tmp_path):
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from gnnio.distributed.launch import DistRunError, launch

    def stopped(sig):
        def then():
            raise SignalException(f"Process got signal: {sig}", sigval=sig)

        return then

    agent.then = stopped(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        launch(2, print, ["train"])
    agent.then = stopped(signal.SIGTERM)
    with pytest.raises(DistRunError, match="^stopped by SIGTERM$"):
        launch(2, print, ["train"])
    assert list(tmp_path.iterdir()) == []


def test_a_rank_that_timed_out_waiting_is_not_the_cause():
    """A rank whose collective timed out waited for a peer: the peer's own error, reported
    later, is the cause named."""
    from gnnio.distributed.launch import failure_line

    waited = {"message": "RuntimeError: [gloo] Timed out waiting 120000ms for recv operation"}
    for words in ("timed out", "Timeout"):
        w = {"message": waited["message"].replace("Timed out", words)}
        err = SimpleNamespace(failures={0: _failure(0, 1, w, ts=1),
                                        1: _failure(1, 1, {"message": "ValueError: bad"}, ts=2)})  # fmt: skip
        assert failure_line(err) == "rank 1 (pid 11) failed: ValueError: bad; stopped rank(s) 0 too"


# ----------------------------------------------------------------------------------------------
# gnnio train --nproc N: what reaches the ranks


@pytest.fixture
def launched(monkeypatch):
    """Calls of the launcher with their timeout (none is started)."""
    calls = []
    monkeypatch.setattr("gnnio.distributed.launch.launch",
                        lambda n, entry, argv, timeout_s=None: calls.append((n, argv, timeout_s)))  # fmt: skip
    return calls


def test_dist_timeout_reaches_the_launcher(tiny, launched):
    assert main(["train", str(tiny), "--nproc", "2", "--quiet", "--dist-timeout", "9"]) == 0
    assert launched == [(2, ["train", str(tiny), "--nproc", "2", "--quiet", "--dist-timeout",
                             "9"], 9.0)]  # fmt: skip


def test_the_built_in_dataset_reaches_the_ranks_with_its_epochs(tiny, launched, monkeypatch):
    """Without DIR one process trains the built-in dataset for DEFAULT_TRAIN_EPOCHS; so do the
    ranks (not TrainConfig's 20)."""
    import gnnio
    import gnnio.train.defaults as defaults

    monkeypatch.setattr(defaults, "default_dataset", lambda progress=True: gnnio.load(tiny))
    assert main(["train", "--nproc", "2", "--quiet"]) == 0
    want = [str(gnnio.load(tiny).path), "--epochs", str(defaults.DEFAULT_TRAIN_EPOCHS)]
    assert launched[0][1][-3:] == want
    assert main(["train", "--nproc", "2", "--quiet", "--epochs", "3"]) == 0
    assert launched[1][1][-3:] == ["--epochs", "3", str(gnnio.load(tiny).path)]
