"""The wording of ``gnnio``'s one-line errors: what is wrong with a path, the flag (not an
internal name) of a value out of range, the command whose ``--help`` to read."""

from __future__ import annotations

import re

import pytest
import torch

from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("wording")
    (root / "afile").write_text("x")
    return {"D": str(write_tiny_dataset(root / "ds", 40, 160)), "FILE": str(root / "afile"),
            "NONE": str(root / "none"), "ROOT": str(root)}  # fmt: skip


CASES = [
    ("info NONE", "NONE: no such directory"),
    ("info FILE", "FILE: not a directory"),
    ("train NONE", "NONE: no such directory"),
    ("reorder NONE --by degree --out ROOT/r", "NONE: no such directory"),
    ("bench sampling NONE", "NONE: no such directory"),
    ("train D --resume FILE --quiet", "--resume FILE: not a directory"),
    ("train D --resume NONE --quiet", "--resume NONE: no such checkpoint directory"),
    ("reorder D --by wrpr --damping 2 --out ROOT/r", "argument --damping: must be in [0, 1]"),
    ("reorder D --by rpr --iterations -1 --out ROOT/r", "argument --iterations: must be >= 0"),
    ("reorder D --by presample --batch-size 0 --out ROOT/r", "argument --batch-size: must be >= 1"),
    ("reorder D --by presample --epochs 0 --out ROOT/r", "argument --epochs: must be >= 1"),
    ("reorder D --by degree --damping 0.5 --out ROOT/r", "--damping: only applies to rpr and wrpr"),
    ("bench hotness D --epochs 0", "argument --epochs: must be >= 1"),
    ("bench tiers D --batch-size 0", "argument --batch-size: must be >= 1"),
    (
        "bench tiers D --device foo",
        "--device: unknown device 'foo' (use cpu, cuda, cuda:N or auto)",
    ),
    (
        "bench loader D --device foo",
        "--device: unknown device 'foo' (use cpu, cuda, cuda:N or auto)",
    ),
    ("train D --device foo", "(use cpu, cuda, cuda:N or auto)"),
    ("train D --epochz 1", "unrecognized arguments: --epochz 1 (see 'gnnio train --help')"),
    ("bench tiers D --foo", "(see 'gnnio bench tiers --help')"),
]
if not torch.cuda.is_available():
    CASES.append(("bench tiers D --device cuda", "--device cuda: CUDA is not available on this "
                  "machine (use --device cpu)"))  # fmt: skip


def _fill(text: str, paths: dict) -> str:
    """``text`` with the upper-case names of ``paths`` (whole words) filled in."""
    return re.sub(r"\b(D|FILE|NONE|ROOT)\b", lambda m: paths[m.group(1)], text)


@pytest.mark.parametrize("argv,words", CASES, ids=[c[0] for c in CASES])
def test_error_line_says_what_is_wrong(argv, words, paths, capsys):
    assert main(_fill(argv, paths).split()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and _fill(words, paths) in err, err


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's line breaks as spaces


@pytest.mark.parametrize(
    "argv,shown",
    [
        (["reorder"], "(default: 15,10,5)"),
        (["prepare", "synthetic"], "sj_fanout and presample (default: 15,10,5)"),
        (["prepare", "synthetic"], "three numbers (default: 0.1 0.05 0.1)"),
        (["bench", "tiers"], "hop 1 first (default: 15,10,5)"),
        (["bench", "hotness"], "hop 1 first (default: 15,10,5)"),
        (["train"], "feature gather (default: min(8, the CPU cores)"),
        (["reorder"], "sampler threads (presample) (default: min(8, the CPU cores))"),
        (["partition"], "for the epoch (default: min(8, the CPU cores))"),
    ],
)
def test_help_shows_defaults_as_the_option_takes_them(argv, shown, capsys):
    text = _help(argv, capsys)
    assert shown in text and "[15, 10, 5]" not in text and "[0.1, 0.05, 0.1]" not in text


def test_a_default_as_shown_is_accepted_and_a_bad_list_named_once(paths, capsys):
    from gnnio.cli.main import build_parser

    args = build_parser().parse_args(["reorder", "d", "--by", "sj", "--out", "o", "--fanouts",
                                      "15,10,5"])  # fmt: skip
    assert args.fanouts == [15, 10, 5]
    args = build_parser().parse_args(["prepare", "synthetic", "--out", "o", "--split",
                                      "0.1", "0.05", "0.1", "--reorder-fanouts", "15,10,5"])  # fmt: skip
    assert args.reorder_fanouts == [15, 10, 5] and args.split == [0.1, 0.05, 0.1]
    for argv, opt in ((["reorder", paths["D"], "--by", "sj", "--out", "o"], "--fanouts"),
                      (["prepare", "synthetic", "--out", "o"], "--reorder-fanouts"),
                      (["bench", "tiers", paths["D"]], "--fanouts")):  # fmt: skip
        assert main([*argv, opt, "[15, 10, 5]"]) == 2
        err = capsys.readouterr().err
        assert f"argument {opt}: expected comma-separated integers" in err, err
        assert err.count("fanouts:") == 1, err  # not "argument --fanouts: --fanouts: ..."


def test_version_answers_without_loading_torch_and_as_argparse_does():
    """``gnnio --version`` prints argparse's line at once, without importing torch or numba (the
    parser's build imports both: seconds), and the parser still knows the same version."""
    import subprocess
    import sys

    code = (
        "import sys; from gnnio.cli.main import main; rc = main(['--version']); "
        "print(rc, 'torch' in sys.modules, 'numba' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from gnnio import __version__

    assert out.stdout.splitlines() == [f"gnnio {__version__}", "0 False False"]
    from gnnio.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])


