"""The admission decisions, driven directly (no HTTP): patches, modes, idempotency, dryRun, forgery,
failures."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuledger.core.model import BindingMode, Placement
from gpuledger.core.pods.placement_codec import decode_placement, encode_placement
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY
from gpuledger.webhook.admission.handler import AdmissionHandler
from gpuledger.webhook.admission.owners import StaticOwners
from gpuledger.webhook.ledger.client import LedgerUnavailable
from tests.webhook.webhook_support import (
    HMAC_KEY,
    Clock,
    apply_patch,
    cluster,
    config,
    gpu_pod,
    handler,
    review,
)

KEY = HMAC_KEY.encode()


def run(coro):
    return asyncio.run(coro)


def env_of(pod, container=0):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][container].get("env", [])}


def test_placement_patch_keeps_unknown_fields_and_signs():
    h, svc = handler(cluster(2, 8))
    pod = gpu_pod(2)
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.node and len(d.devices) == 2
    out = apply_patch(pod, d.patch)
    assert out["spec"]["someUnknownField"] == "survives"
    assert out["spec"]["containers"][0]["futureField"] == {"kept": True}
    placement = decode_placement(out["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
    assert placement is not None and placement.node == d.node and placement.devices == d.devices
    assert out["metadata"]["labels"][RESERVATION_ID_KEY] == placement.id == d.reservation_id
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [d.node]}]}
    ]
    assert "nodeName" not in out["spec"]
    env = env_of(out)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(placement.uuids) and placement.uuids[0].startswith(
        "GPU-"
    )
    assert svc.stats().reservations_pending == 1
    assert all(op["op"] in ("add", "replace", "remove") for op in d.patch)


@pytest.mark.parametrize("mode", ["nodeName", "affinity", "both"])
def test_binding_modes(mode):
    h, _ = handler(cluster(1, 8), config(binding_mode=mode))
    pod = gpu_pod(1)
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                        ]
                    },
                    {},
                ]
            }
        }
    }
    d = run(h.mutate(review(pod)))
    out = apply_patch(pod, d.patch)
    assert (out["spec"].get("nodeName") == d.node) == (mode in ("nodeName", "both"))
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    pinned = all(
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [d.node]}
        in t.get("matchExpressions", [])
        for t in terms
    )
    assert pinned == (mode in ("affinity", "both"))
    assert len(terms) == 2  # every OR term is ANDed with the node, none dropped


def test_affinity_on_metadata_name_uses_match_fields():
    h, _ = handler(cluster(1, 8), config(affinity_key="metadata.name"))
    pod = gpu_pod(1)
    out = apply_patch(pod, run(h.mutate(review(pod))).patch)
    term = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["node-0000"]}]


def test_tolerations_for_gpu_taints():
    h, _ = handler(cluster(1, 8, tainted=True))
    pod = gpu_pod(1)
    d = run(h.mutate(review(pod)))
    assert d.allowed, d.message
    out = apply_patch(pod, d.patch)
    assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in out[
        "spec"
    ]["tolerations"]


def test_visibility_modes_overwrite_user_values():
    for mode, expect in [
        ("host-indices", {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0,1,2"}),
        ("device-plugin", {"CUDA_VISIBLE_DEVICES": "7"}),  # kept: it indexes what the plugin exposes
    ]:
        h, _ = handler(cluster(1, 8), config(visibility_mode=mode))
        pod = gpu_pod(3, containers=2)
        for c in pod["spec"]["containers"]:
            c["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": "7"}, {"name": "KEEP", "value": "me"}]
        out = apply_patch(pod, run(h.mutate(review(pod))).patch)
        for i in range(2):
            env = env_of(out, i)
            assert env.pop("KEEP") == "me"
            assert env == expect, mode
        if mode == "device-plugin":
            assert out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "3"


def test_runtime_uuids_only_for_gpu_containers_when_limits_say_which():
    h, _ = handler(cluster(1, 8))
    pod = gpu_pod(2, limits=True, containers=2)
    out = apply_patch(pod, run(h.mutate(review(pod))).patch)
    assert env_of(out, 0)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env_of(out, 1) == {"NVIDIA_VISIBLE_DEVICES": "void"}  # the sidecar sees no GPU, not all of them


def test_device_plugin_mode_refuses_shares():
    h, _ = handler(cluster(1, 8), config(visibility_mode="device-plugin"))
    d = run(h.mutate(review(gpu_pod(None, annotations={"agentaflow.gpu/milli": "300"}))))
    assert not d.allowed and d.code == 422 and "device-plugin" in d.message


def test_shared_gpu_placement():
    h, svc = handler(cluster(1, 2))
    pods = [gpu_pod(None, annotations={"agentaflow.gpu/milli": "400"}) for _ in range(5)]
    results = [run(h.mutate(review(p))) for p in pods]
    assert [r.allowed for r in results] == [True, True, True, True, False]
    assert "share" in results[-1].message


class ExplodingLedger:
    def __getattr__(self, name):
        raise AssertionError(f"the ledger must not be called ({name})")


def test_pod_without_gpu_is_allowed_unchanged_without_ledger_call():
    cfg = config()
    h = AdmissionHandler(cfg, ExplodingLedger())
    pod = gpu_pod(None)
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.patch == [] and d.outcome == "no_gpu"


def test_user_supplied_ledger_keys_are_removed_first():
    h = AdmissionHandler(config(), ExplodingLedger())
    pod = gpu_pod(None, labels={RESERVATION_ID_KEY: "mine", "app": "x"})
    pod["metadata"]["annotations"].update(
        {PLACEMENT_ANNOTATION: "{}", "gpuledger.io/anything": "x", "keep": "1"}
    )
    d = run(h.mutate(review(pod)))
    out = apply_patch(pod, d.patch)
    assert out["metadata"]["annotations"] == {"keep": "1"}
    assert out["metadata"]["labels"] == {"app": "x"}
    assert d.warnings and "gpuledger.io/anything" in d.warnings[0]


def test_forged_placement_on_gpu_pod_is_replaced_by_a_real_one():
    h, _ = handler(cluster(1, 8))
    pod = gpu_pod(1)
    forged = Placement(id="forged", node="node-0000", devices=(0, 1, 2, 3, 4, 5, 6, 7))
    pod["metadata"]["annotations"][PLACEMENT_ANNOTATION] = encode_placement(forged, b"wrong key")
    d = run(h.mutate(review(pod)))
    out = apply_patch(pod, d.patch)
    real = decode_placement(out["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
    assert real.id != "forged" and len(real.devices) == 1


def test_dry_run_patches_but_reserves_nothing():
    h, svc = handler(cluster(1, 8))
    before = svc.snapshot()
    pod = gpu_pod(8)
    d = run(h.mutate(review(pod, dry_run=True)))
    assert d.allowed and len(d.devices) == 8 and d.patch and "dry run" in d.message
    assert svc.snapshot() == before
    out = apply_patch(pod, d.patch)
    assert run(h.validate(review(out, dry_run=True))).allowed  # signature checked, nothing to look up
    # the same pod for real still fits: the dry run held nothing
    assert run(h.mutate(review(gpu_pod(8)))).allowed


def test_reinvocation_is_idempotent():
    h, svc = handler(cluster(2, 8))
    pod = gpu_pod(3)
    first = run(h.mutate(review(pod)))
    mutated = apply_patch(pod, first.patch)
    again = run(h.mutate(review(mutated)))  # a new uid, as on reinvocation
    assert again.allowed and again.outcome == "reused"
    assert (again.node, again.devices, again.reservation_id) == (
        first.node,
        first.devices,
        first.reservation_id,
    )
    assert again.patch == []
    assert svc.stats().reservations_pending == 1
    assert run(h.validate(review(mutated))).allowed


def test_copied_placement_of_a_stored_pod_gets_a_fresh_reservation():
    h, svc = handler(cluster(1, 8))
    pod = gpu_pod(4)
    first = run(h.mutate(review(pod)))
    stored = apply_patch(pod, first.patch)
    svc.confirm([first.reservation_id], 1000.0)
    copy = json.loads(json.dumps(stored))
    copy["metadata"]["name"] = "copy"
    # the validating webhook refuses the copy outright
    v = run(h.validate(review(copy)))
    assert not v.allowed and "belongs to another pod (stored)" in v.message
    # the mutating webhook gives it its own devices
    d = run(h.mutate(review(copy)))
    assert d.allowed and d.reservation_id != first.reservation_id and not set(d.devices) & set(first.devices)


def test_a_copy_made_before_the_original_is_stored_is_caught():
    h, svc = handler(cluster(1, 8))
    pod = gpu_pod(2)
    first = run(h.mutate(review(pod)))
    original = apply_patch(pod, first.patch)
    assert run(h.validate(review(original))).allowed  # the original's CREATE passes validation: claimed
    copy = json.loads(json.dumps(original))
    copy["metadata"]["name"] = "copy"
    v = run(h.validate(review(copy)))
    assert not v.allowed and "already admitted" in v.message
    d = run(h.mutate(review(copy)))  # not taken for a reinvocation: its own devices
    assert d.allowed and d.reservation_id != first.reservation_id and not set(d.devices) & set(first.devices)


def test_validate_create_denies_forged_unknown_and_mismatched():
    h, svc = handler(cluster(1, 8))
    pod = gpu_pod(1)
    good = apply_patch(pod, run(h.mutate(review(pod))).patch)
    assert run(h.validate(review(good))).allowed

    bad_sig = json.loads(json.dumps(good))
    bad_sig["metadata"]["annotations"][PLACEMENT_ANNOTATION] = encode_placement(
        Placement(id="x", node="node-0000", devices=(5,)), b"not the key"
    )
    v = run(h.validate(review(bad_sig)))
    assert not v.allowed and v.code == 403 and "bad signature" in v.message

    unknown = json.loads(json.dumps(good))
    p = Placement(id="never-made", node="node-0000", devices=(5,))
    unknown["metadata"]["annotations"][PLACEMENT_ANNOTATION] = encode_placement(p, KEY)
    unknown["metadata"]["labels"][RESERVATION_ID_KEY] = "never-made"
    v = run(h.validate(review(unknown)))
    assert not v.allowed and "no live reservation" in v.message

    rid = good["metadata"]["labels"][RESERVATION_ID_KEY]
    mismatch = json.loads(json.dumps(good))
    mismatch["metadata"]["annotations"][PLACEMENT_ANNOTATION] = encode_placement(
        Placement(id=rid, node="node-0000", devices=(7,)), KEY
    )
    v = run(h.validate(review(mismatch)))
    assert not v.allowed and "differs" in v.message

    wrong_label = json.loads(json.dumps(good))
    wrong_label["metadata"]["labels"][RESERVATION_ID_KEY] = "other"
    assert not run(h.validate(review(wrong_label))).allowed

    label_only = gpu_pod(1, labels={RESERVATION_ID_KEY: "x"})
    assert not run(h.validate(review(label_only))).allowed
    assert run(h.validate(review(gpu_pod(1)))).allowed  # no placement at all: nothing to check


def test_validate_update_protects_ledger_keys():
    cfg = config(privileged_usernames=("system:serviceaccount:gpuledger-system:gpuledger-webhook",))
    h, _ = handler(cluster(1, 8), cfg)
    pod = gpu_pod(1)
    placed = apply_patch(pod, run(h.mutate(review(pod))).patch)
    changed = json.loads(json.dumps(placed))
    changed["metadata"]["labels"][RESERVATION_ID_KEY] = "stolen"
    v = run(h.validate(review(changed, operation="UPDATE", old=placed, username="alice")))
    assert not v.allowed and "alice" in v.message and RESERVATION_ID_KEY in v.message
    v = run(
        h.validate(
            review(
                changed,
                operation="UPDATE",
                old=placed,
                username="system:serviceaccount:gpuledger-system:gpuledger-webhook",
            )
        )
    )
    assert v.allowed
    other = json.loads(json.dumps(placed))
    other["metadata"]["labels"]["team"] = "a"  # other changes are not the webhook's business
    assert run(h.validate(review(other, operation="UPDATE", old=placed, username="alice"))).allowed


def test_no_fit_denial_names_strategy_request_and_candidates():
    h, _ = handler(cluster(2, 4))
    d = run(h.mutate(review(gpu_pod(6, annotations={"agentaflow.gpu/scheduling-strategy": "least-loaded"}))))
    assert not d.allowed and d.code == 403
    assert "least_utilized" in d.message and "6 GPUs" in d.message and "not enough GPUs" in d.message


def test_malformed_annotation_denial():
    h, _ = handler(cluster(1, 8))
    d = run(h.mutate(review(gpu_pod(1, annotations={"topology.scheduler/placement-strategy": "tight"}))))
    assert not d.allowed and d.code == 422
    assert "topology.scheduler/placement-strategy" in d.message and "'tight'" in d.message
    assert "consolidated" in d.message


def test_job_gang_from_owner_annotations():
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "default",
            "annotations": {
                "topology.scheduler/gpu-count": "16",
                "topology.scheduler/placement-strategy": "consolidated",
            },
        },
        "spec": {"parallelism": 4},
    }
    h, svc = handler(cluster(4, 8), owners=StaticOwners([job]))
    ref = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "controller": True}]
    results = [run(h.mutate(review(gpu_pod(None, ownerReferences=ref)))) for _ in range(4)]
    assert all(r.allowed for r in results), [r.message for r in results]
    assert [len(r.devices) for r in results] == [4, 4, 4, 4]
    # consolidated packs the gang: two 4-GPU pods per 8-GPU node, each on its own devices
    assert len({r.node for r in results}) == 2
    assert len({(r.node, d) for r in results for d in r.devices}) == 16
    fifth = run(h.mutate(review(gpu_pod(None, ownerReferences=ref))))
    assert not fifth.allowed and "group" in fifth.message


def test_gang_is_all_or_nothing():
    job = {
        "kind": "Job",
        "metadata": {
            "name": "big",
            "namespace": "default",
            "annotations": {"topology.scheduler/gpu-count": "40"},
        },
        "spec": {"parallelism": 5},
    }
    h, svc = handler(cluster(4, 8), owners=StaticOwners([job]))
    ref = [{"kind": "Job", "name": "big", "controller": True}]
    d = run(h.mutate(review(gpu_pod(None, ownerReferences=ref))))
    assert not d.allowed and "group" in d.message
    assert svc.stats().milli_allocated == 0


class SlowLedger:
    async def admit(self, call):
        await asyncio.sleep(10)

    async def claim(self, rid):
        await asyncio.sleep(10)


class DownLedger:
    async def admit(self, call):
        raise LedgerUnavailable("actor restarting")


class BuggyLedger:
    async def admit(self, call):
        raise RuntimeError("boom")


def test_deadline_fail_closed_and_fail_open():
    closed = AdmissionHandler(config(deadline_s=0.05), SlowLedger())
    pod = gpu_pod(1, labels={RESERVATION_ID_KEY: "user"})
    d = run(closed.mutate(review(pod)))
    assert not d.allowed and d.code == 503 and "0.05s" in d.message and "fails closed" in d.message
    opened = AdmissionHandler(config(deadline_s=0.05, fail_open=True), SlowLedger())
    d = run(opened.mutate(review(pod)))
    assert d.allowed and "WITHOUT a GPU placement" in d.warnings[-1]
    assert apply_patch(pod, d.patch)["metadata"]["labels"] == {}  # still stripped
    d = run(closed.mutate(review(pod)))
    v = run(AdmissionHandler(config(deadline_s=0.05), SlowLedger()).validate(review(pod)))
    assert not v.allowed


def test_the_owner_lookup_and_the_ledger_share_one_deadline():
    """The deadline is armed around each wait, not once around the whole admission: what the owner lookup
    took is gone from what the ledger may take; and a lookup that never answers is itself a 503."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "default"}}
    ref = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "controller": True}]
    pod = gpu_pod(1, ownerReferences=ref)
    waits: dict[str, float] = {}

    class SlowOwners(StaticOwners):
        async def get(self, kind, namespace, name):
            await asyncio.sleep(0.2)
            return await super().get(kind, namespace, name)

    class NeverLedger:
        async def admit(self, call):
            loop = asyncio.get_running_loop()
            waits["asked"] = loop.time()
            try:
                await asyncio.Event().wait()
            finally:
                waits["cancelled"] = loop.time()

    h = AdmissionHandler(config(deadline_s=0.3), NeverLedger(), owners=SlowOwners([job]))
    d = run(h.mutate(review(pod)))
    assert not d.allowed and d.code == 503 and "did not answer within 0.3s" in d.message
    assert waits["cancelled"] - waits["asked"] < 0.3  # what was left, not a deadline of its own

    class NeverOwners:
        async def get(self, kind, namespace, name):
            await asyncio.Event().wait()

    stuck = AdmissionHandler(config(deadline_s=0.05), NeverLedger(), owners=NeverOwners())
    d = run(stuck.mutate(review(pod)))
    assert not d.allowed and d.code == 503 and "did not answer within 0.05s" in d.message


