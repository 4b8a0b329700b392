"""The node's word on who holds each device (agentaflow.gpu/device-holders) made the ledger's: foreign
holders by identity, the kubelet's devices for the ledger's own pods, outside-Kubernetes GPU memory, and a
rebuild that equals the live ledger whatever order the objects come in."""

from __future__ import annotations

import itertools
import json

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, Placement, Reason, Request
from gpuledger.core.pods.objects import node_from_object
from gpuledger.core.pods.placement_codec import Binding, encode_placement
from gpuledger.names import HOLDERS_ANNOTATION, PLACEMENT_ANNOTATION
from tests.core.core_factory import node, pod

KEY = b"truth-key"


def config(**kw) -> LedgerConfig:
    return LedgerConfig(placement_key=KEY, **kw)


def truth_node(name="n1", gpus=4, holders=None, external=None, source="podresources", raw=None) -> dict:
    obj = node(name, gpus)
    text = (
        raw
        if raw is not None
        else json.dumps(
            {
                "v": 1,
                "source": source,
                "holders": {
                    str(d): [{"namespace": k.split("/")[0], "pod": k.split("/")[1], "container": "c"}]
                    for d, k in (holders or {}).items()
                },
                "external": {
                    str(d): {"memoryMiB": mib, "pids": [100 + d]} for d, mib in (external or {}).items()
                },
                "unmapped": [],
            }
        )
    )
    obj["metadata"]["annotations"][HOLDERS_ANNOTATION] = text
    return obj


def stored(name: str, p: Placement, namespace: str = "team") -> dict:
    obj = pod(name, namespace=namespace, gpus=len(p.devices))
    obj["metadata"]["annotations"][PLACEMENT_ANNOTATION] = encode_placement(p, KEY, Binding(namespace, name))
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    obj["spec"]["nodeName"] = p.node
    return obj


def owners(led: Ledger, name="n1") -> list:
    return [d[3] for d in led.snapshot()["nodes"][name]["devices"]]


def assert_rebuilds(led: Ledger, objects: list[dict]) -> None:
    """Every order of the objects rebuilds the live snapshot."""
    for order in itertools.permutations(objects):
        assert Ledger.rebuild(list(order), config()).snapshot() == led.snapshot()


# ------------------------------------------------------------------------------------------ parsing


def test_bad_annotations_are_problems_never_crashes():
    for raw in ("{", "[]", '{"v": 2, "source": "podresources"}', '{"v": 1, "source": "x"}', "[" * 5000):
        problems: list[str] = []
        info = node_from_object(truth_node(raw=raw), None, problems)
        assert info.truth is None and info.devices
        assert problems and HOLDERS_ANNOTATION in problems[0] and "accepted" in problems[0]


def test_entries_on_unknown_devices_and_doubly_listed_devices_are_reported_and_dropped():
    raw = json.dumps(
        {
            "v": 1,
            "source": "podresources",
            "holders": {
                "1": [{"namespace": "b", "pod": "y", "container": "c"}, {"namespace": "a", "pod": "x"}],
                "9": [{"namespace": "a", "pod": "z"}],
                "zz": [],
                "2": "nope",
            },
            "external": {"3": {"memoryMiB": "2048", "pids": [7]}, "0": "bad"},
            "unmapped": ["GPU-lost"],
        }
    )
    problems: list[str] = []
    truth = node_from_object(truth_node(raw=raw), None, problems).truth
    assert truth is not None and truth.known
    assert truth.holders == ((1, "a/x", ()),)
    assert truth.external == ((3, 2048, (7,)),)
    assert truth.unmapped == ("GPU-lost",)
    assert len(problems) == 6 and "GPU-lost" in problems[-1]


def test_unavailable_source_knows_no_holders_but_still_reports_external_use():
    led = Ledger.rebuild([truth_node(source="unavailable", holders={0: "x/p"}, external={1: 4096})], config())
    assert led.index.nodes["n1"].info.truth.holders == ()
    assert owners(led) == [None] * 4 and led.index.nodes["n1"].whole_free == 3


# ------------------------------------------------------------------------------------------ foreign holders


