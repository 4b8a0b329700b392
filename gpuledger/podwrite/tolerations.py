"""The tolerations a placement adds: one for each taint of its node the pod does not tolerate yet.

Whether a toleration tolerates a taint is the core's rule (gpuledger.core.model.Toleration.tolerates, the one
the ledger chose the node by); this module only reads a pod's entries into it and writes the missing ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpuledger.core.model import Taint, Toleration

# the effects that keep the scheduler off a node (PreferNoSchedule only makes it look elsewhere first)
HARD_EFFECTS = ("NoSchedule", "NoExecute")
OPERATORS = ("Equal", "Exists")


def read(entry: Any) -> Toleration | None:
    """A pod's toleration entry for the matcher; None for one that tolerates nothing: no mapping, or an
    operator Kubernetes does not know (the API server refuses such a pod after admission, and the
    scheduler's matcher tolerates nothing with it)."""
    if not isinstance(entry, dict):
        return None
    operator = entry.get("operator") or "Equal"
    if operator not in OPERATORS:
        return None
    return Toleration(
        key=entry.get("key") or "",
        operator=operator,
        value=entry.get("value") or "",
        effect=entry.get("effect") or "",
    )


def entry_for(taint: Taint) -> dict[str, Any]:
    """The toleration written for `taint`, members in the API's order: `Exists` for a taint without value."""
    out: dict[str, Any] = {"key": taint.key}
    if taint.value:
        out.update(operator="Equal", value=taint.value)
    else:
        out["operator"] = "Exists"
    if taint.effect:
        out["effect"] = taint.effect
    return out


def missing(existing: Sequence[Any], taints: Iterable[Taint]) -> list[dict[str, Any]]:
    """The entries to append to a pod's `existing` tolerations so that it tolerates every one of `taints`
    (a taint already tolerated, by the pod or by an entry added for an earlier taint, adds none)."""
    held = [t for t in map(read, existing) if t is not None]
    added = []
    for taint in taints:
        if any(t.tolerates(taint) for t in held):
            continue
        entry = entry_for(taint)
        added.append(entry)
        held.append(Toleration(taint.key, entry["operator"], taint.value, taint.effect))
    return added
