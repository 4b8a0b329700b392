"""The parsing layer: quantities, nodes, pod requests, signed placements, object lists."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import DeviceShare, GroupSlot, Placement, Taint
from gpuledger.core.pods import objects as kube
from gpuledger.core.pods import placement_codec, quantity
from tests.core.core_factory import node, pod


@pytest.mark.parametrize(
    "text,value",
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("4Gi", Fraction(4 * 2**30)),
        ("1G", Fraction(10**9)),
        ("128974848", Fraction(128974848)),
        ("1e3", Fraction(1000)),
        ("0.5", Fraction(1, 2)),
        ("100Mi", Fraction(100 * 2**20)),
        ("1k", Fraction(1000)),
        (3, Fraction(3)),
    ],
)
def test_parse_quantity(text, value):
    assert quantity.parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", "5 Gi", "1Zi", True])
def test_bad_quantity_names_value_and_accepted_forms(bad):
    with pytest.raises(quantity.QuantityError) as err:
        quantity.parse_quantity(bad)
    assert repr(bad) in str(err.value) and "Gi" in str(err.value)


def test_unit_conversions_round_requests_up_and_capacity_down():
    assert (
        quantity.cpu_milli("250m") == 250
        and quantity.cpu_milli("1.5") == 1500
        and quantity.cpu_milli("1u") == 1
    )
    assert quantity.memory_mib("1G") == 954  # 1e9 bytes = 953.67 MiB, requests round up
    assert quantity.memory_mib("1G", round_up=False) == 953
    assert quantity.memory_mib("128974848") == 123
    assert quantity.count("2") == 2


def test_pod_requests_sum_containers_max_init_sidecars_and_limits_default():
    p = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
            ],
            "containers": [
                {
                    "name": "a",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "2Gi"},
                        "limits": {"nvidia.com/gpu": 2},
                    },
                },
                {
                    "name": "b",
                    "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                },  # requests default to limits
            ],
            "overhead": {"cpu": "10m"},
        },
    }
    r = kube.pod_requests(p)
    # containers 1500m + sidecar 100m = 1600m < init (sidecar 100m + 3000m) = 3100m; + overhead 10m
    assert r.cpu_milli == 3110
    assert r.memory_mib == 3072
    assert r.gpus == 2


def test_node_from_object_reads_labels_conditions_taints():
    obj = node(
        "n1",
        4,
        spine="sp",
        leaf="lf",
        labels={
            "gpu-orchestrator/cheap-node": "true",
            "agentaflow.gpu/schedulable": "false",
            "accelerator": "x",
        },
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        ready=False,
        unschedulable=True,
    )
    info = kube.node_from_object(obj)
    assert (info.name, info.cpu_milli, info.memory_mib) == ("n1", 64000, 512 * 1024)
    assert [d.index for d in info.devices] == [0, 1, 2, 3]
    assert all(d.memory_mib == 40960 and d.product == "NVIDIA-A100-SXM4-40GB" for d in info.devices)
    assert (info.spine, info.leaf, info.cheap, info.gpu_schedulable) == ("sp", "lf", True, False)
    assert (info.ready, info.unschedulable) == (False, True)
    assert info.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert info.label("accelerator") == "x"


def test_topology_label_keys_are_configurable():
    obj = node("n1", 1, labels={"rack": "r7", "row": "row2"})
    info = kube.node_from_object(obj, LedgerConfig(spine_label="row", leaf_label="rack"))
    assert (info.spine, info.leaf) == ("row2", "r7")


def test_device_annotation_wins_and_bad_annotation_falls_back():
    devices = [
        {"index": 1, "uuid": "GPU-b", "product": "H100", "memoryMiB": 81920, "healthy": False},
        {"index": 0, "uuid": "GPU-a", "product": "H100", "memoryMiB": 81920, "healthy": True},
    ]
    info = kube.node_from_object(node("n", 8, devices=devices))
    assert [(d.index, d.uuid, d.healthy, d.memory_mib) for d in info.devices] == [
        (0, "GPU-a", True, 81920),
        (1, "GPU-b", False, 81920),
    ]
    bad = node("n", 2)
    bad["metadata"]["annotations"][kube.DEVICES_ANNOTATION] = "{not json"
    problems: list[str] = []
    info = kube.node_from_object(bad, None, problems)
    assert len(info.devices) == 2
    assert problems and kube.DEVICES_ANNOTATION in problems[0] and "accepted" in problems[0]


def test_unhealthy_devices_are_never_placed_on():
    devices = [{"index": i, "healthy": i != 0} for i in range(2)]
    led = Ledger()
    led.apply_object(node("n", 2, devices=devices), 0)
    p = led.reserve(kube_request("a", 1), 0)
    assert p.devices == (1,)
    d = led.reserve(kube_request("b", 1), 0)
    assert not isinstance(d, Placement)


def kube_request(rid, gpus):
    from gpuledger.core.model import Request

    return Request(id=rid, gpus=gpus)


PLACEMENT = Placement(
    id="rid-1",
    node="n1",
    devices=(2, 3),
    uuids=("GPU-2", "GPU-3"),
    cpu_milli=1500,
    memory_mib=2048,
    group="job/ns/train",
    slot=1,
    strategy="best_fit",
    score=-3.5,
    tolerated_taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),),
    group_plan=(
        GroupSlot(0, "n0", (0, 1)),
        GroupSlot(1, "n1", (2, 3), ("GPU-2", "GPU-3")),
        GroupSlot(2, "n2", (), (), (DeviceShare(0, 250, 100),)),
    ),
    group_deadline=30.5,
)


def test_placement_annotation_roundtrip_and_signature():
    text = placement_codec.encode_placement(PLACEMENT, b"key")
    assert json.loads(text)["sig"]
    assert placement_codec.decode_placement(text, b"key") == PLACEMENT
    assert placement_codec.decode_placement(text, b"other") is None
    tampered = text.replace('"n1"', '"n9"', 1)
    assert placement_codec.decode_placement(tampered, b"key") is None
    unsigned = placement_codec.encode_placement(PLACEMENT, b"")
    assert "sig" not in json.loads(unsigned)
    assert placement_codec.decode_placement(unsigned, b"") == PLACEMENT
    assert (
        placement_codec.decode_placement(unsigned, b"key") is None
    )  # a signing ledger refuses unsigned placements


def test_share_placement_roundtrip():
    p = Placement(id="s", node="n", shares=(DeviceShare(1, 300, 2048),))
    assert placement_codec.decode_placement(placement_codec.encode_placement(p, b"k"), b"k") == p


@pytest.mark.parametrize("key", [b"k", "text-key", b"\x00" * 64, b"\xff" * 65, bytes(range(200)), b"x" * 32])
def test_signature_is_hmac_sha256(key):
    """The codec's HMAC from precomputed pads is the standard library's HMAC-SHA256, byte for byte (a
    rebuild verifies every stored pod's signature, so it is computed without rehashing the key each time)."""
    import hmac

    from gpuledger.core.pods.placement_codec import _sign

    raw = key.encode() if isinstance(key, str) else key
    for text in ("", "{}", '{"id":"r","node":"n"}', "é" * 100, "x" * 1000):
        assert _sign(text, key) == hmac.digest(raw, text.encode(), "sha256").hex()
        assert _sign(text, key) == _sign(text, key)  # the cached pads are copied, never updated in place


JSON_EDGES = [
    '{"a":1,"a":2}',
    "1e400",
    "-1e400",
    "[1e-400]",
    '"\\ud800"',
    '{"a":"\\udc00x"}',
    "NaN",
    "[Infinity]",
    "123456789012345678901234567890",
    "-9223372036854775809",
    "9223372036854775808",
    "18446744073709551615",
    "1" * 400,
    "[-0]",
    "[-0.0]",
    "1E2",
    "2.5e-324",
    " {} ",
    "{}\n",
    '"\\u0000"',
    '"\x00"',
    "[1,]",
    "0123",
    ".5",
    "\ufeff{}",
    "",
    '{"cpu":250,"id":"s1","node":"n","score":-0.8671875,"shares":[[1,250,8192]]}',
    "[9223372036854775807, -9223372036854775808, 18446744073709551615]",
    "[18446744073709551616, -9223372036854775809, 123456789012345678901234567890]",
    "[1234567890123456789.5, 0.1234567890123456789, 1e-400, -0.0]",
    '"\ud800"',  # a lone surrogate in the text itself (not escaped): no UTF-8 for orjson
    '{"a": 1, "a": 2}',
]


def _decoded(loads, text):
    try:
        value = loads(text)
    except ValueError:  # (json.JSONDecodeError is one)
        return "refused"
    return json.dumps(value)  # (a float and an int that compare equal still encode differently)


@pytest.mark.parametrize("text", JSON_EDGES)
def test_signed_text_decodes_as_json_loads_does(text):
    """The codec reads a signed placement with `json.loads`' own scanner, without its wrappers (a rebuild
    decodes one per stored pod), and anything else with `json.loads` itself: the same value, or the same
    refusal, for every text. (orjson, ~1.5 us faster a placement, is not used: the core imports only the
    standard library, and orjson reads an integer past 64 bits as a float.)"""
    from gpuledger.core.pods.placement_codec import _loads

    assert _decoded(_loads, text) == _decoded(json.loads, text)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES, st.booleans())
