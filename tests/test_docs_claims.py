"""What the user docs' prose and tables claim about the code, checked against the code: every
``--option`` they name exists (in gnnio's parser, or in the named tool or script that takes it),
every default they state next to an option is the parser's (its value, its flag-alone value, or
the default its ``--help`` states where the parser's is None), every ``gnnio/...`` path and
``gnnio.x.y`` name in backticks exists, every test they cite exists, every ``GNNIO_*`` variable
they name is read by the code, docs/pyg.md's argument table is the loader's, and the summary keys
README.md names are written by a small run (three in-process trainings). The docs' command lines
are parsed by tests/test_docs_commands.py and their code blocks run by tests/test_docs_python.py.
docs/benchmarks.md is left out: it records runs as they were on the day."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import warnings
from pathlib import Path

import pytest

from gnnio.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/design.md", "docs/format.md", "docs/pyg.md"]

#: options the docs name that belong to another program: (option, file that must take it or None)
FOREIGN = {
    "--check": None,  # ruff format --check
    "--dev": "scripts/setup.sh",
    "--nnodes": None,  # torchrun's
    "--node-rank": None,
    "--nproc-per-node": None,
    "--master-addr": None,
    "--master-port": None,
    "--rdzv-conf": None,
    "--data": "examples/pyg_training_loop.py",
    "--scripts": "benchmarks/pyg_examples/compare.py",
    "--first-seed": "benchmarks/pyg_examples/compare.py",
}


def _text(doc: str) -> str:
    return (ROOT / doc).read_text()


def _actions() -> dict[str, list[argparse.Action]]:
    """Every option string of every (sub)command -> its actions."""
    found: dict[str, list[argparse.Action]] = {}

    def walk(parser: argparse.ArgumentParser) -> None:
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    walk(sub)
            for o in a.option_strings:
                found.setdefault(o, []).append(a)

    walk(build_parser())
    return found


def _options_named(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


@pytest.mark.parametrize("doc", DOCS)
def test_every_option_the_docs_name_exists(doc):
    actions = _actions()
    bad = []
    for opt in sorted(_options_named(_text(doc))):
        if opt in actions:
            continue
        if opt not in FOREIGN:
            bad.append(f"{opt}: no gnnio command takes it")
        elif FOREIGN[opt] and f"{opt}" not in (ROOT / FOREIGN[opt]).read_text():
            bad.append(f"{opt}: {FOREIGN[opt]} does not take it")
    assert bad == []


def _stated_defaults(action: argparse.Action) -> set[str]:
    """The parser's default, the flag-alone value, and every default the help text states."""
    out = set()
    for value in (action.default, action.const):
        if value is None or isinstance(value, bool) or value == argparse.SUPPRESS:
            continue
        out.add(",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))
    for m in re.findall(
        r"default(?: there)?:? ([^;()%]+?)(?:[;),%]|$| for | with)", action.help or ""
    ):
        out.add(m.strip())
    return out


def _same(claim: str, stated: str) -> bool:
    if claim == stated:
        return True
    try:
        return float(claim) == float(stated)
    except ValueError:
        return False


#: a default stated in the docs: "`X` (default)", "`X` by default", "(default `X`", "default N"
CLAIM = re.compile(
    r"`([^`]+)` \(default\)|`([^`]+)` by default|\(default `([^`]+)`|default:? ([0-9][\w.,]*)"
)


def _default_claims(doc: str):
    """(line, option, value) for each default stated on a line after an option it belongs to: a
    number goes with the last option named before it, a choice with the last named before it
    that has that choice."""
    actions = _actions()
    for ln, line in enumerate(_text(doc).splitlines(), 1):
        for m in CLAIM.finditer(line):
            named = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line[: m.start()])
            if not named:
                continue
            value = next(g for g in m.groups() if g).rstrip(",.")
            opt = named[-1]
            if m.group(4) is None:  # a choice: the option that offers it
                opt = next(
                    (
                        o
                        for o in reversed(named)
                        if any(value in (a.choices or ()) for a in actions.get(o, ()))
                    ),
                    opt,
                )
            yield ln, opt, value


def test_the_docs_state_defaults_to_check():
    assert sum(len(list(_default_claims(d))) for d in DOCS) >= 15


@pytest.mark.parametrize("doc", DOCS)
def test_every_default_the_docs_state_is_the_parsers(doc):
    actions = _actions()
    bad = []
    for ln, opt, value in _default_claims(doc):
        stated = set().union(*(_stated_defaults(a) for a in actions.get(opt, ())))
        if not any(_same(value, s) for s in stated):
            bad.append(f"{doc}:{ln}: {opt} default {value!r}, the parser says {sorted(stated)}")
    assert bad == []


