"""`gpuledger explain` for a pod that would wait in a cluster with GPU queues: the preemption the ledger would
plan for it, each victim with the rule that allows it, or why it would take nothing back.

The cluster file is made the way a user makes one: a first `gpuledger explain` places team-a's pods, their
patches are applied to them (as the API server would) and they are listed running in the cluster file of the
second, which explains the pod that would preempt.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonpatch
import yaml

from devcluster.nodes import make_sample_cluster
from gpuledger.names import QUEUE_API_VERSION
from gpuledger.views.preemption import parse_preemption, split_top
from tests.cli.conftest import run_cli

NODES = make_sample_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=2, tainted_per_leaf=0)  # 2 x 8 GPUs
NOW = "1767229200"  # 2026-01-01T01:00:00Z: team-a's pods started an hour before


def namespace(name: str, team: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"team": team}}}


def queue(team: str, gpus: int) -> dict:
    return {
        "apiVersion": QUEUE_API_VERSION,
        "kind": "GPUQueue",
        "metadata": {"name": f"team-{team}"},
        "spec": {"namespaceSelector": {"matchLabels": {"team": team}}, "quotas": [{"gpus": gpus}]},
    }


def pod(name: str, ns: str, priority: str | None = None) -> dict:
    annotations = {"topology.scheduler/gpu-count": "8"}
    if priority:
        annotations["agentaflow.gpu/priority"] = priority
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]},
    }


def explain(tmp_path: Path, cluster: list[dict], pods: list[dict], *args: str):
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(cluster))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(pods))
    return run_cli(
        "explain",
        "--cluster",
        str(tmp_path / "cluster.yaml"),
        str(tmp_path / "pods.yaml"),
        "--now",
        NOW,
        *args,
    )


def cluster_with_team_a_running(tmp_path: Path, quota_a: int) -> list[dict]:
    """Both nodes held by team-a's two 8-GPU pods (a-1 the younger), under queues of 8 GPUs (team-b) and
    `quota_a` (team-a)."""
    base = [*NODES, namespace("lab-a", "a"), namespace("lab-b", "b"), queue("a", quota_a), queue("b", 8)]
    team_a = [pod("a-0", "lab-a", "low"), pod("a-1", "lab-a", "low")]
    placed = explain(tmp_path, base, team_a, "-o", "json").json()
    running = []
    for i, (p, result) in enumerate(zip(team_a, placed, strict=True)):
        assert result["allowed"] and result["node"], result
        stored = jsonpatch.apply_patch(p, result["patch"])
        stored["spec"]["nodeName"] = result["node"]
        stored["status"] = {"phase": "Running", "startTime": f"2026-01-01T00:0{i}:00Z"}
        running.append(stored)
    return base + running


def test_a_pod_that_would_preempt_shows_its_victims_and_the_rule_allowing_each(tmp_path):
    cluster = cluster_with_team_a_running(tmp_path, quota_a=8)
    result = explain(tmp_path, cluster, [pod("b-0", "lab-b")], "-o", "json").json()[0]
    assert result["allowed"] and result["node"] is None  # it waits, gated
    shown = result["preemption"]
    assert shown["preemptor"] == "lab-b/b-0" and shown["refusal"] == "" and not shown["cannot"]
    assert [(v["workload"], v["gpus"], v["rule"]) for v in shown["victims"]] == [
        ("lab-a/a-1", "8", "reclaim")
    ]
    assert "queue team-a borrows" in shown["victims"][0]["why"]
    text = explain(tmp_path, cluster, [pod("b-0", "lab-b")]).out.splitlines()
    at = text.index("  would preempt 1 workload(s), 8 GPU(s), for lab-b/b-0:")
    assert text[at + 1].startswith("    lab-a/a-1 (8 GPU(s)): rule reclaim: queue team-a borrows")


def test_lower_priority_in_its_own_queue_is_preempted_by_the_priority_rule(tmp_path):
    cluster = cluster_with_team_a_running(tmp_path, quota_a=16)
    result = explain(tmp_path, cluster, [pod("urgent", "lab-a", "high")], "-o", "json").json()[0]
    victims = result["preemption"]["victims"]
    assert [(v["workload"], v["rule"]) for v in victims] == [("lab-a/a-1", "priority")]
    text = explain(tmp_path, cluster, [pod("urgent", "lab-a", "high")]).out
    assert "    lab-a/a-1 (8 GPU(s)): rule priority: " in text


def test_a_pod_whose_queue_may_take_nothing_back_says_why(tmp_path):
    cluster = cluster_with_team_a_running(tmp_path, quota_a=16)  # team-a within its quota: nothing to reclaim
    result = explain(tmp_path, cluster, [pod("b-0", "lab-b")], "-o", "json").json()[0]
    shown = result["preemption"]
    assert shown["victims"] == [] and shown["cannot"], shown
    text = explain(tmp_path, cluster, [pod("b-0", "lab-b")]).out
    assert f"  would not preempt: {shown['cannot']}" in text.splitlines()


def test_a_pod_that_fits_or_a_cluster_without_queues_shows_no_preemption(tmp_path):
    free = explain(tmp_path, [*NODES, queue("a", 8)], [pod("p", "lab-a")], "-o", "json").json()[0]
    assert free["node"] and free["preemption"] is None
    full = [pod(f"p{i}", "ml") for i in range(3)]
    results = explain(tmp_path, list(NODES), full, "-o", "json").json()
    assert results[2]["node"] is None and results[2]["preemption"] is None  # waits; no queue, no plan
    assert "preempt" not in explain(tmp_path, list(NODES), full).out


def test_the_words_split_outside_parentheses_and_unknown_words_are_kept_whole():
    assert split_top("a (b; c); d") == ["a (b; c)", "d"]
    view = parse_preemption("queue team-b is at its quota; ns/p cannot preempt: no victim")
    assert view is not None and view.refusal == "queue team-b is at its quota" and view.cannot == "no victim"
    odd = parse_preemption("something the ledger said")
    assert odd is not None and odd.text == "something the ledger said" and not odd.victims
    assert json.dumps(odd.as_dict())
