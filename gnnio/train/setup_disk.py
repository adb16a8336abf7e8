"""Training with the feature rows on disk (issue 25): ``gnnio train DIR --features-on disk
--host-cache-size F [--cache-policy P] [--gpu-cache-fraction G]``. The stack, innermost first::

    DiskFeatureStore         rows read from the dataset's file with O_DIRECT     (tier "disk")
      -> FeatureCache        host cache of F * N rows, policy P (default sieve)  (tier "host_cache")
         -> TieredFeatureStore   hottest G of the rows on the GPU                (tier "gpu")

``--cache-policy`` names the host cache's policy here (static by ``--score``, sieve, s3fifo,
fifo, lru, lfu, or lookahead without a GPU tier); there is no second cache above it.

What an epoch reports (``rec["disk"]``, summed in the summary's ``disk``): the pages and bytes
the store read (``bytes_read``: the device bytes gnnio counted), the kernel's count of bytes this
process read from storage over the same training pass (``disk_read_bytes``, the ``read_bytes`` of
``/proc/self/io``: every thread, also the loader's, and every file: a first epoch can include
reads that are not rows, such as numba's cached kernels or modules imported lazily, when they were
not in the page cache), and ``read_amplification``. Evaluation reads are outside both. ``bytes_by_tier`` gets ``disk`` -- the device bytes read, whole blocks (512 B or 4 KiB),
the same count as ``bytes_read``, so the kernel's ``disk_read_bytes`` can be held against it;
``rows_by_tier["disk"]`` counts the rows -- and ``host_cache``; under a GPU tier its ``host``
entry (rows from below the GPU) is replaced by the two it consists of.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

__all__ = [
    "HOST_CACHE_POLICIES",
    "build_disk_base",
    "disk_epoch",
    "disk_line",
    "disk_mark",
    "disk_summary",
]

#: --cache-policy values for the host cache over the disk tier
HOST_CACHE_POLICIES = ("static", "sieve", "s3fifo", "fifo", "lru", "lfu", "lookahead")
DEFAULT_HOST_POLICY = "sieve"


def check_disk_options(cfg, ranks: int) -> None:
    """One line for an option that does not go with ``--features-on disk`` (or needs it)."""
    host = getattr(cfg, "host_cache_size", None)
    if cfg.store != "disk":
        if host is not None:
            raise UsageError("--host-cache-size: has no effect without --features-on disk")
        if cfg.cache_policy in ("sieve", "s3fifo"):
            raise UsageError(
                f"--cache-policy {cfg.cache_policy}: a host cache policy; needs --features-on disk"
            )
        return
    if ranks > 1:
        raise UsageError("--features-on disk: single-process only for now")
    if cfg.placement is not None:
        raise UsageError("--features-on disk: not with --placement (its buffers read the file)")
    if host is not None and not (0.0 <= host <= 1.0):
        raise UsageError(f"--host-cache-size: must be a fraction in [0, 1], got {host}")
    if cfg.cache_policy not in ("none", *HOST_CACHE_POLICIES):
        raise UsageError(
            f"--cache-policy {cfg.cache_policy}: with --features-on disk it is the host cache's "
            f"policy, one of {', '.join(HOST_CACHE_POLICIES)}"
        )
    if cfg.cache_policy == "lookahead" and cfg.gpu_cache_fraction is not None:
        raise UsageError(
            "--cache-policy lookahead: the host cache under a GPU tier sees no announced batches; "
            "drop --gpu-cache-fraction or pick another policy"
        )
    if cfg.cpu_cache_size:
        raise UsageError("--cpu-cache-size: with --features-on disk use --host-cache-size")


def host_policy(cfg) -> str:
    return DEFAULT_HOST_POLICY if cfg.cache_policy == "none" else cfg.cache_policy


def needs_disk_score(cfg) -> bool:
    """A static host cache ranks rows by ``--score``."""
    return bool(cfg.host_cache_size) and host_policy(cfg) == "static"


def build_disk_base(ds, cfg, get_score) -> tuple[Any, Any, tuple[str, ...], dict[str, Any]]:
    """``(store, disk, tiers, info)``: the disk store under its host cache (if any)."""
    from ..features.caches.cache import FeatureCache
    from ..features.stores.disk import DiskFeatureStore
    from ..features.tiers.tiered import hot_rows_for_fraction

    disk = DiskFeatureStore(ds.features, queue_depth=getattr(cfg, "disk_queue_depth", 16))
    info: dict[str, Any] = {
        "store": "disk",
        "disk": {
            "direct": disk.direct,
            "queue_depth": disk.queue_depth,
            "path": str(disk.path),
            "block_bytes": disk.block_size,
        },  # fmt: skip
    }
    frac = cfg.host_cache_size or 0.0
    if frac <= 0:
        return disk, disk, ("disk",), info
    policy = host_policy(cfg)
    hot = None
    if policy == "static":
        from ..preprocess.reorder import order_by_score

        hot = order_by_score(get_score())  # hottest first
    cap = hot_rows_for_fraction(min(frac, 1.0), ds.num_nodes)
    cache = FeatureCache(disk, cap, policy, hot_ids=hot, device="cpu", tier="host_cache",
                         lookahead=getattr(cfg, "lookahead", 8))  # fmt: skip
    info["host_cache"] = {"policy": policy, "size": frac, "capacity": int(cache.capacity)}
    return cache, disk, ("host_cache", "disk"), info


# ---- what an epoch read --------------------------------------------------------------------


def proc_read_bytes() -> int | None:
    """``read_bytes`` of ``/proc/self/io`` (bytes this process had read from storage), or None."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def disk_mark(setup) -> dict[str, Any]:
    """Counters before a training pass (see :func:`disk_epoch`)."""
    below = setup.disk_below_gpu
    return {
        "stats": dict(setup.disk.stats.as_dict()),
        "io": proc_read_bytes(),
        "below": below.counters.snapshot() if below is not None else None,
    }


