"""Only the webhook writes gpuledger.io/*: forged, copied and tampered placements never reach a stored pod."""

from __future__ import annotations

import json

import pytest
import yaml

from gpuledger.names import MUTATING_CONFIG
from tests.e2e.conftest import gpu_pod_yaml

pytestmark = pytest.mark.e2e

FORGED = json.dumps({"v": 1, "id": "forged", "node": "leaf-0-node-0", "devices": [0, 1], "sig": "0" * 64})


def forged_pod(name: str, placement: str = FORGED, rid: str = "forged") -> str:
    pod = yaml.safe_load(gpu_pod_yaml(name, gpus=1, annotations={"gpuledger.io/placement": placement}))
    pod["metadata"]["labels"] = {"gpuledger.io/reservation-id": rid}
    return yaml.safe_dump(pod)


def test_forged_placement_on_create_is_replaced_with_a_warning(workloads):
    proc = workloads.apply(forged_pod("forger"))
    assert "gpuledger removed" in proc.stderr, proc.stderr  # kubectl shows the admission warning
    placement = workloads.placement("forger")
    assert placement is not None and placement.id != "forged"
    assert workloads.pod("forger")["metadata"]["labels"]["gpuledger.io/reservation-id"] == placement.id


def test_annotation_tampering_update_is_denied(workloads):
    workloads.apply(gpu_pod_yaml("victim", gpus=1))
    ns = workloads.namespace
    tamper = workloads.cp.kubectl(
        "annotate",
        "pod",
        "victim",
        "-n",
        ns,
        "--overwrite",
        f"gpuledger.io/placement={FORGED}",
        as_user="alice",
        check=False,
    )
    assert tamper.returncode != 0
    assert "validate.gpuledger.io" in tamper.stderr and "gpuledger.io/placement" in tamper.stderr, (
        tamper.stderr
    )
    unlabel = workloads.cp.kubectl(
        "label", "pod", "victim", "-n", ns, "gpuledger.io/reservation-id-", as_user="alice", check=False
    )
    assert unlabel.returncode != 0 and "gpuledger.io/reservation-id" in unlabel.stderr, unlabel.stderr
    # other metadata stays the user's to change
    workloads.cp.kubectl("annotate", "pod", "victim", "-n", ns, "team=vision", as_user="alice")
    assert workloads.pod("victim")["metadata"]["annotations"]["team"] == "vision"


@pytest.fixture
def mutating_bypassed(apiserver, stack):
    """Only the validating registration: as if another path (an operator's mistake, a removed webhook) let a
    pod reach validation with whatever gpuledger.io/* it was created with."""
    apiserver.kubectl("delete", "mutatingwebhookconfiguration", MUTATING_CONFIG)
    try:
        yield
    finally:
        stack.register()


def test_validating_webhook_refuses_forged_and_copied_placements(workloads, mutating_bypassed):
    forged = workloads.apply(forged_pod("forged"), check=False)
    assert forged.returncode != 0, forged.stdout
    assert "validate.gpuledger.io" in forged.stderr and "signature" in forged.stderr, forged.stderr


def test_validating_webhook_refuses_a_copy_of_a_stored_pods_placement(apiserver, stack, workloads):
    workloads.apply(gpu_pod_yaml("original", gpus=1))
    original = workloads.pod("original")
    workloads.wait_confirmed([original])
    annotation = original["metadata"]["annotations"]["gpuledger.io/placement"]
    rid = original["metadata"]["labels"]["gpuledger.io/reservation-id"]
    apiserver.kubectl("delete", "mutatingwebhookconfiguration", MUTATING_CONFIG)
    try:
        copied = workloads.apply(forged_pod("copy", placement=annotation, rid=rid), check=False)
    finally:
        stack.register()
    assert copied.returncode != 0, copied.stdout
    assert "validate.gpuledger.io" in copied.stderr and "stored" in copied.stderr, copied.stderr
