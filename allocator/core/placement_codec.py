"""The `gpuledger.io/placement` annotation: a placement as signed canonical JSON, and back.

The API server is where placements are durable, so this codec is what a rebuilt ledger trusts: decoding
never raises and never accepts a placement whose HMAC does not verify (when a key is set).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from allocator.core.model import DeviceShare, GroupSlot, Placement, Taint
from allocator.core.quantity import ascii_float, ascii_int

PLACEMENT_ANNOTATION = "gpuledger.io/placement"
RESERVATION_ID_KEY = "gpuledger.io/reservation-id"
PLACEMENT_VERSION = 1


def placement_to_dict(p: Placement) -> dict:
    d: dict[str, Any] = {"v": PLACEMENT_VERSION, "id": p.id, "node": p.node}
    if p.devices:
        d["devices"] = list(p.devices)
    if p.shares:
        d["shares"] = [[s.device, s.milli, s.memory_mib] for s in p.shares]
    if p.uuids:
        d["uuids"] = list(p.uuids)
    if p.cpu_milli:
        d["cpu"] = p.cpu_milli
    if p.memory_mib:
        d["mem"] = p.memory_mib
    if p.group is not None:
        d["group"] = p.group
    if p.slot is not None:
        d["slot"] = p.slot
    if p.strategy:
        d["strategy"] = p.strategy
    if p.score:
        d["score"] = p.score
    if p.tolerated_taints:
        d["taints"] = [[t.key, t.value, t.effect] for t in p.tolerated_taints]
    if p.group_plan:
        d["plan"] = [
            [s.slot, s.node, list(s.devices), list(s.uuids), [[x.device, x.milli, x.memory_mib] for x in s.shares]]
            for s in p.group_plan
        ]
    if p.group_deadline is not None:
        d["deadline"] = p.group_deadline
    return d


def _shares(raw) -> tuple[DeviceShare, ...]:
    return tuple(DeviceShare(ascii_int(a), ascii_int(b), ascii_int(c)) for a, b, c in raw) if raw else ()


def _ints(raw) -> tuple[int, ...]:
    return tuple(map(ascii_int, raw)) if raw else ()


def placement_from_dict(d: dict) -> Placement:
    get = d.get
    pid, node = get("id"), get("node")
    if not isinstance(pid, str) or not isinstance(node, str):
        raise ValueError("placement needs string id and node")
    uuids = get("uuids")
    slot = get("slot")
    taints = get("taints")
    plan = get("plan")
    deadline = get("deadline")
    return Placement(
        id=pid,
        node=node,
        devices=_ints(get("devices")),
        shares=_shares(get("shares")),
        uuids=tuple(map(str, uuids)) if uuids else (),
        cpu_milli=ascii_int(get("cpu", 0)),
        memory_mib=ascii_int(get("mem", 0)),
        group=get("group"),
        slot=None if slot is None else ascii_int(slot),
        strategy=str(get("strategy", "")),
        score=ascii_float(get("score", 0.0)),
        tolerated_taints=tuple(Taint(str(k), str(v), str(e)) for k, v, e in taints) if taints else (),
        group_plan=tuple(
            GroupSlot(
                ascii_int(s[0]),
                str(s[1]),
                _ints(s[2]),
                tuple(map(str, s[3])),
                _shares(s[4] if len(s) > 4 else ()),
            )
            for s in plan
        )
        if plan
        else (),
        group_deadline=None if deadline is None else ascii_float(deadline),
    )


def _canonical(d: dict) -> str:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sign(text: str, key: bytes | str) -> str:
    if isinstance(key, str):
        key = key.encode()
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


_SIG_FIELD = ',"sig":"'


def encode_placement(placement: Placement, key: bytes | str = b"") -> str:
    """The `gpuledger.io/placement` annotation value: the placement as canonical JSON (sorted keys, no
    spaces) with an HMAC-SHA256 `sig` of that canonical text appended as the last member. An empty key
    writes an unsigned annotation (development only)."""
    text = _canonical(placement_to_dict(placement))
    if not key:
        return text
    return f'{text[:-1]}{_SIG_FIELD}{_sign(text, key)}"}}'


def decode_placement(text: str, key: bytes | str = b"") -> Placement | None:
    """The placement in an annotation, or None when it is malformed or its signature does not verify
    (the signed text is the annotation with its trailing `sig` member removed).

    With an empty key signatures are not checked (development only)."""
    try:
        if not isinstance(text, str):
            return None
        if key:
            cut = text.rfind(_SIG_FIELD)
            if cut < 0 or not text.endswith('"}'):
                return None
            signed = text[:cut] + "}"
            sig = text[cut + len(_SIG_FIELD) : -2]
            if not hmac.compare_digest(sig, _sign(signed, key)):
                return None
            d = json.loads(signed)
        else:
            d = json.loads(text)
            if isinstance(d, dict):
                d.pop("sig", None)
        if not isinstance(d, dict) or d.get("v", PLACEMENT_VERSION) != PLACEMENT_VERSION:
            return None
        return placement_from_dict(d)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):  # RecursionError: "[[[[..." JSON
        return None
