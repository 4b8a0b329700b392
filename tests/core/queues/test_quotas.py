"""Quota accounting from the ledger's placements: use by product, parents summing children, what is borrowed,
and whether a workload may start (its borrowing limit; only what others do not use and lend)."""

from __future__ import annotations

from gpuledger.core.model import MILLI_PER_GPU, GroupSpec, Placement, Request
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, GPUQueue, LabelSelector, ProductQuota, QueueSet
from gpuledger.core.queues.quotas import (
    Capacity,
    ProductCapacity,
    Usage,
    Use,
    quota_refusal,
    usage_by_namespace,
)
from tests.core.queue_factory import Cluster, gpu_node, nodes

G = MILLI_PER_GPU


def test_use_is_counted_by_the_product_of_the_nodes_it_sits_on():
    c = Cluster.of([gpu_node("h1", 8, product="H100"), gpu_node("a1", 4, product="A100")])
    c.ledger.reserve(Request(id="whole", gpus=4, product="H100", cpu_milli=2000, memory_mib=1024), 0.0)
    c.ledger.reserve(Request(id="share", gpu_milli=250, product="A100"), 0.0)
    view = c.view
    assert view.use_of(["whole"]) == Use((("H100", 4 * G, 2000, 1024),))
    assert view.use_of(["share"]) == Use((("A100", 250, 0, 0),))
    assert view.use_of(["whole", "share", "unknown"]) == Use(
        (("A100", 250, 0, 0), ("H100", 4 * G, 2000, 1024))
    )
    assert (view.use_of(["whole"]) + view.use_of(["share"])).milli == 4250


def test_a_gangs_use_is_every_slot_claimed_or_not():
    c = Cluster.of(nodes(4, 8))
    first = c.ledger.reserve(Request(id="g#0", gpus=8, group=GroupSpec("job/ns/g", 3)), 0.0)
    assert isinstance(first, Placement)
    assert c.view.use_of(["g#0"]).milli == 24 * G  # slots 1 and 2 are held for pods not yet created
    assert len(c.view.holdings(["g#0"])) == 3


def test_capacity_sums_healthy_gpus_free_gpus_cpu_and_memory_by_product():
    c = Cluster.of(
        [
            gpu_node("h1", 8, product="H100"),
            gpu_node("h2", 8, product="H100"),
            gpu_node("a1", 4, product="A100"),
        ]
    )
    c.ledger.reserve(Request(id="x", gpus=3, product="H100"), 0.0)
    cap = c.view.capacity()
    assert cap.products["H100"] == ProductCapacity(16 * G, 13 * G, 256_000, 2 * 1_048_576)
    assert cap.products["A100"].milli == 4 * G
    assert cap.free_milli() == 17 * G and cap.free_milli("h100") == 13 * G
    assert cap.total().milli == 20 * G


def tree() -> QueueSet:
    return QueueSet(
        [
            GPUQueue("org", (ProductQuota(ANY_PRODUCT, 96),)),
            GPUQueue("team-a", (ProductQuota(ANY_PRODUCT, 64),), parent="org"),
            GPUQueue("team-b", (ProductQuota(ANY_PRODUCT, 32),), parent="org"),
            GPUQueue("other", (ProductQuota("H100", 32), ProductQuota(ANY_PRODUCT, 8))),
        ]
    )


def test_a_parent_uses_what_its_children_use_and_each_borrows_above_its_own_quota():
    qs = tree()
    usage = Usage.of(
        qs, [("team-a", Use((("H100", 80 * G, 0, 0),))), ("team-b", Use((("H100", 24 * G, 0, 0),)))]
    )
    assert usage.total("team-a") == 80 * G and usage.borrowed("team-a", ANY_PRODUCT) == 16 * G
    assert usage.borrowed("team-b", ANY_PRODUCT) == 0
    assert usage.total("org") == 104 * G and usage.borrowed_total("org") == 8 * G
    other = Usage.of(qs, [("other", Use((("H100", 40 * G, 0, 0), ("A100", 4 * G, 0, 0))))])
    assert other.milli("other", "H100") == 40 * G and other.milli("other", ANY_PRODUCT) == 4 * G
    assert other.borrowed("other", "H100") == 8 * G and other.borrowed("other", ANY_PRODUCT) == 0
    copy = usage.copy()
    copy.add("team-a", Use((("H100", 80 * G, 0, 0),)), -1)
    assert copy.total("team-a") == 0 and usage.total("team-a") == 80 * G  # the copy is its own


