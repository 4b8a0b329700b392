"""What the ledger does around every strategy, seen through the default one (best_fit): node filters (taints,
selectors, affinity, product, resources), soft domains, the default device choice, denial messages and
determinism across ledgers.
"""

from __future__ import annotations

from gpuledger.core.model import (
    Denial,
    PinnedDevices,
    Placement,
    Reason,
    Request,
    SelectorRequirement,
    Taint,
    Toleration,
)
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_whole_gpus_prefer_contiguous_devices():
    led = make(node("a", 8))
    take(led, "a", 1, "x")  # device 0
    led.reserve(Request(id="y", gpus=1, pinned=PinnedDevices("a", (3,))), 0.0)
    p = led.reserve(Request(id="z", gpus=3), 0.0)
    assert p.devices == (4, 5, 6)  # (1, 2) is too short; the run 4..7 holds three
    q = led.reserve(Request(id="w", gpus=2), 0.0)
    assert q.devices == (1, 2)


def test_taints_and_gpu_taint_tolerated_on_pods_behalf():
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    other = {"key": "dedicated", "value": "infra", "effect": "NoExecute"}
    soft = {"key": "soft", "effect": "PreferNoSchedule"}
    led = make(node("gpu", 4, taints=[gpu_taint, soft]), node("infra", 8, taints=[other]))
    p = led.reserve(Request(id="1", gpus=1), 0.0)
    assert p.node == "gpu"
    assert p.tolerated_taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    tol = Toleration(key="dedicated", operator="Equal", value="infra", effect="NoExecute")
    q = led.reserve(Request(id="2", gpus=8, tolerations=(tol,)), 0.0)
    assert q.node == "infra" and q.tolerated_taints == ()
    d = led.reserve(Request(id="3", gpus=8), 0.0)
    assert isinstance(d, Denial) and dict(d.by_reason)[Reason.TAINT] == 1
    # a pod that tolerates the GPU taint itself needs nothing added
    r = led.reserve(
        Request(id="4", gpus=1, tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),)), 0.0
    )
    assert r.node == "gpu" and r.tolerated_taints == ()


def test_gpu_taint_keys_are_configurable():
    led = make(
        node("a", 2, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]), tolerated_gpu_taint_keys=()
    )
    d = led.reserve(Request(id="1", gpus=1), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.TAINT, 1),)


def test_node_selector_and_affinity_operators():
    led = make(
        node("a", 2, labels={"zone": "z1", "gen": "3"}),
        node("b", 2, labels={"zone": "z2", "gen": "5"}),
        node("c", 2, labels={"gen": "9"}),
    )

    def where(**kw):
        r = led.explain(Request(id="e", gpus=1, **kw)).result
        return r.node if isinstance(r, Placement) else None

    assert where(node_selector=(("zone", "z2"),)) == "b"
    req = SelectorRequirement
    assert where(affinity_terms=((req("zone", "In", ("z1",)),),)) == "a"
    assert where(affinity_terms=((req("zone", "NotIn", ("z1", "z2")),),)) == "c"
    assert where(affinity_terms=((req("zone", "DoesNotExist"),),)) == "c"
    assert where(affinity_terms=((req("zone", "Exists"), req("gen", "Gt", ("4",))),)) == "b"
    assert where(affinity_terms=((req("gen", "Lt", ("4",)),),)) == "a"
    # terms are ORed
    assert where(affinity_terms=((req("zone", "In", ("nope",)),), (req("gen", "Gt", ("8",)),))) == "c"
    d = led.reserve(Request(id="x", gpus=1, node_selector=(("zone", "z9"),)), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.SELECTOR, 3),)


def test_product_and_gpu_memory_filters():
    led = make(
        node("t4", 4, product="Tesla-T4", gpu_memory=15360),
        node("a100", 4, product="NVIDIA-A100-SXM4-80GB", gpu_memory=81920),
    )
    assert led.reserve(Request(id="1", gpus=1, product="a100"), 0.0).node == "a100"
    assert led.reserve(Request(id="2", gpus=1, product="T4"), 0.0).node == "t4"
    d = led.reserve(Request(id="3", gpus=1, product="H100"), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.PRODUCT_MISMATCH, 2),)
    assert "H100" in d.message
    assert led.reserve(Request(id="4", gpus=1, gpu_memory_mib=40000), 0.0).node == "a100"
    e = led.reserve(Request(id="5", gpus=1, gpu_memory_mib=100000), 0.0)
    assert isinstance(e, Denial) and e.by_reason == ((Reason.GPU_MEMORY_TOO_SMALL, 2),)


