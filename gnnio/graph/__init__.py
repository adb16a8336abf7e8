"""Topology, the dataset object, and the on-disk format."""

from .csr import CSRGraph, edges_to_csr, index_dtype
from .dataset import Dataset, info_stats, load
from .format import FORMAT_VERSION, DatasetWriter

__all__ = [
    "CSRGraph",
    "Dataset",
    "DatasetWriter",
    "FORMAT_VERSION",
    "edges_to_csr",
    "index_dtype",
    "info_stats",
    "load",
]
