"""topology.scheduler/network-bandwidth where nodes may say nothing: with no node labelled (neither the
operator's label nor the node agent's) the request is placed unchecked with a warning naming the label; with
some labelled, the minimum holds; the operator's label beats the agent's. The warning is not part of the
placement's identity: not signed, not compared."""

from __future__ import annotations

import pickle

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, GroupSpec, Placement, Reason, Request
from gpuledger.core.pods.placement_codec import decode_placement, encode_placement
from gpuledger.core.pods.request import request_from_pod
from gpuledger.names import AGENT_NETWORK_BANDWIDTH_LABEL, NETWORK_BANDWIDTH_LABEL
from tests.core.core_factory import node

OPERATOR, AGENT = NETWORK_BANDWIDTH_LABEL, AGENT_NETWORK_BANDWIDTH_LABEL
WARNING = (
    "topology.scheduler/network-bandwidth 200Gb not checked: no node has the label "
    "topology.scheduler/network-bandwidth-gbps (or the node agent's agentaflow.gpu/network-bandwidth-gbps); "
    "label the nodes to enforce it"
)


def make(*objs) -> Ledger:
    led = Ledger(LedgerConfig())
    for o in objs:
        led.apply_object(o, 0.0)
    return led


def ask(rid: str, gbps: float = 200.0, **kw) -> Request:
    return Request(id=rid, gpus=1, network_bandwidth_gbps=gbps, **kw)


def test_no_node_labelled_places_unchecked_with_a_warning_naming_the_label():
    led = make(node("a"), node("b"))
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "annotations": {
                "topology.scheduler/gpu-count": "1",
                "topology.scheduler/network-bandwidth": "200Gb",
            },
        },
        "spec": {"containers": [{"name": "c"}]},
    }
    p = led.reserve(request_from_pod(pod, None, None, "r0"), 0.0)
    assert isinstance(p, Placement) and p.warnings == (WARNING,)
    assert led.reserve_or_wait(ask("r1"), 0.0).warnings == (WARNING,)  # type: ignore[union-attr]
    dry = led.explain(ask("r2")).result
    assert isinstance(dry, Placement) and dry.warnings == (WARNING,)
    # without a bandwidth ask, no warning
    plain = led.reserve(Request(id="r3", gpus=1), 0.0)
    assert isinstance(plain, Placement) and plain.warnings == ()


def test_the_multi_node_gang_is_placed_with_the_warning_on_every_pod():
    led = make(*(node(f"{leaf}-n{i}", spine="s1", leaf=leaf) for leaf in ("l1", "l2") for i in range(2)))
    group = GroupSpec("job/ml/train", 4)
    answers = [
        led.reserve(Request(id=f"t{i}", gpus=4, network_bandwidth_gbps=200.0, group=group), 0.0)
        for i in range(4)
    ]
    assert all(isinstance(p, Placement) and p.warnings == (WARNING,) for p in answers)
    assert len({p.node for p in answers}) == 2  # type: ignore[union-attr]


def test_some_nodes_labelled_keeps_the_minimum_by_either_label():
    for key in (OPERATOR, AGENT):
        led = make(node("unlabelled"), node("fast", labels={key: "400"}), node("slow", labels={key: "100"}))
        p = led.reserve(ask("r"), 0.0)
        assert isinstance(p, Placement) and p.node == "fast" and p.warnings == ()
        d = led.reserve(ask("big", gbps=800.0), 0.0)
        assert isinstance(d, Denial) and dict(d.by_reason) == {Reason.NETWORK_BANDWIDTH: 3}


def test_the_operators_label_beats_the_agents():
    led = make(
        node("a", labels={OPERATOR: "100", AGENT: "400"}),  # the operator knows better: 100
        node("b", labels={AGENT: "200"}),
        node("c", labels={OPERATOR: "fast", AGENT: "400"}),  # an unreadable operator label meets nothing
    )
    for i in range(8):
        p = led.reserve(ask(f"r{i}"), 0.0)
        assert isinstance(p, Placement) and p.node == "b"
    d = led.reserve(ask("r8"), 0.0)
    assert isinstance(d, Denial) and dict(d.by_reason).get(Reason.NETWORK_BANDWIDTH) == 2


def test_labelling_a_node_later_turns_the_check_on_and_removing_it_off():
    led = make(node("a"), node("b"))
    assert led.reserve(ask("r0"), 0.0).node in ("a", "b")  # type: ignore[union-attr]
    led.release("r0")
    led.apply_object(node("b", labels={AGENT: "400"}), 0.0)  # the agent published: a cached verdict is stale
    for i in range(8):
        p = led.reserve(ask(f"r{i + 1}"), 0.0)
        assert isinstance(p, Placement) and p.node == "b" and p.warnings == ()
    d = led.reserve(ask("r9"), 0.0)
    assert isinstance(d, Denial) and Reason.NETWORK_BANDWIDTH in dict(d.by_reason)
    led.apply_object(node("b"), 0.0)  # the label removed: nobody says anything again
    p = led.reserve(ask("r10"), 0.0)
    assert isinstance(p, Placement) and p.node == "a" and p.warnings == (WARNING,)
    led.delete_object(node("a"))
    led.apply_object(node("c", labels={OPERATOR: "100"}), 0.0)
    d = led.reserve(ask("r11"), 0.0)
    assert isinstance(d, Denial) and Reason.NETWORK_BANDWIDTH in dict(d.by_reason)


def test_the_warning_is_not_part_of_the_placement():
    led = make(node("a"))
    p = led.reserve(ask("r"), 0.0)
    assert isinstance(p, Placement) and p.warnings
    text = encode_placement(p, b"k")
    assert "not checked" not in text
    back = decode_placement(text, b"k")
    assert back == p and back is not None and back.warnings == ()
    assert led.get("r") == p
    crossed = pickle.loads(pickle.dumps(p))  # how the answer crosses the Ray actor and the ledger channel
    assert crossed.warnings == p.warnings
