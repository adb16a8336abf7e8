"""gnnio: fast mini-batch GNN training on graphs whose features do not fit in GPU memory."""

from .errors import DatasetError, GnnioError
from .graph import CSRGraph, Dataset, DatasetWriter, load

__version__ = "0.1.0"

__all__ = [
    "CSRGraph",
    "Dataset",
    "DatasetError",
    "DatasetWriter",
    "GnnioError",
    "from_pyg",
    "load",
    "__version__",
]


def __getattr__(name: str):
    # ``gnnio.from_pyg`` is imported on first use: ``import gnnio`` stays free of PyG code
    if name == "from_pyg":
        from .importers.pyg import from_pyg

        return from_pyg
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
