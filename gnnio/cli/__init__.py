"""The ``gnnio`` command line; each subcommand lives in its own module with ``register(sub)``."""

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help, except when the help already says what the
    default is or the default is None (the help then describes the unset behaviour)."""

    def _get_help_string(self, action):
        help_text = action.help or ""
        if action.default is None or "(default" in help_text:
            return help_text
        return super()._get_help_string(action)