def _backticked(doc: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _text(doc))


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_and_name_in_backticks_exists(doc):
    bad = []
    for tick in _backticked(doc):
        for path in re.findall(
            r"(?<![\w./-])((?:gnnio|tests|scripts|benchmarks|examples|docs)/[\w./-]*\w)", tick
        ):
            if not (ROOT / path).exists():
                bad.append(f"{path}: no such file or folder")
        for name in re.findall(r"\bgnnio(?:\.\w+)+", tick):
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                try:
                    for attr in parts[i:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    bad.append(f"{name}: does not resolve")
                break
    assert bad == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_test_the_docs_cite_exists(doc):
    """``test_x.py`` files, ``test_x.py::name`` (a trailing ``*`` is a prefix) and the bare
    ``::name`` that continue the file named last."""
    bad, current = [], None
    text = _text(doc)
    for f in sorted(set(re.findall(r"\b(test_\w+\.py)\b", text))):
        if not (ROOT / "tests" / f).exists():
            bad.append(f"tests/{f}: missing")
    for m in re.finditer(r"\b(test_\w+\.py)\b|::(\w+)(\*?)", text):
        if m.group(1):
            current = m.group(1)
            continue
        path = ROOT / "tests" / (current or "")
        if current is None or not path.is_file():
            continue
        if not re.search(rf"def {m.group(2)}" + ("" if m.group(3) else r"\b"), path.read_text()):
            bad.append(f"{current}::{m.group(2)}{m.group(3)}: no such test")
    assert bad == []


def test_every_gnnio_variable_the_docs_name_is_read():
    code = "\n".join(p.read_text() for p in (ROOT / "gnnio").rglob("*.py"))
    code += "\n".join(p.read_text() for p in (ROOT / "scripts").iterdir() if p.is_file())
    named = {v for d in DOCS for v in re.findall(r"\bGNNIO_[A-Z_]*[A-Z]\b", _text(d))}
    assert len(named) >= 5
    assert sorted(v for v in named if f'"{v}"' not in code and f"{v}=" not in code) == []


def test_the_pyg_argument_table_is_the_loaders():
    """docs/pyg.md's table of NeighborLoader's arguments says what ``gnnio.pyg.arguments`` does
    with each one, row for row (the module calls itself the table the docs show)."""
    from gnnio.pyg.arguments import ARGUMENTS

    row = r"^\| `(\w+)` \| (implemented|mapped|refused) \| (.*) \|$"
    rows = {m[0]: (m[1], m[2]) for m in re.findall(row, _text("docs/pyg.md"), re.M)}
    assert rows == ARGUMENTS


#: (run, dotted summary key) for every summary key README.md names; each key must be named there
SUMMARY_KEYS = [
    ("plain", "plan"),
    ("plain", "kernels"),
    ("plain", "bytes_by_tier"),
    ("plain", "simulated"),
    ("plain", "simulated_parts"),
    ("plain", "hidden_fraction"),
    ("plain", "loss_history"),
    ("plain", "rss_mb_per_epoch"),
    ("plain", "history.rss_mb"),
    ("plain", "heap"),
    ("graphed", "cuda_graph.sampler.by_sampler"),
    ("graphed", "isolation"),
    ("graphed", "isolation_profile.cores_by_stage"),
    ("disk", "disk"),
    ("disk", "disk_read_bytes"),
    ("disk", "bytes_by_tier.disk"),
    ("disk", "bytes_by_tier.host_cache"),
]
RUNS = {
    "plain": [],
    "graphed": ["--cuda-graph", "sampler", "--isolation", "auto"],
    "disk": ["--features-on", "disk", "--host-cache-size", "0.1"],
}


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    from gnnio.cli.main import main

    from .helpers import write_tiny_dataset

    tmp = tmp_path_factory.mktemp("claims")
    ds = write_tiny_dataset(tmp / "ds", num_nodes=60, num_edges=240)
    out = {}
    for name, extra in RUNS.items():
        path = tmp / f"{name}.json"
        argv = ["train", str(ds), "--epochs", "1", "--batch-size", "8", "--fanouts", "3,2"]
        with _quiet():
            assert main([*argv, *extra, "--summary", str(path), "--quiet"]) == 0
        out[name] = json.loads(path.read_text())
    return out


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():  # (the CPU's --cuda-graph and --isolation warnings)
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize(("run", "key"), SUMMARY_KEYS)
def test_the_summary_keys_the_readme_names_are_written(summaries, run, key):
    readme = _text("README.md")
    assert f"`{key}`" in readme or f"`{key.split('.')[-1]}`" in readme
    value = summaries[run]
    for part in key.split("."):
        value = value[-1] if isinstance(value, list) else value
        assert part in value, f"{key}: no {part!r} in the summary of the {run} run"
        value = value[part]
