"""gnnio: fast mini-batch GNN training on graphs whose features do not fit in GPU memory."""

from .errors import DatasetError, GnnioError

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

#: names imported on first use: ``import gnnio`` loads no NumPy, torch or PyG code, so the command
#: line can turn an interrupt while those load into one line (gnnio.cli.main)
_LAZY = {
    "CSRGraph": "gnnio.graph",
    "Dataset": "gnnio.graph",
    "DatasetWriter": "gnnio.graph",
    "load": "gnnio.graph",
    "from_pyg": "gnnio.importers.pyg",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
