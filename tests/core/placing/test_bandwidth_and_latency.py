"""topology.scheduler/network-bandwidth as a minimum against the node label, and latency-sensitive pods:
whole unshared GPUs, no node whose GPUs others share, the least loaded node and leaf."""

from __future__ import annotations

import pytest

from gpuledger.core.books.topology import Topology, plan_leaves
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, GroupSpec, Placement, Reason, Request
from gpuledger.core.pods.annotation_values import AnnotationError, node_bandwidth_gbps
from gpuledger.core.pods.request import request_from_pod
from gpuledger.names import NETWORK_BANDWIDTH_LABEL
from tests.core.core_factory import node

BW = NETWORK_BANDWIDTH_LABEL


def make(*objs) -> Ledger:
    led = Ledger(LedgerConfig())
    for o in objs:
        led.apply_object(o, 0.0)
    return led


def pod(annotations, gpus=1):
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


@pytest.mark.parametrize(
    "label, gbps",
    [
        ("200", 200.0),
        ("12.5", 12.5),
        ("400Gbps", 400.0),
        ("1.6T", 1600.0),
        ("fast", None),
        ("", None),
        ("٢٠٠", None),
        (None, None),
    ],
)
def test_node_bandwidth_label_values(label, gbps):
    assert node_bandwidth_gbps(label) == gbps


def test_nodes_below_the_requested_bandwidth_are_filtered_out():
    led = make(node("slow", labels={BW: "100"}), node("none"), node("fast", labels={BW: "400"}))
    r = request_from_pod(pod({"topology.scheduler/network-bandwidth": "200Gb"}), None, None, "r0")
    assert r.network_bandwidth_gbps == 200.0
    p = led.reserve(r, 0.0)
    assert isinstance(p, Placement) and p.node == "fast"
    # the words stay hints: every node
    words = request_from_pod(pod({"topology.scheduler/network-bandwidth": "high"}, gpus=8), None, None, "r1")
    assert isinstance(led.reserve(words, 0.0), Placement)


def test_a_bandwidth_no_node_has_is_denied_naming_annotation_and_label():
    led = make(node("a", labels={BW: "100"}), node("b"))
    d = led.reserve(Request(id="r", gpus=1, network_bandwidth_gbps=400.0), 0.0)
    assert isinstance(d, Denial)
    assert dict(d.by_reason) == {Reason.NETWORK_BANDWIDTH: 2}
    assert "topology.scheduler/network-bandwidth" in d.message and BW in d.message


def test_a_gang_goes_to_the_leaves_that_have_the_bandwidth():
    objs = [
        node(f"{leaf}-n{i}", spine="s1", leaf=leaf, labels={BW: bw})
        for leaf, bw in (("l1", "100"), ("l2", "400"), ("l3", "100"))
        for i in range(2)
    ]
    led = make(*objs)
    p = led.reserve(
        Request(id="g", gpus=8, network_bandwidth_gbps=200.0, group=GroupSpec("job/ml/g", 2)), 0.0
    )
    assert isinstance(p, Placement) and {s.node for s in p.group_plan} == {"l2-n0", "l2-n1"}
    d = led.reserve(
        Request(id="h", gpus=8, network_bandwidth_gbps=200.0, group=GroupSpec("job/ml/h", 2)), 0.0
    )
    assert isinstance(d, Denial) and "network bandwidth" in d.message


def test_latency_sensitive_refuses_a_shared_gpu_naming_both_annotations():
    with pytest.raises(AnnotationError) as err:
        request_from_pod(
            pod({"topology.scheduler/latency-sensitive": "true", "agentaflow.gpu/milli": "250"}, gpus=0),
            None,
            None,
            "r",
        )
    assert "topology.scheduler/latency-sensitive" in str(err.value) and "agentaflow.gpu/milli" in str(
        err.value
    )
    with pytest.raises(AnnotationError, match=r"agentaflow\.gpu/exclusive-access"):
        request_from_pod(
            pod(
                {
                    "topology.scheduler/latency-sensitive": "yes",
                    "agentaflow.gpu/memory": "8Gi",
                    "agentaflow.gpu/exclusive-access": "false",
                },
                gpus=0,
            ),
            None,
            None,
            "r",
        )


