"""Benchmarks behind ``gnnio bench``; each module: HELP, add_arguments(parser), run(args) -> dict."""