def test_ledger_down_and_handler_bug():
    d = run(AdmissionHandler(config(), DownLedger()).mutate(review(gpu_pod(1))))
    assert not d.allowed and d.code == 503 and "actor restarting" in d.message
    h = AdmissionHandler(config(), BuggyLedger())
    d = run(h.mutate(review(gpu_pod(1))))
    assert not d.allowed and d.code == 500 and "boom" in d.message
    assert h.metrics.handler_failures.labels("mutate")._value.get() == 1


def test_pinned_map_through_the_webhook():
    h, _ = handler(cluster(2, 8))
    ann = {"gpu-scheduling-map": "0=node-0001:2,3\n1=node-0000:0"}
    d = run(h.mutate(review(gpu_pod(None, annotations=ann, labels={"apps.kubernetes.io/pod-index": "0"}))))
    assert d.allowed and (d.node, d.devices) == ("node-0001", (2, 3))
    d = run(h.mutate(review(gpu_pod(None, annotations=ann, labels={"apps.kubernetes.io/pod-index": "0"}))))
    assert not d.allowed and "taken" in d.message


def test_non_create_and_other_kinds_pass():
    h = AdmissionHandler(config(), ExplodingLedger())
    assert run(h.mutate(review(gpu_pod(1), operation="UPDATE", old=gpu_pod(1)))).allowed
    assert run(h.validate(review(gpu_pod(1), operation="DELETE"))).allowed


