"""Pods of one template ask the same: what the mutating handler reads of a pod before the ledger, worked out
once per pod shape.

A Deployment's, a Job's or a `kubectl apply` loop's pods differ only in their identity: name, generateName,
uid, creation time, managed fields, kubectl's last-applied copy. What the handler decides from the rest (the
device-environment guard, the scheduler name, the request that annotations and spec make) is the same for
all of them, so it is kept per shape: the pod's JSON without those fields and its namespace, and for the
request also the controller objects the pod's annotations were inherited from. A kept request serves the
next pod through `for_another_pod` (its id, seed and name are that pod's). Never kept: a request pinned by
gpu-scheduling-map (its entry is chosen by the pod's name or index), a pod carrying gpuledger.io keys or a
placement of its own (a reinvocation), and anything that was denied (each denial is worked out afresh).

Pods arrive decoded from JSON, so equal JSON is equal input. Bounded: the oldest shape goes first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gpuledger.core.model import Request
from gpuledger.core.pods.request import for_another_pod
from gpuledger.webhook.admission.scheduler_name import SchedulerChoice

# metadata that names one pod, never read for its request, guard or scheduler (request_from_pod reads the
# name only into Request.name, which for_another_pod sets per pod)
IDENTITY_FIELDS = frozenset({"name", "generateName", "uid", "creationTimestamp", "managedFields"})
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"  # names the pod (kubectl apply)
DEFAULT_CAPACITY = 1024


@dataclass
class PodShapes:
    capacity: int = DEFAULT_CAPACITY
    checked: dict[bytes, SchedulerChoice] = field(default_factory=dict)  # refused nothing; the choice
    requests: dict[tuple[bytes, bytes], Request | None] = field(default_factory=dict)  # None: no GPU
    # the JSON of the owner objects read for a request, by object: the owner lookup hands out the same dict
    # while it is cached and replaces it, never changes it, when it reads the object again; the entry holds
    # the object, so its id is not reused meanwhile
    _owner_json: dict[int, tuple[dict, bytes]] = field(default_factory=dict)

    def key(self, pod: dict, namespace: str) -> bytes | None:
        """The pod's shape: its JSON without its identity, and the namespace; None when it cannot be written
        as JSON (such a pod is simply parsed)."""
        meta = pod.get("metadata")
        if not isinstance(meta, dict):
            return None
        view = {k: v for k, v in meta.items() if k not in IDENTITY_FIELDS}
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and isinstance(annotations.get(LAST_APPLIED), str):
            view["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
        try:
            return orjson.dumps([namespace, {**pod, "metadata": view}])
        except TypeError:  # (orjson's JSONEncodeError): keys or values JSON has no spelling for
            return None

    def choice(self, key: bytes) -> SchedulerChoice | None:
        """The scheduler choice of a shape the guard found nothing in; None when not known yet."""
        return self.checked.get(key)

    def remember_choice(self, key: bytes, choice: SchedulerChoice) -> None:
        _put(self.checked, key, choice, self.capacity)

    def request_key(self, shape: bytes, owners: tuple[dict, ...]) -> tuple[bytes, bytes] | None:
        """The key of a shape's request: the shape and the owner objects its annotations came from (None
        when one cannot be written as JSON)."""
        parts = []
        for owner in owners:
            known = self._owner_json.get(id(owner))
            if known is None:
                try:
                    known = (owner, orjson.dumps(owner))
                except TypeError:
                    return None
                _put(self._owner_json, id(owner), known, self.capacity)
            parts.append(known[1])
        return shape, b"\n".join(parts)

    def request(
        self, key: tuple[bytes, bytes], reservation_id: str, name: str
    ) -> tuple[bool, Request | None]:
        """(True, this pod's request) when the shape's request is known (None: it needs no GPU), else
        (False, None)."""
        if key not in self.requests:
            return False, None
        template = self.requests[key]
        return True, None if template is None else for_another_pod(template, reservation_id, name)

    def remember_request(self, key: tuple[bytes, bytes], request: Request | None) -> None:
        if request is None or request.pinned is None:
            _put(self.requests, key, request, self.capacity)


def _put(table: dict[Any, Any], key: Any, value: Any, capacity: int) -> None:
    if key not in table and len(table) >= capacity:
        del table[next(iter(table))]  # the oldest
    table[key] = value
