"""The placement adapter: writes what the ledger placed for a waiting pod, then removes its scheduling gate.

A pod that waits was admitted gated (gpuledger.core.queues.waiting). When GPUs free (a pod ends or is deleted,
a node or device comes back, a reservation expires) the cluster sync's forwarding thread, right after applying
the events that freed them, asks the ledger for the next placements (`place_waiting`, one call; the ledger
reserves each at once, so nothing is promised twice). This module then writes, in one JSON patch per pod,
only what the API server lets a gated pod change: annotations (the signed placement, the devices its
containers' environment reads through the downward API), the reservation label, the node as a required node
affinity term (or matchFields on metadata.name), tolerations added, and the gate removed. The default
scheduler then binds the pod to the one node the affinity names, and the sync, seeing the pod placed,
confirms the reservation. Deciding is the ledger's; this adapter only writes.

A patch that fails is logged and its reservation released (the pod, still gated, stays in line and is placed
again at the next pass); a pod deleted meanwhile needs nothing: the ledger frees what it reserved when the
sync applies the deletion.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuledger.names import HOSTNAME_LABEL, SCHEDULING_GATE
from gpuledger.podwrite.affinity import with_node
from gpuledger.podwrite.gate import index_of
from gpuledger.podwrite.ungate import placement_ops
from gpuledger.service.ledger_service import PlacedPod
from gpuledger.sync.pod_events import pod_event

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger("gpuledger.sync.placer")


def required_node(affinity: Any, node: str, key: str = HOSTNAME_LABEL) -> dict:
    """`affinity` with `node` ANDed into every required node selector term (gpuledger.podwrite.affinity)."""
    return with_node(affinity, node, key)


def placement_patch(pod: dict, placed: PlacedPod, affinity_key: str = HOSTNAME_LABEL) -> list[dict]:
    """The JSON patch that writes `placed` on the gated `pod` (as last read) and removes gpuledger's gate
    (gpuledger.podwrite.ungate: its first operations test that it is still that pod, still gated)."""
    at = index_of(pod)
    if at is None:
        raise ValueError(f"pod {placed.namespace}/{placed.name} carries no {SCHEDULING_GATE} scheduling gate")
    return placement_ops(
        pod,
        at,
        uid=placed.uid,
        node=placed.node,
        annotations=placed.annotations,
        labels=placed.labels,
        taints=placed.tolerated_taints,
        affinity_key=affinity_key,
    )


def placed_message(placed: PlacedPod) -> str:
    return (
        f"placed on {placed.node} after waiting {placed.waited_s:.1f}s "
        f"(reservation {placed.reservation_id}); gate {SCHEDULING_GATE} removed"
    )


@dataclass
class PlacerStats:
    placed: int = 0  # gates removed with the placement written
    failed: int = 0  # patches that failed (their reservation released)
    gone: int = 0  # pods deleted before their patch
    waited_s: list[float] | None = None  # the waits of the pods placed since last read (metrics)


class WaitingPlacer:
    """Writes the ledger's placements of waiting pods on a thread of its own (API calls only). The cluster
    sync's forwarding thread, the only one that calls the ledger, calls `after_apply` after each batch it
    applied (and after each expiry check and status poll): that asks the ledger for the next placements and
    releases what failed to be written."""

    def __init__(
        self,
        core: CoreV1Api,
        affinity_key: str = HOSTNAME_LABEL,
        clock: Callable[[], float] = time.time,
        on_placed: Callable[[PlacedPod], None] | None = None,
    ):
        self.core, self.affinity_key, self.clock = core, affinity_key, clock
        self.on_placed = on_placed  # e.g. the webhook's metrics (wait time)
        self.stats = PlacerStats(waited_s=[])
        self._todo: queue.Queue[PlacedPod | None] = queue.Queue()
        self._release: list[str] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the forwarding thread's side
    def after_apply(self, target: Any, holder: str) -> int:
        """Release what failed to be written, then ask the ledger for the next placements and queue them.
        Returns how many were placed now."""
        with self._lock:
            failed, self._release = self._release, []
        if failed:
            target.release(failed, holder)
        placed = target.place_waiting(holder)
        for p in placed:
            self._todo.put(p)
        return len(placed)

    # ------------------------------------------------------------------ the writing thread
    def start(self) -> WaitingPlacer:
        self._thread = threading.Thread(target=self._loop, name="gpuledger-placer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._todo.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            placed = self._todo.get()
            if placed is None:
                self._todo.task_done()
                return
            try:
                self.write(placed)
            except Exception:  # the thread outlives any one pod: the failure is logged and released
                log.exception("could not write the placement of %s/%s", placed.namespace, placed.name)
                self._failed(placed)
            finally:
                self._todo.task_done()

    def write(self, placed: PlacedPod) -> bool:
        """Write one placement and remove the gate (one read, one patch). False when it could not be."""
        from kubernetes.client.exceptions import ApiException

        who = f"{placed.namespace}/{placed.name}"
        try:
            pod = self.core.read_namespaced_pod(placed.name, placed.namespace, _preload_content=False)
            body = _json(pod)
            if (body.get("metadata") or {}).get("uid") != placed.uid:
                self.stats.gone += 1
                log.info("waiting pod %s was replaced before its placement was written", who)
                self._release_later(placed.reservation_id)
                return False
            ops = placement_patch(body, placed, self.affinity_key)
            # a list body is sent as a JSON patch (application/json-patch+json)
            self.core.patch_namespaced_pod(placed.name, placed.namespace, ops, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                self.stats.gone += 1  # deleted: the ledger frees its reservation as it applies the deletion
                return False
            log.warning("could not place waiting pod %s: %s %s", who, exc.status, exc.reason)
            self._failed(placed)
            return False
        except ValueError as exc:
            log.warning("could not place waiting pod %s: %s", who, exc)
            self._failed(placed)
            return False
        self.stats.placed += 1
        if self.stats.waited_s is not None:
            self.stats.waited_s.append(placed.waited_s)
        log.info("waiting pod %s placed on %s after %.1fs", who, placed.node, placed.waited_s)
        with contextlib.suppress(Exception):  # an Event is a courtesy: never let it stop the placer
            event = pod_event(who, "Placed", placed_message(placed), self.clock(), False, "placed")
            self.core.create_namespaced_event(placed.namespace, event)  # type: ignore[arg-type]
        if self.on_placed is not None:
            with contextlib.suppress(Exception):
                self.on_placed(placed)
        return True

    def _failed(self, placed: PlacedPod) -> None:
        self.stats.failed += 1
        self._release_later(placed.reservation_id)

    def _release_later(self, rid: str) -> None:
        with self._lock:
            self._release.append(rid)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued placement was written or failed (tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._todo.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False


def _json(response: Any) -> dict:
    return json.loads(response.data)
