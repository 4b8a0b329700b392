"""Every example manifest of the five earlier tools' documentation (/work/shared/earlier-tools), applied with
kubectl as the user alice in an opted-in namespace: each is placed as its tool intended (node, leaf, devices,
env) or denied with a message naming the annotation and what to write instead. docs/migrating.md shows each
beside what gpuledger does with it.

Only what the API server requires is added to a manifest (an image, a Job's template and restartPolicy, a
selector), and the gpu-scheduling-map examples use this cluster's node names, as that tool's docs ask. No
training operator runs: a PyTorchJob's pods are created with a controlling ownerReference, as the operator
would create them. The sample cluster (devcluster.nodes): leaf-0 (100 Gbit/s) and leaf-1 (200) on spine-0,
leaf-2 and leaf-3 (400) on spine-1; node-3 of each leaf is tainted nvidia.com/gpu.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.e2e.conftest import SAMPLE_NODES, wait_nodes_free

pytestmark = pytest.mark.e2e

LABELS = {n["metadata"]["name"]: n["metadata"]["labels"] for n in SAMPLE_NODES}
LEAF = {name: labels["topology.scheduler/leaf"] for name, labels in LABELS.items()}
SPINE = {name: labels["topology.scheduler/spine"] for name, labels in LABELS.items()}
BANDWIDTH = {
    name: float(labels["topology.scheduler/network-bandwidth-gbps"]) for name, labels in LABELS.items()
}
CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"


def nodes_of(*leaves: str) -> list[str]:
    return sorted(name for name, leaf in LEAF.items() if leaf in leaves)


def env_of(pod: dict, container: int = 0) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][container].get("env") or []}


def assert_env(pod: dict, placement, container: int = 0) -> None:
    """runtime-uuids visibility (the default): the runtime gets the devices' UUIDs (their indices on a node
    that reports none), and CUDA inside the container numbers its devices from 0."""
    env = env_of(pod, container)
    shown = placement.uuids if placement.uuids else tuple(str(d) for d in placement.devices)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(shown), env
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(len(placement.devices))), env


def events(workloads, reason: str, expect: int = 1, timeout: float = 60) -> list[dict]:
    def listed():
        found = workloads.cp.get_json(
            "events", "-n", workloads.namespace, "--field-selector", f"reason={reason}", as_user="alice"
        )["items"]
        return found if len(found) >= expect else None

    return workloads.cp.wait_for(listed, timeout=timeout, what=f"{expect} {reason} event(s)")


def placed(workloads, count: int, selector: str, timeout: float = 90):
    pods = workloads.wait_pods(count, selector, timeout=timeout)
    placements = [workloads.placement(p) for p in pods]
    assert all(p is not None for p in placements), [p["metadata"]["name"] for p in pods]
    return pods, placements


# ------------------------------------------------------------------ topology-aware scheduler


def test_topology_single_gpu_job(workloads):
    workloads.apply(
        f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: single-gpu-job
  annotations:
    topology.scheduler/gpu-count: "1"
spec:
  template:
    spec:
      schedulerName: topology-aware-scheduler
      restartPolicy: Never
      containers:
      - name: gpu-job
        image: {CUDA_IMAGE}
        resources:
          limits:
            nvidia.com/gpu: 1
"""
    )
    [pod], [placement] = placed(workloads, 1, "job-name=single-gpu-job")
    assert len(placement.devices) == 1 and placement.group is None
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert_env(pod, placement)


