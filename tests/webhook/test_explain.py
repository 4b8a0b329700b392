"""`gpuledger explain`: the real mutating path offline, in order; and the docs' examples still work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonpatch
import yaml

from gpuledger.cli import main as cli
from gpuledger.names import PLACEMENT_ANNOTATION

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_CLUSTER = ROOT / "devcluster" / "samples" / "cluster.yaml"
ANNOTATIONS_DOC = ROOT / "docs" / "annotations.md"


def run_explain(capsys, pods_file: Path, *extra: str) -> list[dict]:
    assert cli.main(["explain", "--cluster", str(SAMPLE_CLUSTER), str(pods_file), "-o", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def write(tmp_path: Path, docs: list[dict]) -> Path:
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def pod(name, annotations=None, limits=None):
    container = {"name": "c", "image": "busybox"}
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations or {}},
        "spec": {"containers": [container]},
    }


def test_pods_in_order_share_one_ledger(tmp_path, capsys):
    ask = {"topology.scheduler/gpu-count": "8", "topology.scheduler/when-full": "refuse"}
    docs = [pod(f"p{i}", ask) for i in range(17)]
    docs.insert(0, pod("web"))
    results = run_explain(capsys, write(tmp_path, docs))
    assert len(results) == 18
    assert results[0]["allowed"] and results[0]["patch"] == [] and results[0]["node"] is None
    placed = results[1:17]
    assert all(r["allowed"] for r in placed)
    assert len({r["node"] for r in placed}) == 16  # 16 nodes x 8 GPUs, each pod takes a whole node
    last = results[17]
    assert not last["allowed"] and "not enough GPUs" in last["reason"] and last["patch"] == []
    for r in placed:
        assert set(r) >= {"allowed", "node", "devices", "patch", "reason"}
        assert r["devices"] == list(range(8))
        paths = {op["path"] for op in r["patch"]}
        assert "/metadata/annotations/gpuledger.io~1placement" in paths


def test_job_in_the_pod_file_is_expanded_and_placed_as_a_gang(tmp_path, capsys):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "annotations": {"topology.scheduler/gpu-count": "16"},
        },
        "spec": {
            "parallelism": 4,
            "completionMode": "Indexed",
            "template": {"spec": {"containers": [{"name": "t", "image": "x"}]}},
        },
    }
    results = run_explain(capsys, write(tmp_path, [job]))
    assert [r["pod"] for r in results] == [f"ml/train-{i}" for i in range(4)]
    assert all(r["allowed"] and len(r["devices"]) == 4 for r in results)
    assert "group job/ml/train" in results[0]["reason"]


def test_pods_with_their_owner_in_the_file(tmp_path, capsys):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ml", "annotations": {"topology.scheduler/gpu-count": "4"}},
        "spec": {"parallelism": 2},
    }
    pods = []
    for i in range(2):
        p = pod(f"j-{i}")
        p["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "controller": True}
        ]
        pods.append(p)
    results = run_explain(capsys, write(tmp_path, [job, *pods]))
    assert [r["pod"] for r in results] == ["ml/j-0", "ml/j-1"]  # the Job is not expanded: its pods are listed
    assert all(r["allowed"] and len(r["devices"]) == 2 for r in results)


def test_bad_annotation_and_text_output(tmp_path, capsys):
    path = write(
        tmp_path,
        [pod("bad", {"topology.scheduler/gpu-count": "lots"}), pod("ok", limits={"nvidia.com/gpu": 1})],
    )
    assert cli.main(["explain", "--cluster", str(SAMPLE_CLUSTER), str(path)]) == 0
    out = capsys.readouterr().out
    assert "ml/bad: DENIED (422)" in out and "topology.scheduler/gpu-count='lots'" in out
    assert re.search(r"ml/ok: ALLOWED node \S+ devices \d", out)
    assert "add /metadata/annotations/gpuledger.io~1placement" in out


def test_missing_file_is_a_clean_error(tmp_path, capsys):
    assert cli.main(["explain", "--cluster", str(tmp_path / "nope.yaml"), str(tmp_path / "pods.yaml")]) == 2
    assert "gpuledger explain" in capsys.readouterr().err


def test_docs_examples_are_all_admitted(tmp_path, capsys):
    blocks = re.findall(r"```yaml\n(.*?)```", ANNOTATIONS_DOC.read_text(), re.S)
    assert len(blocks) >= 5
    for block in blocks:
        path = tmp_path / "example.yaml"
        path.write_text(block)
        results = run_explain(capsys, path)
        assert results, block
        for r in results:
            assert r["allowed"], (r["pod"], r["reason"])
            mutated = jsonpatch.apply_patch(
                {"metadata": {"annotations": {}}, "spec": {"containers": [{}]}},
                [op for op in r["patch"] if op["path"].startswith("/metadata/annotations/")],
            )
            assert PLACEMENT_ANNOTATION in mutated["metadata"]["annotations"]


def test_docs_error_examples_match_the_messages(tmp_path, capsys):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train-llm",
            "namespace": "ml",
            "annotations": {"topology.scheduler/gpu-count": "10"},
        },
        "spec": {
            "parallelism": 4,
            "completionMode": "Indexed",
            "template": {"spec": {"containers": [{"name": "t", "image": "x"}]}},
        },
    }
    docs = [
        pod(
            "notebook",
            {"topology.scheduler/gpu-count": "2", "topology.scheduler/placement-strategy": "tight"},
        ),
        job,
        pod("big", {"topology.scheduler/gpu-count": "12"}),
    ]
    results = run_explain(capsys, write(tmp_path, docs))
    text = ANNOTATIONS_DOC.read_text()
    for r in (results[0], results[1]):  # our own messages, verbatim
        assert not r["allowed"]
        assert r["reason"] in text, r["reason"]
    # the core words the no-fit reason; the docs show a recent wording of it
    assert not results[-1]["allowed"]
    assert results[-1]["reason"].split(" with strategy")[0] in text


def test_pods_of_a_pod_group_in_the_file_are_explained_as_its_gang(tmp_path, capsys):
    group = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "ml", "annotations": {"topology.scheduler/gpu-count": "8"}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    pods = []
    for i in range(2):
        p = pod(f"pg-{i}")
        p["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
        pods.append(p)
    results = run_explain(capsys, write(tmp_path, [group, *pods]))
    assert [r["pod"] for r in results] == ["ml/pg-0", "ml/pg-1"]
    assert all(r["allowed"] and len(r["devices"]) == 4 for r in results), results
    assert "group podgroup/ml/pg" in results[0]["reason"]


def test_a_pod_resized_in_place_in_the_cluster_file_holds_its_new_size(tmp_path, capsys):
    from tests.core.core_factory import node

    running = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ml", "generation": 1},
        "spec": {
            "nodeName": "n",
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "c", "allocatedResources": {"cpu": "1"}, "resources": {"requests": {"cpu": "1"}}}
            ],
        },
    }
    resized = json.loads(json.dumps(running))
    resized["metadata"]["generation"] = 2
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "7"
    resized["status"]["containerStatuses"][0] = {
        "name": "c",
        "allocatedResources": {"cpu": "7"},
        "resources": {"requests": {"cpu": "7"}},
    }
    asking = pod("train", limits={"nvidia.com/gpu": "1", "cpu": "2"})
    asking["metadata"]["annotations"] = {"topology.scheduler/when-full": "refuse"}
    answers = {}
    for label, web in (("as created", running), ("resized", resized)):
        cluster = tmp_path / f"{label}.yaml"
        cluster.write_text(yaml.safe_dump_all([node("n", 8, cpu="8"), web]))
        pods = write(tmp_path, [asking])
        assert cli.main(["explain", "--cluster", str(cluster), str(pods), "-o", "json"]) == 0
        (answers[label],) = json.loads(capsys.readouterr().out)
    assert answers["as created"]["allowed"] and answers["as created"]["node"] == "n"
    assert not answers["resized"]["allowed"] and "cpu" in answers["resized"]["reason"].lower()
    print(answers["resized"]["reason"])
