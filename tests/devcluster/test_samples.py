"""The sample cluster file and the builder it comes from must agree;
the builder's shape is what tests assume."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import yaml

from devcluster.nodes import DEVICES_ANNOTATION, LEAF_LABEL, SPINE_LABEL, as_list, make_sample_cluster

SAMPLE = Path(__file__).resolve().parents[2] / "devcluster" / "samples" / "cluster.yaml"


def test_sample_file_is_the_builder_output():
    assert yaml.safe_load(SAMPLE.read_text()) == as_list(make_sample_cluster()), (
        "regenerate with: .venv/bin/python -m devcluster.nodes > devcluster/samples/cluster.yaml"
    )


def test_sample_cluster_shape():
    nodes = make_sample_cluster()
    assert len(nodes) == 16
    leaves = Counter(n["metadata"]["labels"][LEAF_LABEL] for n in nodes)
    spines = {n["metadata"]["labels"][LEAF_LABEL]: n["metadata"]["labels"][SPINE_LABEL] for n in nodes}
    assert leaves == {f"leaf-{i}": 4 for i in range(4)}
    assert spines == {"leaf-0": "spine-0", "leaf-1": "spine-0", "leaf-2": "spine-1", "leaf-3": "spine-1"}
    tainted = [n for n in nodes if n["spec"].get("taints")]
    assert len(tainted) == 4 and all(n["metadata"]["name"].endswith("node-3") for n in tainted)
    with_devices = [n for n in nodes if DEVICES_ANNOTATION in n["metadata"]["annotations"]]
    assert len(with_devices) == 8
    devices = json.loads(with_devices[0]["metadata"]["annotations"][DEVICES_ANNOTATION])
    assert [d["index"] for d in devices] == list(range(8)) and all(d["healthy"] for d in devices)
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in nodes)