def test_latency_sensitive_implies_least_utilized_unless_a_strategy_is_named():
    ann = {"topology.scheduler/latency-sensitive": "true"}
    assert request_from_pod(pod(ann), None, None, "r").strategy == "least_utilized"
    named = {**ann, "agentaflow.gpu/scheduling-strategy": "best-fit"}
    assert request_from_pod(pod(named), None, None, "r").strategy == "best_fit"
    topo = {**ann, "topology.scheduler/placement-strategy": "consolidated"}
    assert request_from_pod(pod(topo), None, None, "r").strategy == "consolidated"


def test_latency_sensitive_avoids_nodes_whose_gpus_are_shared():
    led = make(node("a", 8), node("b", 2))
    assert isinstance(led.reserve(Request(id="s", gpu_milli=100, strategy="best_fit"), 0.0), Placement)
    shared = led.get("s").node
    r = Request(id="l", gpus=1, latency_sensitive=True, strategy="best_fit")
    p = led.reserve(r, 0.0)
    assert isinstance(p, Placement) and p.node != shared
    led.release("l")
    d = led.reserve(
        Request(
            id="m",
            gpus=2,
            latency_sensitive=True,
            strategy="best_fit",
            node_selector=(("kubernetes.io/hostname", shared),),
        ),
        0.0,
    )
    assert isinstance(d, Denial) and dict(d.by_reason).get(Reason.SHARED_GPUS) == 1
    assert "latency-sensitive" in d.message


def test_latency_sensitive_prefers_the_least_loaded_leaf_on_equal_nodes():
    objs = [
        node("l1-a", leaf="l1"),
        node("l1-b", leaf="l1"),
        node("l2-a", leaf="l2"),
        node("l2-b", leaf="l2"),
    ]
    led = make(*objs)
    led.reserve(Request(id="busy", gpus=8, node_selector=(("kubernetes.io/hostname", "l1-b"),)), 0.0)
    led.reserve(Request(id="x", gpus=4, node_selector=(("kubernetes.io/hostname", "l2-b"),)), 0.0)
    # l1-a and l2-a are equally free (8); l2 is the less loaded leaf
    r = request_from_pod(pod({"topology.scheduler/latency-sensitive": "true"}), None, None, "lat")
    p = led.reserve(r, 0.0)
    assert isinstance(p, Placement) and p.node == "l2-a" and p.strategy == "least_utilized"


def test_a_latency_sensitive_gang_takes_the_least_loaded_window():
    topo = Topology.build([("s", "l1"), ("s", "l2"), ("s", "l3")])
    caps = {("s", "l1"): 3, ("s", "l2"): 3, ("s", "l3"): 2}
    assert plan_leaves(topo, caps, 4) == [(("s", "l2"), 3), (("s", "l3"), 1)]  # the tightest pair
    assert plan_leaves(topo, caps, 4, prefer_spare=True) == [(("s", "l1"), 3), (("s", "l2"), 1)]
    # through the ledger: three leaves of 3, 3 and 2 free nodes, a gang of four
    objs = [node(f"{leaf}-n{i}", leaf=leaf) for leaf in ("l1", "l2", "l3") for i in range(3)]
    led = make(*objs)
    led.reserve(Request(id="x", gpus=8, node_selector=(("kubernetes.io/hostname", "l3-n2"),)), 0.0)
    tight = led.reserve(Request(id="t", gpus=8, group=GroupSpec("job/ml/t", 4)), 0.0)
    assert {led.index.nodes[s.node].info.leaf for s in tight.group_plan} == {"l2", "l3"}
    led.release("t")
    loose = led.reserve(Request(id="u", gpus=8, latency_sensitive=True, group=GroupSpec("job/ml/u", 4)), 0.0)
    assert {led.index.nodes[s.node].info.leaf for s in loose.group_plan} == {"l1", "l2"}
