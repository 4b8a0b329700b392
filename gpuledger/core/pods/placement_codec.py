"""The `gpuledger.io/placement` annotation: a placement as signed canonical JSON, and back.

The API server is where placements are durable, so this codec is what a rebuilt ledger trusts: decoding
never raises and never accepts a placement whose HMAC does not verify (when a key is set). Version 2 signs
the placement together with its `Binding` (where it was issued), so a copy on another pod is detectable;
version 1 (no binding) is still read, as legacy, during an upgrade.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from sys import intern
from typing import Any

from gpuledger.core.model import DeviceShare, GroupSlot, Placement, Taint
from gpuledger.core.pods.quantity import ascii_float, ascii_int
from gpuledger.core.slots_init import dict_init

PLACEMENT_VERSION = 2  # signs the placement with its Binding
LEGACY_VERSION = 1  # no binding: honoured on any pod (annotations written before version 2)


@dict_init  # one per stored pod a rebuild reads
@dataclass(frozen=True)
class Binding:
    """Where a placement was issued, as known at mutating admission and fixed afterwards: the namespace, and
    the pod's name, or (a generateName pod is nameless then) its generateName and controller owner's uid."""

    namespace: str
    name: str = ""
    generate_name: str = ""
    owner_uid: str = ""

    def as_dict(self) -> dict[str, str]:
        d = {"ns": self.namespace, "name": self.name, "gen": self.generate_name, "owner": self.owner_uid}
        return {k: v for k, v in d.items() if v or k == "ns"}

    @classmethod
    def from_dict(cls, d: Any) -> Binding:
        if not isinstance(d, dict) or not isinstance(d.get("ns"), str):
            raise ValueError("placement binding needs a string ns")
        get = d.get
        name, gen, owner = get("name", ""), get("gen", ""), get("owner", "")
        if type(name) is str and type(gen) is str and type(owner) is str:  # (what a signer writes)
            return cls(str(d["ns"]), name, gen, owner)
        return cls(str(d["ns"]), str(name), str(gen), str(owner))


def _meta(pod: object) -> Mapping:
    if type(pod) is dict:  # (a dict is a Mapping: the ABC's check skipped for the common case)
        meta = pod.get("metadata")
    else:
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    return meta if type(meta) is dict or isinstance(meta, Mapping) else {}


def controller_uid(pod: Mapping) -> str:
    """The uid of the pod's controlling owner (any kind), "" when it has none."""
    refs = _meta(pod).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if (type(ref) is dict or isinstance(ref, Mapping)) and ref.get("controller") and ref.get("uid"):
            return str(ref["uid"])
    return ""


def binding_of(pod: Mapping, namespace: str = "", name: str = "") -> Binding:
    """The binding of a pod at mutating admission (`namespace`/`name` from the AdmissionReview when given)."""
    meta = _meta(pod)
    name = name or str(meta.get("name") or "")
    namespace = namespace or str(meta.get("namespace") or "") or "default"
    if name:
        return Binding(namespace, name)
    return Binding(
        namespace, generate_name=str(meta.get("generateName") or ""), owner_uid=controller_uid(pod)
    )


def binding_mismatch(binding: Binding | None, pod: Mapping, namespace: str = "") -> str:
    """Why `pod` is not where the placement was issued, naming the field; "" when it is (or for a legacy
    placement, which has no binding)."""
    if binding is None:
        return ""
    meta = _meta(pod)
    ns = namespace or str(meta.get("namespace") or "") or "default"
    if ns != binding.namespace:
        issued = binding.namespace
        return f"metadata.namespace {ns!r} is not the namespace the placement was issued for ({issued!r})"
    name = str(meta.get("name") or "")
    if binding.name:
        if name != binding.name:
            return f"metadata.name {name!r} is not the pod the placement was issued for ({binding.name!r})"
        return ""
    if binding.generate_name and name and not name.startswith(binding.generate_name):
        return (
            f"metadata.name {name!r} was not generated from the generateName the placement was issued for "
            f"({binding.generate_name!r})"
        )
    uid = controller_uid(pod)
    if uid != binding.owner_uid:
        return (
            f"metadata.ownerReferences controller uid {uid!r} is not the owner the placement was issued for "
            f"({binding.owner_uid!r})"
        )
    return ""