@pytest.mark.parametrize(
    "name,container,image",
    [
        ("multi-gpu-job", "gpu-job", CUDA_IMAGE),  # "Multi-GPU Job"
        ("gpu-job", "gpu-container", "gpu-workload:latest"),  # "Submitting a GPU Job"
    ],
)
def test_topology_multi_gpu_job_in_its_preferred_leaf(apiserver, stack, workloads, name, container, image):
    wait_nodes_free(apiserver, stack, nodes_of("leaf-1"))
    workloads.apply(
        f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  annotations:
    topology.scheduler/gpu-count: "8"
    topology.scheduler/preferred-domain: "leaf-1"
spec:
  template:
    spec:
      schedulerName: topology-aware-scheduler
      restartPolicy: Never
      containers:
      - name: {container}
        image: {image}
        resources:
          limits:
            nvidia.com/gpu: 8
"""
    )
    [pod], [placement] = placed(workloads, 1, f"job-name={name}")
    assert LEAF[placement.node] == "leaf-1" and placement.devices == tuple(range(8))
    assert_env(pod, placement)


def test_topology_latency_sensitive_inference_deployment(stack, workloads):
    workloads.apply(
        """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: gpu-inference-service
  annotations:
    topology.scheduler/gpu-count: "4"
    topology.scheduler/latency-sensitive: "true"
spec:
  replicas: 1
  selector: {matchLabels: {app: gpu-inference-service}}
  template:
    metadata: {labels: {app: gpu-inference-service}}
    spec:
      schedulerName: topology-aware-scheduler
      containers:
      - name: inference
        image: tensorflow/serving:latest
        resources:
          limits:
            nvidia.com/gpu: 4
"""
    )
    [pod], [placement] = placed(workloads, 1, "app=gpu-inference-service")
    assert len(placement.devices) == 4 and placement.strategy == "least_utilized"  # implied by latency
    devices = stack.call("snapshot")["nodes"][placement.node]["devices"]
    assert all(not shares for *_, shares in devices)  # no GPU of its node is shared with other pods
    assert_env(pod, placement)


def test_latency_sensitive_pod_asking_for_a_share_is_denied_naming_both(workloads):
    proc = workloads.apply(
        """
apiVersion: v1
kind: Pod
metadata:
  name: shared-inference
  annotations:
    topology.scheduler/latency-sensitive: "true"
    agentaflow.gpu/milli: "250"
spec:
  containers:
  - name: inference
    image: tensorflow/serving:latest
""",
        check=False,
    )
    assert proc.returncode != 0
    assert "topology.scheduler/latency-sensitive='true' is not accepted" in proc.stderr
    assert "agentaflow.gpu/milli" in proc.stderr


def test_topology_multi_node_training_job(apiserver, stack, workloads):
    wait_nodes_free(apiserver, stack, nodes_of("leaf-2", "leaf-3"))
    workloads.apply(
        f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: multi-node-training
  annotations:
    topology.scheduler/gpu-count: "16"
    topology.scheduler/preferred-domain: "spine-1"
    topology.scheduler/network-bandwidth: "200Gb"
    topology.scheduler/placement-strategy: "consolidated"
spec:
  parallelism: 4
  completions: 4
  template:
    metadata: {{labels: {{app: multi-node-training}}}}
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: {CUDA_IMAGE}
"""
    )
    pods, placements = placed(workloads, 4, "app=multi-node-training")
    assert [len(p.devices) for p in placements] == [4, 4, 4, 4]  # 16 over the Job's 4 pods
    assert len({p.group for p in placements}) == 1 and sorted(p.slot for p in placements) == [0, 1, 2, 3]
    nodes = {p.node for p in placements}
    assert {SPINE[n] for n in nodes} == {"spine-1"} and len({LEAF[n] for n in nodes}) == 1
    assert all(BANDWIDTH[n] >= 200 for n in nodes)
    assert len(nodes) == 2  # consolidated: two 4-GPU pods per 8-GPU node (the leaf rules count nodes)
    held = [(p.node, d) for p in placements for d in p.devices]
    assert len(held) == len(set(held)) == 16
    for pod, placement in zip(pods, placements, strict=True):
        assert_env(pod, placement)


def test_a_bandwidth_no_node_has_is_denied_naming_annotation_and_label(workloads):
    proc = workloads.apply(
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: fast-network
  annotations:
    topology.scheduler/gpu-count: "1"
    topology.scheduler/network-bandwidth: "800Gb"
spec:
  containers:
  - name: main
    image: {CUDA_IMAGE}
""",
        check=False,
    )
    assert proc.returncode != 0
    # the count is every ready node of the shared cluster (an earlier test may have left one cordoned)
    assert re.search(
        r"\d+ node\(s\) network bandwidth below topology.scheduler/network-bandwidth", proc.stderr
    )
    assert "topology.scheduler/network-bandwidth-gbps" in proc.stderr


# ------------------------------------------------------------------ AgentaFlow


def operator_pod(job: dict, name: str, gpus: int) -> str:
    """The pod a training operator creates for a replica of `job`."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"training.kubeflow.org/job-name": job["metadata"]["name"]},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": job["kind"],
                    "name": job["metadata"]["name"],
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "pytorch/pytorch:latest-gpu",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ]
        },
    }
    return yaml.safe_dump(pod)


PYTORCHJOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {name}
  annotations:
{annotations}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
          - name: pytorch
            image: pytorch/pytorch:latest-gpu
            resources: {{limits: {{nvidia.com/gpu: 2}}}}
    Worker:
      replicas: 1
      template:
        spec:
          containers:
          - name: pytorch
            image: pytorch/pytorch:latest-gpu
            resources: {{limits: {{nvidia.com/gpu: 2}}}}
"""


def test_agentaflow_pytorchjob_pods_are_placed_one_by_one(workloads):
    # AgentaFlow's Kubeflow example: strategy and priority on the PyTorchJob, no gang asked for
    workloads.apply(
        PYTORCHJOB.format(
            name="bert",
            annotations='    agentaflow.gpu/scheduling-strategy: "priority"\n'
            '    agentaflow.gpu/priority: "10"',
        )
    )
    job = workloads.cp.get_json("pytorchjob", "bert", "-n", workloads.namespace, as_user="alice")
    for name in ("bert-master-0", "bert-worker-0"):
        workloads.apply(operator_pod(job, name, 2))
    for name in ("bert-master-0", "bert-worker-0"):
        pod = workloads.pod(name)
        placement = workloads.placement(pod)
        assert len(placement.devices) == 2 and placement.strategy == "priority" and placement.group is None
        assert_env(pod, placement)


def test_a_pytorchjob_that_asks_for_a_gang_is_one(workloads):
    workloads.apply(PYTORCHJOB.format(name="llm", annotations='    topology.scheduler/gang: "true"'))
    job = workloads.cp.get_json("pytorchjob", "llm", "-n", workloads.namespace, as_user="alice")
    workloads.apply(operator_pod(job, "llm-master-0", 2))
    first = workloads.placement(workloads.pod("llm-master-0"))
    assert (
        first.group == f"pytorchjob/{workloads.namespace}/llm" and len(first.group_plan) == 2
    )  # Master + Worker
    workloads.apply(operator_pod(job, "llm-worker-0", 2))
    second = workloads.placement(workloads.pod("llm-worker-0"))
    assert second.group == first.group and {first.slot, second.slot} == {0, 1}
    assert (second.node, second.devices) == (
        first.group_plan[second.slot].node,
        first.group_plan[second.slot].devices,
    )


# ------------------------------------------------------------------ gpu-scheduling-map scheduler


def map_pod(name: str, mapping: str, scheduler: str = "gpu-scheduler") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-scheduling-map": mapping}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "test",
                    "image": "busybox:1.35",
                    "command": [
                        "sh",
                        "-c",
                        "while true; do echo 'Node: '$(hostname)' | CUDA_VISIBLE_DEVICES: '"
                        "${CUDA_VISIBLE_DEVICES}; sleep 10; done",
                    ],
                }
            ],
        },
    }


# the quick start's map, with this cluster's nodes in place of the AKS workers vmss000000..04
QUICK_START_MAP = "0=leaf-2-node-0:0,1\n1=leaf-2-node-1:2\n2=leaf-2-node-2:0,1,2\n3=leaf-2-node-3:3\n"


def test_gpu_scheduling_map_quick_start_pods(apiserver, stack, workloads):
    wait_nodes_free(apiserver, stack, nodes_of("leaf-2"))
    proc = workloads.apply(
        yaml.safe_dump_all([map_pod("gpu-test-0", QUICK_START_MAP), map_pod("gpu-test-1", QUICK_START_MAP)])
    )
    assert "spec.schedulerName 'gpu-scheduler' was replaced by 'default-scheduler'" in proc.stderr
    expected = {"gpu-test-0": ("leaf-2-node-0", (0, 1)), "gpu-test-1": ("leaf-2-node-1", (2,))}
    for name, (node, devices) in expected.items():
        pod = workloads.pod(name)
        placement = workloads.placement(pod)
        assert (placement.node, placement.devices, placement.strategy) == (node, devices, "explicit"), name
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert_env(pod, placement)


def test_gpu_scheduling_map_names_without_and_with_a_deployment_suffix(apiserver, stack, workloads):
    wait_nodes_free(apiserver, stack, nodes_of("leaf-2"))
    # "Manual Testing": a name with no trailing number takes entry 0; "deployment-name-abc123-0" style
    # names take their trailing number, as that scheduler's index extraction did
    workloads.apply(
        yaml.safe_dump_all(
            [map_pod("test-gpu-pod", QUICK_START_MAP), map_pod("check-abc123-3", QUICK_START_MAP)]
        )
    )
    first = workloads.placement(workloads.pod("test-gpu-pod"))
    assert (first.node, first.devices) == ("leaf-2-node-0", (0, 1))
    third = workloads.pod("check-abc123-3")
    placement = workloads.placement(third)
    assert (placement.node, placement.devices) == ("leaf-2-node-3", (3,))  # the tainted node: tolerated
    assert any(t.get("key") == "nvidia.com/gpu" for t in third["spec"]["tolerations"])


def test_gpu_scheduler_check_statefulset(apiserver, stack, workloads):
    wait_nodes_free(apiserver, stack, nodes_of("leaf-3"))
    # the helm chart's StatefulSet (Parallel), its podAnnotations map with this cluster's nodes
    workloads.apply(
        """
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: gpu-scheduler-check
spec:
  serviceName: gpu-scheduler-check
  podManagementPolicy: Parallel
  replicas: 3
  selector: {matchLabels: {app.kubernetes.io/name: gpu-scheduler-check}}
  template:
    metadata:
      labels: {app.kubernetes.io/name: gpu-scheduler-check}
      annotations:
        gpu-scheduling-map: |
          0=leaf-3-node-0:0,1
          1=leaf-3-node-1:2
          2=leaf-3-node-2:0,1,2
          3=leaf-3-node-3:3
          4=leaf-3-node-3:3
    spec:
      schedulerName: gpu-scheduler
      containers:
      - name: check
        image: gpu-scheduler-check:latest
