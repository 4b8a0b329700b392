"""The cluster sync reports placement conflicts the ledger lists: each new one counted once and posted as a
Warning Event on the pod; one that goes and comes back is new again."""

from __future__ import annotations

from gpuledger.sync.cluster_sync import ClusterSync
from gpuledger.sync.conflicts import conflict_event


class RecordingCore:
    def __init__(self, fail: bool = False):
        self.events: list[tuple[str, dict]] = []
        self.fail = fail

    def create_namespaced_event(self, namespace, body):
        if self.fail:
            raise RuntimeError("forbidden")
        self.events.append((namespace, body))


def sync_with(core) -> ClusterSync:
    sync = ClusterSync(None, target=None, clock=lambda: 1_700_000_000.0)
    sync.core = core
    return sync


def test_each_new_conflict_is_counted_and_posted_once():
    core = RecordingCore()
    sync = sync_with(core)
    copy = [
        "plain/copy",
        "r1",
        "metadata.namespace 'plain' is not the namespace the placement was issued for",
    ]
    assert sync.conflicts.report([copy]) == [tuple(copy)]
    assert sync.conflicts.report([copy]) == []
    assert sync.stats.conflicts == 1 and sync.stats.conflict_events == 1
    namespace, body = core.events[0]
    assert namespace == "plain" and body["involvedObject"]["name"] == "copy"
    assert body["reason"] == "PlacementConflict" and body["type"] == "Warning"
    assert "r1" in body["message"] and "metadata.namespace" in body["message"]
    assert sync.conflicts.report([]) == []
    assert sync.conflicts.report([copy]) == [tuple(copy)]  # it went and came back
    assert sync.stats.conflicts == 2


def test_a_failed_event_post_never_stops_the_sync():
    sync = sync_with(RecordingCore(fail=True))
    assert len(sync.conflicts.report([["a/b", "r", "why"], ["uid:123", "r", "nameless"]])) == 2
    assert sync.stats.conflicts == 2 and sync.stats.conflict_events == 0


def test_conflict_event_names_the_pod():
    body = conflict_event("team/p-1", "r9", "reservation r9 belongs to pod team/p-0", 0.0)
    assert body["metadata"]["namespace"] == "team" and body["involvedObject"]["kind"] == "Pod"
    assert body["firstTimestamp"] == "1970-01-01T00:00:00Z"
