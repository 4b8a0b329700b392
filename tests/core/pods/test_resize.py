"""A pod resized in place holds what its node's kubelet reports it has (gpuledger.core.pods.allocated): the
request parser, a placed pod's holding, a pod gpuledger did not place, and the rebuild all read the same
status fields, so rebuilt equals live after resizes; a resize the kubelet defers is not counted."""

from __future__ import annotations

import copy
import json

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Placement, Request
from gpuledger.core.pods.allocated import allocated_sizes, resized
from gpuledger.core.pods.objects import pod_requests, pod_usage
from tests.core.core_factory import node, pod

KEY = b"resize-key"


def running(
    obj: dict, *, allocated: dict | None = None, applied: dict | None = None, pending: str = ""
) -> dict:
    """`obj` as its kubelet reports it: the main container's allocated and applied CPU and memory, and a
    resize it deferred (`pending`: the PodResizePending condition's reason)."""
    out = copy.deepcopy(obj)
    asked = out["spec"]["containers"][0]["resources"]["requests"]
    entry: dict = {"name": "main", "ready": True}
    entry["allocatedResources"] = dict(allocated if allocated is not None else asked)
    entry["resources"] = {"requests": dict(applied if applied is not None else entry["allocatedResources"])}
    out["status"]["containerStatuses"] = [entry]
    if pending:
        out["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": pending}]
    return out


def resized_spec(obj: dict, cpu: str, memory: str) -> dict:
    """`obj` after `kubectl patch --subresource resize`: the new size in its spec, its generation counted."""
    out = copy.deepcopy(obj)
    out["metadata"]["generation"] = out["metadata"].get("generation", 1) + 1
    out["spec"]["containers"][0]["resources"]["requests"].update({"cpu": cpu, "memory": memory})
    return out


def test_a_running_container_holds_what_its_kubelet_allocated_and_applied():
    base = pod("p", node_name="n", cpu="2", memory="4Gi")
    assert not resized(running(base))  # as created: nothing of the status is read
    grown = running(resized_spec(base, "8", "16Gi"), allocated={"cpu": "8", "memory": "16Gi"})
    assert resized(grown)
    assert allocated_sizes(grown) == {"main": {"cpu": 8000, "memory": 16384}}
    assert (pod_requests(grown).cpu_milli, pod_requests(grown).memory_mib) == (8000, 16384)
    # accepted, not yet applied: the allocation holds; a decrease holds the old size until it is applied
    accepted = running(
        resized_spec(base, "8", "4Gi"),
        allocated={"cpu": "8", "memory": "4Gi"},
        applied={"cpu": "2", "memory": "4Gi"},
    )
    assert pod_requests(accepted).cpu_milli == 8000
    shrinking = running(
        resized_spec(base, "1", "4Gi"),
        allocated={"cpu": "1", "memory": "4Gi"},
        applied={"cpu": "2", "memory": "4Gi"},
    )
    assert pod_requests(shrinking).cpu_milli == 2000
    # deferred by the kubelet (no room on the node): the spec asks 32, the pod still holds 2
    deferred = running(
        resized_spec(base, "32", "4Gi"), allocated={"cpu": "2", "memory": "4Gi"}, pending="Deferred"
    )
    assert pod_requests(deferred).cpu_milli == 2000
    # a pending pod (no container statuses) holds what its spec asks
    assert pod_requests(resized_spec(base, "32", "4Gi")).cpu_milli == 32000


def test_a_quantity_spelled_otherwise_is_read_and_a_malformed_one_is_a_problem():
    base = resized_spec(pod("p", node_name="n", cpu="500m", memory="1Gi"), "500m", "1Gi")
    respelled = running(base, allocated={"cpu": "0.5", "memory": "1024Mi"})
    assert (pod_requests(respelled).cpu_milli, pod_requests(respelled).memory_mib) == (500, 1024)
    problems: list[str] = []
    bad = running(base, allocated={"cpu": "lots", "memory": "1Gi"}, applied={"cpu": "lots", "memory": "1Gi"})
    assert pod_requests(bad, problems).cpu_milli == 500  # the spec's, with the reason recorded
    assert problems and "status main allocatedResources cpu" in problems[0] and "'lots'" in problems[0]


