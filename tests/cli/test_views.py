"""The pure views behind the commands: inventory (holders, totals, fragmentation), workload rows and the
queue, health findings (time injected), the placement reader against the ledger's own codec, and the
strategy edit of the shipped config file."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devcluster.nodes import make_node
from gpuledger.cli import strategy
from gpuledger.cli.common import CommandError
from gpuledger.controller import gpunodes
from gpuledger.core.model import DeviceShare, Placement
from gpuledger.core.pods.placement_codec import encode_placement
from gpuledger.views import freshness, health, inventory
from gpuledger.views.placement import parse_placement, placement_of_pod
from gpuledger.views.workloads import age, priority_value, queue, workload_row, workload_rows
from gpuledger.webhook.config import WebhookConfig

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def placed_pod(name: str, node: str, devices=(), shares=(), phase="Pending", namespace="ml") -> dict:
    p = Placement(
        id=f"r-{name}",
        node=node,
        devices=tuple(devices),
        shares=tuple(DeviceShare(d, m, mem) for d, m, mem in shares),
        strategy="best_fit",
    )
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"gpuledger.io/placement": encode_placement(p, b"key")},
        },
        "status": {"phase": phase},
    }


def test_placement_reader_agrees_with_the_ledger_codec():
    pod = placed_pod("a", "n1", devices=(3, 5), shares=((1, 250, 8192),))
    got = placement_of_pod(pod)
    assert got.node == "n1" and got.devices == (3, 5) and got.shares == ((1, 250, 8192),)
    assert got.signed and got.strategy == "best_fit" and got.describe_devices() == "3,5,1:250m"
    assert got.holdings() == [(3, 1000), (5, 1000), (1, 250)]
    assert parse_placement("not json") is None and parse_placement('{"id": "x"}') is None
    assert placement_of_pod({"metadata": {}}) is None


def cluster():
    nodes = [
        make_node("a0", "s0", "l0", gpus=4, agentaflow=True, unhealthy=[3]),
        make_node("a1", "s0", "l0", gpus=4),
        make_node("b0", "s1", "l1", gpus=2),
    ]
    nodes[2]["spec"]["unschedulable"] = True
    pods = [
        placed_pod("whole", "a0", devices=(0, 1)),
        placed_pod("share", "a1", shares=((0, 500, 0),)),
        placed_pod("done", "a1", devices=(1,), phase="Succeeded"),
        placed_pod("elsewhere", "zz", devices=(0,)),
    ]
    return nodes, pods


def test_inventory_from_nodes_and_placed_pods():
    nodes, pods = cluster()
    views = {v.name: v for v in inventory.views_from_nodes(nodes, pods)}
    a0, a1, b0 = views["a0"], views["a1"], views["b0"]
    assert [str(h) for d in a0.devices for h in d.holders] == ["ml/whole", "ml/whole"]
    assert not a0.devices[3].healthy and a0.devices[0].uuid and a0.agent_reported
    assert [str(h) for h in a1.devices[0].holders] == ["ml/share (500m)"] and not a1.devices[
        1
    ].holders  # done: freed
    assert not b0.placeable and not a1.agent_reported
    t = inventory.totals(list(views.values()))  # b0 is cordoned: not counted, as the ledger counts
    assert (t.nodes, t.gpus, t.milli_total, t.milli_free, t.whole_free) == (2, 7, 7000, 4500, 4)
    assert t.fragmentation == pytest.approx(1 - 4000 / 4500)
    leaves = {leaf: tot for _, leaf, tot in inventory.leaf_totals(list(views.values()))}
    assert leaves["l0"] == t and leaves["l1"].gpus == 0
    assert views["a0"].as_dict()["allocatedGpus"] == 2 and views["a1"].as_dict()["allocatedGpus"] == 0.5


def test_inventory_from_gpu_nodes():
    obj = {
        "metadata": {"name": "g0"},
        "status": {
            "leaf": "l9",
            "spine": "s9",
            "agentLastUpdate": "2026-11-23T11:59:30Z",
            "devices": [
                {
                    "index": 0,
                    "uuid": "GPU-0",
                    "product": "H100",
                    "memoryMiB": 81920,
                    "healthy": True,
                    "utilization": 40,
                    "holders": [{"namespace": "ml", "pod": "p", "milli": 1000}],
                },
                {"index": 1, "healthy": False, "reason": "XID 79", "pod": "ml/q", "milli": 250},
            ],
        },
    }
    (view,) = inventory.views_from_gpu_nodes([obj])
    assert view.source == "GPUNode" and (view.leaf, view.spine) == ("l9", "s9")
    assert [str(h) for d in view.devices for h in d.holders] == ["ml/p", "ml/q (250m)"]
    assert view.devices[0].utilization == 40 and view.whole_free == 0 and view.milli_free == 0
    assert health.findings([view], NOW) == [health.Finding("g0", "device-unhealthy", "XID 79", 1)]


def published(nodes, ledger_nodes, pods_by_reservation, written: datetime) -> list[dict]:
    """GPUNode objects as the controller writes them (gpuledger.controller.gpunodes), at `written`."""
    statuses = gpunodes.statuses(
        {"nodes": ledger_nodes},
        {n["metadata"]["name"]: n for n in nodes},
        pods_by_reservation,
        written.timestamp(),
    )
    return [
        {"apiVersion": "agentaflow.io/v1", "kind": "GPUNode", "metadata": {"name": name}, "status": status}
        for name, status in statuses.items()
    ]


def ledger_node(
    held: dict[int, str] | None = None, shares: dict[int, tuple[str, int]] | None = None, gpus: int = 4
) -> dict:
    """A node in the ledger's snapshot: (index, free milli, free MiB, owner, [(holder, milli, MiB)])."""
    held, shares = held or {}, shares or {}
    devices = []
    for i in range(gpus):
        share = [(shares[i][0], shares[i][1], 0)] if i in shares else []
        free = 0 if i in held else 1000 - sum(m for _, m, _ in share)
        devices.append((i, free, 0, held.get(i), share))
    return {"devices": devices}