"""
    )
    pods, _ = placed(workloads, 3, "app.kubernetes.io/name=gpu-scheduler-check")
    got = {p["metadata"]["name"]: workloads.placement(p) for p in pods}
    expected = {
        "gpu-scheduler-check-0": ("leaf-3-node-0", (0, 1)),
        "gpu-scheduler-check-1": ("leaf-3-node-1", (2,)),
        "gpu-scheduler-check-2": ("leaf-3-node-2", (0, 1, 2)),
    }
    assert {name: (p.node, p.devices) for name, p in got.items()} == expected
    assert all(p.group is None for p in got.values())  # a map pins each pod: no gang


def test_a_map_naming_nodes_the_cluster_lacks_is_denied_naming_the_map(workloads):
    # "Multiple GPU Types": that cluster's node names
    proc = workloads.apply(
        yaml.safe_dump(
            map_pod("gpu-types-0", "0=gpu-node-v100:0,1\n1=gpu-node-a100:0\n2=gpu-node-t4:0,1,2,3\n")
        ),
        check=False,
    )
    assert proc.returncode != 0
    assert "gpu-scheduling-map" in proc.stderr and "node gpu-node-v100 is unknown" in proc.stderr


# ------------------------------------------------------------------ GPU worker Jobs


@pytest.fixture
def labelled_a100_nodes(apiserver, stack, workloads):
    """The worker-jobs guide's setup step: label GPU nodes with their accelerator (and, as its AWS example
    has, the instance type); wait until admission sees the labels."""
    nodes = ["leaf-1-node-0", "leaf-1-node-1"]
    for node in nodes:
        apiserver.kubectl(
            "label",
            "node",
            node,
            "accelerator=nvidia-tesla-a100",
            "node.kubernetes.io/instance-type=p4d.24xlarge",
            "--overwrite",
        )
    probe = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "label-probe"},
            "spec": {
                "nodeSelector": {"accelerator": "nvidia-tesla-a100"},
                "containers": [
                    {"name": "c", "image": CUDA_IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        }
    )
    apiserver.wait_for(
        lambda: workloads.apply(probe, check=False, extra=("--dry-run=server",)).returncode == 0,
        timeout=30,
        what="the accelerator label reaches the ledger",
    )
    return nodes


def test_worker_jobs_complete_gpu_job(labelled_a100_nodes, workloads):
    workloads.apply(
        """
apiVersion: batch/v1
kind: Job
metadata:
  name: ml-training-job
