"""The node's network bandwidth in Gbit/s, read from its network devices in sysfs, for the agent's label
`agentaflow.gpu/network-bandwidth-gbps` (the ledger's minimum for `topology.scheduler/network-bandwidth`
when no operator labelled the node).

The rule: the sum of the rates of the node's ACTIVE InfiniBand ports when it has any (multi-rail training
traffic uses every port at once), else the speed of its fastest physical Ethernet link that is up (a bond
or a second link is not assumed to add up); None when neither says anything. Reads only files under `root`
(a directory laid out like /sys), so tests hand it a temporary tree; an unreadable file is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_SYS_ROOT = Path("/sys")
# an InfiniBand port's `rate`: "200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)"
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([GM])b/sec\b")
_ACTIVE = "ACTIVE"  # a port's `state`: "4: ACTIVE"


def node_bandwidth_gbps(root: Path = DEFAULT_SYS_ROOT) -> float | None:
    """The node's bandwidth by the rule above, or None when no active port and no up physical link."""
    infiniband = infiniband_gbps(root)
    if infiniband:
        return sum(infiniband)
    ethernet = ethernet_gbps(root)
    return max(ethernet) if ethernet else None


def infiniband_gbps(root: Path) -> list[float]:
    """The rate of each ACTIVE port of each InfiniBand device (class/infiniband/*/ports/*)."""
    rates = []
    for port in sorted((root / "class" / "infiniband").glob("*/ports/*")):
        state = _read(port / "state")
        if state is None or state.split(":")[-1].strip() != _ACTIVE:
            continue
        rate = _read(port / "rate")
        match = _RATE.match(rate or "")
        if match is None:
            continue
        value = float(match.group(1)) / (1000.0 if match.group(2) == "M" else 1.0)
        if value > 0:
            rates.append(value)
    return rates


def ethernet_gbps(root: Path) -> list[float]:
    """The speed of each physical interface (one with a `device` link: not lo, a bridge, a veth or a bond)
    whose operstate is up; a speed of -1 (unknown) or an unreadable one is left out."""
    speeds = []
    for interface in sorted((root / "class" / "net").iterdir()) if (root / "class" / "net").is_dir() else ():
        if interface.name == "lo" or not (interface / "device").exists():
            continue
        if "/virtual/" in str(interface.resolve()):
            continue
        if _read(interface / "operstate") != "up":
            continue
        try:
            mbps = int(_read(interface / "speed") or "")
        except ValueError:
            continue
        if mbps > 0:
            speeds.append(mbps / 1000.0)
    return speeds


def label_value(gbps: float) -> str:
    """The label's text: "200", "12.5" (what `topology.scheduler/network-bandwidth-gbps` takes too)."""
    return f"{gbps:.3f}".rstrip("0").rstrip(".")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:  # missing, or a driver that refuses the read (speed on a link that is down: EINVAL)
        return None