def test_help_a_mistyped_command_and_info_load_no_torch(paths):
    """``gnnio --help`` and a mistyped command answer from the commands' names alone (no NumPy,
    numba or torch: they took seconds); ``gnnio info`` opens and checks a dataset without torch.
    The deferral of Ctrl-C during numba's compiles is installed before ``info`` runs."""
    import subprocess
    import sys

    code = (
        "import sys, signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # (a terminal's; not xdist's)
        "from gnnio.cli.main import main\n"
        "def heavy(): return [m for m in ('torch', 'numpy', 'numba') if m in sys.modules]\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    print('help', e.code, heavy())\n"
        "try:\n    main(['bench', '--help'])\nexcept SystemExit as e:\n"
        "    print('bench', e.code, heavy())\n"
        "print('typo', main(['trian']), heavy())\n"
        "import gnnio.cli.info as info\n"
        "real = info.run\n"
        "def run(args):\n"
        "    from gnnio.utils import interrupts\n"
        "    h = signal.getsignal(signal.SIGINT)\n"
        "    print('deferred', getattr(h, '__self__', None) is interrupts._installed is not None)\n"
        "    return real(args)\n"
        f"info.run = run\nrc = main(['info', {paths['D']!r}])\n"
        "print('info', rc, heavy())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.split(" ")[0] in ("help", "bench", "typo",
             "info", "deferred")]  # fmt: skip
    assert lines == ["help 0 []", "bench 0 []", "typo 2 []", "deferred True",
                     "info 0 ['numpy', 'numba']"]  # fmt: skip
    assert "invalid choice: 'trian'" in out.stderr


def test_the_command_list_is_the_same_whichever_command_is_built():
    """``build_parser(argv)`` registers only ``argv``'s command; the others stand in by name and
    help line: ``gnnio --help`` reads the same as with every command built, each command built
    alone is the one built with all (same options), and each module's parser has the listed
    help."""
    from gnnio.cli import COMMANDS
    from gnnio.cli.main import build_parser

    def subs(parser):
        return next(a for a in parser._actions if a.dest == "command")

    full = build_parser()
    assert build_parser([]).format_help() == full.format_help()
    assert list(subs(full).choices) == list(COMMANDS)
    for name in COMMANDS:
        alone = subs(build_parser([name, "DIR"])).choices
        assert alone[name].format_help() == subs(full).choices[name].format_help()
        others = [n for n in COMMANDS if n != name]
        assert all(alone[n].format_help() != subs(full).choices[n].format_help() for n in others)
    helps = {a.dest: a.help for a in subs(full)._choices_actions}
    assert helps == COMMANDS


def test_bench_builds_the_benchmark_it_runs_alone():
    """``gnnio bench KIND``: only KIND's module is registered (the same parser as with every
    benchmark built); the others stand in by name and help line; ``gnnio bench --help`` reads
    the same as with every benchmark built."""
    from gnnio.bench import KINDS
    from gnnio.cli.main import build_parser

    def kinds(parser):
        bench = next(a for a in parser._actions if a.dest == "command").choices["bench"]
        return bench, next(a for a in bench._actions if a.dest == "bench")

    full, full_kinds = kinds(build_parser())
    assert kinds(build_parser(["bench"]))[0].format_help() == full.format_help()
    assert list(full_kinds.choices) == list(KINDS)
    assert {a.dest: a.help for a in full_kinds._choices_actions} == KINDS
    for name in ("step", "dist-sampling"):
        _, alone = kinds(build_parser(["bench", name, "--json"]))
        assert alone.choices[name].format_help() == full_kinds.choices[name].format_help()
        other = next(k for k in KINDS if k != name)
        assert alone.choices[other].format_help() != full_kinds.choices[other].format_help()


@pytest.mark.parametrize(
    "argv,torch_at_start",
    [
        ("info D", False),
        ("reorder D --by degree --out ROOT/r_ --quiet", False),
        (
            "prepare synthetic --num-nodes 300 --avg-degree 4 --feat-dim 4 --out ROOT/s_ --quiet",
            False,
        ),  # fmt: skip
        ("partition D --parts 2 --out ROOT/p_", True),
        ("prepare pyg --module ROOT/pyg_graph.py --out ROOT/g_ --quiet", True),
        ("plan D --topology 2", True),
        ("train D --epochs 1 --quiet", True),
    ],
)
def test_a_command_on_torch_imports_it_while_ctrl_c_is_one_line(argv, torch_at_start, paths):
    """torch is imported inside :func:`gnnio.cli.main._loading` (where Ctrl-C ends in one line)
    for a command that runs on it, also where its module defers the import to the run
    (``partition``, ``plan``, ``train``: their parsers load without it); the commands that run
    without it never import it."""
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    argv = _fill(argv.replace("_ ", f"{uuid.uuid4().hex[:8]} "), paths).split()
    (Path(paths["ROOT"]) / "pyg_graph.py").write_text(
        "import types, torch\n"
        "data = types.SimpleNamespace(x=torch.ones(6, 2), y=torch.arange(6) % 2,\n"
        "                             edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]))\n"
    )
    code = (
        "import sys\n"
        "import gnnio.cli.main as m\n"
        "seen, real = [], m._loading\n"
        "def loading(load):\n"
        "    out = real(load)\n"
        "    seen.append('torch' in sys.modules)\n"
        "    return out\n"
        "m._loading = loading\n"
        f"rc = m.main({argv!r})\n"
        "print('result', rc, seen, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("result ")][-1]
    assert line == f"result 0 [False, {torch_at_start}] {torch_at_start}", (line, out.stderr)
