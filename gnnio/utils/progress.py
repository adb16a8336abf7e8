"""Progress bars (tqdm on stderr). Disabled with ``enabled=False`` or GNNIO_NO_PROGRESS=1."""

from __future__ import annotations

import os

from tqdm.auto import tqdm

__all__ = ["bar"]


def bar(total: int | None = None, desc: str = "", unit: str = "it", enabled: bool = True, **kw):
    disable = (not enabled) or os.environ.get("GNNIO_NO_PROGRESS") == "1"
    return tqdm(
        total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, leave=False, **kw
    )