def test_any_json_decodes_as_json_loads_does(value, compact):
    from gpuledger.core.pods.placement_codec import _loads

    text = json.dumps(value, separators=(",", ":") if compact else None, ensure_ascii=compact)
    assert _decoded(_loads, text) == _decoded(json.loads, text)


def test_pod_usage():
    p = pod("p", node_name="n1", gpus=2, cpu="1", memory="1Gi", phase="Running")
    u = kube.pod_usage(p)
    assert (u.key, u.node, u.terminal, u.gpus, u.cpu_milli, u.memory_mib) == (
        "default/p",
        "n1",
        False,
        2,
        1000,
        1024,
    )
    assert u.placement is None
    done = kube.pod_usage(pod("p", node_name="n1", phase="Succeeded"))
    assert done.terminal
    signed = kube.pod_usage(pod("q", placement=PLACEMENT, key=b"k"), b"k")
    assert signed.placement == PLACEMENT and signed.node == "n1"
    forged = kube.pod_usage(pod("q", placement=PLACEMENT, key=b"x"), b"k")
    assert forged.placement is None and kube.PLACEMENT_ANNOTATION in forged.placement_problem


@pytest.mark.parametrize(
    "meta",
    [
        {"name": "p", "namespace": "ns", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        {"name": "p"},  # no namespace: default
        {"uid": "u2"},  # nameless: keyed by uid
        {},  # nothing at all
        {"name": "", "namespace": "ns", "uid": 7, "creationTimestamp": 5},  # not strings: as str() gives
    ],
)
def test_pod_usage_key_and_text_fields_are_those_of_pod_key_and_str(meta):
    """pod_usage keys the pod from the metadata it holds and skips str() on strings (a rebuild's hot path):
    the same values as pod_key and str()."""
    obj = {"metadata": dict(meta), "spec": {"nodeName": 42}, "status": {"phase": "Running"}}
    problems: list[str] = []
    obj["metadata"]["annotations"] = {kube.PLACEMENT_ANNOTATION: "{not json"}
    u = kube.pod_usage(obj, b"k", problems, lazy=True)
    assert u.key == kube.pod_key(obj)
    assert (u.node, u.created, u.uid) == (
        "42",
        str(meta.get("creationTimestamp") or ""),
        str(meta.get("uid") or ""),
    )
    assert problems == [f"pod {kube.pod_key(obj)}: {u.placement_problem}"]


KUBECTL_YAML = """
apiVersion: v1
items:
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      nvidia.com/gpu.product: Tesla-T4
      nvidia.com/gpu.memory: "15360"
      topology.scheduler/leaf: leaf-a
      topology.scheduler/spine: spine-1
    name: gpu-1
  spec:
    taints:
    - effect: NoSchedule
      key: nvidia.com/gpu
      value: present
  status:
    allocatable:
      cpu: 7910m
      memory: 31574984Ki
      nvidia.com/gpu: "4"
      pods: "110"
    conditions:
    - status: "True"
      type: Ready
- apiVersion: v1
  kind: Pod
  metadata:
    name: legacy
    namespace: ml
  spec:
    nodeName: gpu-1
    containers:
    - name: c
      resources:
        limits:
          nvidia.com/gpu: "1"
        requests:
          cpu: 500m
          memory: 1G
  status:
    phase: Running
- apiVersion: v1
  kind: Pod
  metadata:
    name: finished
    namespace: ml
  spec:
    nodeName: gpu-1
    containers:
    - name: c
      resources:
        limits:
          nvidia.com/gpu: "2"
  status:
    phase: Succeeded
kind: List
metadata:
  resourceVersion: ""
"""


def test_kubectl_get_yaml_is_valid_input():
    doc = yaml.safe_load(KUBECTL_YAML)
    led = Ledger.rebuild(doc, LedgerConfig(), now=0.0)
    n = led.index.nodes["gpu-1"]
    assert n.info.product == "Tesla-T4" and n.info.leaf == "leaf-a"
    assert n.cpu_free == 7910 - 500 and n.unknown_gpus == 1 and n.whole_free == 3
    assert n.mem_free == 31574984 // 1024 - 954
    # the List's items alone work too
    assert Ledger.rebuild(doc["items"], LedgerConfig(), now=0.0).snapshot() == led.snapshot()


def test_natural_key_orders_numbers():
    assert sorted(["leaf-10", "leaf-2", "leaf-1"], key=kube.natural_key) == ["leaf-1", "leaf-2", "leaf-10"]


def test_every_placement_field_survives_the_annotation():
    """The decoder builds `Placement` positionally: a field it put in another's place would show here. Every
    field of the placement's identity (those compared; a warning to the user is not one) is carried."""
    import dataclasses

    full = dataclasses.replace(
        PLACEMENT, shares=(DeviceShare(1, 300, 2048),), uuids=("GPU-2", "GPU-3", "GPU-1")
    )
    identity = [f for f in dataclasses.fields(Placement) if f.compare]
    assert [f.name for f in dataclasses.fields(Placement) if not f.compare] == ["warnings"]
    assert all(getattr(full, f.name) != f.default for f in identity)
    back = placement_codec.decode_placement(placement_codec.encode_placement(full, b"k"), b"k")
    for f in identity:
        assert getattr(back, f.name) == getattr(full, f.name), f.name


def test_nodes_without_the_device_annotation_share_one_tuple_of_plain_devices():
    def plain(name: str, gpus: str, product: str = "A100") -> dict:
        labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": "81920"}
        return {
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus}},
        }

    a, b = kube.node_from_object(plain("a", "8")), kube.node_from_object(plain("b", "8"))
    other = kube.node_from_object(plain("c", "8", product="H100"))
    assert a.devices == tuple(kube.Device(index=i, product="A100", memory_mib=81920) for i in range(8))
    assert a.devices is b.devices  # one kind, one tuple: a Device is frozen
    assert other.devices is not a.devices and {d.product for d in other.devices} == {"H100"}
    assert kube.node_from_object(plain("d", "0")).devices == ()


