"""Each GPUQueue's status written from the ledger through the real API server: `kubectl get gpuqueues` shows
quota, used, borrowed and waiting (and share with -o wide); an unchanged body is not written again; nothing is
written by a sync that does not lead; a field the ledger no longer states is cleared.

The ledger's side here is `StandingTarget`, a small target answering `queue_status(holder)` with what a test
sets, so each case is exact (the numbers are the ledger's, tested with it:
tests/core/queues/test_queue_service.py; the real ledger's status written through the sync is in
tests/sync/test_evictor.py); time is the writer's clock, and `tick()` is called directly, as the writer's
thread does every interval.
"""

from __future__ import annotations

import uuid

import pytest

from gpuledger.names import GPUQUEUE_PLURAL, QUEUE_API_VERSION, QUEUE_GROUP, QUEUE_VERSION
from gpuledger.sync.queue_status import QueueStatusWriter

pytestmark = pytest.mark.e2e

T = 1_700_000_000.0


class StandingTarget:
    def __init__(self, standing: dict[str, dict]):
        self.standing = standing
        self.asked: list[str] = []

    def queue_status(self, holder: str) -> dict[str, dict]:
        self.asked.append(holder)
        return {name: dict(body) for name, body in self.standing.items()}


@pytest.fixture
def queues(apiserver):
    tag = uuid.uuid4().hex[:6]
    names = [f"team-a-{tag}", f"team-b-{tag}"]
    apiserver.apply(
        [
            {
                "apiVersion": QUEUE_API_VERSION,
                "kind": "GPUQueue",
                "metadata": {"name": name},
                "spec": {"quotas": [{"gpus": 64}]},
            }
            for name in names
        ]
    )
    yield names
    apiserver.kubectl("delete", GPUQUEUE_PLURAL, *names, "--wait=false", check=False)


@pytest.fixture
def custom(apiserver):
    from kubernetes import client

    return client.CustomObjectsApi(apiserver.api_client())


def standing(used: float, borrowed: float, waiting: int, share: float | None = 0.0) -> dict:
    body: dict = {
        "quota": 64,
        "used": used,
        "borrowed": borrowed,
        "waiting": waiting,
        "products": [{"product": "any", "quota": 64, "used": used, "borrowed": borrowed}],
    }
    if share is not None:
        body["share"] = share
    return body


def status_of(custom, name: str) -> dict:
    return (
        custom.get_cluster_custom_object(QUEUE_GROUP, QUEUE_VERSION, GPUQUEUE_PLURAL, name).get("status")
        or {}
    )


def test_kubectl_get_gpuqueues_shows_what_the_ledger_counts(apiserver, custom, queues):
    a, b = queues
    target = StandingTarget({a: standing(128, 64, 0, 0.5), b: standing(0, 0, 3)})
    now = [T]
    writer = QueueStatusWriter(custom, target, lambda: "sync-a", clock=lambda: now[0])
    assert writer.tick() == 2 and target.asked == ["sync-a"]
    assert status_of(custom, a) == {**standing(128, 64, 0, 0.5), "updatedTime": "2023-11-14T22:13:20Z"}

    rows = table(apiserver.kubectl("get", GPUQUEUE_PLURAL, a, b, "-o", "wide").stdout)
    columns = ("PARENT", "QUOTA", "USED", "BORROWED", "WAITING", "WEIGHT", "SHARE")
    assert [rows[a][c] for c in columns] == ["", "64", "128", "64", "0", "1", "0.5"]
    assert [rows[b][c] for c in columns] == ["", "64", "0", "0", "3", "1", "0"]


def table(text: str) -> dict[str, dict[str, str]]:
    """kubectl's table by name, each cell cut at its column's place in the header (an empty cell is "")."""
    header, *lines = text.splitlines()
    names = header.split()
    starts = [header.index(n) for n in names] + [None]
    cells = [{n: line[starts[i] : starts[i + 1]].strip() for i, n in enumerate(names)} for line in lines]
    return {row["NAME"]: row for row in cells}


def test_an_unchanged_body_is_not_written_again_and_a_change_is(apiserver, custom, queues):
    a, b = queues
    target = StandingTarget({a: standing(8, 0, 1), b: standing(0, 0, 0)})
    now = [T]
    writer = QueueStatusWriter(custom, target, lambda: "sync-a", clock=lambda: now[0])
    assert writer.tick() == 2
    now[0] += 10
    assert writer.tick() == 0  # nothing changed: no write, the old updatedTime stays
    assert status_of(custom, a)["updatedTime"] == "2023-11-14T22:13:20Z"
    target.standing[a] = standing(16, 0, 0, share=None)  # the ledger no longer states a share
    assert writer.tick() == 1 and writer.written == 3
    written = status_of(custom, a)
    assert (written["used"], written["waiting"], written["updatedTime"]) == (16, 0, "2023-11-14T22:13:30Z")
    assert "share" not in written  # cleared, not left stale
    assert status_of(custom, b)["updatedTime"] == "2023-11-14T22:13:20Z"


def test_only_the_leading_sync_writes_and_a_new_term_writes_everything_again(apiserver, custom, queues):
    a, _ = queues
    target = StandingTarget({a: standing(4, 0, 0)})
    holder: list[str | None] = [None]
    writer = QueueStatusWriter(custom, target, lambda: holder[0], clock=lambda: T)
    assert writer.tick() == 0 and target.asked == []  # standing by: the ledger is not even asked
    assert status_of(custom, a) == {}
    holder[0] = "sync-a"
    assert writer.tick() == 1
    holder[0] = None
    writer.tick()
    holder[0] = "sync-a"  # leads again: another replica may have written meanwhile
    assert writer.tick() == 1


def test_a_queue_the_api_does_not_hold_is_skipped(apiserver, custom, queues):
    a, _ = queues
    target = StandingTarget({a: standing(1, 0, 0), f"deleted-{uuid.uuid4().hex[:6]}": standing(0, 0, 0)})
    writer = QueueStatusWriter(custom, target, lambda: "sync-a", clock=lambda: T)
    assert writer.tick() == 1 and writer.failed == 0
