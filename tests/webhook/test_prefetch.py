"""Placements admitted ahead (gpuledger.webhook.ledger.prefetch), driven through the real handler and an
in-process ledger:
the next pod of a shape skips the ledger call, and every guarantee of the ordinary path still holds."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuledger.core.pods.placement_codec import decode_placement
from gpuledger.names import PLACEMENT_ANNOTATION
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.ledger.prefetch import PrefetchSettings
from tests.webhook.webhook_support import (
    HMAC_KEY,
    Clock,
    apply_patch,
    cluster,
    config,
    gpu_pod,
    handler,
    review,
)

KEY = HMAC_KEY.encode()


async def settle() -> None:
    """Let the background fills (in-process ledger: no real I/O) run."""
    for _ in range(5):
        await asyncio.sleep(0)


def prefetching(nodes: int = 2, gpus: int = 8, depth: int = 2, **cfg):
    h, svc = handler(cluster(nodes, gpus), config(prefetch_depth=depth, **cfg))
    clock = Clock(50.0)
    assert h.prefetch is not None
    h.prefetch.clock = clock  # time is an input: no test waits for max_age_s
    return h, svc, clock


def reserved(svc) -> int:
    stats = svc.stats()
    return stats.reservations_pending + stats.reservations_confirmed


def test_the_next_pod_of_a_shape_takes_a_placement_admitted_ahead():
    h, svc, _ = prefetching(depth=2)

    async def main():
        calls = h.ledger.transport_calls
        first = await h.mutate(review(gpu_pod(1)))
        await settle()
        assert first.allowed and first.ledger_batch == 1
        assert h.prefetch.held == 2 and reserved(svc) == 3  # the pod's own, and two ahead
        before = calls["in-process"]
        pod = gpu_pod(1)
        second = await h.mutate(review(pod))
        assert second.allowed and second.ledger_batch == 0  # taken: no ledger call on its path
        assert calls["in-process"] == before
        placed = apply_patch(pod, second.patch)
        placement = decode_placement(placed["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
        assert placement is not None and placement.id == second.reservation_id
        assert (await h.validate(review(placed))).allowed  # the ordinary claim, unchanged
        await settle()
        assert h.prefetch.held == 1  # above the low-water mark (0 at depth 2): not topped up yet
        third = await h.mutate(review(gpu_pod(1)))
        assert third.allowed and third.ledger_batch == 0
        await settle()
        assert h.prefetch.held == 2  # down to 0: topped up to the depth in the background
        assert h.metrics.prefetch.labels("hit")._value.get() == 2
        assert h.metrics.prefetch.labels("miss")._value.get() == 1

    asyncio.run(main())


def test_no_device_twice_and_a_copy_is_still_denied():
    h, svc, _ = prefetching(nodes=2, gpus=8, depth=3)

    async def main():
        devices = set()
        placed_pods = []
        for _ in range(10):
            pod = gpu_pod(1)
            d = await h.mutate(review(pod))
            assert d.allowed
            placed = apply_patch(pod, d.patch)
            assert (await h.validate(review(placed))).allowed
            devices |= {(d.node, x) for x in d.devices}
            placed_pods.append(placed)
            await settle()
        assert len(devices) == 10
        pooled = {
            (a.placement.node, x)
            for pool in h.prefetch.pools.values()
            for a in pool
            for x in a.placement.devices
        }
        # depth 3, low water 1: topped up to 3 on every other pod, so 2 held after the tenth
        assert not pooled & devices and len(pooled) == h.prefetch.held == 2
        copy = json.loads(json.dumps(placed_pods[-1]))
        v = await h.validate(review(copy))  # another admission of the same pod (another uid)
        assert not v.allowed and "already admitted" in v.message

    asyncio.run(main())


def test_what_is_not_taken_in_time_is_released():
    h, svc, clock = prefetching(depth=2, prefetch_max_age_s=1.0)

    async def main():
        await h.mutate(review(gpu_pod(1)))
        await settle()
        assert reserved(svc) == 3
        clock.now += 1.0
        h.prefetch.sweep()
        await settle()
        assert h.prefetch.held == 0 and reserved(svc) == 1  # only the pod's own reservation is left
        assert h.metrics.prefetch.labels("released")._value.get() == 2
        # an old placement is never handed out: the next pod of the shape asks the ledger
        await h.mutate(review(gpu_pod(1)))
        await settle()
        clock.now += 0.5
        d = await h.mutate(review(gpu_pod(1)))
        assert d.ledger_batch == 0
        clock.now += 1.0
        d = await h.mutate(review(gpu_pod(1)))
        assert d.ledger_batch == 1  # the one left had aged out: released, and this pod admitted as usual
        await settle()
        await h.prefetch.stop()
        assert reserved(svc) == 4  # the four pods' own; everything held ahead went back

    asyncio.run(main())


def test_held_placements_never_cause_a_denial():
    h, svc, _ = prefetching(nodes=1, gpus=8, depth=2)

    async def main():
        for _ in range(6):
            assert (await h.mutate(review(gpu_pod(1)))).allowed
            await settle()
        assert h.prefetch.held == 1 and svc.stats().whole_free == 1  # 6 pods' own, 1 ahead, 1 free
        d = await h.mutate(review(gpu_pod(2)))  # room only with what this replica holds ahead: given back
        assert d.allowed and len(d.devices) == 2
        assert h.prefetch.held == 0
        d = await h.mutate(review(gpu_pod(1)))
        assert not d.allowed and d.code == 403  # really full now
        await settle()
        assert h.prefetch.held == 0  # the shape was denied: nothing held back for it
        assert h.metrics.prefetch.labels("denied")._value.get() >= 1

    asyncio.run(main())


def test_gangs_pins_dry_runs_and_reinvocations_go_to_the_ledger():
    h, svc, _ = prefetching(nodes=2, gpus=8, depth=2)

    async def main():
        pod = gpu_pod(1)
        first = await h.mutate(review(pod))
        await settle()
        assert h.prefetch.held == 2
        again = await h.mutate(review(apply_patch(pod, first.patch)))  # a reinvocation: the same placement
        assert again.reservation_id == first.reservation_id and h.prefetch.held == 2
        dry = await h.mutate(review(gpu_pod(1), dry_run=True))
        assert dry.allowed and h.prefetch.held == 2
        pinned = gpu_pod(1, name="pinned-0", annotations={"gpu-scheduling-map": "0=node-0001:5"})
        d = await h.mutate(review(pinned))
        assert d.allowed and d.node == "node-0001" and d.devices == (5,) and d.ledger_batch == 1
        await settle()
        assert h.prefetch.held == 2  # no pool for a pinned pod

    asyncio.run(main())


def test_shapes_are_kept_apart():
    h, svc, _ = prefetching(nodes=2, gpus=8, depth=1)

    async def main():
        await h.mutate(review(gpu_pod(1)))
        await h.mutate(review(gpu_pod(2)))
        await settle()
        assert h.prefetch.held == 2 and len(h.prefetch.pools) == 2
        d = await h.mutate(review(gpu_pod(2)))
        assert d.ledger_batch == 0 and len(d.devices) == 2
        d = await h.mutate(review(gpu_pod(1, namespace="other")))  # another namespace: another shape
        assert d.ledger_batch == 1 and len(d.devices) == 1

    asyncio.run(main())


def test_off_by_default_and_settings_are_checked():
    assert WebhookConfig().prefetch_depth == 0
    h, _ = handler(cluster(1, 8))
    assert h.prefetch is None
    for bad, words in (
        ({"prefetch_depth": -1}, "prefetch_depth=-1"),
        ({"prefetch_depth": "2"}, "prefetch_depth='2'"),
        ({"prefetch_depth": True}, "prefetch_depth=True"),
        ({"prefetch_max_age_s": 0}, "prefetch_max_age_s=0"),
    ):
        with pytest.raises(ValueError, match=words):
            config(**bad)
    assert PrefetchSettings(depth=4, max_age_s=0.5).depth == 4
