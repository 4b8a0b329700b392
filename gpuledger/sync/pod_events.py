"""The core/v1 Event the cluster sync posts on a pod: one shape for every reason it has to tell a pod
something (a placement conflict, a device correction, a device conflict)."""

from __future__ import annotations

import time

MAX_MESSAGE = 1024


def pod_event(pod: str, reason: str, message: str, now: float, warning: bool, name_tag: str) -> dict:
    """An Event on `pod` ("namespace/name"), named `<pod>.gpuledger-<name_tag>-<random>`."""
    namespace, _, name = pod.partition("/")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name[:200]}.gpuledger-{name_tag}-", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
        "reason": reason,
        "type": "Warning" if warning else "Normal",
        "message": f"gpuledger: {message}"[:MAX_MESSAGE],
        "source": {"component": "gpuledger-sync"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
