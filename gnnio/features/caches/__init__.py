"""Caches over any feature store: static / FIFO / LRU / LFU, the lookahead and optimal policies,
SIEVE and S3-FIFO, BGL's per-GPU sharded cache, and HyDRA's cross-batch reuse. The public names
are exported from :mod:`gnnio.features`."""
