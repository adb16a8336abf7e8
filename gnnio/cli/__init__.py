"""The ``gnnio`` command line; each subcommand lives in its own module with ``register(sub)``."""
