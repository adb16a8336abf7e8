"""Tiers over a base store: hot rows on a GPU, the rest read zero-copy from pinned host memory
(Data Tiering), and per-GPU shards read through a placement (Song & Jiang). The public names are
exported from :mod:`gnnio.features`."""
