"""Benchmarks behind ``gnnio bench``; each benchmark module (``gnnio.bench.NAME`` for each
name of :data:`KINDS`, ``-`` read as ``_``): HELP (its line of :data:`KINDS`), add_arguments(parser),
run(args) -> dict. Helpers: :mod:`._timing` (timed passes), :mod:`.tier_bandwidth` (``gnnio bench
tiers --bandwidth``), :mod:`.gpu_check` (``scripts/gpu-check.sh``: the one-command GPU check).

This package imports nothing: ``gnnio bench --help`` lists the benchmarks from :data:`KINDS`
without importing their modules (and torch with them)."""

#: benchmark name -> its one-line help, in ``gnnio bench --help``'s order
KINDS = {
    "sampling": "sampled edges/s, ms/batch and input nodes/batch of a neighbour sampler",
    "gather": "feature-gather bandwidth (GB/s) of a store vs. a random 512-byte-row memory ceiling",
    "loader": "mini-batches per second through the pipelined loader (sample + gather, overlapped)",
    "hotness": "how much of the sampled feature reads each hotness score's top nodes capture",
    "reorder": "edges/s of the CSR relabel (numba vs numpy vs plain reference)",
    "placement": "time placement strategies (Algorithm 1, ...) on a large synthetic score vector",
    "tiers": "host->GPU bytes of a tiered feature store vs hot fraction, per hotness score",
    "cache": "feature-cache hit ratio / overhead per policy, size and seed order; eta1 per batch size",
    "locality": "host feature traffic of locality-aware sampling for several scales s",
    "dist": "feature fetch across ranks per placement: bytes per link (measured vs modeled), ms/batch",
    "dist-sampling": "neighbour sampling over a partitioned topology: bytes per link, requests, ms per batch",
    "disk": "the O_DIRECT feature tier: device ceilings, random-row reads, epochs with host caches",
    "step": "where the time of a training batch goes (sample, gather, forward, backward, ...)",
}
