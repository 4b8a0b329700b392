"""The operator's view of GPU queues: quota, used, borrowed, lendable, share and the waiting line per queue,
read from API objects; its figures are the core's own (gpuledger.core.queues.quotas and .fair_share) for the
same cluster, and `gpuledger status` shows them in a short section."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from gpuledger.cli.common import render_text
from gpuledger.cli.queues import queues_table, quotas_table, summary_table, waiting_table
from gpuledger.cli.snapshot import Snapshot
from gpuledger.cli.status import status_data
from gpuledger.core.model import Placement
from gpuledger.core.pods.placement_codec import encode_placement
from gpuledger.core.queues.fair_share import dominant_share, quota_used
from gpuledger.core.queues.gpu_queues import queue_set_from_objects
from gpuledger.core.queues.quotas import Capacity, ProductCapacity, Use, usage_by_namespace
from gpuledger.names import PLACEMENT_ANNOTATION, PRODUCT_LABEL
from gpuledger.service.queue_standing import QueueError
from gpuledger.views.queues import queues_view
from gpuledger.views.workloads import workload_rows
from tests.cli.conftest import parse_table
from tests.cli.test_waiting_views import waiting_pod

H100 = "NVIDIA-H100-80GB-HBM3"


def gpu_queue(name: str, spec: dict) -> dict:
    return {
        "apiVersion": "gpuledger.io/v1alpha1",
        "kind": "GPUQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def namespace(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


def node(name: str, gpus: int = 8, product: str = H100) -> dict:
    return {
        "metadata": {"name": name, "labels": {PRODUCT_LABEL: product}},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def placed_pod(ns: str, name: str, on: str, devices: tuple[int, ...], cpu_milli: int = 8000) -> dict:
    placement = Placement(f"id-{name}", on, devices=devices, cpu_milli=cpu_milli, memory_mib=65536)
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "annotations": {PLACEMENT_ANNOTATION: encode_placement(placement, b"k")},
        },
        "spec": {"nodeName": on, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


QUEUES = [
    gpu_queue("research", {"quotas": [{"gpus": 8}], "weight": 2}),
    gpu_queue(
        "team-a",
        {"parent": "research", "namespaceSelector": {"matchLabels": {"team": "a"}}, "quotas": [{"gpus": 4}]},
    ),
    gpu_queue(
        "team-b",
        {
            "namespaceSelector": {"matchLabels": {"team": "b"}},
            "quotas": [{"product": H100, "gpus": 8, "lendingLimit": 2, "borrowingLimit": 4}],
        },
    ),
]
NAMESPACES = [
    namespace("a1", team="a"),
    namespace("a2", team="a"),
    namespace("b1", team="b"),
    namespace("misc"),
]
NODES = [node("n1"), node("n2")]
PODS = [
    placed_pod("a1", "a-big", "n1", (0, 1, 2, 3, 4, 5)),  # team-a: 6 of its 4, borrows 2
    placed_pod("b1", "b-one", "n2", (0,)),  # team-b: 1 of its 8
    placed_pod("misc", "m-one", "n2", (1,)),  # the implicit default queue: all borrowed
    waiting_pod("a2", "a-wait", 0, 20.0),
    waiting_pod("b1", "b-wait", 100, 30.0, gpus=2),
    waiting_pod("a1", "a-early", 0, 10.0),
]


def rows_by_name(view):
    return {r.name: r.as_dict() for r in view.rows}


def test_each_queue_shows_quota_used_borrowed_lendable_and_its_namespaces():
    view = queues_view(QUEUES, NAMESPACES, NODES, PODS)
    rows = rows_by_name(view)
    assert list(rows) == ["default", "research", "team-a", "team-b"]  # parents before children, else by name
    a, b, org, default = rows["team-a"], rows["team-b"], rows["research"], rows["default"]
    assert (a["quota"], a["used"], a["borrowed"], a["lendable"]) == (4, 6, 2, 0)
    assert a["parent"] == "research" and a["namespaces"] == ["a1", "a2"] and a["weight"] == 1.0
    # the organisation counts its team's use against its own quota of 8: within it, 2 unused to lend
    assert (org["quota"], org["used"], org["borrowed"], org["lendable"]) == (8, 6, 0, 2)
    assert org["children"] == ["team-a"] and org["fairOrder"] is None and org["namespaces"] == []
    # team-b lends at most 2 of its 7 unused H100s
    assert (b["quota"], b["used"], b["borrowed"], b["lendable"]) == (8, 1, 0, 2)
    assert b["quotas"] == [
        {
            "product": H100,
            "gpus": 8,
            "borrowingLimit": 4,
            "lendingLimit": 2,
            "used": 1,
            "borrowed": 0,
            "lendable": 2,
        }
    ]
    assert default["implicit"] and default["default"] and default["namespaces"] == ["misc"]
    assert (default["quota"], default["used"], default["borrowed"]) == (0, 1, 1)
    assert default["quotaUsed"] is None  # uses what it has no quota for (infinite in the core)


def test_the_waiting_pods_are_listed_under_their_queue_in_the_ledgers_order():
    rows = rows_by_name(queues_view(QUEUES, NAMESPACES, NODES, PODS))
    # the one line: b-wait (priority 100), then a-early (10.0), then a-wait (20.0)
    assert [(w["name"], w["position"]) for w in rows["team-a"]["waiting"]] == [("a-early", 2), ("a-wait", 3)]
    assert [(w["name"], w["position"]) for w in rows["team-b"]["waiting"]] == [("b-wait", 1)]
    assert rows["team-b"]["waiting"][0]["waitingFor"] == "2 GPUs on one node"
    assert rows["research"]["waiting"] == [] and rows["default"]["waiting"] == []


def test_share_and_quota_used_are_the_cores_for_the_same_cluster():
    view = queues_view(QUEUES, NAMESPACES, NODES, PODS)
    queues = queue_set_from_objects(QUEUES)
    labels = {"a1": {"team": "a"}, "a2": {"team": "a"}, "b1": {"team": "b"}, "misc": {}}
    held = [
        ("a1", Use.of([(H100, 6000, 8000, 65536)])),
        ("b1", Use.of([(H100, 1000, 8000, 65536)])),
        ("misc", Use.of([(H100, 1000, 8000, 65536)])),
    ]
    usage = usage_by_namespace(queues, labels, held)
    capacity = Capacity({H100: ProductCapacity(16000, 8000, 128000, 2 * 512 * 1024)})
    for row in view.rows:
        assert row.standing.share == pytest.approx(dominant_share(queues, usage, capacity, row.name))
        expected = quota_used(queues, usage, row.name)
        assert row.standing.quota_used == expected or (
            math.isinf(expected) and math.isinf(row.standing.quota_used)
        )
    shares = {r.name: r.standing.share for r in view.rows}
    # team-a borrows 2 of 16 GPUs (its 6,000 milli-CPU of 8,000 held for them is a smaller part): 2/16
    assert shares["team-a"] == pytest.approx(2 / 16) and shares["team-b"] == 0.0
    assert shares["default"] == pytest.approx(1 / 16)


def test_fair_order_serves_the_queue_furthest_below_its_share_first():
    rows = rows_by_name(queues_view(QUEUES, NAMESPACES, NODES, PODS))
    # the top level decides first: team-b and research are within quota (share 0), team-b using less of it
    # (1/8 against research's 6/8); the implicit default borrows (1/16 of the GPUs) and goes last
    assert [rows[q]["fairOrder"] for q in ("team-b", "team-a", "default")] == [1, 2, 3]


def test_a_namespace_two_queues_select_counts_in_the_default_queue_and_is_reported():
    queues = [*QUEUES, gpu_queue("team-x", {"namespaceSelector": {"matchLabels": {"team": "a"}}})]
    view = queues_view(queues, NAMESPACES, NODES, PODS)
    assert set(view.conflicts) == {"a1", "a2"}
    assert "team-a" in view.conflicts["a1"] and "team-x" in view.conflicts["a1"]
    assert rows_by_name(view)["default"]["used"] == 7  # a1's 6 and misc's 1
    assert view.as_dict()["conflicts"][0]["namespace"] == "a1"


def test_gpuqueues_that_cannot_be_honoured_are_refused_naming_the_field():
    with pytest.raises(QueueError, match=r"spec\.parent"):
        queues_view([gpu_queue("t", {"parent": "nowhere"})], NAMESPACES, NODES, PODS)


def test_the_tables_show_what_the_json_holds():
    view = queues_view(QUEUES, NAMESPACES, NODES, PODS)
    lines = render_text(queues_table(view.rows)).splitlines()
    table = {r["NAME"].split()[0]: r for r in parse_table(lines)}
    assert table["team-a"]["USED"] == "6" and table["team-a"]["BORROWED"] == "2"
    assert table["team-a"]["NAMESPACES"] == "a1,a2" and table["team-a"]["WAITING"] == "2"
    assert table["default"]["NAME"] == "default (default)" and table["team-a"]["PARENT"] == "research"
    assert table["team-b"]["LENDABLE"] == "2" and table["team-b"]["FAIR-ORDER"] == "1"
    quotas = render_text(quotas_table(view.rows)).splitlines()
    assert any(H100 in line and "team-b" in line for line in quotas)
    waiting = render_text(waiting_table(view.rows, datetime.now(UTC)))
    assert "PODS WAITING FOR GPUS 3" in waiting and "b-wait" in waiting
    summary = render_text(summary_table(view.rows))
    assert "GPU QUEUES" in summary and "team-a" in summary


def test_status_carries_a_queues_section():
    view = queues_view(QUEUES, NAMESPACES, NODES, PODS)
    snap = Snapshot([], workload_rows([], PODS, PODS))
    data = status_data(snap, None, view)
    assert [q["name"] for q in data["queues"]] == ["default", "research", "team-a", "team-b"]
    assert data["queues"][2]["borrowed"] == 2 and data["queues"][2]["waiting"] == 2
    assert status_data(snap, None)["queues"] == []