def test_gpu_nodes_as_the_controller_writes_them():
    nodes, pods = cluster()
    nodes[0]["metadata"]["annotations"]["agentaflow.gpu/last-update"] = "2026-11-23T11:59:50Z"
    ledger = {"a0": ledger_node({0: "r-whole", 1: "r-whole"}), "b0": ledger_node(gpus=2)}
    views = {
        v.name: v
        for v in inventory.views_from_gpu_nodes(published(nodes, ledger, {"r-whole": "ml/whole"}, NOW))
    }
    a0 = views["a0"]
    assert [str(h) for d in a0.devices for h in d.holders] == ["ml/whole", "ml/whole"]
    assert [d.healthy for d in a0.devices] == [True, True, True, False]  # health: Unhealthy
    assert a0.agent_reported and a0.agent_last_update == "2026-11-23T11:59:50Z"  # agentHeartbeatTime
    nodes[2]["metadata"]["labels"]["agentaflow.gpu/schedulable"] = "false"
    (b0,) = [v for v in inventory.views_from_gpu_nodes(published(nodes, ledger, {}, NOW)) if v.name == "b0"]
    assert not b0.placeable  # schedulable: false


def test_stale_gpu_nodes_give_way_to_what_the_api_holds():
    nodes, pods = cluster()  # now: ml/whole holds a0 0,1; ml/share holds 500m of a1 0
    live = inventory.views_from_nodes(nodes, pods)
    # what a controller stopped an hour ago had published: a0 held whole by a pod long deleted, a1 idle
    before = {
        "a0": ledger_node(dict.fromkeys(range(4), "r-gone")),
        "a1": ledger_node(),
        "b0": ledger_node(gpus=2),
    }
    old = published(nodes, before, {"r-gone": "ml/long-gone"}, NOW - timedelta(hours=1))
    choice = freshness.choose(old, nodes, pods, NOW, 5.0)
    assert choice.nodes == live and {v.source for v in choice.nodes} == {"Node"}
    assert choice.notice == (
        "GPUNode objects are 3600 s old (the controller publishes every 5 s while anything changes) and "
        "disagree with the API server on 2 node(s): showing what the API server holds now"
    )
    assert freshness.disagreements(inventory.views_from_gpu_nodes(old), live) == ["a0", "a1"]

    # written within the interval: the controller is publishing, its view is shown as it is
    recent = published(nodes, before, {"r-gone": "ml/long-gone"}, NOW - timedelta(seconds=4))
    kept = freshness.choose(recent, nodes, pods, NOW, 5.0)
    assert kept.notice == "" and {v.source for v in kept.nodes} == {"GPUNode"}

    # old but right (a quiet cluster: the controller writes only when something changes): shown, no line
    now_held = {
        "a0": ledger_node({0: "r-whole", 1: "r-whole"}),
        "a1": ledger_node(shares={0: ("r-share", 500)}),
        "b0": ledger_node(gpus=2),
    }
    quiet = published(
        nodes, now_held, {"r-whole": "ml/whole", "r-share": "ml/share"}, NOW - timedelta(hours=1)
    )
    same = freshness.choose(quiet, nodes, pods, NOW, 5.0)
    assert same.notice == "" and same.nodes == inventory.views_from_gpu_nodes(quiet)

    # a pod holding devices on a node no GPUNode names, or a GPUNode whose node is gone, disagrees too
    assert freshness.disagreements(inventory.views_from_gpu_nodes(quiet[1:]), live) == ["a0"]
    assert freshness.disagreements(inventory.views_from_gpu_nodes(quiet), live[1:]) == ["a0"]