def test_a_foreign_pod_holds_its_device_by_identity_and_is_counted_once():
    foreign = pod("f", namespace="plain", node_name="n1", gpus=1)  # the stock device plugin's pod
    led = Ledger.rebuild([truth_node(holders={0: "plain/f"}), foreign], config())
    n = led.index.nodes["n1"]
    assert owners(led)[0] == "truth:n1" and n.unknown_gpus == 0 and n.whole_free == 3
    p = led.reserve(Request("r1", gpus=1), 1.0)
    assert p.devices == (1,)
    assert_rebuilds(
        Ledger.rebuild([truth_node(holders={0: "plain/f"}), foreign], config()),
        [truth_node(holders={0: "plain/f"}), foreign],
    )


def test_without_truth_the_foreign_pod_is_counted_per_node_and_the_ledger_may_guess_its_device():
    led = Ledger.rebuild([node("n1", 4), pod("f", namespace="plain", node_name="n1", gpus=1)], config())
    assert led.index.nodes["n1"].unknown_gpus == 1
    assert led.reserve(Request("r1", gpus=1), 1.0).devices == (0,)  # a guess: maybe the foreign pod's GPU


def test_a_pod_the_ledger_has_not_seen_holds_its_device_too():
    led = Ledger.rebuild([truth_node(holders={2: "other/ghost"})], config())
    assert owners(led) == [None, None, "truth:n1", None]
    assert led.reserve(Request("r", gpus=4), 0.0).__class__ is Denial


def test_a_pending_reservation_on_a_device_a_foreign_pod_holds_moves():
    led = Ledger.rebuild([node("n1", 4)], config())
    p = led.reserve(Request("r1", gpus=1), 0.0)
    assert p.devices == (0,)
    led.apply_object(truth_node(holders={0: "plain/f"}), 1.0)
    assert led.get("r1").devices == (1,) and owners(led)[:2] == ["truth:n1", "r1"]
    assert led.issued("r1") == p  # what the pod carries: the validating webhook checks it against this
    assert led.stats().devices_moved == 1


# ------------------------------------------------------------------------------------------ own pods


def test_the_kubelets_devices_replace_the_ledgers_guess_for_its_own_pod():
    led = Ledger.rebuild([node("n1", 4)], config())
    p = led.reserve(Request("r1", gpus=1), 0.0)
    mine = stored("mine", p)
    led.apply_object(mine, 0.5)
    assert p.devices == (0,)
    node_obj = truth_node(holders={3: "team/mine"})
    led.apply_object(node_obj, 1.0)
    assert led.get("r1").devices == (3,)
    assert owners(led) == [None, None, None, "r1"]
    assert led.device_corrections() == [["team/mine", "r1", "n1", [0], [3]]]
    assert led.stats().device_corrections == 1 and led.stats().device_conflicts == 0
    assert led.reserve(Request("r2", gpus=1), 2.0).devices == (0,)
    led.release("r2")
    assert_rebuilds(led, [node_obj, mine])
    led.apply_object(node("n1", 4), 3.0)  # the annotation goes: back to what the placement says
    assert led.get("r1").devices == (0,) and led.device_corrections() == []
    assert_rebuilds(led, [node("n1", 4), mine])


def test_two_own_pods_swapping_devices_are_both_corrected():
    led = Ledger.rebuild([node("n1", 4)], config())
    a, b = led.reserve(Request("ra", gpus=1), 0.0), led.reserve(Request("rb", gpus=1), 0.0)
    pods = [stored("a", a), stored("b", b)]
    for obj in pods:
        led.apply_object(obj, 0.5)
    node_obj = truth_node(holders={a.devices[0]: "team/b", b.devices[0]: "team/a"})
    led.apply_object(node_obj, 1.0)
    assert led.get("ra").devices == b.devices and led.get("rb").devices == a.devices
    assert led.conflicts() == [] and led.stats().device_corrections == 2
    assert_rebuilds(led, [node_obj, *pods])


