"""The operator's view of the line of waiting pods: read from the gated pods' tickets alone, in the ledger's
order (priority, then arrival), across namespaces; `gpuledger status` lists them."""

from __future__ import annotations

from gpuledger.cli.snapshot import Snapshot
from gpuledger.cli.status import status_data
from gpuledger.core.model import Request
from gpuledger.core.pods.placement_codec import Binding
from gpuledger.core.pods.waiting_codec import WaitTicket, encode_waiting
from gpuledger.names import SCHEDULING_GATE, WAITING_ANNOTATION
from gpuledger.views.workloads import WAITING, waiting_line, workload_rows


def waiting_pod(namespace: str, name: str, priority: int, arrival: float, gpus: int = 8) -> dict:
    req = Request(id=f"id-{name}", gpus=gpus, priority=priority, namespace=namespace)
    text = encode_waiting(WaitTicket(req, arrival, Binding(namespace, name)), b"some-key")
    return {
        "metadata": {"namespace": namespace, "name": name, "annotations": {WAITING_ANNOTATION: text}},
        "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}], "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


def test_waiting_pods_take_their_place_in_the_one_line_across_namespaces():
    pods = [
        waiting_pod("a", "late", 0, 30.0),
        waiting_pod("b", "other-team", 0, 10.0),
        waiting_pod("a", "urgent", 100, 50.0, gpus=2),
        waiting_pod("a", "early", 0, 20.0),
    ]
    mine = [p for p in pods if p["metadata"]["namespace"] == "a"]
    rows = workload_rows([], mine, pods)
    line = waiting_line(rows)
    assert [(r.name, r.queue_position) for r in line] == [("urgent", 1), ("early", 3), ("late", 4)]
    assert all(r.phase == WAITING for r in line)
    assert line[0].reason == "waiting for 2 GPUs on one node" and line[0].priority == "100"
    # a pod whose gate was removed (placed) is no longer in line
    placed = dict(pods[0], spec={"containers": []})
    assert not waiting_line(workload_rows([], [placed], [placed]))


def test_status_lists_the_waiting_pods():
    pods = [waiting_pod("a", "w1", 0, 1.0), waiting_pod("a", "w2", 0, 2.0)]
    snap = Snapshot([], workload_rows([], pods, pods))
    data = status_data(snap, None)
    assert [(r["name"], r["queuePosition"]) for r in data["waiting"]] == [("w1", 1), ("w2", 2)]


def test_status_and_watch_draw_the_line_as_a_table():
    from datetime import UTC, datetime

    from gpuledger.cli import common
    from gpuledger.cli.status import waiting_table

    pods = [waiting_pod("a", "w1", 5, 1.0, gpus=4)]
    text = common.render_text(waiting_table(workload_rows([], pods, pods), datetime.now(UTC)), color=False)
    assert "PODS WAITING FOR GPUS 1" in text
    assert "w1" in text and "waiting for 4 GPUs on one node" in text
