"""A pod may not name its own host GPUs, through kubectl and the real kube-apiserver: the denial
and the CUDA_VISIBLE_DEVICES replacement warning reach the user as kubectl prints them."""

from __future__ import annotations

import pytest
import yaml

from tests.e2e.conftest import gpu_pod_yaml

pytestmark = pytest.mark.e2e


def test_a_pod_asking_the_runtime_for_every_gpu_is_denied(workloads):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reads-every-gpu"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ]
        },
    }
    out = workloads.apply(yaml.safe_dump(pod), check=False)
    assert out.returncode != 0
    assert "denied the request" in out.stderr
    assert (
        f'gpuledger: pod {workloads.namespace}/reads-every-gpu: container "main" sets '
        "spec.containers[0].env[NVIDIA_VISIBLE_DEVICES]='all': a pod may not choose its own GPUs"
    ) in out.stderr
    assert (
        "ask for GPUs with resources.limits nvidia.com/gpu or the annotation topology.scheduler/gpu-count"
        in (out.stderr)
    )
    assert workloads.pods() == []


def test_cuda_visible_devices_the_placement_sets_is_replaced_with_a_warning(workloads):
    text = gpu_pod_yaml("own-cuda-index", gpus=1, spec={})
    pod = yaml.safe_load(text)
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": "3"}]
    out = workloads.apply(yaml.safe_dump(pod))
    assert (
        "Warning: gpuledger replaced CUDA_VISIBLE_DEVICES=3 in container \"cuda\" with '0': "
        "in visibility mode runtime-uuids the placement sets it"
    ) in out.stderr
    stored = workloads.pod("own-cuda-index")
    env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0]["env"]}
    placement = workloads.placement(stored)
    shown = placement.uuids or tuple(map(str, placement.devices))  # indices on a node that reports no UUIDs
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": ",".join(shown)}


def test_kubectl_debug_cannot_add_a_container_that_names_every_gpu(apiserver, workloads):
    workloads.apply(gpu_pod_yaml("debugged", gpus=1))
    out = apiserver.kubectl(
        "debug",
        "-n",
        workloads.namespace,
        "debugged",
        "--image=busybox",
        "--container=peek",
        "--env=NVIDIA_VISIBLE_DEVICES=all",
        "--attach=false",
        "--profile=general",
        check=False,
    )
    assert out.returncode != 0, out.stdout
    assert (
        "container \"peek\" sets spec.ephemeralContainers[0].env[NVIDIA_VISIBLE_DEVICES]='all'" in out.stderr
    ), out.stderr
    assert not workloads.pod("debugged")["spec"].get("ephemeralContainers")