def test_integers_past_64_bits_survive_the_annotation():
    """Integers past 64 bits (which a faster JSON reader such as orjson would read as floats) come back as
    they were signed."""
    import dataclasses

    big = dataclasses.replace(
        PLACEMENT, cpu_milli=10**22, memory_mib=2**70 + 1, shares=(DeviceShare(1, 2**64, 2**63 + 7),)
    )
    back = placement_codec.decode_placement(placement_codec.encode_placement(big, b"k"), b"k")
    assert back == big
    assert type(back.cpu_milli) is int and back.memory_mib == 2**70 + 1


_TEXTS = st.sampled_from(["", "ns", "default", "p", "p-1", "p-", "u-1", "u-2"])
_ODDITIES = st.sampled_from([None, 0, 5, True, [], {}, ["ns"]])
_FIELD = {  # each field mostly from values that meet its counterpart's, so every branch is reached
    "ns": st.sampled_from(["ns", "default", ""]),
    "namespace": st.sampled_from(["ns", "default", ""]),
    "name": st.sampled_from(["", "p-1", "p"]),
    "gen": st.sampled_from(["", "p-", "q-"]),
    "generateName": st.sampled_from(["", "p-"]),
    "owner": st.sampled_from(["", "u-1", "u-2"]),
    "uid": st.sampled_from(["", "u-1", "u-2"]),
}


