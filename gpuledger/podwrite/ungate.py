"""The JSON patch that writes a waiting pod's placement and removes gpuledger's gate from it, in one request.

A gated pod may change only some of its spec: its annotations and labels, additions to its required node
affinity terms (not nodeName), additions to its tolerations, and its gates. Its first operations test that it
is still the pod that was read and still gated there, so a patch meant for a pod since replaced fails instead
of landing elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuledger.core.model import Taint
from gpuledger.names import SCHEDULING_GATE
from gpuledger.podwrite import tolerations
from gpuledger.podwrite.affinity import with_node
from gpuledger.podwrite.copy_on_write import dict_at, list_at
from gpuledger.podwrite.pointer import escape


def placement_ops(
    pod: dict,
    gate: int,
    *,
    uid: str,
    node: str,
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    taints: Iterable[Taint],
    affinity_key: str,
) -> list[dict]:
    """The operations for `pod` (as last read, gpuledger's gate at index `gate`): the signed annotations and
    labels added, `node` ANDed into its required affinity, the tolerations missing for the hard `taints`
    added (a soft one does not keep the scheduler off the node), the gate removed."""
    meta, spec = dict_at(pod, "metadata"), dict_at(pod, "spec")
    ops: list[dict] = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": f"/spec/schedulingGates/{gate}/name", "value": SCHEDULING_GATE},
    ]
    for field, values in (("annotations", annotations), ("labels", labels)):
        if isinstance(meta.get(field), Mapping):
            ops += [
                {"op": "add", "path": f"/metadata/{field}/{escape(k)}", "value": v} for k, v in values.items()
            ]
        else:
            ops.append({"op": "add", "path": f"/metadata/{field}", "value": dict(values)})
    ops.append(
        {"op": "add", "path": "/spec/affinity", "value": with_node(spec.get("affinity"), node, affinity_key)}
    )
    existing = list_at(spec, "tolerations")
    hard = [t for t in taints if t.effect in tolerations.HARD_EFFECTS]
    added = tolerations.missing(existing, hard)
    if added:
        ops.append({"op": "add", "path": "/spec/tolerations", "value": [*existing, *added]})
    ops.append({"op": "remove", "path": f"/spec/schedulingGates/{gate}"})
    return ops
