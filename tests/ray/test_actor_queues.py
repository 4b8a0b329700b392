"""GPU queues through the real Ray actor and its sync target: the preemption orders (`preemptions_due`),
a refused eviction (`eviction_refused`) and each GPUQueue's status (`queue_status`) cross Ray as the sync
calls them, fenced by the sync lease."""

from __future__ import annotations

import pytest
import ray

from gpuledger.service.preemption_orders import EvictionRefused, PreemptionOrder
from gpuledger.sync.targets import RayLedgerTarget
from tests.core.passes.test_held_plans import T0, World
from tests.ray.test_actor import new_actor
from tests.webhook.webhook_support import HMAC_KEY

pytestmark = [pytest.mark.ray, pytest.mark.slow]
HOLDER = "sync-queues"


@pytest.fixture(scope="module")
def ray_local():
    ray.init(
        address="local",
        namespace="gpuledger-test-actor-queues",
        include_dashboard=False,
        num_cpus=1,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


def test_preemption_orders_refusals_and_queue_status_cross_ray(ray_local, tmp_path):
    w = World(key=HMAC_KEY.encode())
    w.run("a1", "ns-a", started=T0)
    w.run("a2", "ns-a", started=T0 + 60)  # team-a borrows 8
    w.wait("b1", "ns-b")
    handle, _, _ = new_actor(list(w.objects.values()), tmp_path)
    target = RayLedgerTarget(handle)
    assert target.sync_lease(HOLDER, 30.0)["held"]
    target.resync(list(w.objects.values()), HOLDER)
    assert target.place_waiting(HOLDER) == []
    (order,) = target.preemptions_due(HOLDER)
    assert isinstance(order, PreemptionOrder) and order.name == "b1" and not order.recorded
    assert [(v.namespace, v.rule) for v in order.victims] == [("ns-a", "reclaim")]
    status = target.queue_status(HOLDER)
    assert status["team-a"]["used"] == 16 and status["team-a"]["borrowed"] == 8
    assert status["team-b"]["waiting"] == 1
    victim = order.victims[0]
    target.eviction_refused(
        [EvictionRefused(order.id, victim.namespace, victim.name, victim.uid, 429, "budget")], HOLDER
    )
    again = target.preemptions_due(HOLDER)
    assert all(v.name != victim.name for o in again for v in o.victims)  # left out for a while
    with pytest.raises(Exception, match=r"SyncFenced|sync lease"):
        target.queue_status("not-the-holder")