def test_usage_by_namespace_counts_each_namespace_in_its_queue():
    qs = QueueSet(
        [
            GPUQueue(
                "a", (ProductQuota(ANY_PRODUCT, 8),), namespace_selector=LabelSelector((("team", "a"),))
            ),
            GPUQueue(
                "b", (ProductQuota(ANY_PRODUCT, 8),), namespace_selector=LabelSelector((("tier", "x"),))
            ),
        ]
    )
    labels = {"ns-a": {"team": "a"}, "ns-ab": {"team": "a", "tier": "x"}, "ns-z": {}}
    four = Use((("H100", 4 * G, 0, 0),))
    usage = usage_by_namespace(qs, labels, [("ns-a", four), ("ns-a", four), ("ns-z", four), ("ns-ab", four)])
    assert usage.total("a") == 8 * G
    assert usage.total("default") == 8 * G  # ns-z: no queue selects it; ns-ab: two do


def cap(free: int, total: int = 128) -> Capacity:
    return Capacity({"H100": ProductCapacity(total * G, free * G, 0, 0)})


def test_a_workload_within_quota_may_start_and_one_past_its_borrowing_limit_may_not():
    qs = QueueSet(
        [
            GPUQueue("a", (ProductQuota(ANY_PRODUCT, 64, borrowing_limit=16),)),
            GPUQueue("b", (ProductQuota(ANY_PRODUCT, 64),)),
        ]
    )
    usage = Usage.of(qs, [("a", Use((("H100", 64 * G, 0, 0),)))])
    assert quota_refusal(qs, usage, cap(64), "a", Use((("H100", 16 * G, 0, 0),))) is None
    refusal = quota_refusal(qs, usage, cap(64), "a", Use((("H100", 24 * G, 0, 0),)))
    assert refusal == "queue a would use 88 GPU(s) of any product: its quota is 64 and it may borrow 16 more"


def test_borrowing_takes_only_what_others_lend():
    """b keeps 48 of its 64 (lends 16) while it does not use them: a may borrow only 16 of b's free GPUs."""
    qs = QueueSet(
        [
            GPUQueue("a", (ProductQuota(ANY_PRODUCT, 64),)),
            GPUQueue("b", (ProductQuota(ANY_PRODUCT, 64, lending_limit=16),)),
        ]
    )
    usage = Usage.of(qs, [("a", Use((("H100", 64 * G, 0, 0),)))])
    assert quota_refusal(qs, usage, cap(64), "a", Use((("H100", 16 * G, 0, 0),))) is None
    refusal = quota_refusal(qs, usage, cap(64), "a", Use((("H100", 24 * G, 0, 0),)))
    assert refusal == (
        "queue a would borrow GPUs other queues keep for themselves: 48 GPU(s) kept, 40 would stay free"
    )
    # once b uses what it keeps, there is nothing kept to leave free
    busy = Usage.of(qs, [("a", Use((("H100", 64 * G, 0, 0),))), ("b", Use((("H100", 48 * G, 0, 0),)))])
    assert quota_refusal(qs, busy, cap(16), "a", Use((("H100", 16 * G, 0, 0),))) is None
    # within its quota a queue never asks: b's kept GPUs are its own
    assert quota_refusal(qs, Usage(qs), cap(128), "b", Use((("H100", 64 * G, 0, 0),))) is None


def test_a_named_products_kept_gpus_are_kept_of_that_product():
    qs = QueueSet(
        [
            GPUQueue("a", (ProductQuota(ANY_PRODUCT, 0),)),
            GPUQueue("b", (ProductQuota("H100", 8, lending_limit=0),)),
        ]
    )
    both = Capacity(
        {"H100": ProductCapacity(8 * G, 8 * G, 0, 0), "A100": ProductCapacity(8 * G, 8 * G, 0, 0)}
    )
    assert quota_refusal(qs, Usage(qs), both, "a", Use((("A100", 8 * G, 0, 0),))) is None
    refusal = quota_refusal(qs, Usage(qs), both, "a", Use((("H100", 4 * G, 0, 0),)))
    assert refusal is not None and "8 GPU(s) of h100 kept, 4 would stay free" in refusal


def test_victims_about_to_go_count_as_free():
    qs = QueueSet(
        [
            GPUQueue("a", (ProductQuota(ANY_PRODUCT, 64),)),
            GPUQueue("b", (ProductQuota(ANY_PRODUCT, 64, lending_limit=0),)),
        ]
    )
    usage = Usage.of(qs, [("a", Use((("H100", 64 * G, 0, 0),))), ("b", Use((("H100", 32 * G, 0, 0),)))])
    ask = Use((("H100", 8 * G, 0, 0),))
    assert quota_refusal(qs, usage, cap(32), "a", ask) is not None  # b keeps 32 unused
    assert quota_refusal(qs, usage, cap(32), "a", ask, freed=Use((("H100", 8 * G, 0, 0),))) is None
