"""The `gpuledger.io/waiting` annotation: a waiting pod's request and arrival, signed, and back.

A pod that does not fit now is stored gated and holding nothing; this annotation is all the ledger needs to
put it back in line after a restart: the request as admission parsed it (its workload's annotations and gang
included, which the pod alone no longer says), the arrival the ledger stamped (its place in line), and the
binding (where it was issued, so a copy on another pod is told apart). Signed with the placement key, as the
placement annotation is (gpuledger.core.pods.placement_codec); decoding never raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger.core.model import GroupSpec, PinnedDevices, Request, SelectorRequirement, Toleration
from gpuledger.core.pods.placement_codec import (
    Binding,
    _canonical,
    _sign,
    _verified_members,
    binding_mismatch,
)
from gpuledger.core.pods.quantity import ascii_float

WAITING_VERSION = 1
_SIG_FIELD = ',"sig":"'


@dataclass(frozen=True)
class WaitTicket:
    """What a waiting pod carries: its request (its id is the reservation id it will be placed under), the
    arrival the ledger stamped, and where it was issued."""

    request: Request
    arrival: float
    binding: Binding


def request_to_dict(r: Request) -> dict[str, Any]:
    """Every field that differs from its default (so the text stays short and stable)."""
    d: dict[str, Any] = {"id": r.id}
    for name in ("gpus", "gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib", "priority", "seed"):
        if getattr(r, name):
            d[name] = getattr(r, name)
    for name in ("product", "preferred_domain", "strategy", "network_bandwidth", "namespace", "name"):
        if getattr(r, name):
            d[name] = getattr(r, name)
    if r.node_selector:
        d["node_selector"] = [[k, v] for k, v in r.node_selector]
    if r.affinity_terms:
        d["affinity_terms"] = [
            [[q.key, q.operator, list(q.values)] for q in term] for term in r.affinity_terms
        ]
    if r.tolerations:
        d["tolerations"] = [[t.key, t.operator, t.value, t.effect] for t in r.tolerations]
    if r.pinned is not None:
        d["pinned"] = [r.pinned.node, list(r.pinned.devices)]
    if r.group is not None:
        g = r.group
        d["group"] = [g.key, g.size, g.max_nodes_per_leaf, g.max_gpus_per_leaf]
    if r.latency_sensitive:
        d["latency_sensitive"] = True
    if r.network_bandwidth_gbps is not None:
        d["network_bandwidth_gbps"] = r.network_bandwidth_gbps
    return d


def _int(d: Mapping, name: str) -> int:
    value = d.get(name, 0)
    if type(value) is not int:
        raise ValueError(f"{name} is not an integer: {value!r}")
    return value


def _text(d: Mapping, name: str) -> str | None:
    value = d.get(name)
    if value is not None and type(value) is not str:
        raise ValueError(f"{name} is not text: {value!r}")
    return value


def _strings(values: Any) -> tuple[str, ...]:
    if not isinstance(values, list) or not all(type(v) is str for v in values):
        raise ValueError(f"not a list of text: {values!r}")
    return tuple(values)


def request_from_dict(d: Mapping) -> Request:
    """The request `request_to_dict` wrote; raises ValueError (or TypeError) on anything else."""
    rid = _text(d, "id")
    if not rid:
        raise ValueError("a waiting request needs an id")
    selector = tuple((str(k), str(v)) for k, v in d.get("node_selector") or ())
    terms = tuple(
        tuple(SelectorRequirement(str(k), str(op), _strings(values)) for k, op, values in term)
        for term in d.get("affinity_terms") or ()
    )
    tolerations = tuple(
        Toleration(str(k), str(op), str(v), str(e)) for k, op, v, e in d.get("tolerations") or ()
    )
    pinned = None
    if d.get("pinned") is not None:
        node, devices = d["pinned"]
        pinned = PinnedDevices(str(node), tuple(int(x) for x in devices))
    group = None
    if d.get("group") is not None:
        key, size, max_nodes, max_gpus = d["group"]
        group = GroupSpec(str(key), int(size), int(max_nodes), int(max_gpus))
    gbps = d.get("network_bandwidth_gbps")
    return Request(
        id=rid,
        gpus=_int(d, "gpus"),
        gpu_milli=_int(d, "gpu_milli"),
        gpu_memory_mib=_int(d, "gpu_memory_mib"),
        cpu_milli=_int(d, "cpu_milli"),
        memory_mib=_int(d, "memory_mib"),
        product=_text(d, "product"),
        node_selector=selector,
        affinity_terms=terms,
        tolerations=tolerations,
        preferred_domain=_text(d, "preferred_domain"),
        strategy=_text(d, "strategy"),
        priority=_int(d, "priority"),
        pinned=pinned,
        group=group,
        latency_sensitive=d.get("latency_sensitive") is True,
        network_bandwidth=_text(d, "network_bandwidth"),
        seed=_int(d, "seed"),
        namespace=_text(d, "namespace") or "",
        name=_text(d, "name") or "",
        network_bandwidth_gbps=None if gbps is None else ascii_float(gbps),
    )


def encode_waiting(ticket: WaitTicket, key: bytes | str = b"") -> str:
    """The annotation's value: canonical JSON with an HMAC-SHA256 `sig` of it as the last member (unsigned
    with an empty key: development only)."""
    d = {
        "v": WAITING_VERSION,
        "req": request_to_dict(ticket.request),
        "at": ticket.arrival,
        "bind": ticket.binding.as_dict(),
    }
    text = _canonical(d)
    if not key:
        return text
    return f'{text[:-1]}{_SIG_FIELD}{_sign(text, key)}"}}'


def decode_waiting(text: Any, key: bytes | str = b"") -> WaitTicket | None:
    """The ticket in an annotation, or None when it is malformed, of another version or its signature does
    not verify. Its binding is not checked here (`ticket_for`)."""
    try:
        d = _verified_members(text, key)
        if d is None or d.get("v") != WAITING_VERSION:
            return None
        req = d.get("req")
        if not isinstance(req, dict):
            return None
        arrival = ascii_float(d.get("at"))
        if not math.isfinite(arrival):
            return None
        return WaitTicket(request_from_dict(req), arrival, Binding.from_dict(d.get("bind")))
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        return None


def ticket_for(text: Any, key: bytes | str, pod: Mapping, namespace: str = "") -> WaitTicket | None:
    """The ticket when it verifies and was issued for `pod` (`binding_mismatch` finds nothing), else None."""
    ticket = decode_waiting(text, key)
    if ticket is None or binding_mismatch(ticket.binding, pod, namespace):
        return None
    return ticket