def placement_to_dict(p: Placement) -> dict:
    d: dict[str, Any] = {"v": LEGACY_VERSION, "id": p.id, "node": p.node}
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
            [
                s.slot,
                s.node,
                list(s.devices),
                list(s.uuids),
                [[x.device, x.milli, x.memory_mib] for x in s.shares],
            ]
            for s in p.group_plan
        ]
    if p.group_deadline is not None:
        d["deadline"] = p.group_deadline
    return d


def _shares(raw) -> tuple[DeviceShare, ...]:
    if not raw:
        return ()
    out = []
    for a, b, c in raw:
        if type(a) is int and type(b) is int and type(c) is int:  # (what a signer writes: no conversion)
            out.append(DeviceShare(a, b, c))
        else:
            out.append(DeviceShare(ascii_int(a), ascii_int(b), ascii_int(c)))
    return tuple(out)


def _ints(raw) -> tuple[int, ...]:
    if not raw:
        return ()
    out = tuple(raw)
    for x in out:
        if type(x) is not int:  # (ints, the JSON a signer writes, need no conversion)
            return tuple(map(ascii_int, raw))
    return out


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
    cpu, mem, score = get("cpu", 0), get("mem", 0), get("score", 0.0)
    # positional, in the field order of `Placement` (a third faster than keywords; the round-trip tests fill
    # every field with a distinct value)
    return Placement(
        pid,
        intern(node),  # one copy of each node name, device uuid and strategy name across placements
        _ints(get("devices")),
        _shares(get("shares")),
        tuple(intern(str(u)) for u in uuids) if uuids else (),
        cpu if type(cpu) is int else ascii_int(cpu),
        mem if type(mem) is int else ascii_int(mem),
        get("group"),
        None if slot is None else ascii_int(slot),
        intern(str(get("strategy", ""))),
        score if type(score) is float else ascii_float(score),
        tuple(Taint(str(k), str(v), str(e)) for k, v, e in taints) if taints else (),
        tuple(
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
        None if deadline is None else ascii_float(deadline),
    )


# built once: json.dumps with these arguments builds an encoder on every call (~1 us of each admission)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _canonical(d: dict) -> str:
    return _CANONICAL.encode(d)


_BLOCK = 64  # SHA-256's block size
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


@functools.lru_cache(maxsize=8)
def _pads(key: bytes | str) -> tuple[Any, Any]:
    """SHA-256 states that have absorbed the key's inner and outer pad (RFC 2104): `hmac.digest` hashes both
    pads again on every call, two of the three compressions of a short placement's HMAC. Cached by the key as
    given (a text key is encoded once, here)."""
    if isinstance(key, str):
        key = key.encode()
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


def _sign(text: str, key: bytes | str) -> str:
    """HMAC-SHA256 of `text` as hex: `hmac.digest(key, text, "sha256").hex()` (tested), ~3x faster."""
    inner, outer = _pads(key)
    inner = inner.copy()
    inner.update(text.encode())
    outer = outer.copy()
    outer.update(inner.digest())
    return outer.hexdigest()


# json.loads' own scanner, without its wrappers (a rebuild's hot path; the core imports only the standard
# library, so not orjson)
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str) -> Any:
    """`json.loads(text)`, faster for the canonical text a signer writes (no surrounding whitespace): anything
    else goes through `json.loads` itself, so every input decodes (or fails) as it does."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


_SIG_FIELD = ',"sig":"'


def encode_placement(placement: Placement, key: bytes | str = b"", binding: Binding | None = None) -> str:
    """The `gpuledger.io/placement` annotation value: the placement (with its `binding` under `bind`, version
    2; without one, a legacy version 1 value) as canonical JSON (sorted keys, no spaces) with an HMAC-SHA256
    `sig` of that canonical text appended as the last member. An empty key writes an unsigned annotation
    (development only)."""
    d = placement_to_dict(placement)
    if binding is not None:
        d["v"] = PLACEMENT_VERSION
        d["bind"] = binding.as_dict()
    text = _canonical(d)
    if not key:
        return text
    return f'{text[:-1]}{_SIG_FIELD}{_sign(text, key)}"}}'


def decode_placement(text: str, key: bytes | str = b"") -> Placement | None:
    """The placement in an annotation, or None when it is malformed or its signature does not verify
    (the signed text is the annotation with its trailing `sig` member removed). Its binding is not checked:
    see `decode_bound` and `binding_mismatch`.

    With an empty key signatures are not checked (development only)."""
    decoded = decode_bound(text, key)
    return None if decoded is None else decoded[0]


def decode_bound(text: str, key: bytes | str = b"") -> tuple[Placement, Binding | None] | None:
    """The placement in an annotation and the binding signed with it (None for a legacy version 1 value),
    or None when it is malformed or its signature does not verify."""
    try:
        decoded = _signed_placement(text, key)
        if decoded is None:
            return None
        placement, bind = decoded
        return placement, None if bind is None else Binding.from_dict(bind)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):  # RecursionError: "[[[[..." JSON
        return None


def decode_issued_for(text: str, key: bytes | str, pod: Mapping) -> Placement | None:
    """`decode_bound`'s placement when it was issued for `pod` (`binding_mismatch` finds nothing) or is a
    legacy value; None for anything else. One call, and no `Binding` built for the common binding: a rebuild
    asks it of every stored pod."""
    try:
        decoded = _signed_placement(text, key)
        if decoded is None:
            return None
        placement, bind = decoded
        return placement if bind is None or issued_for(bind, pod) else None
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        return None


def _signed_placement(text: str, key: bytes | str) -> tuple[Placement, dict | None] | None:
    """The placement of an annotation whose signature verifies and the members of the binding signed with it
    (None: a legacy version 1 value, bound to nothing); None for an unknown version. May raise on a malformed
    text or binding (the callers catch)."""
    d = _verified_members(text, key)
    if d is None:
        return None
    version = d.get("v", LEGACY_VERSION)
    if type(version) is not int:
        return None
    if version == LEGACY_VERSION and "bind" not in d:
        return placement_from_dict(d), None
    if version == PLACEMENT_VERSION:
        placement = placement_from_dict(d)
        bind = d.get("bind")
        if not isinstance(bind, dict):
            raise ValueError(f"placement binding is not an object: {bind!r}")
        return placement, bind
    return None


def issued_for(bind: Any, pod: Mapping) -> bool:
    """`not binding_mismatch(Binding.from_dict(bind), pod)` (raising as that does), read from the signed
    members as they are where every value is text, as a signer writes them."""
    if type(bind) is dict:
        get = bind.get
        ns, name, gen, owner = get("ns"), get("name", ""), get("gen", ""), get("owner", "")
        if type(ns) is str and type(name) is str and type(gen) is str and type(owner) is str:
            meta = _meta(pod)
            pod_ns, pod_name = meta.get("namespace"), meta.get("name")
            if (pod_ns is None or type(pod_ns) is str) and (pod_name is None or type(pod_name) is str):
                if (pod_ns or "default") != ns:
                    return False
                pod_name = pod_name or ""
                if name:
                    return pod_name == name
                if gen and pod_name and not pod_name.startswith(gen):
                    return False
                return controller_uid(pod) == owner
    return not binding_mismatch(Binding.from_dict(bind), pod)


def _verified_members(text: str, key: bytes | str) -> dict | None:
    """The members of a placement annotation whose signature verifies (any JSON object when `key` is
    empty, its `sig` dropped); None otherwise. May raise on a malformed text (the callers catch)."""
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
        d = _loads(signed)
    else:
        d = json.loads(text)
        if isinstance(d, dict):
            d.pop("sig", None)
    return d if isinstance(d, dict) else None