def disk_epoch(setup, mark: dict[str, Any], rec: dict[str, Any]) -> None:
    """Add ``rec["disk"]`` (this pass's reads) and the disk tiers to ``rec["bytes_by_tier"]``."""
    now = setup.disk.stats.as_dict()
    d = {k: now[k] - mark["stats"][k] for k in ("pages_read", "bytes_read", "reads", "unique_rows")}
    io = proc_read_bytes()
    d["disk_read_bytes"] = io - mark["io"] if io is not None and mark["io"] is not None else None
    rb = setup.disk.row_bytes
    d["read_amplification"] = d["bytes_read"] / (d["unique_rows"] * rb) if d["unique_rows"] else 0.0
    rec["disk"] = d
    below = setup.disk_below_gpu
    if below is not None:  # the GPU tier's "host" rows came from the host cache or the disk
        after = below.counters.snapshot()
        rec["bytes_by_tier"].pop("host", None)
        rec["rows_by_tier"].pop("host", None)
        for kind, key in (("bytes", "bytes_by_tier"), ("rows", "rows_by_tier")):
            for t, v in after[kind].items():
                rec[key][t] = v - mark["below"][kind].get(t, 0)
    if "disk" in rec["bytes_by_tier"] or d["bytes_read"]:
        # the disk link moves whole blocks: its bytes are the device bytes read (O_DIRECT, every
        # one from the device), not rows x row bytes; rows_by_tier keeps the rows
        rec["bytes_by_tier"]["disk"] = int(d["bytes_read"])


def disk_summary(history: list[dict[str, Any]], setup) -> dict[str, Any]:
    """The summary's ``disk`` (totals over the training passes) and ``disk_read_bytes``."""
    recs = [h["disk"] for h in history if "disk" in h]
    tot = {k: int(sum(r[k] for r in recs)) for k in ("pages_read", "bytes_read", "reads")}
    uniq = sum(r["unique_rows"] for r in recs)
    kern = [r["disk_read_bytes"] for r in recs]
    io = None if not kern or any(v is None for v in kern) else int(sum(kern))
    rb = setup.disk.row_bytes
    return {
        "disk": {
            **tot,
            "read_amplification": tot["bytes_read"] / (uniq * rb) if uniq else 0.0,
            "direct": bool(setup.disk.direct),
            "queue_depth": int(setup.disk.queue_depth),
            "block_bytes": int(setup.disk.block_size),
            "bytes_read_per_epoch": [int(r["bytes_read"]) for r in recs],
            "scope": "training passes (evaluation excluded); bytes_read counted by the store, "
            "disk_read_bytes by the kernel (/proc/self/io read_bytes: every file this process "
            "read from storage, e.g. also numba's cached kernels in a first epoch)",
        },
        "disk_read_bytes": io,
    }


def disk_line(s: dict[str, Any]) -> str:
    """The line ``gnnio train`` prints about the disk tier, from the summary ``s``."""
    dk, kern = s["disk"], s.get("disk_read_bytes")
    return (
        f"disk ({'O_DIRECT' if dk['direct'] else 'buffered'}, queue depth {dk['queue_depth']}): "
        f"{dk['bytes_read'] / 2**20:,.1f} MiB read in {dk['pages_read']:,} blocks of "
        f"{dk.get('block_bytes', 4096)} B, read "
        f"amplification {dk['read_amplification']:.2f}"
        + (f"; the kernel counted {kern / 2**20:,.1f} MiB" if kern is not None else "")
    )
