"""The core/v1 Event the cluster sync posts: one shape for every reason it has to tell a pod (a placement
conflict, a device correction, a device conflict) or a workload (a preemption) something."""

from __future__ import annotations

import hashlib
import time

MAX_MESSAGE = 1024


def pod_event(pod: str, reason: str, message: str, now: float, warning: bool, name_tag: str) -> dict:
    """An Event on `pod` ("namespace/name"), named `<pod>.gpuledger-<name_tag>-<random>`."""
    namespace, _, name = pod.partition("/")
    event = object_event(
        {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
        reason,
        message,
        now,
        warning,
    )
    event["metadata"] = {"generateName": f"{name[:200]}.gpuledger-{name_tag}-", "namespace": namespace}
    return event


def once_name(involved_name: str, name_tag: str, *parts: str) -> str:
    """A name the same for the same `parts`: posting the Event again answers 409 AlreadyExists, so an act
    carried out twice (after a restart) tells it once."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return f"{involved_name[:200]}.gpuledger-{name_tag}-{digest}"


def object_event(
    involved: dict, reason: str, message: str, now: float, warning: bool, name: str = ""
) -> dict:
    """An Event on `involved` (apiVersion, kind, namespace, name, and uid where known), named `name`."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    namespace = str(involved.get("namespace", ""))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason,
        "type": "Warning" if warning else "Normal",
        "message": f"gpuledger: {message}"[:MAX_MESSAGE],
        "source": {"component": "gpuledger-sync"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
