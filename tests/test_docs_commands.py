"""The user docs' command lines still parse: every ``gnnio ...`` line in README.md and the user
guides under docs/ (in backticks or a code block) is read by the CLI's own parser, so an option
renamed or removed in the code cannot stay in the docs. Placeholders (``DIR``, ``K``, ``$VAR``) and
fragments that leave out a required argument are allowed; an unknown option or an unknown choice
spelled in lower case is not. docs/benchmarks.md is left out: it records commands as they ran on
the day."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gnnio.cli.main import build_parser
from gnnio.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/design.md", "docs/format.md", "docs/pyg.md"]


def _commands(text: str) -> list[str]:
    found = re.findall(r"`(gnnio [^`]+)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.strip().removeprefix(".venv/bin/")
            if line.startswith("gnnio "):
                found.append(line)
    out = []
    for c in found:  # one command per piece of a shell line, comments and redirections dropped
        for piece in re.split(r"&&|\|\||;|\|", c.split(" #")[0]):
            piece = piece.split(">")[0].strip()
            if piece.startswith("gnnio "):
                out.append(" ".join(piece.split()))
    return out


def _refusal(argv: list[str]) -> str | None:
    """The parser's complaint about ``argv``, None where it parses or misses only a placeholder's
    value or a required argument (a fragment quoted in prose)."""
    try:
        build_parser().parse_args(argv)
    except (UsageError, SystemExit) as e:
        msg = str(e)
        if "unrecognized arguments" in msg:
            return msg
        m = re.search(r"invalid choice: '([^']*)'", msg)
        if m and not m.group(1).isupper():
            return msg
    return None


def test_the_docs_hold_commands_to_check():
    assert len([c for d in DOCS for c in _commands((ROOT / d).read_text())]) > 50


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_in_the_user_docs_parses(doc):
    bad = []
    for c in _commands((ROOT / doc).read_text()):
        try:
            argv = [a for a in shlex.split(c)[1:] if a not in ("...", "…")]  # (elided options)
        except ValueError:  # (an unbalanced quote across a line break in prose)
            continue
        if any(a.startswith("$") for a in argv):
            continue
        why = _refusal(argv)
        if why:
            bad.append(f"{c!r}: {why}")
    assert bad == []