def _ledger() -> Ledger:
    led = Ledger(LedgerConfig(placement_key=KEY, reservation_ttl_s=30.0, default_strategy="best_fit"))
    led.apply_object(node("n", 8, cpu="64", memory="512Gi"), 0.0)
    return led


def _cpu_free(led: Ledger) -> int:
    return led.snapshot()["nodes"]["n"]["cpu_free"]


def _rebuilt_equals_live(led: Ledger, objects: list[dict]) -> bool:
    rebuilt = Ledger.rebuild([node("n", 8, cpu="64", memory="512Gi"), *objects], led.config, 1.0)
    return json.dumps(rebuilt.snapshot(), sort_keys=True, default=str) == json.dumps(
        led.snapshot(), sort_keys=True, default=str
    )


def test_a_placed_pod_resized_in_place_holds_its_new_size_and_the_rebuild_agrees():
    led = _ledger()
    request = Request(id="train", gpus=2, cpu_milli=4000, memory_mib=8192, namespace="default", name="train")
    placement = led.reserve(request, 0.0)
    assert isinstance(placement, Placement)
    stored = running(pod("train", placement=placement, key=KEY, cpu="4", memory="8Gi", gpus=2))
    led.apply_object(stored, 0.0)
    assert _cpu_free(led) == 60000 and _rebuilt_equals_live(led, [stored])

    grown = running(resized_spec(stored, "16", "8Gi"), allocated={"cpu": "16", "memory": "8Gi"})
    led.apply_object(grown, 1.0)
    assert _cpu_free(led) == 48000
    ((state, held),) = led.snapshot()["reservations"].values()
    assert state == "confirmed" and held["cpu"] == 16000 and held["devices"] == list(placement.devices)
    assert _rebuilt_equals_live(led, [grown])

    deferred = running(
        resized_spec(grown, "60", "8Gi"), allocated={"cpu": "16", "memory": "8Gi"}, pending="Deferred"
    )
    led.apply_object(deferred, 2.0)
    assert _cpu_free(led) == 48000 and _rebuilt_equals_live(led, [deferred])

    shrunk = running(resized_spec(grown, "2", "8Gi"), allocated={"cpu": "2", "memory": "8Gi"})
    led.apply_object(shrunk, 3.0)
    assert _cpu_free(led) == 62000 and _rebuilt_equals_live(led, [shrunk])
    # the freed CPU is placeable again: a pod asking for 62 CPUs fits beside it
    assert isinstance(led.reserve(Request(id="big", gpus=1, cpu_milli=62000), 3.0), Placement)


def test_a_pod_gpuledger_did_not_place_is_counted_at_its_new_size():
    led = _ledger()
    foreign = running(pod("web", node_name="n", cpu="2", memory="1Gi"))
    led.apply_object(foreign, 0.0)
    assert _cpu_free(led) == 62000
    grown = running(resized_spec(foreign, "10", "1Gi"), allocated={"cpu": "10", "memory": "1Gi"})
    led.apply_object(grown, 1.0)
    assert _cpu_free(led) == 54000 and _rebuilt_equals_live(led, [grown])


def test_usage_reads_the_resized_placement_on_both_paths():
    led = _ledger()
    placement = led.reserve(Request(id="a", gpus=1, cpu_milli=1000, namespace="default", name="a"), 0.0)
    assert isinstance(placement, Placement)
    grown = running(
        resized_spec(pod("a", placement=placement, key=KEY, cpu="1", gpus=1), "3", "1Gi"),
        allocated={"cpu": "3", "memory": "1Gi"},
    )
    for lazy in (True, False):
        usage = pod_usage(grown, KEY, [], lazy=lazy)
        assert usage.placement is not None and usage.placement.cpu_milli == 3000
        assert usage.cpu_milli == 3000 and usage.gpus == 1
