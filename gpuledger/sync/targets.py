"""Where the cluster sync sends what it saw: a `LedgerTarget` (the service's batched methods, called
blocking), backed by the named Ray actor or by a `LedgerService` in this process.

These only relay calls; they never read the API or decide anything about a reservation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol


class LedgerTarget(Protocol):
    """What the sync needs of the ledger: the Ray actor's batched methods (docs/architecture.md), called
    blocking. `holder` is the sync's identity: the ledger takes these writes only from the holder of its sync
    lease (gpuledger.service.sync_writer), which `sync_lease` takes, renews and hands back."""

    def apply_events(self, events: list[tuple[str, dict]], holder: str) -> Any: ...

    def resync(self, objects: list[dict], holder: str) -> Any: ...

    def expiry_candidates(self, now: float) -> list[str]: ...

    def confirm(self, ids: list[str], holder: str) -> Any: ...

    def release(self, ids: list[str], holder: str) -> Any: ...

    def sync_lease(self, holder: str, term_s: float, hand_back: bool = False) -> dict: ...

    def status(self) -> dict: ...

    def place_waiting(self, holder: str) -> list: ...

    def preemptions_due(self, holder: str) -> list: ...

    def eviction_refused(self, refusals: list, holder: str) -> None: ...

    def queue_status(self, holder: str) -> dict[str, dict]: ...


class CallingTarget:
    """The `LedgerTarget` methods, each one `_call(method, *args)` of the actor's method of that name."""

    def _call(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def apply_events(self, events, holder):
        return self._call("apply_events", events, holder)

    def resync(self, objects, holder):
        return self._call("resync", objects, holder)

    def expiry_candidates(self, now):
        return self._call("expiry_candidates", now)

    def confirm(self, ids, holder):
        return self._call("confirm", ids, holder)

    def release(self, ids, holder):
        return self._call("release", ids, holder)

    def sync_lease(self, holder, term_s, hand_back=False):
        return self._call("sync_lease", holder, term_s, hand_back)

    def status(self):
        return self._call("status")

    def place_waiting(self, holder):
        return self._call("place_waiting", holder)

    def preemptions_due(self, holder):
        return self._call("preemptions_due", holder)

    def eviction_refused(self, refusals, holder):
        return self._call("eviction_refused", refusals, holder)

    def queue_status(self, holder):
        return self._call("queue_status", holder)


class RayLedgerTarget(CallingTarget):
    """The named Ray actor behind the `LedgerTarget` methods; each call waits for its result."""

    def __init__(self, handle, timeout_s: float = 60.0):
        self.handle, self.timeout_s = handle, timeout_s

    def _call(self, method: str, *args):
        import ray

        return ray.get(getattr(self.handle, method).remote(*args), timeout=self.timeout_s)


class LocalLedgerTarget:
    """A `LedgerService` in this process (no Ray): the same methods, with `now` from `clock`."""

    def __init__(self, service, clock: Callable[[], float] = time.time):
        self.service, self.clock = service, clock
        self._lock = threading.Lock()  # the sync's thread and a caller's may share the service

    def apply_events(self, events, holder):
        with self._lock:
            return self.service.apply_events(events, self.clock(), holder)

    def resync(self, objects, holder):
        with self._lock:
            return self.service.resync(objects, self.clock(), holder)

    def expiry_candidates(self, now):
        with self._lock:
            return self.service.expiry_candidates(now)

    def confirm(self, ids, holder):
        with self._lock:
            return self.service.confirm(ids, self.clock(), holder)

    def release(self, ids, holder):
        with self._lock:
            return self.service.release(ids, self.clock(), holder)

    def sync_lease(self, holder, term_s, hand_back=False):
        with self._lock:
            return self.service.sync_lease(holder, self.clock(), term_s, hand_back)

    def status(self):
        with self._lock:
            return self.service.status()

    def place_waiting(self, holder):
        with self._lock:
            return self.service.place_waiting(self.clock(), holder)

    def preemptions_due(self, holder):
        with self._lock:
            return self.service.preemptions_due(self.clock(), holder)

    def eviction_refused(self, refusals, holder):
        with self._lock:
            return self.service.eviction_refused(refusals, self.clock(), holder)

    def queue_status(self, holder):
        with self._lock:
            return self.service.queue_status(self.clock(), holder)