def test_accelerator_label_counts_as_product():
    led = make(node("x", 2, product="", labels={"accelerator": "nvidia-tesla-v100"}))
    assert led.reserve(Request(id="1", gpus=1, product="v100"), 0.0).node == "x"


def test_not_ready_cordoned_and_not_gpu_schedulable_nodes_are_out():
    led = make(
        node("down", 8, ready=False),
        node("cordoned", 8, unschedulable=True),
        node("off", 8, labels={"agentaflow.gpu/schedulable": "false"}),
    )
    d = led.reserve(Request(id="1", gpus=1), 0.0)
    assert isinstance(d, Denial)
    assert dict(d.by_reason) == {Reason.NOT_READY: 2, Reason.NOT_GPU_SCHEDULABLE: 1}


def test_cpu_and_memory_must_fit():
    led = make(node("small", 8, cpu="2", memory="4Gi"), node("big", 1))
    assert led.reserve(Request(id="1", gpus=1, cpu_milli=4000), 0.0).node == "big"
    d = led.reserve(Request(id="2", gpus=1, cpu_milli=4000, memory_mib=1024), 0.0)
    assert isinstance(d, Denial)
    assert dict(d.by_reason) == {Reason.NOT_ENOUGH_CPU: 1, Reason.NOT_ENOUGH_GPUS: 1}


def test_preferred_domain_is_soft():
    led = make(node("a", 8, leaf="L1", spine="S1"), node("b", 8, leaf="L2", spine="S2"))
    assert led.reserve(Request(id="1", gpus=1, preferred_domain="L2"), 0.0).node == "b"
    assert led.reserve(Request(id="2", gpus=1, preferred_domain="S1"), 0.0).node == "a"
    take(led, "b", 7, "fill-b")
    assert led.reserve(Request(id="3", gpus=2, preferred_domain="L2"), 0.0).node == "a"  # falls back


def test_denial_message_counts_reasons_and_names_best_near_miss():
    taint = {"key": "dedicated", "effect": "NoSchedule"}
    nodes = [node(f"full-{i:02d}", 4) for i in range(12)] + [
        node(f"t-{i}", 8, taints=[taint]) for i in range(4)
    ]
    led = make(*nodes)
    for i in range(12):
        take(led, f"full-{i:02d}", 2 if i else 1, f"pre{i}")
    d = led.reserve(Request(id="big", gpus=4), 0.0)
    assert isinstance(d, Denial)
    assert d.message.startswith("no node fits 4 whole GPU(s) with strategy best_fit: ")
    assert "12 node(s) not enough GPUs (best: full-00 has 3 free)" in d.message
    assert "4 node(s) untolerated taint" in d.message
    assert dict(d.by_reason) == {Reason.NOT_ENOUGH_GPUS: 12, Reason.TAINT: 4}
    assert d.near_misses[0].node == "full-00" and d.near_misses[0].free_gpus == 3


def test_denial_for_share_and_unknown_gpu_identity():
    led = make(node("a", 1))
    led.apply_object(
        {
            "kind": "Pod",
            "metadata": {"name": "legacy", "namespace": "x"},
            "spec": {
                "nodeName": "a",
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            },
            "status": {"phase": "Running"},
        },
        0.0,
    )
    d = led.reserve(Request(id="s", gpu_milli=100), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.NOT_ENOUGH_GPU_SHARE, 1),)
    assert "share of 100 milli-GPU" in d.message


def test_invalid_requests_are_denied_with_the_field_named():
    led = make(node("a", 1))
    d = led.reserve(Request(id="x", gpus=1, gpu_milli=200), 0.0)
    assert isinstance(d, Denial) and "gpu_milli=200" in d.message
    d2 = led.reserve(Request(id="y", gpu_milli=1500), 0.0)
    assert isinstance(d2, Denial) and "0..1000" in d2.message


def test_same_seed_same_result_across_ledgers():
    nodes = [node(f"n{i}", 8, leaf=f"L{i % 3}") for i in range(9)]
    reqs = [
        Request(id=f"r{i}", gpus=1 + i % 3, strategy=s, seed=7)
        for i, s in enumerate(["random", "balanced", "round_robin", "distributed"] * 5)
    ]

    def run():
        led = make(*nodes)
        return [led.reserve(r, 0.0) for r in reqs]

    assert run() == run()
