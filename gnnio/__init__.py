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
    "load",
    "__version__",
]
