"""Every operator command against the real kube-apiserver and the real webhook, through its real output:
the JSON is parsed and the table checked against it.

No kubelet runs, so pods stay Pending with what admission wrote; that is what `nodes` and `workloads` read.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from devcluster.nodes import create_nodes, device_entries, make_node
from gpuledger import client
from tests.cli.conftest import parse_table

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def placed_pods(apiserver, namespace: str, count: int, selector: str | None = None) -> list[dict]:
    """Until `count` pods in the namespace carry a placement."""

    def placed():
        pods = [p for p in apiserver.pods(namespace, selector) if client.placement_of(p)]
        return pods if len(pods) >= count else None

    return apiserver.wait_for(placed, timeout=60, what=f"{count} placed pods in {namespace}")


def job_yaml(name: str, gpus: int = 1, parallelism: int = 1) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "parallelism": parallelism,
                "completions": parallelism,
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "w",
                                "image": "busybox",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                            }
                        ],
                    }
                },
            },
        }
    )


# ------------------------------------------------------------------------------------------------ nodes
def test_nodes_shows_who_holds_each_device(apiserver, stack, namespace, cli):
    name = client.create_gpu_job("holder", "busybox", 2, namespace=namespace, kube=apiserver.api_client())
    (pod,) = placed_pods(apiserver, namespace, 1, f"job-name={name}")
    placement = client.placement_of(pod)
    holder = f"{namespace}/{pod['metadata']['name']}"

    result = cli("nodes", placement.node, "--source", "nodes", "-o", "json")
    assert result.code == 0, result.err
    (node,) = result.json()["items"]
    held = {
        d["index"] for d in node["devices"] if any(h["pod"] == pod["metadata"]["name"] for h in d["holders"])
    }
    assert held == set(placement.devices) and len(held) == 2
    assert node["allocatedGpus"] >= 2

    table = cli("nodes", placement.node, "--source", "nodes")
    assert table.code == 0
    rows = table.table()
    assert [int(r["GPU"]) for r in rows] == [d["index"] for d in node["devices"]]
    for row, device in zip(rows, node["devices"], strict=True):
        assert row["NODE"] == placement.node and row["PRODUCT"] == device["product"]
        assert (holder in row["HELD-BY"]) == (device["index"] in held)


def test_nodes_shows_the_nodes_whose_gpus_are_published_through_dra(apiserver, cli):
    from tests.core.nodes.test_resource_slices import gpu_slice
    from tests.sync.test_sync_resource_slices import dra_only_node

    name = f"dra-cli-{uuid.uuid4().hex[:5]}"
    create_nodes(apiserver.api_client(), [dra_only_node(name, "leaf-dra-cli")])
    apiserver.apply(gpu_slice(f"{name}-gpus", node_name=name, gpus=8))
    try:
        result = cli("nodes", name, "--source", "nodes", "-o", "json")
        assert result.code == 0, result.err
        data = result.json()
        assert data["items"] == []  # no device gpuledger places
        assert data["publishedThroughDRA"] == [
            {
                "name": name,
                "gpus": 8,
                "drivers": ["gpu.nvidia.com"],
                "products": {"NVIDIA H100 80GB HBM3": 8},
                "incompletePools": [],
            }
        ]
        text = cli("nodes", name, "--source", "nodes").out
        section = text.split("GPUs published through DRA\n", 1)[1].splitlines()
        (row,) = parse_table(section)
        assert row == {
            "NODE": name,
            "GPUS": "8",
            "PUBLISHED": "8x NVIDIA H100 80GB HBM3 (driver gpu.nvidia.com)",
        }
        everything = cli("nodes", "--source", "nodes", "-o", "json").json()
        assert name in {n["name"] for n in everything["publishedThroughDRA"]}
    finally:
        apiserver.kubectl("delete", "resourceslices", f"{name}-gpus", "--ignore-not-found", check=False)
        apiserver.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def test_nodes_unknown_node_exits_4(cli, stack):
    result = cli("nodes", "no-such-node", "--source", "nodes")
    assert result.code == 4 and "no-such-node" in result.err


# ----------------------------------------------------------------------------------------------- status
def test_status_totals_agree_with_nodes_and_table(apiserver, stack, namespace, cli):
    client.create_gpu_job("status", "busybox", 1, namespace=namespace, kube=apiserver.api_client())
    placed_pods(apiserver, namespace, 1)
    # `status` and `nodes` read the cluster at two moments, and other tests' namespaces are still going away
    # (their pods with them): take a `nodes` read between two `status` reads that agree
    data = cli("status", "--source", "nodes", "-o", "json").json()
    for _ in range(10):
        nodes = cli("nodes", "--source", "nodes", "-o", "json").json()["items"]
        again = cli("status", "--source", "nodes", "-o", "json").json()
        if again == data:
            break
        data = again
    placeable = [n for n in nodes if n["placeable"]]
    cluster = data["cluster"]
    assert cluster["gpus"] == sum(n["healthyGpus"] for n in placeable)
    assert cluster["allocatedGpus"] == pytest.approx(sum(n["allocatedGpus"] for n in placeable))
    assert cluster["allocatedGpus"] >= 1
    assert sum(leaf["gpus"] for leaf in data["leaves"]) == cluster["gpus"]
    assert {leaf["leaf"] for leaf in data["leaves"]} >= {"leaf-0", "leaf-1", "leaf-2", "leaf-3"}

    # the same for the table and the JSON
    for _ in range(10):
        text = cli("status", "--source", "nodes")
        again = cli("status", "--source", "nodes", "-o", "json").json()
        if again == data:
            break
        data, cluster = again, again["cluster"]
    assert text.code == 0
    rows = {r["LEAF"]: r for r in text.table()}
    total = rows["TOTAL"]
    assert int(total["GPUS"]) == cluster["gpus"] and int(total["FREE-WHOLE"]) == cluster["freeWholeGpus"]
    assert total["UTILIZATION"] == f"{100 * cluster['utilization']:.1f}%"
    for leaf in data["leaves"]:
        assert int(rows[leaf["leaf"] or "-"]["GPUS"]) == leaf["gpus"]


def test_status_lists_the_queue_in_order(apiserver, gpu_crds, namespace, cli):
    for name, position, priority in (("late", 2, 1), ("first", 1, 9)):
        obj = client.gpu_workload(name, "busybox", 4, priority=priority, namespace=namespace)
        client.submit_workload(obj, kube=apiserver.api_client())
        status = {
            "status": {
                "phase": "Queued",
                "queuePosition": position,
                "reason": "InsufficientGPUs",
                "message": "needs 4 whole GPUs on one node",
            }
        }
        apiserver.kubectl(
            "patch",
            "gpuworkload.agentaflow.io",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )
    data = cli("status", "-n", namespace, "--source", "nodes", "-o", "json").json()
    assert [q["name"] for q in data["queue"]] == ["first", "late"]
    assert data["workloads"]["gpuWorkloads"]["Queued"] == 2
    text = cli("status", "-n", namespace, "--source", "nodes").out
    queue_lines = text[text.index("GPUWORKLOADS") :].splitlines()
    assert "Queued=2" in queue_lines[0]
    from tests.cli.conftest import parse_table

    rows = parse_table(queue_lines[1:])
    assert [(r["POSITION"], r["NAME"], r["REASON"]) for r in rows] == [
        ("1", "first", "InsufficientGPUs"),
        ("2", "late", "InsufficientGPUs"),
    ]


# ----------------------------------------------------------------------------------- stale GPUNode objects
STALE_LINE = re.compile(
    r"warning: GPUNode objects are (\d+) s old \(the controller publishes every [\d.]+ s while anything "
    r"changes\) and disagree with the API server on \d+ node\(s\): showing what the API server holds now"
)


def test_stale_gpunodes_give_way_to_what_the_api_holds(apiserver, stack, gpu_crds, namespace, cli):
    name = client.create_gpu_job("truth", "busybox", 1, namespace=namespace, kube=apiserver.api_client())
    (pod,) = placed_pods(apiserver, namespace, 1, f"job-name={name}")
    node = client.placement_of(pod).node
    # what a controller stopped an hour ago left: every device of the node held by a pod deleted since
    written = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ghost = {"pod": "gone/long-deleted", "reservationId": "r-gone", "milli": 1000, "confirmed": True}
    devices = [
        {"index": i, "health": "Healthy", "allocatedMilli": 1000, "holders": [ghost]} for i in range(8)
    ]
    status = {"devices": devices, "schedulable": True, "updatedTime": written}
    # the only GPUNode is that one: none newer that a controller of an earlier test module published
    apiserver.kubectl("delete", "gpunodes.agentaflow.io", "--all", "--wait=true")
    apiserver.apply([{"apiVersion": "agentaflow.io/v1", "kind": "GPUNode", "metadata": {"name": node}}])
    try:
        apiserver.kubectl(
            "patch",
            "gpunode",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )
        shown = cli("nodes", node, "-o", "json")
        assert shown.code == 0, shown.err
        (view,) = shown.json()["items"]
        held = {(h["namespace"], h["pod"]) for d in view["devices"] for h in d["holders"]}
        assert view["source"] == "Node" and (namespace, pod["metadata"]["name"]) in held
        assert ("gone", "long-deleted") not in held
        age = STALE_LINE.search(shown.err)
        assert age and int(age.group(1)) >= 3600, shown.err

        table = cli("nodes", node)
        assert STALE_LINE.search(table.err) and "gone/long-deleted" not in table.out
        assert f"{namespace}/{pod['metadata']['name']}" in table.out

        # status: the API's figures (as --source nodes computes them), not the GPUNode's 8 allocated GPUs
        for _ in range(10):  # other tests' pods may come and go between two reads
            auto = cli("status", "-o", "json")
            truth = cli("status", "--source", "nodes", "-o", "json")
            if auto.json()["cluster"] == truth.json()["cluster"]:
                break
        assert auto.json()["cluster"] == truth.json()["cluster"] and STALE_LINE.search(auto.err)
        assert not STALE_LINE.search(truth.err)
        assert STALE_LINE.search(cli("status").err)

        # --source gpunodes shows the objects as they are, asked for
        as_written = cli("nodes", node, "--source", "gpunodes", "-o", "json")
        (gpunode,) = as_written.json()["items"]
        assert gpunode["source"] == "GPUNode" and gpunode["allocatedGpus"] == 8 and not as_written.err
    finally:
        apiserver.kubectl("delete", "gpunode", node, "--ignore-not-found")


# -------------------------------------------------------------------------------------------- workloads
def test_workloads_lists_gpuworkloads_and_placed_pods(apiserver, stack, gpu_crds, namespace, cli):
    client.submit_workload(
        client.gpu_workload(
            "warp", "busybox", 2, priority="high", namespace=namespace, api_version="gpu.warp.dev/v1alpha1"
        ),
        kube=apiserver.api_client(),
    )
    client.create_gpu_job("train", "busybox", 1, namespace=namespace, kube=apiserver.api_client())
    (pod,) = placed_pods(apiserver, namespace, 1)
    placement = client.placement_of(pod)

    items = cli("workloads", "-n", namespace, "-o", "json").json()["items"]
    by_name = {i["name"]: i for i in items}
    assert (
        by_name["warp"]["kind"] == "GPUWorkload" and by_name["warp"]["apiVersion"] == "gpu.warp.dev/v1alpha1"
    )
    assert by_name["warp"]["gpus"] == "2" and by_name["warp"]["priority"] == "high"
    row = by_name[pod["metadata"]["name"]]
    assert row["kind"] == "Pod" and row["nodes"] == [placement.node] and row["owner"] == "Job/train"
    assert row["devices"] == ",".join(map(str, placement.devices))

    table = {r["NAME"]: r for r in cli("workloads", "-n", namespace).table()}
    assert set(table) == set(by_name)
    assert table[pod["metadata"]["name"]]["NODE"] == placement.node
    assert table[pod["metadata"]["name"]]["DEVICES"] == row["devices"]
    assert table["warp"]["KIND"] == "GPUWorkload" and table["warp"]["PHASE"] == "Pending"

    everywhere = cli("workloads", "-A", "-o", "json").json()["items"]
    assert {(i["namespace"], i["name"]) for i in items} <= {(i["namespace"], i["name"]) for i in everywhere}
    assert "NAMESPACE" in cli("workloads", "-A").out.splitlines()[0]


# ----------------------------------------------------------------------------------------------- submit
def test_submit_applies_a_job_the_webhook_places(apiserver, stack, namespace, cli, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job_yaml("submitted", gpus=1))
    first = cli("submit", str(path), "-n", namespace)
    assert first.code == 0, first.err
    assert first.out.strip() == "job.batch/submitted created"
    (pod,) = placed_pods(apiserver, namespace, 1, "job-name=submitted")
    assert client.placement_of(pod).devices
    again = cli("submit", str(path), "-n", namespace, "-o", "json")
    assert again.code == 0 and again.json()["items"][0]["metadata"]["name"] == "submitted"
    assert cli("submit", str(path), "-n", namespace).out.strip() == "job.batch/submitted configured"


def test_submit_dry_run_stores_nothing_and_denials_exit_3(apiserver, stack, namespace, cli, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job_yaml("dry"))
    dry = cli("submit", str(path), "-n", namespace, "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.strip() == "job.batch/dry created (server dry run)"
    assert apiserver.kubectl("get", "jobs", "-n", namespace, "-o", "name").stdout.strip() == ""

    pod = yaml.safe_load(job_yaml("x"))["spec"]["template"]
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": pod["spec"],
        "metadata": {"name": "bad", "annotations": {"agentaflow.gpu/priority": "urgent"}},
    }
    path.write_text(yaml.safe_dump(bad))
    denied = cli("submit", str(path), "-n", namespace)
    assert denied.code == 3
    assert "agentaflow.gpu/priority" in denied.err and "urgent" in denied.err  # the webhook's own message


def test_submit_refuses_a_namespace_not_opted_in(apiserver, stack, cli, tmp_path):
    plain = apiserver.create_namespace(f"t-plain-{uuid.uuid4().hex[:5]}", admission=False)
    try:
        path = tmp_path / "job.yaml"
        path.write_text(job_yaml("refused"))
        result = cli("submit", str(path), "-n", plain)
        assert result.code == 3
        assert (
            f"namespace {plain} is not opted in" in result.err
            and "gpuledger.io/admission=enabled" in result.err
        )
        assert apiserver.kubectl("get", "jobs", "-n", plain, "-o", "name").stdout.strip() == ""
    finally:
        apiserver.kubectl("delete", "namespace", plain, "--wait=false")


def test_submit_creates_gpuworkloads_of_both_groups(apiserver, gpu_crds, namespace, cli, tmp_path):
    docs = [
        client.gpu_workload("a", "busybox", 1),
        client.gpu_workload("w", "busybox", 2, api_version="gpu.warp.dev/v1alpha1"),
    ]
    path = tmp_path / "workloads.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = cli("submit", str(path), "-n", namespace)
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "gpuworkload.agentaflow.io/a created",
        "gpuworkload.gpu.warp.dev/w created",
    ]
    names = {
        (i["apiVersion"], i["name"]) for i in cli("workloads", "-n", namespace, "-o", "json").json()["items"]
    }
    assert names == {("agentaflow.io/v1", "a"), ("gpu.warp.dev/v1alpha1", "w")}


def test_submit_bad_input_exits_2(cli, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = cli("submit", str(path))
    assert result.code == 2 and "kind='ConfigMap'" in result.err and "Job (batch/v1)" in result.err


# ----------------------------------------------------------------------------------------------- health
@pytest.fixture
def agent_nodes(apiserver):
    """Two cordoned GPU nodes of this test's own: one whose agent reports now, one quiet with a bad GPU."""
    suffix = uuid.uuid4().hex[:5]
    now = datetime.now(UTC)
    made = []
    for name, last, unhealthy in (
        (f"h-fresh-{suffix}", now, ()),
        (f"h-quiet-{suffix}", now - timedelta(hours=1), (2,)),
    ):
        node = make_node(name, "spine-h", "leaf-h", gpus=4)
        node["spec"]["unschedulable"] = True  # never placed on: the other tests' ledgers stay as they were
        node["metadata"]["annotations"].update(
            {
                "agentaflow.gpu/devices": json.dumps(
                    device_entries(name, 4, "NVIDIA-H100", 81920, unhealthy)
                ),
                "agentaflow.gpu/last-update": last.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "agentaflow.gpu/status": "degraded" if unhealthy else "healthy",
            }
        )
        made.append(node)
    create_nodes(apiserver.api_client(), made)
    yield [n["metadata"]["name"] for n in made]
    apiserver.kubectl("delete", "node", *[n["metadata"]["name"] for n in made], "--wait=false")