def _field(name: str):
    return st.one_of(_FIELD[name], _FIELD[name], _FIELD[name], _TEXTS, _ODDITIES)


@st.composite
def _bindings_and_pods(draw):
    """Signed binding members (as a signer writes them, or odd) and pods (named, generated, owned, odd)."""
    bind = draw(
        st.one_of(
            st.builds(
                lambda d, keep: {k: v for k, v in d.items() if k in keep},
                st.fixed_dictionaries({k: _field(k) for k in ("ns", "name", "gen", "owner")}),
                st.one_of(
                    st.just({"ns", "gen", "owner"}), st.sets(st.sampled_from(["ns", "name", "gen", "owner"]))
                ),
            ),
            _ODDITIES,
        )
    )
    meta = draw(
        st.builds(
            lambda d, keep: {k: v for k, v in d.items() if k in keep},
            st.fixed_dictionaries({k: _field(k) for k in ("namespace", "name", "generateName")}),
            st.sets(st.sampled_from(["namespace", "name", "generateName"])),
        )
    )
    refs = draw(
        st.one_of(
            st.lists(
                st.one_of(
                    st.fixed_dictionaries(
                        {
                            "uid": st.one_of(_TEXTS, _ODDITIES),
                            "controller": st.one_of(st.booleans(), _ODDITIES),
                        }
                    ),
                    _ODDITIES,
                ),
                max_size=2,
            ),
            _ODDITIES,
        )
    )
    if draw(st.booleans()):
        meta["ownerReferences"] = refs
    return bind, draw(st.one_of(st.just({"metadata": meta}), _ODDITIES, st.just({"metadata": refs})))


