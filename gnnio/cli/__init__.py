"""The ``gnnio`` command line; each subcommand lives in its own module with ``register(sub)``."""

import argparse

from ..errors import UsageError

#: the subcommands in ``gnnio --help``'s order, each with its one-line help. Each lives in
#: ``gnnio.cli.NAME`` with ``register(sub)``; they are kept here, where importing them costs
#: nothing, so ``gnnio --help`` (and a mistyped command) lists them without importing any
#: subcommand's module, and with it NumPy, numba and torch (:func:`gnnio.cli.main.build_parser`)
COMMANDS = {
    "prepare": "import a dataset (synthetic, planetoid, facebook, ogb, npy, pyg) into gnnio's "
    "format",
    "info": "validate a prepared dataset and print its statistics",
    "reorder": "relabel a dataset by a hotness score (hottest node gets id 0)",
    "partition": "partition the graph over ranks or machines (random, range, metis, bfs-block, "
    "hdr)",
    "plan": "compare multi-GPU feature placements with a cost model and recommend one",
    "train": "train a GNN (GraphSAGE, GCN, GAT, GIN) with mini-batch neighbour sampling",
    "bench": "benchmark a part on a dataset: sampling, gather, loader, tiers, caches, disk, the "
    "training step, ... (gnnio bench --help lists them)",
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help, except when the help already says what the
    default is or the default is None (the help then describes the unset behaviour)."""

    def _get_help_string(self, action):
        help_text = action.help or ""
        if action.default is None or "(default" in help_text:
            return help_text
        return super()._get_help_string(action)


def add_feature_dtype_argument(p: argparse.ArgumentParser) -> None:
    """``--feature-dtype`` of ``prepare`` and ``reorder`` (issue 25, item 4)."""
    from ..graph.feature_dtype import FEATURE_DTYPES

    p.add_argument(
        "--feature-dtype",
        choices=list(FEATURE_DTYPES),
        default=None,
        metavar="DTYPE",
        help="store the feature rows as DTYPE: float32, float16, bfloat16 (its bits as int16) or "
        "int8 (asymmetric per-column min/max quantization; the scale and zero point are kept as "
        "arrays x_scale and x_zero_point); every tier then stores and moves the compressed rows "
        "and the model decodes them on its device (default: as the input has them: float16 and "
        "bfloat16 stay, anything else float32)",
    )


def refuse_without_effect(rules) -> None:
    """One ``gnnio: error:`` line for the first option given where it would do nothing: ``rules``
    holds ``(option, value, needed, what)``; ``value`` None means not given (the option's default
    is None), ``needed`` false means the other options leave it no effect, ``what`` names what it
    needs ("OPTION: has no effect without WHAT")."""
    for option, given, needs, what in rules:
        if given is not None and not needs:
            raise UsageError(f"{option}: has no effect without {what}")
