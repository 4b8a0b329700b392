"""Waiting pods as the API server stores them, for the core's tests: gated with a signed ticket, and the
same pod once the placement adapter has written its placement and removed the gate."""

from __future__ import annotations

import copy

from gpuledger.core.model import Placement
from gpuledger.core.pods.placement_codec import Binding, encode_placement
from gpuledger.core.pods.waiting_codec import WaitTicket, encode_waiting
from gpuledger.core.queues.waiting import Waiting
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY, SCHEDULING_GATE, WAITING_ANNOTATION


def gated_pod(name: str, answer: Waiting, key: bytes, namespace: str = "default", created: str = "") -> dict:
    """The pod admission let in gated for `answer` (a Waiting), as stored."""
    ticket = WaitTicket(answer.request, answer.arrival, Binding(namespace, name))
    meta: dict = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "annotations": {WAITING_ANNOTATION: encode_waiting(ticket, key)},
    }
    if created:
        meta["creationTimestamp"] = created
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [{"name": "main", "image": "x"}],
        },
        "status": {"phase": "Pending"},
    }


def placed_pod(gated: dict, placement: Placement, key: bytes, bound: bool = True) -> dict:
    """`gated` as the placement adapter leaves it (placement written, gate removed), and, with `bound`, as
    the scheduler binds it (spec.nodeName)."""
    pod = copy.deepcopy(gated)
    meta = pod["metadata"]
    binding = Binding(meta["namespace"], meta["name"])
    meta["annotations"][PLACEMENT_ANNOTATION] = encode_placement(placement, key, binding)
    meta.setdefault("labels", {})[RESERVATION_ID_KEY] = placement.id
    del pod["spec"]["schedulingGates"]
    if bound:
        pod["spec"]["nodeName"] = placement.node
    return pod