@settings(max_examples=600, deadline=None)
@given(_bindings_and_pods())
def test_issued_for_reads_the_signed_members_as_binding_mismatch_does(case):
    """`issued_for` (a rebuild's check of every stored pod's binding, no `Binding` built) answers what
    `binding_mismatch(Binding.from_dict(...))` answers, and refuses (raises) what that refuses."""
    from gpuledger.core.pods.placement_codec import Binding, binding_mismatch, issued_for

    bind, pod = case
    try:
        expected: object = not binding_mismatch(Binding.from_dict(bind), pod)
    except (ValueError, TypeError, AttributeError) as err:
        expected = type(err)
    try:
        got: object = issued_for(bind, pod)
    except (ValueError, TypeError, AttributeError) as err:
        got = type(err)
    assert got == expected


@pytest.mark.parametrize("binding", [None, ("ns", "p"), ("ns", "q"), ("other", "p"), ("ns", "", "p", "u-1")])
def test_decode_issued_for_is_decode_bound_then_binding_mismatch(binding):
    from gpuledger.core.pods.placement_codec import Binding, binding_mismatch, decode_bound, decode_issued_for

    pod = {"metadata": {"name": "p-1" if binding and len(binding) > 2 else "p", "namespace": "ns"}}
    pod["metadata"]["ownerReferences"] = [{"uid": "u-1", "controller": True}]
    text = placement_codec.encode_placement(PLACEMENT, b"k", Binding(*binding) if binding else None)
    placement, signed = decode_bound(text, b"k")
    expected = placement if signed is None or not binding_mismatch(signed, pod) else None
    assert decode_issued_for(text, b"k", pod) == expected
    assert decode_issued_for(text, b"another key", pod) is None
    assert decode_issued_for(text[:-4] + '0"}', b"k", pod) is None


def test_issued_for_answers_as_binding_mismatch_on_every_combination():
    """Every combination of a few values per field (a match and a miss of each check, and odd types)."""
    import itertools

    from gpuledger.core.pods.placement_codec import Binding, binding_mismatch, issued_for

    refs_variants = [
        None,
        [{"uid": "u-1", "controller": True}],
        [{"uid": "u-2", "controller": True}],
        [{"uid": "u-1"}],
        "odd",
    ]
    for ns, name, gen, owner, pod_ns, pod_name, refs in itertools.product(
        ["ns", "default", "", 5],
        ["", "p", "p-1", None],
        ["", "p-", "q-"],
        ["", "u-1"],
        ["ns", "default", "", None, 5],
        ["", "p", "p-1", None, 7],
        refs_variants,
    ):
        bind = {"ns": ns, "gen": gen, "owner": owner} | ({} if name is None else {"name": name})
        meta = {"namespace": pod_ns, "name": pod_name}
        if refs is not None:
            meta["ownerReferences"] = refs
        pod = {"metadata": meta}
        try:
            expected: object = not binding_mismatch(Binding.from_dict(bind), pod)
        except ValueError as err:
            expected = type(err)
        try:
            got: object = issued_for(bind, pod)
        except ValueError as err:
            got = type(err)
        assert got == expected, (bind, pod)
