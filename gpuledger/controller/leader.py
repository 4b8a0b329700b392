"""Leader election on a coordination.k8s.io Lease, so that of several controller replicas exactly one acts.

`decide` is pure (the Lease as stored, who I am, `now`); `LeaseElector` does the reads and conditional writes
(a write carries the resourceVersion read, so two replicas racing for an expired Lease cannot both win). Only
the leader runs the controller's handlers; a leader that cannot renew within its deadline stops acting.
kopf's own peering was not used: replicas of equal priority both keep running there, with a warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

log = logging.getLogger("gpuledger.controller.leader")

DEFAULT_LEASE_S = 15.0
DEFAULT_RENEW_DEADLINE_S = 10.0
DEFAULT_RETRY_S = 2.0


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    renewed: float  # epoch seconds of the last renewal
    duration_s: float
    transitions: int = 0


def decide(lease: LeaseView | None, me: str, now: float) -> str:
    """`create` (no Lease), `renew` (mine), `take` (expired: another's, or nobody's) or `wait`."""
    if lease is None:
        return "create"
    if lease.holder == me:
        return "renew"
    if not lease.holder or now >= lease.renewed + lease.duration_s:
        return "take"
    return "wait"


def _micro(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, datetime):
        return value.timestamp() if value.tzinfo else value.replace(tzinfo=UTC).timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


class LeaseElector:
    """Acquire and keep one Lease. Blocking calls (run it in a thread)."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        name: str,
        identity: str,
        lease_s: float = DEFAULT_LEASE_S,
        renew_deadline_s: float = DEFAULT_RENEW_DEADLINE_S,
        retry_s: float = DEFAULT_RETRY_S,
        clock: Callable[[], float] = time.time,
    ):
        from kubernetes import client

        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self.clock = clock
        self.last_renewed = 0.0
        self.last_contact = 0.0  # when a Lease read last got an answer from the API server (`clock`)
        # no call may hang longer than a renewal may take: a stop or a lost Lease is noticed within it
        self.request_timeout_s = max(1.0, renew_deadline_s / 2)

    def _read(self) -> tuple[Any, LeaseView | None]:
        from kubernetes.client.rest import ApiException

        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.request_timeout_s
            )
        except ApiException as err:
            if err.status == 404:
                self.last_contact = self.clock()
                return None, None
            raise
        self.last_contact = self.clock()
        spec = lease.spec
        if spec is None:
            return lease, LeaseView(None, 0.0, self.lease_s)
        view = LeaseView(
            spec.holder_identity,
            _epoch(spec.renew_time or spec.acquire_time),
            float(spec.lease_duration_seconds or self.lease_s),
            int(spec.lease_transitions or 0),
        )
        return lease, view

    def try_once(self) -> bool:
        """One step of the protocol; True when this replica holds the Lease afterwards."""
        from kubernetes.client.rest import ApiException

        now = self.clock()
        try:
            lease, view = self._read()
            action = decide(view, self.identity, now)
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": round(self.lease_s),
                "renewTime": _micro(now),
            }
            if action == "create":
                spec.update(acquireTime=_micro(now), leaseTransitions=0)
                self.api.create_namespaced_lease(
                    self.namespace,
                    _request_timeout=self.request_timeout_s,
                    body=cast(
                        Any,
                        {  # a dict body is sent as it is
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {"name": self.name, "namespace": self.namespace},
                            "spec": spec,
                        },
                    ),
                )
            elif action in ("renew", "take"):
                if action == "take":
                    spec.update(
                        acquireTime=_micro(now), leaseTransitions=(view.transitions if view else 0) + 1
                    )
                body = {"metadata": {"resourceVersion": lease.metadata.resource_version}, "spec": spec}
                self.api.patch_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self.request_timeout_s
                )
            else:
                return False
        except ApiException as err:
            if err.status in (404, 409):  # another replica wrote first
                return False
            log.warning("lease %s/%s: %s", self.namespace, self.name, err.reason)
            return self._still_valid(now)
        except Exception as err:  # noqa: BLE001 - the API unreachable: we hold it only until the deadline
            log.warning("lease %s/%s: %s", self.namespace, self.name, err)
            return self._still_valid(now)
        if action == "take":
            log.info(
                "took over lease %s/%s from %s", self.namespace, self.name, view.holder if view else None
            )
        self.last_renewed = now
        return True

    def _still_valid(self, now: float) -> bool:
        return bool(self.last_renewed) and now - self.last_renewed < self.renew_deadline_s

    def valid(self) -> bool:
        """May this replica act now: renewed within the renew deadline (shorter than the Lease, so it stops
        acting before any other replica may take the Lease over)."""
        return self._still_valid(self.clock())

    def in_contact(self, within_s: float) -> bool:
        """Did a Lease read reach the API server within the last `within_s` seconds."""
        return bool(self.last_contact) and self.clock() - self.last_contact < within_s

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until leader (True) or until `stop` is set (False, at once: the wait between tries is on
        `stop`)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            if self.try_once():
                return True
            if stop.wait(self.retry_s):
                break
        return False

    def release(self) -> None:
        """Hand the Lease back at a clean exit so a standby takes over at once."""
        try:
            lease, view = self._read()
            if view is not None and view.holder == self.identity:
                self.api.patch_namespaced_lease(
                    self.name,
                    self.namespace,
                    {
                        "metadata": {"resourceVersion": lease.metadata.resource_version},
                        "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
                    },
                    _request_timeout=self.request_timeout_s,
                )
        except Exception as err:  # noqa: BLE001 - best effort: the Lease expires anyway
            log.info("lease release: %s", err)
