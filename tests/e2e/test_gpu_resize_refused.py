"""In-place resize (`kubectl patch --subresource resize`, GA in 1.35) changes CPU and memory only: the API
server refuses a resize of `nvidia.com/gpu`, so a pod's GPUs stay what the ledger placed. This checks that it
stays so on the harness's Kubernetes."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.e2e

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"


def test_the_api_server_refuses_to_resize_a_pods_gpus(apiserver, stack, workloads, namespace):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-resize"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"},
                        "requests": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"},
                    },
                }
            ]
        },
    }
    workloads.apply(yaml.safe_dump(pod))
    placement = workloads.placement("gpu-resize")
    assert placement is not None and len(placement.devices) == 1
    resize = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}},
                }
            ]
        }
    }
    proc = apiserver.kubectl(
        "patch", "pod", "gpu-resize", "-n", namespace, "--subresource", "resize", "--type", "strategic",
        "-p", json.dumps(resize), check=False,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    print(f"\nthe API server's answer: {proc.stderr.strip()}")
    assert "only cpu and memory resources are mutable" in proc.stderr, proc.stderr
    stored = workloads.pod("gpu-resize")["spec"]["containers"][0]["resources"]["limits"]
    assert stored["nvidia.com/gpu"] == "1"
    assert len(workloads.placement("gpu-resize").devices) == 1