def test_binding_mode_config_accepts_strings():
    assert config(binding_mode="both").binding_mode is BindingMode.BOTH
    with pytest.raises(ValueError):
        config(visibility_mode="magic")


def test_clock_is_an_input():
    clock = Clock(5000.0)
    h, svc = handler(cluster(1, 8), clock=clock)
    d = run(h.mutate(review(gpu_pod(8))))
    assert d.allowed
    clock.now += 31
    assert svc.sweep(clock.now) == [d.reservation_id]  # TTL 30s, nothing stored: released
    assert run(h.mutate(review(gpu_pod(8)))).allowed


def test_unsynced_ledger_is_unavailable_not_a_decision():
    from gpuledger.service.ledger_service import LedgerService
    from gpuledger.webhook.ledger.client import InProcessLedgerClient

    nodes = cluster(1, 8)
    svc = LedgerService(config().ledger_config(), {"kind": "kubernetes"})
    svc.apply_events([("ADDED", nodes[0])], 1000.0)  # a watch event before the full list: pods still unknown
    h = AdmissionHandler(config(), InProcessLedgerClient(svc, Clock()))
    d = run(h.mutate(review(gpu_pod(1))))
    assert not d.allowed and d.code == 503 and "not synced" in d.message
    opened = AdmissionHandler(config(fail_open=True), InProcessLedgerClient(svc, Clock()))
    assert run(opened.mutate(review(gpu_pod(1)))).allowed
    svc.resync(nodes, 1000.0)
    assert run(h.mutate(review(gpu_pod(1)))).allowed


def test_a_pod_the_user_bound_to_a_node_is_placed_there():
    h, _ = handler(cluster(3, 8))
    pod = gpu_pod(2)
    pod["spec"]["nodeName"] = "node-0002"
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.node == "node-0002"
    assert run(h.validate(review(apply_patch(pod, d.patch)))).allowed
    pod = gpu_pod(2)
    pod["spec"]["nodeName"] = "no-such-node"
    d = run(h.mutate(review(pod)))
    assert not d.allowed and "nodeSelector" in d.message
