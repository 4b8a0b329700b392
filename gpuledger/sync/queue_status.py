"""Each GPUQueue's status, written from the ledger: what `kubectl get gpuqueues` shows (quota, used, borrowed,
waiting; share with -o wide), as the CRD's printer columns read it (gpuledger.controller.crd_fields).

The ledger owns the numbers (`queue_status(holder)`: queue name -> the status body); this adapter only writes
them, every `interval_s` while its sync leads (one replica writes, as it alone writes the ledger), as a merge
patch of the status subresource with `updatedTime` added, and skips a queue whose body has not changed since
it last wrote it. Time is an input: `tick()` writes once, and the thread only calls it on a timer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuledger.names import GPUQUEUE_PLURAL, QUEUE_GROUP, QUEUE_VERSION

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi

    from gpuledger.sync.targets import LedgerTarget

log = logging.getLogger("gpuledger.sync.queue_status")

MERGE_PATCH = "application/merge-patch+json"


def stamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


class QueueStatusWriter:
    """Writes the ledger's standing of each GPUQueue to its status. `holder()` is the sync's identity while
    it leads, else None (nothing is written)."""

    def __init__(
        self,
        custom: CustomObjectsApi,
        target: LedgerTarget,
        holder: Callable[[], str | None],
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ):
        self.custom, self.target, self.holder = custom, target, holder
        self.interval_s, self.clock = interval_s, clock
        self.written = 0  # status patches sent
        self.failed = 0  # ledger calls or patches that failed (written again at the next tick)
        self._last: dict[str, dict] = {}  # queue name -> the body last written (without updatedTime)
        self._last_holder: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> int:
        """Ask the ledger for every queue's status and patch those that changed. Returns how many were
        written. Nothing while this sync does not lead."""
        from kubernetes.client.exceptions import ApiException

        holder = self.holder()
        if holder != self._last_holder:  # a new term: another replica may have written meanwhile
            self._last.clear()
            self._last_holder = holder
        if holder is None:
            return 0
        standing: dict[str, dict] = dict(self.target.queue_status(holder) or {})
        for gone in set(self._last) - set(standing):
            del self._last[gone]
        written = 0
        for name, body in sorted(standing.items()):
            body = dict(body)
            if self._last.get(name) == body:
                continue
            status: dict[str, Any] = dict.fromkeys(set(self._last.get(name) or {}) - set(body))  # -> null
            status.update(body, updatedTime=stamp(self.clock()))
            try:
                self.custom.patch_cluster_custom_object_status(
                    QUEUE_GROUP,
                    QUEUE_VERSION,
                    GPUQUEUE_PLURAL,
                    name,
                    {"status": status},
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            except ApiException as exc:
                if exc.status != 404:  # 404: deleted meanwhile; the ledger forgets it with the event
                    self.failed += 1
                    log.warning(
                        "could not write the status of GPUQueue %s: %s %s", name, exc.status, exc.reason
                    )
                continue
            self._last[name] = body
            written += 1
        self.written += written
        return written

    # ------------------------------------------------------------------ the timer
    def start(self) -> QueueStatusWriter:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpuledger-queue-status", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            # everything, on purpose: the ledger restarting or the API unavailable; the next tick writes
            except Exception as exc:  # noqa: BLE001
                self.failed += 1
                log.warning("could not write the GPU queues' status: %r", exc)
