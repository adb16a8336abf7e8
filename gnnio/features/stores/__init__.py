"""Base feature stores: where every row lives (RAM or a GPU, a memory-mapped file, a file read
with ``O_DIRECT``). The public names are exported from :mod:`gnnio.features`."""
