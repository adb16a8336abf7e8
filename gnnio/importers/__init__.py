"""Importers: each module turns one source into a gnnio dataset directory.

Each importer module provides
  - ``HELP`` / ``DESCRIPTION``: text for ``gnnio prepare SOURCE --help``;
  - ``add_arguments(parser)``: its CLI options (``--out``, ``--overwrite``, ``--quiet`` are added by
    the dispatcher);
  - ``run(args) -> Path``: the CLI glue, calling
  - a library function ``prepare_<source>(..., out, overwrite=False, progress=True) -> Path`` that
    writes through :class:`gnnio.graph.DatasetWriter` (atomic: temp dir + rename).
"""

from . import facebook, npy, ogb, planetoid, pyg, synthetic

IMPORTERS = {
    "synthetic": synthetic,
    "planetoid": planetoid,
    "facebook": facebook,
    "ogb": ogb,
    "npy": npy,
    "pyg": pyg,
}

__all__ = ["IMPORTERS"]
