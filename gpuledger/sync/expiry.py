"""Expiry, asked of the API: before the ledger drops a reservation whose TTL passed, the cluster sync asks the
API itself (not the watch) whether a stored pod carries it, and confirms those instead.

The sync holds one `ExpiryChecks`, made with its config, counters, target and the ways it lists pods; it
never releases a reservation a stored pod carries.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from gpuledger.sync.config import POD, SyncConfig, SyncStats
from gpuledger.sync.targets import LedgerTarget

log = logging.getLogger("gpuledger.sync")

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def batches(items: list, size: int) -> Iterable[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class ExpiryChecks:
    """Asks the API which expiring reservations a stored pod carries, and tells the ledger: confirmed or
    released, as the sync `identity` that holds the lease. `raw_list(kind)` is the sync's raw list call of a
    kind, `list_objects(kind)` its full list (objects, resourceVersion)."""

    def __init__(
        self,
        config: SyncConfig,
        stats: SyncStats,
        target: LedgerTarget,
        identity: str,
        raw_list: Callable[[str], Callable[..., Any]],
        list_objects: Callable[[str], tuple[list[dict], str]],
    ):
        self.config = config
        self.stats = stats
        self.target = target
        self.identity = identity
        self._raw_list = raw_list
        self.list_objects = list_objects

    def pods_carrying(self, ids: list[str]) -> set[str]:
        """Which reservation ids a stored pod carries, asked of the API itself rather than the watch."""
        label = self.config.reservation_label
        found: set[str] = set()
        as_label = [i for i in ids if len(i) <= 63 and _LABEL_VALUE.match(i)]
        for chunk in batches(as_label, 50):
            resp = self._raw_list(POD)(
                label_selector=f"{label} in ({','.join(chunk)})", _preload_content=False
            )
            for pod in json.loads(resp.data).get("items") or []:
                found.add(((pod.get("metadata") or {}).get("labels") or {}).get(label, ""))
        odd = set(ids) - set(as_label)
        if odd:  # ids that cannot be label values are looked for in annotations
            pods, _ = self.list_objects(POD)
            for pod in pods:
                value = ((pod.get("metadata") or {}).get("annotations") or {}).get(label)
                if value in odd:
                    found.add(value)
        return found & set(ids)

    def check_expiry(self, now: float) -> tuple[list[str], list[str]]:
        """Confirm candidates a stored pod carries; release the rest. Returns (confirmed, released)."""
        ids = list(self.target.expiry_candidates(now))
        if not ids:
            return [], []
        stored = self.pods_carrying(ids)
        confirmed = [i for i in ids if i in stored]
        released = [i for i in ids if i not in stored]
        if confirmed:
            self.target.confirm(confirmed, self.identity)
        if released:
            self.target.release(released, self.identity)
        self.stats.expiry_confirmed += len(confirmed)
        self.stats.expiry_released += len(released)
        if released:
            log.info("released %d expired reservations with no stored pod", len(released))
        return confirmed, released
