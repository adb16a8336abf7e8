"""Benchmarks behind ``gnnio bench``; each benchmark module (listed in
:data:`gnnio.cli.bench.BENCHES`): HELP, add_arguments(parser), run(args) -> dict. Helpers:
:mod:`._timing` (timed passes), :mod:`.tier_bandwidth` (``gnnio bench tiers --bandwidth``),
:mod:`.gpu_check` (``scripts/gpu-check.sh``: the one-command GPU check)."""
