"""Installs the pyg-lib stand-in (``standin.py``) in every Python process started with
``GNNIO_PYG_STANDIN=1`` and this folder on ``PYTHONPATH``."""

import os

if os.environ.get("GNNIO_PYG_STANDIN") == "1":
    import standin

    standin.install()
