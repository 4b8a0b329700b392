"""The earlier tools' users, through kubectl against the real API server: their manifests work as written, and
every decision shows up where they look (warnings on apply, Events on the pod or its workload).

The manifests are the earlier tools' own examples (/work/shared/earlier-tools, also quoted in docs/webhook.md)
with only what the API server requires added (a selector, an image). No training operator runs: the
PyTorchJob test creates the job, then its pod with a controlling ownerReference, as the operator would.
"""

from __future__ import annotations

import pytest
import yaml

from tests.e2e.conftest import gpu_pod_yaml

pytestmark = pytest.mark.e2e


def events(workloads, reason: str, expect: int = 1, timeout: float = 30) -> list[dict]:
    """`kubectl get events` (as alice) with this reason, once at least `expect` of them are there."""

    def listed():
        found = workloads.cp.get_json(
            "events", "-n", workloads.namespace, "--field-selector", f"reason={reason}", as_user="alice"
        )["items"]
        return found if len(found) >= expect else None

    return workloads.cp.wait_for(
        listed, timeout=timeout, what=f"{expect} {reason} event(s) in {workloads.namespace}"
    )


def pods_found_by_watch(stack) -> float:
    """The webhook's `gpuledger_events_pods_found_total{by="watch"}`: placed pods its Events found through the
    cluster sync's watch rather than a LIST."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=str(stack.tls_paths["ca.crt"]))
    with urllib.request.urlopen(f"{stack.url}/metrics", context=context, timeout=10) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith('gpuledger_events_pods_found_total{by="watch"}'):
            return float(line.split()[-1])
    return 0.0


def test_topology_aware_scheduler_deployment_is_placed_per_its_annotations(workloads):
    found_before = pods_found_by_watch(workloads.stack)
    # topology-aware-scheduler's "Inference Service Deployment": the annotations sit on the Deployment, the
    # template names the scheduler gpuledger replaces
    workloads.apply(
        """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: gpu-inference-service
  annotations:
    topology.scheduler/gpu-count: "4"
    topology.scheduler/latency-sensitive: "true"
    topology.scheduler/placement-strategy: consolidated
spec:
  replicas: 2
  selector: {matchLabels: {app: gpu-inference-service}}
  template:
    metadata: {labels: {app: gpu-inference-service}}
    spec:
      schedulerName: topology-aware-scheduler
      containers:
      - name: inference
        image: tensorflow/serving:latest
"""
    )
    pods = workloads.wait_pods(2, "app=gpu-inference-service")
    placements = [workloads.placement(p) for p in pods]
    assert all(p is not None for p in placements), [p["metadata"]["name"] for p in pods]
    assert [len(p.devices) for p in placements] == [4, 4]  # the Deployment's gpu-count, per pod
    assert all(p.group is None for p in placements)  # a Deployment's replicas are not a gang
    assert {p.strategy for p in placements} == {"consolidated"}
    assert all(p["spec"]["schedulerName"] == "default-scheduler" for p in pods)
    workloads.wait_confirmed(pods)
    placed = events(workloads, "GPUPlaced", expect=2)
    # the two generateName pods were found stored through the sync's watch (no LIST per round)
    assert pods_found_by_watch(workloads.stack) >= found_before + 2
    by_pod = {e["involvedObject"]["name"]: e for e in placed}
    for pod, placement in zip(pods, placements, strict=True):
        event = by_pod[pod["metadata"]["name"]]
        assert (
            event["involvedObject"]["uid"] == pod["metadata"]["uid"]
            and event["involvedObject"]["kind"] == "Pod"
        )
        assert event["type"] == "Normal" and f"node {placement.node}" in event["message"]
        assert "strategy consolidated" in event["message"] and placement.id in event["message"]


def test_pytorchjob_annotations_reach_the_operators_pods(workloads):
    # AgentaFlow's Kubeflow integration: the strategy and priority are on the PyTorchJob
    workloads.apply(
        """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: bert
  annotations:
    agentaflow.gpu/scheduling-strategy: "priority"
    agentaflow.gpu/priority: "10"
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
          - name: pytorch
            image: pytorch/pytorch:latest
            resources: {limits: {nvidia.com/gpu: 2}}
