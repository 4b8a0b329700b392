"""Fair order: among queues, the one furthest below its weighted fair share (dominant resource share of what
it borrows); within a queue, priority (GPU_Orchestrator's words or a PriorityClass value) then arrival."""

from __future__ import annotations

import pytest

from gpuledger.core.model import MILLI_PER_GPU, GroupSpec, Request
from gpuledger.core.pods.annotation_values import PRIORITY_WORDS
from gpuledger.core.queues.fair_share import (
    WaitingWorkload,
    dominant_share,
    line,
    next_waiting,
    queue_key,
    quota_used,
)
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, GPUQueue, ProductQuota, QueueSet
from gpuledger.core.queues.quotas import Capacity, ProductCapacity, Usage, Use

G = MILLI_PER_GPU
CAP = Capacity({"H100": ProductCapacity(128 * G, 0, 128 * 64_000, 128 * 512_000)})


def gpus(n: int, cpu: int = 0, memory: int = 0) -> Use:
    return Use((("H100", n * G, cpu, memory),))


def two(weight_b: float = 1.0) -> QueueSet:
    return QueueSet(
        [
            GPUQueue("a", (ProductQuota(ANY_PRODUCT, 32),)),
            GPUQueue("b", (ProductQuota(ANY_PRODUCT, 32),), weight=weight_b),
        ]
    )


def test_within_quota_the_share_is_zero_and_above_it_is_what_is_borrowed_over_the_cluster():
    qs = two()
    usage = Usage.of(qs, [("a", gpus(32)), ("b", gpus(64))])
    assert dominant_share(qs, usage, CAP, "a") == 0.0
    assert dominant_share(qs, usage, CAP, "b") == pytest.approx(32 / 128)
    assert quota_used(qs, usage, "a") == 1.0 and quota_used(qs, usage, "b") == 2.0


def test_a_weight_divides_the_share():
    qs = two(weight_b=2.0)
    usage = Usage.of(qs, [("a", gpus(64)), ("b", gpus(64))])
    assert dominant_share(qs, usage, CAP, "b") == pytest.approx(dominant_share(qs, usage, CAP, "a") / 2)
    assert queue_key(qs, usage, CAP, "b") < queue_key(qs, usage, CAP, "a")


def test_cpu_and_memory_held_beside_borrowed_gpus_count_where_they_dominate():
    qs = two()
    # both borrow 16 GPUs; b's pods hold half the CPUs of the H100 nodes with them
    usage = Usage.of(qs, [("a", gpus(48)), ("b", gpus(48, cpu=128 * 64_000 * 3 // 2 // 3))])
    share_a, share_b = dominant_share(qs, usage, CAP, "a"), dominant_share(qs, usage, CAP, "b")
    assert share_a == pytest.approx(16 / 128)
    assert share_b == pytest.approx((16 / 48) * (128 * 64_000 / 2) / (128 * 64_000))
    assert share_b > share_a


def w(key: str, queue: str, priority: int = 0, arrival: float = 0.0, n: int = 8) -> WaitingWorkload:
    return WaitingWorkload(key, queue, priority, arrival, gpus(n))


def test_the_queue_furthest_below_its_fair_share_goes_first():
    qs = two()
    usage = Usage.of(qs, [("a", gpus(64)), ("b", gpus(40))])
    waiting = [w("a1", "a", arrival=1), w("b1", "b", arrival=2)]
    assert next_waiting(qs, usage, CAP, waiting).key == "b1"
    assert next_waiting(qs, Usage(qs), CAP, []) is None


def test_within_quota_the_queue_using_least_of_its_quota_goes_first():
    qs = two()
    usage = Usage.of(qs, [("a", gpus(8)), ("b", gpus(24))])
    assert next_waiting(qs, usage, CAP, [w("b1", "b", arrival=0), w("a1", "a", arrival=5)]).key == "a1"


def test_within_a_queue_priority_then_arrival():
    qs = two()
    words = PRIORITY_WORDS
    waiting = [
        w("low-early", "a", words["low"], 0.0),
        w("medium", "a", words["medium"], 1.0),
        w("critical-late", "a", words["critical"], 9.0),
        w("high-b", "a", words["high"], 3.0),
        w("high-a", "a", words["high"], 2.0),
        w("priorityclass-2000", "a", 2000, 10.0),  # a PriorityClass value above critical's
    ]
    order = [x.key for x in line(qs, Usage(qs), CAP, waiting)]
    assert order == ["priorityclass-2000", "critical-late", "high-a", "high-b", "medium", "low-early"]


def test_a_waiting_workload_asks_what_its_request_asks():
    gang = Request(id="g#0", gpus=8, product="H100", cpu_milli=1000, group=GroupSpec("job/ns/g", 4))
    assert WaitingWorkload.of_request("job/ns/g", "a", gang, 3.0) == WaitingWorkload(
        "job/ns/g", "a", 0, 3.0, Use((("H100", 32 * G, 4000, 0),))
    )
    share = Request(id="s", gpu_milli=250, priority=PRIORITY_WORDS["high"])
    assert WaitingWorkload.of_request("pod/ns/s", "a", share, 1.0).use == Use((("", 250, 0, 0),))


def test_the_line_shares_the_cluster_by_weight():
    """Two queues with no quota left, b weighing twice a's: b gets two turns for each of a's."""
    qs = QueueSet([GPUQueue("a"), GPUQueue("b", weight=2.0)])
    waiting = [w(f"a{i}", "a", arrival=i) for i in range(4)] + [w(f"b{i}", "b", arrival=i) for i in range(8)]
    order = [x.queue for x in line(qs, Usage(qs), CAP, waiting)]
    assert order[:9] == ["a", "b", "b", "a", "b", "b", "a", "b", "b"]
    assert sorted(order) == sorted(x.queue for x in waiting)


def test_a_two_level_tree_chooses_the_organisation_then_the_team():
    qs = QueueSet(
        [
            GPUQueue("org1", (ProductQuota(ANY_PRODUCT, 64),)),
            GPUQueue("t1", (ProductQuota(ANY_PRODUCT, 8),), parent="org1"),
            GPUQueue("t2", (ProductQuota(ANY_PRODUCT, 56),), parent="org1"),
            GPUQueue("org2", (ProductQuota(ANY_PRODUCT, 64),)),
        ]
    )
    # org1 borrows (t1 heavily); org2 within quota goes first, then within org1 t2 (within its quota)
    usage = Usage.of(qs, [("t1", gpus(72)), ("org2", gpus(8))])
    waiting = [w("t1-job", "t1", arrival=0), w("t2-job", "t2", arrival=1), w("org2-job", "org2", arrival=2)]
    assert [x.key for x in line(qs, usage, CAP, waiting)] == ["org2-job", "t2-job", "t1-job"]
