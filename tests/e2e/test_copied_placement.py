"""A copy of a placed pod in a namespace that is not opted in never double-books a device, and a rebuilt
ledger equals the live one (a placed pod copied, the original deleted, the copy kept: through kubectl)."""

from __future__ import annotations

import uuid

import pytest
import yaml

from tests.e2e.conftest import gpu_pod_yaml, stable_snapshot

pytestmark = pytest.mark.e2e


def _copy_of(pod: dict, name: str) -> str:
    """The stored pod as a user would copy it: metadata (annotations, labels), affinity and env kept."""
    meta = pod["metadata"]
    copy = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": dict(meta.get("annotations") or {}),
            "labels": dict(meta.get("labels") or {}),
        },
        "spec": {k: v for k, v in pod["spec"].items() if k not in ("nodeName",)},
    }
    return yaml.safe_dump(copy)


@pytest.fixture
def plain_namespace(apiserver):
    name = f"t-not-opted-{uuid.uuid4().hex[:6]}"
    apiserver.create_namespace(name, admission=False)
    yield name
    apiserver.force_delete("pods", namespace=name)
    apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _holders(stack, node: str) -> tuple[list, int]:
    snap = stack.call("snapshot")["nodes"][node]
    return [d[3] for d in snap["devices"]], snap["unknown_gpus"]


def test_a_copy_in_a_plain_namespace_never_double_books_and_rebuild_equals_live(
    apiserver, stack, workloads, plain_namespace
):
    workloads.apply(gpu_pod_yaml("original", gpus=1))
    original = workloads.pod("original")
    workloads.wait_confirmed([original])
    placed = workloads.placement(original)

    # 1. a full copy in a namespace without the opt-in label: the webhook never sees it
    apiserver.kubectl("apply", "-n", plain_namespace, "-f", "-", input=_copy_of(original, "copy"))
    copy = apiserver.get_json("pod", "copy", "-n", plain_namespace)
    assert (
        copy["metadata"]["annotations"]["gpuledger.io/placement"]
        == original["metadata"]["annotations"]["gpuledger.io/placement"]
    )

    # the ledger counts the copy as foreign use on that node, not as the reservation's owner
    def copy_counted():
        owners, unknown = _holders(stack, placed.node)
        return unknown >= 1 and owners[placed.devices[0]] == placed.id

    apiserver.wait_for(copy_counted, timeout=30, what="the copy counted as foreign use")
    # a conflict: listed by the ledger with the field that does not match, and an Event on the copy
    conflicts = [c for c in stack.call("snapshot")["conflicts"] if c[0] == f"{plain_namespace}/copy"]
    assert [c[1] for c in conflicts] == [placed.id] and "metadata.namespace" in conflicts[0][2]

    def conflict_event():
        events = apiserver.get_json("events", "-n", plain_namespace)["items"]
        return [
            e
            for e in events
            if e.get("reason") == "PlacementConflict" and e["involvedObject"].get("name") == "copy"
        ]

    apiserver.wait_for(conflict_event, timeout=30, what="a PlacementConflict Event on the copy")

    # 2. the original goes: its device stays held by the copy (by identity), so no new pod gets it
    apiserver.force_delete("pod", "original", namespace=workloads.namespace)

    def original_gone():
        owners, _ = _holders(stack, placed.node)
        return owners[placed.devices[0]] != placed.id

    apiserver.wait_for(original_gone, timeout=30, what="the original released")
    owners, _ = _holders(stack, placed.node)
    assert owners[placed.devices[0]] is not None, "the copy's device was freed: it can be double-booked"
    workloads.apply(
        gpu_pod_yaml("next", gpus=1, spec={"nodeSelector": {"kubernetes.io/hostname": placed.node}})
    )
    nxt = workloads.placement("next")
    assert nxt is not None and (nxt.node, nxt.devices) != (placed.node, placed.devices)

    # 3. the rebuilt ledger equals the live one, on what this test made: the node the copy and the original
    # shared, and the conflicts of this test's namespaces (the session's cluster is shared, and an earlier
    # test's namespace may still be draining elsewhere while the ledger is rebuilt)
    workloads.wait_confirmed([workloads.pod("next")])

    def own(snap: dict) -> dict:
        mine = (f"{workloads.namespace}/", f"{plain_namespace}/")
        return {
            "node": snap["nodes"][placed.node],
            "conflicts": [c for c in snap["conflicts"] if c[0].startswith(mine)],
        }

    before = own(stable_snapshot(stack))
    incarnation = stack.kill_ledger()
    stack.wait_ledger_synced(after_incarnation=incarnation)
    after = own(stable_snapshot(stack))
    assert after == before