def test_an_own_pod_whose_device_the_kubelet_gives_another_is_counted_not_placed():
    led = Ledger.rebuild([node("n1", 4)], config())
    p = led.reserve(Request("r1", gpus=1), 0.0)
    mine = stored("mine", p)
    led.apply_object(mine, 0.5)
    node_obj = truth_node(holders={p.devices[0]: "plain/f"})
    led.apply_object(node_obj, 1.0)
    assert led.get("r1") is None
    assert [c[:2] for c in led.device_conflicts()] == [["team/mine", "r1"]]
    assert "plain/f" in led.device_conflicts()[0][2] and HOLDERS_ANNOTATION in led.device_conflicts()[0][2]
    n = led.index.nodes["n1"]
    assert owners(led)[0] == "truth:n1" and n.unknown_gpus == 1 and n.whole_free == 2
    assert_rebuilds(led, [node_obj, mine])
    led.apply_object(truth_node(holders={p.devices[0]: "plain/f", 2: "team/mine"}), 2.0)  # now it runs
    assert led.get("r1").devices == (2,) and led.device_conflicts() == []
    assert led.index.nodes["n1"].unknown_gpus == 0


# ------------------------------------------------------------------------------------- outside Kubernetes


def test_external_gpu_memory_over_the_threshold_blocks_the_device_and_the_denial_says_why():
    led = Ledger.rebuild([truth_node(gpus=2, external={0: 2048, 1: 100})], config())
    assert led.reserve(Request("r1", gpus=1), 0.0).devices == (1,)
    denial = led.reserve(Request("r2", gpus=1), 0.0)
    assert isinstance(denial, Denial)
    assert dict(denial.by_reason) == {Reason.EXTERNAL_GPU_USE: 1}
    for words in ("n1", "device 0", "2048 MiB", "external_memory_threshold_mib 1024", HOLDERS_ANNOTATION):
        assert words in denial.message, denial.message
    led.config = config(external_memory_threshold_mib=4096)
    led.renew_external()
    assert led.reserve(Request("r2", gpus=1), 1.0).devices == (0,)


def test_the_snapshot_shows_the_truth_and_stays_canonical():
    node_obj = truth_node(holders={1: "plain/f"}, external={2: 5000})
    snap = Ledger.rebuild([node_obj], config()).snapshot()
    assert snap["nodes"]["n1"]["truth"] == {
        "source": "podresources",
        "holders": {"1": ["plain/f", ["c"]]},
        "external": {"2": [5000, [102], True]},
        "unmapped": [],
    }
    assert json.loads(json.dumps(snap)) == snap


def test_a_counted_pod_is_counted_by_identity_for_the_devices_listed_and_per_node_for_the_rest():
    foreign = pod("f", namespace="plain", node_name="n1", gpus=2)
    led = Ledger.rebuild([node("n1", 4), foreign], config())
    assert led.index.nodes["n1"].unknown_gpus == 2
    node_obj = truth_node(holders={3: "plain/f"})
    led.apply_object(node_obj, 1.0)
    n = led.index.nodes["n1"]
    assert owners(led)[3] == "truth:n1" and n.unknown_gpus == 1 and n.whole_free == 2
    assert_rebuilds(led, [node_obj, foreign])
    led.delete_object(foreign)  # gone from the API, still listed by the agent: the device stays held
    assert owners(led)[3] == "truth:n1" and led.index.nodes["n1"].unknown_gpus == 0
    assert_rebuilds(led, [node_obj])


def test_a_gang_pod_the_kubelet_put_on_another_slots_device_keeps_its_gang():
    from gpuledger.core.model import GroupSpec

    led = Ledger.rebuild([node("n1", 4)], config())
    pods = []
    for i in range(3):
        p = led.reserve(Request(f"g{i}", gpus=1, group=GroupSpec("g", 3)), 0.0)
        obj = stored(f"m{i}", p)
        obj["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:0{i}Z"
        pods.append(obj)
        led.apply_object(obj, 0.5)
    node_obj = truth_node(
        holders={0: "team/m1"}
    )  # m1 runs on the device planned for m0, which is not running
    led.apply_object(node_obj, 1.0)
    assert led.get("g1").devices == (0,) and led.get("g0") is None
    assert [c[0] for c in led.device_conflicts()] == ["team/m0"]
    slots = led.snapshot()["groups"]["g"]["slots"]
    assert slots[1] == ["n1", [1], [], "g1"]  # recorded as planned: what every pod of the gang carries
    assert_rebuilds(led, [node_obj, *pods])