def test_health_reports_quiet_agents_and_bad_devices(agent_nodes, cli):
    fresh, quiet = agent_nodes
    ok = cli("health", fresh, "--source", "nodes", "-o", "json")
    assert ok.code == 5  # cordoned: not placeable
    assert [f["problem"] for f in ok.json()["findings"]] == ["not-placeable"]

    result = cli("health", quiet, "--source", "nodes", "-o", "json")
    assert result.code == 5
    found = {(f["problem"], f["device"]) for f in result.json()["findings"]}
    assert found == {
        ("not-placeable", None),
        ("agent-quiet", None),
        ("device-unhealthy", 2),
        ("device-stale", 0),
        ("device-stale", 1),
        ("device-stale", 3),
    }
    rows = cli("health", quiet, "--source", "nodes").table()
    assert {(r["PROBLEM"], r["GPU"]) for r in rows} == {(p, "-" if d is None else str(d)) for p, d in found}
    assert (
        cli("health", quiet, "--source", "nodes", "--stale-after", "7200").code == 5
    )  # still cordoned, bad GPU


def test_health_exit_0_when_all_is_well(apiserver, cli):
    name = f"h-well-{uuid.uuid4().hex[:5]}"
    node = make_node(name, "spine-h", "leaf-h", gpus=2)
    node["spec"]["taints"] = [{"key": "gpuledger.io/test-only", "value": "true", "effect": "NoSchedule"}]
    node["metadata"]["annotations"]["agentaflow.gpu/last-update"] = datetime.now(UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    create_nodes(apiserver.api_client(), [node])
    try:
        result = cli("health", name, "--source", "nodes")
        assert result.code == 0, result.out
        assert "all 2 GPUs on 1 nodes healthy and reporting" in result.out
    finally:
        apiserver.kubectl("delete", "node", name, "--wait=false")


# ------------------------------------------------------------------------------------------------ watch
def test_watch_redraws_until_its_count(apiserver, stack, namespace, cli):
    result = cli("watch", "--count", "2", "--interval", "0", "-n", namespace, "--source", "nodes")
    assert result.code == 0, result.err
    frames = result.out.count("gpuledger watch")
    assert frames == 2 and result.out.count("TOTAL") == 2
