"""The suite's temporary files go in one directory, removed when the session ends.

Left to themselves, the processes a test run starts leave thousands of entries in ``/tmp``: PyG
writes each ``MessagePassing`` class's generated ``propagate`` module to a temporary ``.py`` file
it never deletes (one per class per process), ``torchrun`` leaves a ``torchelastic_*`` directory
per launch, ``multiprocessing`` a ``pymp-*`` one per pool -- about 5,000 after a few runs on the
development VM. ``TMPDIR`` set here, before any test runs, is inherited by every subprocess (the
CLI, ``torchrun`` and its ranks) and read by :mod:`tempfile` in this one; pytest's ``tmp_path``
lives under it too. The process that made the directory removes it (a worker of a parallel run
reuses its parent's).
"""

from __future__ import annotations

import os
import shutil
import tempfile

_KEY = "GNNIO_TEST_TMPDIR"

if os.environ.get(_KEY) and os.path.isdir(os.environ[_KEY]):
    _OWNED = None  # a worker of a parallel run, or a nested pytest: the outer one cleans up
else:
    _OWNED = tempfile.mkdtemp(prefix="gnnio-tests-")
    os.environ[_KEY] = os.environ["TMPDIR"] = _OWNED
    tempfile.tempdir = None  # tempfile re-reads TMPDIR on its next call


def pytest_unconfigure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    if _OWNED is not None:
        shutil.rmtree(_OWNED, ignore_errors=True)