spec:
  backoffLimit: 3
  ttlSecondsAfterFinished: 3600
  template:
    spec:
      restartPolicy: OnFailure
      containers:
      - name: trainer
        image: agent_bus:latest
        resources:
          requests:
            memory: "16Gi"
            cpu: "8000m"
            nvidia.com/gpu: "1"
          limits:
            memory: "32Gi"
            cpu: "16000m"
            nvidia.com/gpu: "1"
        env:
        - name: WORKER_TYPE
          value: "gpu"
        - name: CUDA_VISIBLE_DEVICES
          value: "0"
        volumeMounts:
        - name: workspace
          mountPath: /workspace
        - name: shm
          mountPath: /dev/shm
      volumes:
      - name: workspace
        persistentVolumeClaim:
          claimName: ml-workspace
      - name: shm
        emptyDir:
          medium: Memory
          sizeLimit: 4Gi
      nodeSelector:
        accelerator: nvidia-tesla-a100
        node.kubernetes.io/instance-type: p4d.24xlarge
      tolerations:
      - key: nvidia.com/gpu
        operator: Equal
        value: "true"
        effect: NoSchedule
"""
    )
    [pod], [placement] = placed(workloads, 1, "job-name=ml-training-job")
    assert placement.node in labelled_a100_nodes and len(placement.devices) == 1
    assert env_of(pod)["WORKER_TYPE"] == "gpu"
    assert_env(pod, placement)  # the CUDA_VISIBLE_DEVICES the user wrote is replaced by the placement's


def test_worker_jobs_multi_gpu_configuration(workloads):
    out = workloads.apply(
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: multi-gpu-worker
spec:
  containers:
  - name: worker
    image: {CUDA_IMAGE}
    resources:
      limits:
        nvidia.com/gpu: "2"
    env:
    - name: CUDA_VISIBLE_DEVICES
      value: "0,1"
"""
    )
    pod = workloads.pod("multi-gpu-worker")
    placement = workloads.placement(pod)
    assert len(placement.devices) == 2
    assert_env(pod, placement)
    # runtime-uuids numbers the 2 GPUs 0,1: the placement writes the value the user wrote, so no replacement
    # warning (in host-indices mode it would be replaced, with one: tests/webhook/test_env_guard_handler.py)
    assert "CUDA_VISIBLE_DEVICES" not in out.stderr, out.stderr


def test_worker_jobs_basic_job_on_a_gpu_type_the_cluster_lacks_is_denied_on_the_job(workloads):
    workloads.apply(
        """
apiVersion: batch/v1
kind: Job
metadata:
  name: gpu-ml-task
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: worker
        image: agent_bus:latest
        resources:
          limits:
            nvidia.com/gpu: 1
      nodeSelector:
        accelerator: nvidia-tesla-v100
      tolerations:
      - key: nvidia.com/gpu
        operator: Equal
        value: "true"
        effect: NoSchedule
"""
    )
    [event, *_] = events(workloads, "GPUPlacementDenied")
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("Job", "gpu-ml-task")
    assert "nodeSelector/affinity mismatch" in event["message"]


def test_a_plain_parallel_job_places_each_pod_on_its_own(workloads):
    # the worker-jobs template with parallelism: twenty 1-GPU workers, not a gang (none was asked for)
    workloads.apply(
        f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: workers
spec:
  parallelism: 20
  completions: 20
  template:
    metadata: {{labels: {{app: workers}}}}
    spec:
      restartPolicy: Never
      containers:
      - name: worker
        image: {CUDA_IMAGE}
        resources:
          limits:
            nvidia.com/gpu: 1
"""
    )
    pods, placements = placed(workloads, 20, "app=workers", timeout=120)
    assert all(p.group is None and len(p.devices) == 1 for p in placements)
    held = [(p.node, p.devices[0]) for p in placements]
    assert len(set(held)) == 20


# ------------------------------------------------------------------ GPU_Orchestrator


def test_gpu_orchestrator_priority_and_strategy_words(workloads):
    # a GPUWorkload's spec (gpuCount 2, priority "high", schedulingStrategy leastLoaded) as pod annotations
    workloads.apply(
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: my-model
  annotations:
    topology.scheduler/gpu-count: "2"
    agentaflow.gpu/priority: "high"
    agentaflow.gpu/scheduling-strategy: "leastLoaded"
spec:
  containers:
  - name: model
    image: {CUDA_IMAGE}
"""
    )
    pod = workloads.pod("my-model")
    placement = workloads.placement(pod)
    assert len(placement.devices) == 2 and placement.strategy == "least_utilized"
    assert_env(pod, placement)
