"""What users of the earlier tools write (../shared/earlier-tools/) reads as they meant it: priority words,
memory quantities, bandwidths in bits per second, and map indices from the pod's name."""

from __future__ import annotations

import pytest

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, GroupSpec, PinnedDevices, Placement, Reason, Request
from gpuledger.core.pods.annotation_values import PRIORITY_WORDS, AnnotationError, scheduling_map_index
from gpuledger.core.pods.request import request_from_pod
from tests.core.core_factory import node

AKS_MAP = """0=aks-workerpool-25338008-vmss000000:0,1
1=aks-workerpool-25338008-vmss000001:2
2=aks-workerpool-25338008-vmss000003:0,1,2
3=aks-workerpool-25338008-vmss000004:3
"""


def pod(annotations=None, name="p", labels=None, owner=None):
    meta = {
        "name": name,
        "namespace": "ml",
        "annotations": dict(annotations or {}),
        "labels": dict(labels or {}),
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"metadata": meta, "spec": {"containers": [{"name": "test", "image": "busybox:1.35"}]}}


def req(p, owner=None):
    return request_from_pod(p, owner, None, "r1")


def refused(annotations, named, **kw) -> str:
    with pytest.raises(AnnotationError) as err:
        req(pod(annotations, **kw))
    assert err.value.annotation == named and named in str(err.value)
    return str(err.value)


# --------------------------------------------------------------------------------------------- priority


@pytest.mark.parametrize(
    "value,priority",
    [
        ("low", -100),
        ("Medium", 0),
        ("HIGH", 100),
        (" critical ", 1000),
        ("10", 10),
        ("-5", -5),
        ("+7", 7),
    ],
)
def test_priority_takes_gpu_orchestrator_words_and_integers(value, priority):
    r = req(pod({"topology.scheduler/gpu-count": "1", "agentaflow.gpu/priority": value}))
    assert r.priority == priority


def test_priority_denial_lists_the_words_and_the_integers():
    text = refused(
        {"topology.scheduler/gpu-count": "1", "agentaflow.gpu/priority": "urgent"}, "agentaflow.gpu/priority"
    )
    assert "'urgent'" in text and "integer" in text and "low | medium | high | critical" in text


def test_priority_words_sit_on_the_right_side_of_the_headroom_rule():
    """The `priority` strategy keeps headroom for priority >= 1: high and critical may use it, low and
    medium (the default) may not."""
    assert PRIORITY_WORDS["low"] < PRIORITY_WORDS["medium"] == 0
    assert PRIORITY_WORDS["high"] >= 1
    assert PRIORITY_WORDS["high"] < PRIORITY_WORDS["critical"]
    import gpuledger.strategies  # noqa: F401  (registers the priority strategy)

    led = Ledger(LedgerConfig(priority_headroom=0.2))
    led.apply_object(node("a", 10), 0.0)
    for i in range(8):
        assert isinstance(led.reserve(Request(id=f"fill{i}", gpus=1), 0.0), Placement)

    def ask(word):
        r = request_from_pod(
            pod(
                {
                    "topology.scheduler/gpu-count": "1",
                    "agentaflow.gpu/priority": word,
                    "agentaflow.gpu/scheduling-strategy": "priority",
                }
            ),
            None,
            None,
            f"r-{word}",
        )
        return led.reserve(r, 0.0)

    for word in ("low", "medium"):
        denial = ask(word)
        assert isinstance(denial, Denial) and denial.by_reason[0][0] == Reason.PRIORITY_HEADROOM
    for word in ("high", "critical"):
        assert isinstance(ask(word), Placement)


# ------------------------------------------------------------------------------------------------ memory


@pytest.mark.parametrize(
    "value,mib",
    [
        ("16384", 16384),
        ("16Gi", 16384),
        ("16384Mi", 16384),
        ("1.5Gi", 1536),
        ("40G", 38147),
        ("1Ti", 2**20),
        (" 8Gi ", 8192),
        ("2097152Ki", 2048),
        ("1M", 1),
    ],
)
def test_gpu_memory_takes_quantities_and_plain_integers_stay_mib(value, mib):
    r = req(pod({"topology.scheduler/gpu-count": "1", "agentaflow.gpu/memory": value}))
    assert r.gpu_memory_mib == mib


def test_gpu_memory_quantity_for_a_shared_gpu():
    r = req(pod({"agentaflow.gpu/exclusive-access": "false", "agentaflow.gpu/memory": "8Gi"}))
    assert (r.gpus, r.gpu_memory_mib, r.is_shared) == (0, 8192, True)


@pytest.mark.parametrize(
    "value",
    [
        "16GB",
        "16gi",
        "1e3",
        "500m",
        "0",
        "0Mi",
        "-1Gi",
        "16 Gi",
        "20000Gi",
        "10000001",
        "1.5",
        "٨Gi",
        "Gi",
    ],
)
def test_gpu_memory_refusals_name_mib_and_the_quantity_forms(value):
    text = refused(
        {"topology.scheduler/gpu-count": "1", "agentaflow.gpu/memory": value}, "agentaflow.gpu/memory"
    )
    assert repr(value) in text and "MiB" in text and "16Gi" in text


