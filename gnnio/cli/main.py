"""``gnnio`` command line: prepare, info, train, bench (and more as they land).

The subcommands (and with them NumPy, numba and torch, a few seconds on a busy machine) are
imported inside :func:`main`, so an interrupt (Ctrl-C) while they load ends with the same one
line and exit status 130 as an interrupt later, not with a traceback of the import. While they
load, SIGINT prints the line and ends the process at once (:func:`_interrupted_while_loading`):
a KeyboardInterrupt raised inside an extension module's import code would make Python end by
SIGINT (status -2) even when caught, and nothing has been written yet. Python's own start-up
before :func:`main` (tens of milliseconds) stays Python's."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from .. import __version__
from ..errors import GnnioError, UsageError
from ..utils.argtypes import apply_common_ranges

T = TypeVar("T")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors (a missing option, a value out of range, an unknown choice)
    are one ``gnnio: error:`` line (a :class:`~gnnio.errors.UsageError`, exit 2) naming the
    command's ``--help``, instead of argparse's usage block. Subcommand parsers inherit it
    (``add_subparsers`` makes them of the parent's class)."""

    def error(self, message: str):
        raise UsageError(f"{' '.join(message.split())} (see '{self.prog} --help')")

    def parse_args(self, args=None, namespace=None):
        """argparse's, but an unrecognized argument names the help of the (sub)command that was
        run (``gnnio train --help``), not the top-level one."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self._chosen(ns).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def _chosen(self, ns) -> argparse.ArgumentParser:
        """The innermost subcommand parser that ``ns`` was parsed by (``self`` without any)."""
        parser = self
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            name = getattr(ns, subs[0].dest, None) if subs else None
            if name is None or name not in (subs[0].choices if subs else ()):
                return parser
            parser = subs[0].choices[name]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser; with the command line ``argv`` only the subcommand it
    runs (its first word, :func:`words_of`) is imported and registered, the others stand in as
    their name and one-line help (:data:`gnnio.cli.COMMANDS`), so ``gnnio --help``, a mistyped
    command and ``gnnio info`` do not import what ``train`` and ``bench`` need; a first word that
    is no command (none, a typo) registers none: argparse's listing and its invalid-choice error
    need only the names. ``bench`` likewise imports only the benchmark its second word names.
    Called without arguments, every subcommand and benchmark."""
    from . import COMMANDS

    parser = OneLineParser(
        prog="gnnio",
        description=(
            "Fast mini-batch GNN training on graphs whose features do not fit in GPU memory. "
            "Run 'gnnio COMMAND --help' for each command's options."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gnnio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    command, kind = words_of(argv) if argv is not None else (None, None)
    for name, help_line in COMMANDS.items():
        if command is None or name == command:
            module = importlib.import_module(f"gnnio.cli.{name}")
            if name == "bench":  # (its benchmarks likewise: the second word)
                module.register(sub, kind=kind)
            else:
                module.register(sub)
        else:
            sub.add_parser(name, help=help_line)  # (never parses: command names another)
    apply_common_ranges(parser)  # --threads, --seed, --passes, --warmup: the same everywhere
    return parser


def words_of(argv: list[str]) -> tuple[str, str]:
    """The first two words of ``argv`` that are not options (``""`` where there are fewer): the
    subcommand and, for ``bench``, the benchmark (``gnnio bench``'s own only option, ``--help``,
    takes no value; nor do gnnio's, ``--help`` and ``--version``)."""
    first, second = ([a for a in argv if not a.startswith("-")] + ["", ""])[:2]
    return first, second


#: a value that argparse takes for an option because it starts with "-": "-1,-1,-1", "-1,2"
_NEGATIVE_LIST = re.compile(r"^-[0-9.][0-9.eE+-]*(,[0-9.eE+-]*)+$")


def join_negative_lists(argv: list[str]) -> list[str]:
    """``["--fanouts", "-1,-1,-1"]`` -> ``["--fanouts=-1,-1,-1"]``: argparse reads a
    comma-separated list that starts with a minus as an option, not as the value."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a.startswith("--") and "=" not in a and nxt is not None and _NEGATIVE_LIST.match(nxt):
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


#: options whose value is optional (argparse ``nargs="?"``), each with a test of what is a value
_OPTIONAL_VALUE = {
    "--cuda-graph": lambda v: v in ("off", "step", "sampler", "all"),
    "--prune-threshold": lambda v: "," in v,
}


def dir_before_optional_values(argv: list[str]) -> list[str]:
    """``["--cuda-graph", "DIR", ...]`` -> ``["DIR", "--cuda-graph", ...]`` where ``DIR`` is an
    existing directory and not a value of the option: argparse would take the dataset directory
    for the value of an option whose value is optional (``gnnio train --cuda-graph DIR``). ``DIR``
    goes before the whole run of such options without a value (``--cuda-graph --prune-threshold
    DIR``), else the first of them would take it."""
    out: list[str] = []
    i = 0
    run: int | None = None  # run: where in out a run of those options without a value starts
    while i < len(argv):
        a, nxt = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        is_value = _OPTIONAL_VALUE.get(a)
        if is_value and nxt is not None and not is_value(nxt) and os.path.isdir(nxt):
            at = len(out) if run is None else run
            out[at:at] = [nxt]
            out.append(a)
            i, run = i + 2, None
            continue
        bare = is_value is not None and (nxt is None or not is_value(nxt))
        run = (len(out) if run is None else run) if bare else None
        out.append(a)
        i += 1
    return out


def normalise_argv(argv: list[str]) -> list[str]:
    """The command line as argparse should read it (:func:`join_negative_lists`,
    :func:`dir_before_optional_values`)."""
    return dir_before_optional_values(join_negative_lists(argv))


def _interrupted_while_loading(signum, frame) -> None:
    try:
        sys.stderr.write("gnnio: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(130)


def _loading(load: Callable[[], T]) -> T:
    """``load()`` (imports: :func:`build_parser`, numba's for the SIGINT handler) with SIGINT
    ending the process in one line (module docstring); the previous handler is back afterwards.
    An ignored SIGINT stays ignored."""
    prev = None
    if threading.current_thread() is threading.main_thread():
        prev = signal.getsignal(signal.SIGINT)
        if prev in (signal.SIG_IGN, None):
            prev = None
        else:
            signal.signal(signal.SIGINT, _interrupted_while_loading)
    try:
        return load()
    finally:
        if prev is not None:
            signal.signal(signal.SIGINT, prev)


#: commands that import no torch, their modules nor their runs (tests/test_cli_wording.py)
_WITHOUT_TORCH = ("info", "reorder", "prepare")
#: ... except from these sources
_TORCH_SOURCES = ("pyg",)


def _import_what_it_runs_on(args) -> None:
    """numba (for :func:`~gnnio.utils.interrupts.defer_sigint_while_compiling`, which must run
    after :func:`_loading` has put SIGINT's handler back: it installs only over Python's own)
    and, for a command that runs on torch, torch: imported while Ctrl-C is one line, not inside
    the command (``partition`` and ``prepare pyg`` import it only when they run)."""
    importlib.import_module("numba.core.event")
    if args.command not in _WITHOUT_TORCH or getattr(args, "source", None) in _TORCH_SOURCES:
        importlib.import_module("torch")


class Terminated(BaseException):
    """SIGTERM (``kill``, ``timeout``, a scheduler) as an exception, so the ``finally`` blocks of a
    command run -- a writer removes its temporary directory and releases its claim -- before the
    process ends with 143, as it does without gnnio's handler."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _one_line_warnings(python_format):
    """gnnio's own warnings as one ``gnnio: warning:`` line, as its errors are (Python's format
    adds a path and a line of gnnio's source that say nothing to a user); others unchanged."""

    def format_warning(message, category, filename, lineno, line=None):
        # (gnnio.utils.warnings_at.warn marks its warnings: they point at the user's line)
        mine = getattr(message, "gnnio_warning", False) is True
        if mine or os.path.abspath(filename).startswith(_PACKAGE):
            return f"gnnio: warning: {' '.join(str(message).split())}\n"
        return python_format(message, category, filename, lineno, line)

    return format_warning


def main(argv: list[str] | None = None) -> int:
    prev_term, prev_format = None, warnings.formatwarning
    warnings.formatwarning = _one_line_warnings(prev_format)
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            prev_term = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv)
    except Terminated:
        print("gnnio: terminated", file=sys.stderr)
        return 143
    finally:
        warnings.formatwarning = prev_format
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)


def _main(argv: list[str] | None) -> int:
    if (list(argv) if argv is not None else sys.argv[1:]) == ["--version"]:
        print(f"gnnio {__version__}")  # (at once, before any parser is built)
        return 0
    try:
        argv = normalise_argv(list(argv) if argv is not None else sys.argv[1:])
        parser = _loading(lambda: build_parser(argv))
        args = parser.parse_args(argv)  # (--help and a usage error end here, before numba loads)
        _loading(lambda: _import_what_it_runs_on(args))
        from ..utils.interrupts import defer_sigint_while_compiling

        defer_sigint_while_compiling()  # Ctrl-C never cuts a numba compile in half
        args.argv = argv
        args.rank_entry = rank_main
        with _bars_off(getattr(args, "no_progress", False)):
            rc = args.func(args)
    except GnnioError as e:
        print(f"gnnio: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("gnnio: interrupted", file=sys.stderr)
        return 130
    except MemoryError as e:  # an allocation larger than the machine (numpy)
        print(f"gnnio: error: out of memory: {_first_line(e)}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # torch's allocators say it in a RuntimeError
        if "can't allocate memory" not in str(e) and "out of memory" not in str(e):
            lost = _peer_lost(e)
            if lost is None:
                raise
            print(f"gnnio: error: {lost}", file=sys.stderr)
            return 1
        print(f"gnnio: error: out of memory: {_first_line(e)}", file=sys.stderr)
        return 2
    return int(rc or 0)


def _peer_lost(e: RuntimeError) -> str | None:
    """A rank under ``torchrun`` (``WORLD_SIZE`` > 1; ``--nproc`` ranks run :func:`rank_main`,
    whose launcher names the rank) whose collective failed because another rank died or timed
    out: one line instead of a traceback through the training loop. None otherwise."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) <= 1:
        return None
    from ..distributed.launch import is_peer_loss, peer_loss_line

    if not is_peer_loss(str(e)):
        return None
    return peer_loss_line(e, os.environ.get("RANK", "?"), int(world))


@contextmanager
def _bars_off(off: bool):
    """``--no-progress``: every progress bar of this command off (:mod:`gnnio.utils.progress`
    reads ``GNNIO_NO_PROGRESS``; ranks started from here inherit it), the variable restored after
    (``main`` also runs inside other programs and the tests)."""
    if not off:
        yield
        return
    old = os.environ.get("GNNIO_NO_PROGRESS")
    os.environ["GNNIO_NO_PROGRESS"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("GNNIO_NO_PROGRESS", None)
        else:
            os.environ["GNNIO_NO_PROGRESS"] = old


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def rank_main(argv: list[str]) -> int:
    """One rank of ``gnnio train --nproc N`` (started by :func:`gnnio.distributed.launch.launch`): the
    command line with exceptions propagated and recorded for the elastic agent."""
    from torch.distributed.elastic.multiprocessing.errors import record

    # Ctrl-C reaches every process of the terminal's group; the launcher's agent (gnnio's or
    # torchrun's) stops the ranks and gnnio prints its one line. A rank ends at once, by the
    # signal's default action: a KeyboardInterrupt would print a traceback per rank, or abort
    # inside a C++ callback ("terminate called after throwing ... KeyboardInterrupt")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    warnings.formatwarning = _one_line_warnings(warnings.formatwarning)

    @record
    def run() -> int:
        args = build_parser().parse_args(normalise_argv(list(argv)))
        args.argv, args.rank_entry = list(argv), rank_main
        with _bars_off(getattr(args, "no_progress", False)):
            rc = int(args.func(args) or 0)
        if rc != 0:
            raise SystemExit(rc)
        return rc

    return int(run() or 0)  # (record's wrapper is typed to return None too)


if __name__ == "__main__":
    sys.exit(main())
