"""The ledger follows GPUQueue, Namespace and PodDisruptionBudget objects: each pod's queue (its namespace's
gpuledger.io/queue label, else the queues' selectors, else the default queue), a set of GPUQueues it cannot
honour kept at its last good state and recorded as a problem, and no GPUQueue at all meaning no queues."""

from __future__ import annotations

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.names import QUEUE_LABEL


def gpu_queue(name: str, gpus: int = 8, **spec) -> dict:
    return {
        "apiVersion": "gpuledger.io/v1alpha1",
        "kind": "GPUQueue",
        "metadata": {"name": name},
        "spec": {"quotas": [{"product": "any", "gpus": gpus}], **spec},
    }


def namespace(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def budget(namespace: str, name: str, allowed: int, **match: str) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"selector": {"matchLabels": match}},
        "status": {"disruptionsAllowed": allowed},
    }


def test_no_gpu_queue_means_no_queues():
    ledger = Ledger(LedgerConfig())
    ledger.apply_object(namespace("team-a", team="a"), 0.0)
    assert ledger.queue_of("team-a") is None


def test_the_namespace_label_wins_over_selectors_then_selectors_then_the_default():
    ledger = Ledger(LedgerConfig())
    ledger.apply_object(gpu_queue("team-a", namespaceSelector={"matchLabels": {"team": "a"}}), 0.0)
    ledger.apply_object(gpu_queue("team-b"), 0.0)
    ledger.apply_object(namespace("ns-a", team="a"), 0.0)
    ledger.apply_object(namespace("ns-b", team="a", **{QUEUE_LABEL: "team-b"}), 0.0)
    ledger.apply_object(namespace("ns-missing", **{QUEUE_LABEL: "nope"}), 0.0)
    assert ledger.queue_of("ns-a") == "team-a"
    assert ledger.queue_of("ns-b") == "team-b"
    assert ledger.queue_of("ns-missing") == "default"
    assert ledger.queue_of("never-seen") == "default"
    # the label changes: the namespace moves
    ledger.apply_object(namespace("ns-a", team="a", **{QUEUE_LABEL: "team-b"}), 0.0)
    assert ledger.queue_of("ns-a") == "team-b"
    ledger.delete_object(gpu_queue("team-b"))
    assert ledger.queue_of("ns-a") == "team-a"


def test_queues_that_cannot_be_honoured_keep_the_last_good_set_and_say_why():
    ledger = Ledger(LedgerConfig())
    ledger.apply_object(gpu_queue("team-a", namespaceSelector={"matchLabels": {"team": "a"}}), 0.0)
    ledger.apply_object(namespace("ns-a", team="a"), 0.0)
    ledger.apply_object(gpu_queue("team-b", parent="missing-org"), 0.0)
    assert ledger.queue_of("ns-a") == "team-a"
    assert any("spec.parent" in p and "missing-org" in p for p in ledger.problems)
    ledger.apply_object(gpu_queue("team-c", weight="heavy"), 0.0)  # malformed: refused, naming the field
    assert any("spec.weight" in p for p in ledger.problems)
    assert ledger.queue_of("ns-a") == "team-a"


def test_a_rebuild_reads_queues_namespaces_and_budgets_in_any_order():
    objects = [
        namespace("ns-a", **{QUEUE_LABEL: "team-a"}),
        gpu_queue("team-a", parent="org"),  # before its parent: fine in a rebuild
        gpu_queue("org", gpus=16),
        budget("ns-a", "keep-one", 1, app="x"),
    ]
    ledger = Ledger.rebuild(objects)
    assert ledger.queue_of("ns-a") == "team-a"
    assert not ledger.problems
    assert ledger.disruption_allowances() == {"ns-a/keep-one": 1}