# --------------------------------------------------------------------------------------------- bandwidth


@pytest.mark.parametrize(
    "value,gbps",
    [
        ("100Gb", 100.0),
        ("200Gb", 200.0),
        ("400Gbps", 400.0),
        ("25G", 25.0),
        ("1.6Tbps", 1600.0),
        ("800Mbps", 0.8),
        ("100 Gbps", 100.0),
        ("10gbit/s", 10.0),
        ("2.5G", 2.5),
    ],
)
def test_network_bandwidth_takes_bits_per_second(value, gbps):
    r = req(pod({"topology.scheduler/gpu-count": "1", "topology.scheduler/network-bandwidth": value}))
    assert (r.network_bandwidth, r.network_bandwidth_gbps) == (None, gbps)


def test_network_bandwidth_words_stay_words():
    r = req(pod({"topology.scheduler/gpu-count": "1", "topology.scheduler/network-bandwidth": "Medium"}))
    assert (r.network_bandwidth, r.network_bandwidth_gbps) == ("medium", None)
    assert req(pod({"topology.scheduler/gpu-count": "1"})).network_bandwidth_gbps is None


@pytest.mark.parametrize(
    "value",
    ["100GB", "100GBps", "fast", "0Gb", "-1Gb", "100", "Gb", "100Gib", "１００Gb", ""],  # noqa: RUF001
)
def test_network_bandwidth_refusals_name_the_forms(value):
    text = refused(
        {"topology.scheduler/gpu-count": "1", "topology.scheduler/network-bandwidth": value},
        "topology.scheduler/network-bandwidth",
    )
    assert repr(value) in text and "high | medium | low" in text and "100Gb" in text


def test_topology_aware_schedulers_multi_node_training_job():
    """The Job from the topology-aware scheduler's README, as its users have it."""
    job = {
        "kind": "Job",
        "metadata": {
            "name": "multi-node-training",
            "namespace": "ml",
            "annotations": {
                "topology.scheduler/gpu-count": "16",
                "topology.scheduler/preferred-domain": "spine-1",
                "topology.scheduler/network-bandwidth": "200Gb",
                "topology.scheduler/placement-strategy": "consolidated",
            },
        },
        "spec": {"parallelism": 4, "completions": 4},
    }
    r = req(pod(name="", owner=("Job", "multi-node-training")), job)
    assert (r.gpus, r.group, r.strategy, r.preferred_domain) == (
        4,
        GroupSpec("job/ml/multi-node-training", 4),
        "consolidated",
        "spine-1",
    )
    assert (r.network_bandwidth, r.network_bandwidth_gbps) == (None, 200.0)


# ------------------------------------------------------------------------------------------- map index


@pytest.mark.parametrize(
    "name,node,devices",
    [
        ("gpu-test-0", "aks-workerpool-25338008-vmss000000", (0, 1)),
        ("gpu-test-1", "aks-workerpool-25338008-vmss000001", (2,)),
        ("gpu-scheduler-check-2", "aks-workerpool-25338008-vmss000003", (0, 1, 2)),
        ("name-abc123-3", "aks-workerpool-25338008-vmss000004", (3,)),
        ("test-gpu-pod", "aks-workerpool-25338008-vmss000000", (0, 1)),  # no trailing number: entry 0
        ("", "aks-workerpool-25338008-vmss000000", (0, 1)),  # generateName: nameless at admission
    ],
)
def test_gpu_scheduling_map_takes_the_index_from_the_pod_name(name, node, devices):
    r = req(pod({"gpu-scheduling-map": AKS_MAP}, name=name))
    assert (r.pinned, r.gpus) == (PinnedDevices(node, devices), len(devices))


def test_index_sources_are_tried_in_order():
    named = {"metadata": {"name": "gpu-test-1"}}
    assert scheduling_map_index(named) == 1
    assert (
        scheduling_map_index(
            {"metadata": {"name": "gpu-test-1", "labels": {"apps.kubernetes.io/pod-index": "3"}}}
        )
        == 3
    )
    assert (
        scheduling_map_index(
            {
                "metadata": {
                    "name": "gpu-test-1",
                    "annotations": {"batch.kubernetes.io/job-completion-index": "2"},
                }
            }
        )
        == 2
    )
    assert scheduling_map_index({"metadata": {"name": "gpu-test-١"}}) == 0  # not a number: entry 0  # noqa: RUF001
    assert (
        scheduling_map_index({"metadata": {"name": "x-12345678901"}}) == 345678901
    )  # as the StatefulSet rule
    assert scheduling_map_index({}) == 0
    assert "1." in scheduling_map_index.__doc__ and "4." in scheduling_map_index.__doc__


def test_a_malformed_index_label_is_refused_not_replaced_by_the_name():
    refused(
        {"gpu-scheduling-map": AKS_MAP},
        "apps.kubernetes.io/pod-index",
        name="gpu-test-1",
        labels={"apps.kubernetes.io/pod-index": "one"},
    )


def test_a_name_index_without_an_entry_is_a_denial_listing_the_entries():
    text = refused({"gpu-scheduling-map": AKS_MAP}, "gpu-scheduling-map", name="gpu-test-7")
    assert "index 7" in text and "entries: 0, 1, 2, 3" in text
