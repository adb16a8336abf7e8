"""The machine a placement is planned for: GPUs, NVLink groups, link bandwidths, memory budget.

One :class:`Topology` drives both the cost model (modeled seconds from counted bytes) and the
simulated multi-device stores used on machines without GPUs (see docs/design.md, "Multi-GPU feature placement").

Devices are numbered ``0 .. num_gpus - 1``. An **NVLink group** is a set of GPUs that can read each
other's memory over fast links (an NVLink bridge pair, or all GPUs behind an NVSwitch); a GPU reads
a row from its own memory, else from a GPU of its group, else from host memory over PCIe
(Song & Jiang §3, Fig. 3). GPUs in different groups never read from each other.

Group shorthand (the ``--topology`` argument), terms joined by ``+``:

* ``"4"`` -- one group of four all-connected GPUs (Song & Jiang's "4GPU");
* ``"2+2"`` -- two NVLink pairs (their "(2+2)GPU");
* ``"2*4"`` -- four groups of 2, i.e. eight GPUs in pairs (their "(2*4)GPU"): ``a*b`` is ``b``
  groups of ``a`` GPUs;
* ``"1+1"`` or ``"1*2"`` -- two standalone GPUs (PCIe only, Rule 1 applies).

Units: bandwidths are bytes per second (one direction, per GPU); memory sizes are bytes. Files and
flags also accept strings with units: ``"12 GB/s"``, ``"100 Gb/s"``, ``"16 GiB"``.

Preset bandwidths are *nominal* figures from vendor specifications (see each preset's ``note``),
not measurements; contention between GPUs sharing a PCIe switch or the host memory bus is not
modeled.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = [
    "Topology",
    "PRESETS",
    "parse_groups",
    "parse_bytes",
    "parse_bandwidth",
    "load_topology",
    "topology_from_dict",
]

GB = 1e9
GiB = 2**30

# Defaults for the shorthand forms ("2", "2+2", "4", "2*4", "8"): Song & Jiang's platform, V100
# GPUs behind an NVSwitch (six NVLink2 links of 25 GB/s per direction) with PCIe 3.0 x16 to the
# host (15.75 GB/s nominal, ~12 GB/s achievable), 32 GB GPUs, 100 Gb/s network.
DEFAULT_HOST_BW = 12 * GB
DEFAULT_PEER_BW = 150 * GB
DEFAULT_NETWORK_BW = 12.5 * GB
DEFAULT_GPU_MEMORY = 32 * GiB


@dataclass(frozen=True)
class Topology:
    """One machine's GPUs and links.

    Attributes:
        name: a label for reports (preset name, shorthand or file name).
        groups: NVLink groups as tuples of device indices; together they cover ``0..n-1`` once.
        host_bw: host memory -> one GPU over PCIe, bytes/s (per GPU; contention not modeled).
        peer_bw: one GPU -> another GPU of its group (NVLink/NVSwitch), bytes/s per direction.
        network_bw: between machines, bytes/s (recorded for multi-machine plans).
        gpu_memory_bytes: total memory of each GPU, bytes (informational), or None.
        feature_budget_bytes: memory each GPU may spend on feature rows, bytes, or None when the
            buffer is given as a fraction of N instead.
        note: where the numbers come from.
    """

    name: str
    groups: tuple[tuple[int, ...], ...]
    host_bw: float = DEFAULT_HOST_BW
    peer_bw: float = DEFAULT_PEER_BW
    network_bw: float = DEFAULT_NETWORK_BW
    gpu_memory_bytes: int | None = DEFAULT_GPU_MEMORY
    feature_budget_bytes: int | None = None
    note: str = ""
    _group_of: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups = tuple(tuple(int(d) for d in g) for g in self.groups)
        object.__setattr__(self, "groups", groups)
        flat = sorted(d for g in groups for d in g)
        if not groups or any(len(g) == 0 for g in groups):
            raise UsageError(f"topology {self.name!r}: needs at least one non-empty GPU group")
        if flat != list(range(len(flat))):
            raise UsageError(
                f"topology {self.name!r}: groups must cover devices 0..{len(flat) - 1} exactly "
                f"once, got {[list(g) for g in groups]}"
            )
        for attr in ("host_bw", "peer_bw", "network_bw"):
            v = getattr(self, attr)
            if not (0 < float(v) <= MAX_BANDWIDTH):  # also NaN and infinity
                raise UsageError(
                    f"topology {self.name!r}: {attr} must be in (0, {MAX_BANDWIDTH:.0e}] "
                    f"bytes/s, got {v}"
                )
        for attr in ("gpu_memory_bytes", "feature_budget_bytes"):
            v = getattr(self, attr)
            if v is not None and int(v) < 0:
                raise UsageError(f"topology {self.name!r}: {attr} must be >= 0 bytes, got {v}")
        group_of = [0] * len(flat)
        for gi, g in enumerate(groups):
            for d in g:
                group_of[d] = gi
        object.__setattr__(self, "_group_of", tuple(group_of))

    @property
    def num_gpus(self) -> int:
        return len(self._group_of)

    @property
    def shorthand(self) -> str:
        """The groups as text: ``"4"``, ``"2+2"``, ``"2*4"`` (``a*b`` for ``b > 2`` equal groups)."""
        sizes = [len(g) for g in self.groups]
        if len(sizes) > 2 and len(set(sizes)) == 1:
            return f"{sizes[0]}*{len(sizes)}"
        return "+".join(str(s) for s in sizes)

    def group_of(self, device: int) -> tuple[int, ...]:
        """The NVLink group (device indices) that ``device`` belongs to."""
        self._check_device(device)
        return self.groups[self._group_of[device]]

    def peers(self, device: int) -> tuple[int, ...]:
        """The other GPUs ``device`` may read from over NVLink (empty for a standalone GPU)."""
        return tuple(d for d in self.group_of(device) if d != device)

    @property
    def peers_cheaper(self) -> bool:
        """True when ``C_gpu < C_cpu`` (Eq. 3, first case): peer reads beat host reads."""
        return self.peer_bw > self.host_bw

    def c_host(self, row_bytes: int) -> float:
        """``C_cpu``: seconds to read one row of ``row_bytes`` from host memory."""
        return row_bytes / self.host_bw

    def c_peer(self, row_bytes: int) -> float:
        """``C_gpu``: seconds to read one row of ``row_bytes`` from a GPU of the same group."""
        return row_bytes / self.peer_bw

    @property
    def alpha(self) -> float:
        """``C_gpu / C_cpu`` = host_bw / peer_bw: the threshold of Eq. 7 implied by the links."""
        return self.host_bw / self.peer_bw

    def buffer_rows(self, row_bytes: int) -> int | None:
        """Rows of ``row_bytes`` that fit in ``feature_budget_bytes`` (None if no budget is set)."""
        if self.feature_budget_bytes is None:
            return None
        return int(self.feature_budget_bytes) // int(row_bytes)

    def with_overrides(self, **kw: Any) -> Topology:
        """A copy with some fields replaced (``None`` values are ignored)."""
        kw = {k: v for k, v in kw.items() if v is not None}
        return replace(self, **kw) if kw else self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("_group_of", None)
        d["groups"] = [list(g) for g in self.groups]
        d["num_gpus"] = self.num_gpus
        return d

    def describe(self) -> str:
        """One line for reports."""
        budget = (
            f", feature budget {self.feature_budget_bytes / GiB:.2f} GiB/GPU"
            if self.feature_budget_bytes is not None
            else ""
        )
        return (
            f"{self.name}: {self.num_gpus} GPU(s), NVLink groups {self.shorthand}, "
            f"host->GPU {self.host_bw / GB:g} GB/s, GPU<->GPU {self.peer_bw / GB:g} GB/s, "
            f"network {self.network_bw / GB:g} GB/s{budget}"
        )

    def _check_device(self, device: int) -> None:
        if not 0 <= int(device) < self.num_gpus:
            raise IndexError(f"device {device} out of range [0, {self.num_gpus})")


_GROUP_RE = re.compile(r"^\s*(\d+)\s*(?:\*\s*(\d+)\s*)?$")


def parse_groups(spec: str) -> tuple[tuple[int, ...], ...]:
    """``"2+2"`` -> ``((0, 1), (2, 3))``; ``"2*4"`` -> four pairs; ``"4"`` -> ``((0, 1, 2, 3),)``."""
    sizes: list[int] = []
    for term in str(spec).split("+"):
        m = _GROUP_RE.match(term)
        if not m:
            raise UsageError(
                f"--topology: cannot read GPU groups {spec!r} (expected e.g. 4, 2+2, 2*4, 1+1)"
            )
        size, count = int(m.group(1)), int(m.group(2) or 1)
        if size < 1 or count < 1:
            raise UsageError(f"--topology: group sizes and counts must be >= 1 in {spec!r}")
        sizes.extend([size] * count)
    if sum(sizes) > 1024:
        raise UsageError(f"--topology: {sum(sizes)} GPUs in {spec!r} is more than 1024")
    groups, start = [], 0
    for s in sizes:
        groups.append(tuple(range(start, start + s)))
        start += s
    return tuple(groups)


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: the largest bandwidth (bytes/s, 1 PB/s) and byte count (1 EB) a topology may give
MAX_BANDWIDTH = 1e15
MAX_BYTES = 1e18
_QTY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: Any, what: str = "size") -> int:
    """A byte count from a number or a string such as ``"16 GiB"``, ``"8GB"``, ``"1.5e9"``."""
    if isinstance(value, bool):
        raise UsageError(f"{what}: expected a byte count, got {value!r}")
    if isinstance(value, int | float):
        v = float(value)
    else:
        m = _QTY_RE.match(str(value))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise UsageError(f"{what}: cannot read {value!r} as bytes (e.g. 16GiB, 8GB, 1e9)")
        v = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(v) or v > MAX_BYTES:  # 1e400 in JSON is inf
        raise UsageError(f"{what}: {value!r} is not a byte count (at most {MAX_BYTES:.0e})")
    if v < 0:
        raise UsageError(f"{what}: must be >= 0 bytes, got {value}")
    return int(value) if isinstance(value, int) else int(v)


def parse_bandwidth(value: Any, what: str = "bandwidth") -> float:
    """Bytes/s from a number (bytes/s) or a string: ``"12 GB/s"``, ``"25GB"`` (bytes, capital B) or
    ``"100 Gb/s"`` (bits: a final lower-case ``b``); in ``(0, MAX_BANDWIDTH]`` (``1e400`` in a
    JSON file reads as infinity, which would make every modeled time 0)."""
    if isinstance(value, bool):
        raise UsageError(f"{what}: expected bytes per second, got {value!r}")
    if isinstance(value, int | float):
        v = float(value)
    else:
        text = str(value).strip().removesuffix("/s")
        m = _QTY_RE.match(text)
        unit = m.group(2) if m else None
        if not m or unit is None or unit.lower() not in _UNITS:
            raise UsageError(f"{what}: cannot read {value!r} as a bandwidth (e.g. 12GB/s, 100Gb/s)")
        bits = unit.endswith("b")  # "Gb/s" = gigabits per second; "GB/s" = gigabytes
        v = float(m.group(1)) * _UNITS[unit.lower()] / (8 if bits else 1)
    if not 0 < v <= MAX_BANDWIDTH:  # also NaN and infinity
        raise UsageError(f"{what}: must be in (0, {MAX_BANDWIDTH:.0e}] bytes/s, got {value!r}")
    return v


#: Named machines. Bandwidths are nominal per-direction figures; see each ``note``.
PRESETS: dict[str, dict[str, Any]] = {
    "dgx-a100-8": {
        "groups": "8",
        "host_bw": 25 * GB,
        "peer_bw": 300 * GB,
        "network_bw": 25 * GB,
        "gpu_memory_bytes": 40 * GiB,
        "note": "8x A100-40GB on NVSwitch (NVLink3, 12 links x 25 GB/s per direction), PCIe 4.0 "
        "x16 (~25 GB/s achievable of 32 nominal), one 200 Gb/s HDR NIC per GPU",
    },
    "dgx-v100-16": {
        "groups": "16",
        "host_bw": 12 * GB,
        "peer_bw": 150 * GB,
        "network_bw": 12.5 * GB,
        "gpu_memory_bytes": 32 * GiB,
        "note": "16x V100-32GB on NVSwitch (6 NVLink2 links x 25 GB/s), PCIe 3.0 x16",
    },
    "v100-nvswitch-8": {
        "groups": "8",
        "host_bw": DEFAULT_HOST_BW,
        "peer_bw": DEFAULT_PEER_BW,
        "network_bw": DEFAULT_NETWORK_BW,
        "gpu_memory_bytes": DEFAULT_GPU_MEMORY,
        "note": "Song & Jiang's platform: 8x V100-32GB all connected through NVSwitch, PCIe 3.0",
    },
    "4xV100-nvlink": {
        "groups": "4",
        "host_bw": 12 * GB,
        "peer_bw": 50 * GB,
        "network_bw": 12.5 * GB,
        "gpu_memory_bytes": 16 * GiB,
        "note": "4x V100-16GB SXM2, all pairs NVLink2-connected (2 links x 25 GB/s), PCIe 3.0 x16",
    },
    "2xA6000-nvlink": {
        "groups": "2",
        "host_bw": 25 * GB,
        "peer_bw": 56 * GB,
        "network_bw": 12.5 * GB,
        "gpu_memory_bytes": 48 * GiB,
        "note": "2x RTX A6000 with an NVLink bridge (112.5 GB/s both directions), PCIe 4.0 x16",
    },
    "4xA6000-2nvlink": {
        "groups": "2+2",
        "host_bw": 25 * GB,
        "peer_bw": 56 * GB,
        "network_bw": 12.5 * GB,
        "gpu_memory_bytes": 48 * GiB,
        "note": "4x RTX A6000 as two NVLink-bridged pairs, PCIe 4.0 x16",
    },
    "pcie-2gpu": {
        "groups": "1+1",
        "host_bw": 12 * GB,
        "peer_bw": 10 * GB,
        "network_bw": 12.5 * GB,
        "gpu_memory_bytes": 24 * GiB,
        "note": "2 GPUs without NVLink (PCIe 3.0 x16); peer reads would cross PCIe, so none",
    },
    "pcie-4gpu": {
        "groups": "1*4",
        "host_bw": 12 * GB,
        "peer_bw": 10 * GB,
        "network_bw": 12.5 * GB,
        "gpu_memory_bytes": 24 * GiB,
        "note": "4 GPUs without NVLink (PCIe 3.0 x16)",
    },
}

_KEYS = {
    "name",
    "preset",
    "groups",
    "num_gpus",
    "host_bw",
    "peer_bw",
    "network_bw",
    "gpu_memory_bytes",
    "feature_budget_bytes",
    "note",
}


def topology_from_dict(d: dict[str, Any], where: str = "topology") -> Topology:
    """Build a topology from a mapping (the TOML/JSON file format, see module docstring).

    Keys: ``groups`` (shorthand string or list of lists of device ids), optional ``preset`` (start
    from a named preset), ``name``, ``num_gpus`` (checked against ``groups``), ``host_bw``,
    ``peer_bw``, ``network_bw`` (bytes/s or strings with units), ``gpu_memory_bytes``,
    ``feature_budget_bytes`` (bytes or strings with units), ``note``. A ``[bandwidth]`` table with
    ``host_to_gpu``, ``gpu_to_gpu``, ``network`` is accepted as an alternative spelling.
    """
    d = dict(d)
    bw = d.pop("bandwidth", None)
    if bw is not None:
        if not isinstance(bw, dict):
            raise UsageError(
                f"{where}: 'bandwidth' must be a table of host_to_gpu/gpu_to_gpu/network"
            )
        for src, dst in (
            ("host_to_gpu", "host_bw"),
            ("gpu_to_gpu", "peer_bw"),
            ("network", "network_bw"),
        ):
            if src in bw:
                d[dst] = bw.pop(src)
        if bw:
            raise UsageError(f"{where}: unknown bandwidth key(s) {sorted(bw)}")
    unknown = set(d) - _KEYS
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {sorted(unknown)}; expected {sorted(_KEYS)}")
    base: dict[str, Any] = {}
    if "preset" in d:
        name = str(d.pop("preset"))
        if name not in PRESETS:
            raise UsageError(f"{where}: unknown preset {name!r}; known: {', '.join(PRESETS)}")
        base = dict(PRESETS[name], name=name)
    base.update(d)
    if "groups" not in base:
        raise UsageError(
            f"{where}: needs 'groups' (e.g. \"2+2\" or [[0, 1], [2, 3]]) or a 'preset'"
        )
    g = base["groups"]
    if isinstance(g, str | int):
        groups = parse_groups(str(g))
    elif isinstance(g, list | tuple) and all(isinstance(x, list | tuple) for x in g):
        try:
            groups = tuple(tuple(int(v) for v in x) for x in g)
        except (TypeError, ValueError):
            raise UsageError(f"{where}: 'groups' must hold integer device ids, got {g!r}") from None
    else:
        raise UsageError(f"{where}: 'groups' must be a string like \"2+2\" or a list of lists")
    topo = Topology(
        name=str(base.get("name", where)),
        groups=groups,
        host_bw=parse_bandwidth(base.get("host_bw", DEFAULT_HOST_BW), f"{where}: host_bw"),
        peer_bw=parse_bandwidth(base.get("peer_bw", DEFAULT_PEER_BW), f"{where}: peer_bw"),
        network_bw=parse_bandwidth(
            base.get("network_bw", DEFAULT_NETWORK_BW), f"{where}: network_bw"
        ),
        gpu_memory_bytes=(
            None
            if base.get("gpu_memory_bytes", DEFAULT_GPU_MEMORY) is None
            else parse_bytes(
                base.get("gpu_memory_bytes", DEFAULT_GPU_MEMORY), f"{where}: gpu_memory_bytes"
            )
        ),
        feature_budget_bytes=(
            None
            if base.get("feature_budget_bytes") is None
            else parse_bytes(base["feature_budget_bytes"], f"{where}: feature_budget_bytes")
        ),
        note=str(base.get("note", "")),
    )
    ng = base.get("num_gpus")
    if "num_gpus" in base and (not isinstance(ng, int) or isinstance(ng, bool)):
        raise UsageError(f"{where}: num_gpus must be an integer, got {ng!r}")
    if "num_gpus" in base and ng != topo.num_gpus:
        raise UsageError(
            f"{where}: num_gpus = {base['num_gpus']} but groups describe {topo.num_gpus} GPUs"
        )
    return topo


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        raise UsageError(f"{path}: reading TOML needs Python >= 3.11; use a .json file") from None
    return tomllib.loads(path.read_text())


def load_topology(spec: str | Path, **overrides: Any) -> Topology:
    """A topology from a preset name, a shorthand (``"2+2"``), or a ``.toml`` / ``.json`` file.

    ``overrides`` (``host_bw``, ``peer_bw``, ``network_bw``, ``feature_budget_bytes``, ...) replace
    the corresponding fields; ``None`` values are ignored. Strings with units are accepted.
    """
    text = str(spec)
    path = Path(text)
    if text in PRESETS:
        topo = topology_from_dict({"preset": text})
    elif path.suffix.lower() in (".toml", ".json"):
        if not path.is_file():
            raise UsageError(f"{path}: topology file not found")
        try:
            if path.suffix.lower() == ".toml":
                data = _read_toml(path)
            else:
                data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # TOML/JSONDecodeError
            raise UsageError(
                f"{path}: cannot parse topology file: {e}".replace("\n", " ")
            ) from None
        if not isinstance(data, dict):
            raise UsageError(f"{path}: topology file must hold a table/object at the top level")
        data.setdefault("name", path.stem)
        topo = topology_from_dict(data, where=str(path))
    elif _GROUP_RE.match(text.split("+")[0] or "x"):
        topo = Topology(
            name=f"{text}GPU" if "+" not in text and "*" not in text else f"({text})GPU",
            groups=parse_groups(text),
            note="shorthand: Song & Jiang's platform bandwidths (V100 NVSwitch, PCIe 3.0)",
        )
    else:
        raise UsageError(
            f"--topology: {text!r} is not a preset ({', '.join(PRESETS)}), a group shorthand "
            "(2, 2+2, 4, 2*4, 8) or a .toml/.json file"
        )
    conv: dict[str, Any] = {}
    for k, v in overrides.items():
        if v is None:
            continue
        if k in ("host_bw", "peer_bw", "network_bw"):
            conv[k] = parse_bandwidth(v, f"--{k.replace('_', '-')}")
        elif k in ("gpu_memory_bytes", "feature_budget_bytes"):
            conv[k] = parse_bytes(v, f"--{k.replace('_', '-')}")
        else:
            conv[k] = v
    return topo.with_overrides(**conv)