"""
    )
    job = workloads.cp.get_json("pytorchjob", "bert", "-n", workloads.namespace, as_user="alice")
    pod = yaml.safe_load(gpu_pod_yaml("bert-master-0", gpus=2))
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "bert",
            "uid": job["metadata"]["uid"],
            "controller": True,
        }
    ]
    workloads.apply(yaml.safe_dump(pod))
    stored = workloads.pod("bert-master-0")
    placement = workloads.placement(stored)
    assert placement is not None and len(placement.devices) == 2
    assert placement.strategy == "priority"
    [event] = events(workloads, "GPUPlaced")
    assert event["involvedObject"]["name"] == "bert-master-0"
    assert event["involvedObject"]["uid"] == stored["metadata"]["uid"]


def test_gpu_scheduler_pod_is_handed_to_the_default_scheduler_with_a_warning(workloads):
    # gpu-scheduling-map-scheduler's test pod, with this cluster's node names in the map
    proc = workloads.apply(
        """
apiVersion: v1
kind: Pod
metadata:
  name: gpu-test-0
  annotations:
    gpu-scheduling-map: |
      0=leaf-3-node-1:0,1
      1=leaf-3-node-2:2
spec:
  schedulerName: gpu-scheduler
  containers:
  - name: test
    image: busybox:1.35
    command: ["sh", "-c", "while true; do echo $CUDA_VISIBLE_DEVICES; sleep 10; done"]
"""
    )
    assert (
        "Warning: gpuledger: spec.schedulerName 'gpu-scheduler' was replaced by 'default-scheduler'"
        in proc.stderr
    )
    pod = workloads.pod("gpu-test-0")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    placement = workloads.placement(pod)
    assert (placement.node, placement.devices) == ("leaf-3-node-1", (0, 1))


def test_another_schedulers_pod_is_left_alone_with_a_warning(workloads):
    proc = workloads.apply(gpu_pod_yaml("volcano-pod", gpus=1, spec={"schedulerName": "volcano"}))
    assert "Warning: gpuledger: spec.schedulerName 'volcano' is another scheduler's" in proc.stderr
    pod = workloads.pod("volcano-pod")
    assert pod["spec"]["schedulerName"] == "volcano"
    assert workloads.placement(pod) is None and "affinity" not in pod["spec"]


def test_denials_are_events_on_the_workload(workloads):
    workloads.apply(
        """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: too-big
  annotations:
    topology.scheduler/gpu-count: "64"
spec:
  replicas: 1
  selector: {matchLabels: {app: too-big}}
  template:
    metadata: {labels: {app: too-big}}
    spec:
      containers:
      - name: main
        image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04
"""
    )
    deployment = workloads.cp.get_json("deployment", "too-big", "-n", workloads.namespace, as_user="alice")
    denied = events(workloads, "GPUPlacementDenied")  # the ReplicaSet retries: one Event per round of retries
    for event in denied:
        assert (
            event["involvedObject"]["kind"] == "Deployment" and event["involvedObject"]["name"] == "too-big"
        )
        assert event["involvedObject"]["uid"] == deployment["metadata"]["uid"]
        assert event["type"] == "Warning" and "no placement for pod" in event["message"]
        assert "64 GPUs" in event["message"]
    # `kubectl describe deployment` shows it where the user looks
    described = workloads.cp.kubectl(
        "describe", "deployment", "too-big", "-n", workloads.namespace, as_user="alice"
    ).stdout
    assert "GPUPlacementDenied" in described
    assert workloads.pods("app=too-big") == []


def test_bare_pod_denial_is_an_event_too(workloads):
    proc = workloads.apply(gpu_pod_yaml("huge", gpus=64), check=False)
    assert proc.returncode != 0 and "no placement for pod" in proc.stderr
    [event] = events(workloads, "GPUPlacementDenied")
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("Pod", "huge")
