"""argparse value types with a range: a value out of range is one line (exit 2, before anything
runs; :class:`gnnio.cli.main.OneLineParser`), ``gnnio: error: argument --threads: must be >= 1,
got 0 (see 'gnnio train --help')``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = [
    "COMMON_RANGES",
    "apply_common_ranges",
    "fanouts_arg",
    "int_range",
    "positive_float",
    "seconds_up_to",
]


def int_range(least: int, most: int | None = None) -> Callable[[str], int]:
    """An ``int`` type accepting values in ``[least, most]`` (``most`` None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {v}")
        if most is not None and v > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {v}")
        return v

    parse.__name__ = "int"
    return parse


def fanouts_arg(text: str) -> list[int]:
    """Comma-separated fanouts (``15,10,5``; -1 = all neighbours), one hop at least. Give the
    option the default as the same text (``default="15,10,5"``): ``--help`` then shows it in the
    form the option takes, and argparse parses it like a given value."""
    from ..sampling.threaded import parse_fanouts

    try:
        return parse_fanouts(text)
    except ValueError as e:  # "--fanouts: ..." or "fanouts: ...": argparse names the option
        msg = str(e)  # itself ("argument --reorder-fanouts: ..."), so without the prefix
        if msg.lstrip("-").startswith("fanouts: "):
            msg = msg.split(": ", 1)[1]
        raise argparse.ArgumentTypeError(msg) from None


fanouts_arg.__name__ = "fanouts"


def positive_float(text: str) -> float:
    """A finite ``float`` > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def seconds_up_to(most: float) -> Callable[[str], float]:
    """A ``float`` number of seconds in ``(0, most]`` (a timeout the standard library can hold)."""

    def parse(text: str) -> float:
        v = positive_float(text)
        if v > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g} seconds, got {text}")
        return v

    parse.__name__ = "float"
    return parse


#: options every command shares, by argparse ``dest``: the range each must be in
COMMON_RANGES: dict[str, Callable[[str], int | float]] = {
    "threads": int_range(1, 4096),
    "seed": int_range(0, 2**63 - 1),
    "passes": int_range(1),
    "warmup": int_range(0),
    "po_sequences": int_range(1),
    "dist_timeout": seconds_up_to(1e7),
    "pagraph_max_nodes": int_range(0),  # (a negative cap skipped pagraph on every graph)
}


def apply_common_ranges(parser: argparse.ArgumentParser) -> None:
    """Give every ``int``/``float`` option of ``parser`` and its subcommands whose ``dest`` is in
    :data:`COMMON_RANGES` that range (``--threads 0`` on any benchmark is then argparse's one
    line instead of a traceback from deep inside the sampler)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_common_ranges(sub)
        elif action.type in (int, float) and action.dest in COMMON_RANGES:
            action.type = COMMON_RANGES[action.dest]
