"""Placement conflicts, told to the pods they concern: the cluster sync counts each new pod the ledger says
holds a placement it does not own, once, and posts a Warning Event on it.

The sync holds one `ConflictReports`, made with its counters and a way to its API client; an Event is a
courtesy, so a failure to post one never stops the sync.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuledger.sync.config import SyncStats
from gpuledger.sync.pod_events import pod_event

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger("gpuledger.sync")


def conflict_event(pod: str, rid: str, why: str, now: float) -> dict:
    """A Warning Event on `pod` ("namespace/name") that holds reservation `rid` without owning it."""
    message = (
        f"this pod carries placement {rid} but does not own it ({why}); its GPUs are counted as foreign use "
        "on its node, never given to it"
    )
    return pod_event(pod, "PlacementConflict", message, now, warning=True, name_tag="conflict")


class ConflictReports:
    """The placement conflicts told so far (pod, reservation id), counted in the sync's `stats` and posted
    through the API client `core_of` gives (read on each post: the sync's client may be replaced)."""

    def __init__(self, core_of: Callable[[], CoreV1Api], clock: Callable[[], float], stats: SyncStats):
        self._core_of = core_of
        self.clock = clock
        self.stats = stats
        self._seen: set[tuple[str, str]] = set()

    def report(self, conflicts: list) -> list[tuple[str, str, str]]:
        """Count the placement conflicts that appeared since the last status and post a Warning Event on each
        such pod (best effort). Returns the new ones as (pod, reservation id, why)."""
        current = {
            (str(c[0]), str(c[1])): str(c[2])
            for c in conflicts
            if isinstance(c, (list, tuple)) and len(c) >= 3
        }
        new = [(pod, rid, current[(pod, rid)]) for pod, rid in sorted(set(current) - self._seen)]
        self._seen = set(current)
        for pod, rid, why in new:
            self.stats.conflicts += 1
            log.warning("placement conflict: pod %s holds reservation %s it does not own: %s", pod, rid, why)
            if "/" not in pod:
                continue  # a nameless pod: nothing to attach an Event to
            with contextlib.suppress(Exception):  # an Event is a courtesy: never let it stop the sync
                self._core_of().create_namespaced_event(
                    pod.split("/", 1)[0],
                    conflict_event(pod, rid, why, self.clock()),  # type: ignore[arg-type]  # a plain dict body is sent as is
                )
                self.stats.conflict_events += 1
        return new
