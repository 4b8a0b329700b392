"""What the nodes' kubelets said against the ledger, told to the pods it concerns: the cluster sync reads the
ledger's device corrections and device conflicts (gpuledger.core.books.truth, through the service's status),
counts each new one once and posts an Event on its pod (best effort, like the placement conflicts' Events).

GPUDevicesCorrected (Normal): the ledger now records the devices the kubelet gave the pod, not the ones its
placement named. GPUDeviceConflict (Warning): the kubelet says another pod holds the devices the pod's
placement names; the pod is counted as GPUs of unknown identity until the kubelet lists it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuledger.names import HOLDERS_ANNOTATION
from gpuledger.sync.pod_events import pod_event

log = logging.getLogger("gpuledger.sync")


@dataclass
class DeviceTruthStats:
    corrections: int = 0  # device corrections that appeared (a pod recorded on the kubelet's devices)
    conflicts: int = 0  # device conflicts that appeared (a pod whose devices the kubelet gives another pod)
    events: int = 0  # Events posted for either


def device_event(pod: str, reason: str, message: str, now: float, warning: bool = False) -> dict:
    """A core/v1 Event on `pod` ("namespace/name")."""
    return pod_event(pod, reason, message, now, warning, name_tag="devices")


def correction_message(rid: str, node: str, recorded: list, actual: list) -> str:
    return (
        f"the kubelet of node {node} gave this pod GPU device(s) {actual} (annotation {HOLDERS_ANNOTATION}); "
        f"the ledger had recorded {recorded} for reservation {rid} and now records {actual}"
    )


def conflict_message(rid: str, why: str) -> str:
    return (
        f"the devices of reservation {rid} are another pod's: {why}; this pod is counted as GPUs of unknown "
        "identity on its node until its kubelet lists it"
    )


class DeviceTruthReports:
    """Counts the corrections and conflicts that appeared since the last status, posting an Event on each."""

    def __init__(self, core: Callable[[], Any], clock: Callable[[], float] = time.time):
        self.core = core  # the CoreV1Api, asked for at each post (the sync's, which tests replace)
        self.clock = clock
        self.stats = DeviceTruthStats()
        self._corrections: set[tuple] = set()
        self._conflicts: set[tuple] = set()

    def report(self, status: dict) -> list[tuple]:
        """New corrections and conflicts in a ledger status (its `device_corrections`, `device_conflicts`)."""
        corrections = {
            (str(c[0]), str(c[1]), str(c[2]), tuple(c[3]), tuple(c[4])): c
            for c in status.get("device_corrections") or []
            if isinstance(c, (list, tuple)) and len(c) >= 5
        }
        conflicts = {
            (str(c[0]), str(c[1]), str(c[2])): c
            for c in status.get("device_conflicts") or []
            if isinstance(c, (list, tuple)) and len(c) >= 3
        }
        new: list[tuple] = []
        for key in sorted(set(corrections) - self._corrections):
            pod, rid, node, recorded, actual = key
            self.stats.corrections += 1
            log.warning("device correction: pod %s (%s) on %s: %s -> %s", pod, rid, node, recorded, actual)
            message = correction_message(rid, node, list(recorded), list(actual))
            self._post(pod, "GPUDevicesCorrected", message, warning=False)
            new.append(("GPUDevicesCorrected", *key))
        for seen in sorted(set(conflicts) - self._conflicts):
            pod, rid, why = seen
            self.stats.conflicts += 1
            log.warning("device conflict: pod %s (%s): %s", pod, rid, why)
            self._post(pod, "GPUDeviceConflict", conflict_message(rid, why), warning=True)
            new.append(("GPUDeviceConflict", *seen))
        self._corrections, self._conflicts = set(corrections), set(conflicts)
        return new

    def _post(self, pod: str, reason: str, message: str, warning: bool) -> None:
        if "/" not in pod:
            return  # a nameless pod: nothing to attach an Event to
        with contextlib.suppress(Exception):  # an Event is a courtesy: never let it stop the sync
            self.core().create_namespaced_event(
                pod.split("/", 1)[0], device_event(pod, reason, message, self.clock(), warning)
            )
            self.stats.events += 1
