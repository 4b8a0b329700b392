"""Reading a pod's `gpuledger.io/placement` annotation for display: node, devices, shares, UUIDs, strategy.

Only reads: it verifies no signature (the webhook and the ledger do) and never raises on a bad value, so
one odd pod cannot break a listing. Kept apart from gpuledger.core so the CLI needs no ledger code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpuledger.names import PLACEMENT_ANNOTATION

MILLI_PER_GPU = 1000


@dataclass(frozen=True)
class PodPlacement:
    """What admission wrote on one pod: its node, whole devices, shares (device, milli, MiB) and UUIDs."""

    id: str
    node: str
    devices: tuple[int, ...] = ()
    shares: tuple[tuple[int, int, int], ...] = ()
    uuids: tuple[str, ...] = ()
    strategy: str = ""
    group: str | None = None
    slot: int | None = None
    signed: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def holdings(self) -> list[tuple[int, int]]:
        """(device index, milli) for every device this pod holds: a whole device counts 1000."""
        return [(d, MILLI_PER_GPU) for d in self.devices] + [(d, m) for d, m, _ in self.shares]

    def describe_devices(self) -> str:
        """`0,1` for whole devices, `2:250m` for a share."""
        parts = [str(d) for d in self.devices] + [f"{d}:{m}m" for d, m, _ in self.shares]
        return ",".join(parts)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "node": self.node, "devices": list(self.devices)}
        if self.shares:
            d["shares"] = [{"device": dev, "milli": m, "memoryMiB": mem} for dev, m, mem in self.shares]
        if self.uuids:
            d["uuids"] = list(self.uuids)
        if self.strategy:
            d["strategy"] = self.strategy
        if self.group is not None:
            d["group"], d["slot"] = self.group, self.slot
        return d


def _ints(raw: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in raw) if isinstance(raw, list) else ()


def parse_placement(text: str | None) -> PodPlacement | None:
    """The annotation's value as a PodPlacement, or None when absent or not a placement."""
    if not text:
        return None
    try:
        d = json.loads(text)
        if not isinstance(d, dict) or not isinstance(d.get("node"), str):
            return None
        shares = tuple((int(a), int(b), int(c)) for a, b, c in d.get("shares") or ())
        slot = d.get("slot")
        return PodPlacement(
            id=str(d.get("id", "")),
            node=d["node"],
            devices=_ints(d.get("devices")),
            shares=shares,
            uuids=tuple(str(u) for u in d.get("uuids") or ()),
            strategy=str(d.get("strategy", "")),
            group=d.get("group"),
            slot=None if slot is None else int(slot),
            signed="sig" in d,
        )
    except (ValueError, TypeError):
        return None


def placement_of_pod(pod: dict) -> PodPlacement | None:
    """The placement admission wrote on this pod (a pod dict as the API returns it), or None."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return parse_placement(annotations.get(PLACEMENT_ANNOTATION))
