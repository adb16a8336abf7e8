"""Exceptions that the CLI turns into one-line errors (no traceback)."""

__all__ = ["GnnioError", "DatasetError", "UsageError"]


class GnnioError(Exception):
    """Base class: the message is one line naming the file/argument and the problem."""


class DatasetError(GnnioError):
    """A dataset directory or input file is missing, malformed or violates an invariant."""


class UsageError(GnnioError):
    """A bad command-line argument or option combination."""