def test_a_gpu_node_without_updated_time_is_as_old_as_its_last_write():
    obj = {
        "metadata": {
            "name": "g",
            "creationTimestamp": "2026-11-23T10:00:00Z",
            "managedFields": [{"time": "2026-11-23T11:00:00Z"}, {"time": "2026-11-23T11:30:00Z"}],
        },
        "status": {"devices": []},
    }
    assert freshness.written_at(obj) == datetime(2026, 11, 23, 11, 30, tzinfo=UTC)
    del obj["metadata"]["managedFields"]
    assert freshness.written_at(obj) == datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    obj["status"]["updatedTime"] = "2026-11-23T11:59:58"  # no zone: UTC
    assert freshness.written_at(obj) == NOW - timedelta(seconds=2)


def test_health_findings_take_time_as_an_input():
    node = make_node("q", "s", "l", gpus=2, agentaflow=True, unhealthy=[1])
    node["metadata"]["annotations"]["agentaflow.gpu/last-update"] = "2026-11-23T11:58:00Z"
    views = inventory.views_from_nodes([node], [])
    assert [f.problem for f in health.findings(views, NOW)] == [
        "agent-quiet",
        "device-stale",
        "device-unhealthy",
    ]
    assert [f.problem for f in health.findings(views, NOW - timedelta(seconds=60))] == ["device-unhealthy"]
    assert [f.problem for f in health.findings(views, NOW, timedelta(minutes=5))] == ["device-unhealthy"]
    silent = make_node("s", "s", "l", gpus=1, agentaflow=True)  # devices annotation, never a last-update
    (finding, stale) = health.findings(inventory.views_from_nodes([silent], []), NOW)
    assert finding.problem == "agent-quiet" and "no agentaflow.gpu/last-update" in finding.detail
    assert stale.problem == "device-stale"
    plain = make_node("p", "s", "l", gpus=1)  # no agent ever: nothing to say about it
    assert health.findings(inventory.views_from_nodes([plain], []), NOW) == []


def gw(
    name, phase="Queued", position=None, priority=0, created="2026-11-23T11:00:00Z", group="agentaflow.io/v1"
):
    status = {"phase": phase, **({"queuePosition": position} if position is not None else {})}
    return {
        "apiVersion": group,
        "kind": "GPUWorkload",
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
        "spec": {"priority": priority, "gpuRequirements": {"gpuCount": 2}},
        "status": status,
    }


def test_workload_rows_and_queue_order():
    rows = workload_rows(
        [
            gw("b", position=2),
            gw("a", position=1),
            gw("r", phase="Running"),
            gw("hi", priority="high", created="2026-11-23T11:30:00Z"),
            gw("lo", priority="low", created="2026-11-23T10:00:00Z"),
        ],
        [placed_pod("p", "n1", devices=(0,))],
    )
    assert [r.name for r in rows] == ["a", "b", "hi", "lo", "r", "p"]
    assert [r.name for r in queue(rows)] == ["a", "b", "hi", "lo"]  # positions first, then priority, then age
    assert rows[-1].kind == "Pod" and rows[-1].nodes == ["n1"] and rows[-1].devices == "0"
    warp = workload_row(
        {
            "apiVersion": "gpu.warp.dev/v1alpha1",
            "metadata": {"name": "w"},
            "spec": {"gpuCount": 4, "parallelism": 2},
            "status": {"assignedNode": "n2", "devices": [{"node": "n2", "indices": [0, 1]}]},
        }
    )
    assert (warp.phase, warp.gpus, warp.nodes, warp.devices) == ("Pending", "2x4", ["n2"], "n2:0,1")
    assert priority_value("High") == 100 and priority_value("7") == 7 and priority_value(None) == 0
    assert age("2026-11-23T11:59:15Z", NOW) == "45s" and age("2026-11-21T12:00:00Z", NOW) == "2d"


def test_strategy_edit_keeps_the_file_and_loads():
    text = (REPO / "manifests" / "config" / "config.yaml").read_text()
    edited = strategy.with_strategy(text, "priority")
    assert edited.replace("default_strategy: priority", "default_strategy: fgd_host") == text
    assert WebhookConfig.from_document(__import__("yaml").safe_load(edited)).default_strategy == "priority"
    assert strategy.with_strategy("fail_open: false\n", "fgd") == "fail_open: false\ndefault_strategy: fgd\n"
    assert strategy.canonical("leastLoaded") == "least_utilized"
    with pytest.raises(CommandError) as bad:
        strategy.canonical("fastest")
    assert bad.value.code == 2 and "fastest" in str(bad.value)
    deployment = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "webhook", "env": [{"name": "SCHEDULING_STRATEGY", "value": "priority"}]}
                    ]
                }
            }
        }
    }
    assert strategy.env_override(deployment) == "priority" and strategy.env_override(None) == ""


def test_device_json_round_trip():
    nodes, pods = cluster()
    (a0,) = [v for v in inventory.views_from_nodes(nodes, pods) if v.name == "a0"]
    d = json.loads(json.dumps(a0.as_dict()))
    assert d["devices"][0]["holders"] == [{"namespace": "ml", "pod": "whole", "milli": 1000}]
    assert d["freeWholeGpus"] == 1 and d["healthyGpus"] == 3
