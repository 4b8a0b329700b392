"""RFC 6902 operations turning a pod into its copy-on-write copy (gpuledger.podwrite.copy_on_write), as the
webhook's mutating path wrote it: the members it writes are compared, nothing else, so unknown fields survive
and a reinvocation that writes the same again gets no operations. No whole-object diff: diffing the pod was
the largest part of an admission's CPU before."""

from __future__ import annotations

from typing import Any

from gpuledger.podwrite.containers import CONTAINER_KINDS
from gpuledger.podwrite.pointer import escape

_MISSING: Any = object()
# Every member the webhook's mutating path writes (its strip of gpuledger's keys, its scheduler takeover, this
# layer's writers): the patch compares these and nothing else. tests/webhook/test_webhook_fuzz.py checks, on
# random pods through every mode, that the patch turns the original into the mutated pod exactly.
SPEC_MEMBERS = ("schedulerName", "nodeName", "affinity", "tolerations", "schedulingGates")
CONTAINER_MEMBERS = ("env", "resources")


def patch_of(original: dict, work: dict) -> list[dict]:
    """The operations turning `original` into `work`, its `shallow_pod` copy as written: `add` for a new
    member, `replace` for a changed one, `remove`; compared by identity first (copy-on-write leaves untouched
    subtrees shared) and by value second."""
    ops: list[dict] = []
    if work is original:
        return ops
    old_meta, new_meta = original.get("metadata", _MISSING), work.get("metadata", _MISSING)
    if new_meta is not old_meta:
        if isinstance(old_meta, dict) and isinstance(new_meta, dict):
            for field in ("annotations", "labels"):
                _mapping_ops(old_meta, new_meta, field, f"/metadata/{field}", ops)
        else:
            _member_op(original, work, "metadata", "/metadata", ops)
    old_spec, new_spec = original.get("spec", _MISSING), work.get("spec", _MISSING)
    if new_spec is old_spec:
        return ops
    if not (isinstance(old_spec, dict) and isinstance(new_spec, dict)):
        _member_op(original, work, "spec", "/spec", ops)
        return ops
    for key in SPEC_MEMBERS:
        _member_op(old_spec, new_spec, key, f"/spec/{key}", ops)
    for kind in CONTAINER_KINDS:
        old, new = old_spec.get(kind), new_spec.get(kind)
        if new is old:
            continue
        if not (isinstance(old, list) and isinstance(new, list) and len(old) == len(new)):
            _member_op(old_spec, new_spec, kind, f"/spec/{kind}", ops)
            continue
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a is b:
                continue
            if isinstance(a, dict) and isinstance(b, dict):
                for key in CONTAINER_MEMBERS:
                    _member_op(a, b, key, f"/spec/{kind}/{i}/{key}", ops)
            elif a != b:
                ops.append({"op": "replace", "path": f"/spec/{kind}/{i}", "value": b})
    return ops


def _member_op(old: dict, new: dict, key: str, path: str, ops: list[dict]) -> None:
    """`add` when new[key] is new, `replace` when it differs, `remove` when it went."""
    value = new.get(key, _MISSING)
    before = old.get(key, _MISSING)
    if value is before:
        return
    if value is _MISSING:
        ops.append({"op": "remove", "path": path})
    elif before is _MISSING:
        ops.append({"op": "add", "path": path, "value": value})
    elif before != value:
        ops.append({"op": "replace", "path": path, "value": value})


def _mapping_ops(old_meta: dict, new_meta: dict, field: str, path: str, ops: list[dict]) -> None:
    """Annotations and labels key by key (the whole map would repeat e.g. kubectl's last-applied copy)."""
    old, new = old_meta.get(field, _MISSING), new_meta.get(field, _MISSING)
    if new is old:
        return
    if not (isinstance(old, dict) and isinstance(new, dict)):
        _member_op(old_meta, new_meta, field, path, ops)
        return
    for key in old:
        if key not in new:
            ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if before is _MISSING:
            ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": value})
        elif before is not value and before != value:
            ops.append({"op": "replace", "path": f"{path}/{escape(key)}", "value": value})
