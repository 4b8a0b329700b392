"""The Python helper against the real kube-apiserver and webhook: `create_gpu_job` makes a Job the webhook
places, `placement_of` reads where, `submit_workload` and `wait` drive GPUWorkloads (time injected)."""

from __future__ import annotations

import uuid

import pytest

from gpuledger import client
from gpuledger.cli.kube import Kube, KubeError

pytestmark = pytest.mark.e2e


def test_create_gpu_job_is_placed_with_everything_asked(apiserver, stack, namespace):
    kube = Kube(apiserver.api_client())
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    name = client.create_gpu_job(
        "ml-task-123",
        "agent_bus:latest",
        2,
        command=["python", "-m", "src.workers.worker"],
        env={"WORKER_TYPE": "gpu", "TASK_ID": "ml_task_123"},
        node_selector={"topology.scheduler/leaf": "leaf-1"},
        tolerations=[toleration],
        namespace=namespace,
        requests={"cpu": "500m"},
        kube=kube,
    )
    assert name == "ml-task-123"
    job = client.wait(f"job/{name}", ("Running",), namespace=namespace, timeout_s=60, poll_s=0.2, kube=kube)
    pod_spec = job["spec"]["template"]["spec"]
    assert (
        pod_spec["nodeSelector"] == {"topology.scheduler/leaf": "leaf-1"}
        and toleration in pod_spec["tolerations"]
    )
    container = pod_spec["containers"][0]
    assert container["command"] == ["python", "-m", "src.workers.worker"]
    assert {"name": "TASK_ID", "value": "ml_task_123"} in container["env"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"

    pods = apiserver.wait_for(
        lambda: [p for p in apiserver.pods(namespace, f"job-name={name}") if client.placement_of(p)],
        timeout=60,
        what="the job's pod placed",
    )
    placement = client.placement_of(pods[0])
    assert placement.node.startswith("leaf-1-") and len(placement.devices) == 2
    assert placement == stack_placement(stack, pods[0])
    # a kubernetes V1Pod model reads the same
    from kubernetes.client import V1ObjectMeta, V1Pod

    v1pod = V1Pod(
        metadata=V1ObjectMeta(
            name=pods[0]["metadata"]["name"], annotations=pods[0]["metadata"]["annotations"]
        )
    )
    assert client.placement_of(v1pod) == placement


def stack_placement(stack, pod: dict) -> client.PodPlacement:
    """The ledger's own decoding (signature verified), in the helper's terms."""
    p = stack.placement(pod)
    return client.PodPlacement(
        id=p.id,
        node=p.node,
        devices=tuple(p.devices),
        shares=tuple((s.device, s.milli, s.memory_mib) for s in p.shares),
        uuids=tuple(p.uuids),
        strategy=p.strategy,
        group=p.group,
        slot=p.slot,
        signed=True,
    )


def test_create_gpu_job_refuses_a_namespace_not_opted_in(apiserver):
    plain = apiserver.create_namespace(f"t-plain-{uuid.uuid4().hex[:5]}", admission=False)
    try:
        with pytest.raises(client.NamespaceNotOptedIn, match=r"gpuledger\.io/admission=enabled"):
            client.create_gpu_job("x", "busybox", 1, namespace=plain, kube=apiserver.api_client())
        assert apiserver.kubectl("get", "jobs", "-n", plain, "-o", "name").stdout.strip() == ""
    finally:
        apiserver.kubectl("delete", "namespace", plain, "--wait=false")


def test_create_gpu_job_checks_its_arguments(apiserver, namespace):
    with pytest.raises(ValueError, match="gpus=0 is not accepted"):
        client.create_gpu_job("x", "busybox", 0, namespace=namespace, kube=apiserver.api_client())
    with pytest.raises(KubeError) as refused:  # the API's own validation, its message kept
        client.create_gpu_job("Not_A_Name", "busybox", 1, namespace=namespace, kube=apiserver.api_client())
    assert refused.value.status == 422 and "Not_A_Name" in str(refused.value)


def test_submit_workload_and_wait_with_an_injected_clock(apiserver, gpu_crds, namespace):
    kube = Kube(apiserver.api_client())
    name = client.submit_workload(
        client.gpu_workload(
            "llama", "busybox", 2, priority="high", api_version="gpu.warp.dev/v1alpha1", max_retries=3
        ),
        namespace=namespace,
        kube=kube,
    )
    stored = apiserver.get_json("gpuworkload.gpu.warp.dev", name, "-n", namespace)
    # the CRD's schema defaults the fields the client left out
    assert stored["spec"]["gpuCount"] == 2 and stored["spec"]["retryPolicy"]["maxRetries"] == 3

    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    with pytest.raises(TimeoutError, match="still Pending after 5s"):
        client.wait(
            f"gpuworkload.gpu.warp.dev/{name}",
            namespace=namespace,
            timeout_s=5,
            poll_s=2,
            kube=kube,
            clock=lambda: now[0],
            sleep=sleep,
        )
    assert sleeps == [2, 2, 2]
    apiserver.kubectl(
        "patch",
        "gpuworkload.gpu.warp.dev",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Running", "assignedNodes": ["leaf-0-node-0"]}}',
    )
    running = client.wait(
        f"gpuworkload.gpu.warp.dev/{name}", namespace=namespace, kube=kube, clock=lambda: now[0], sleep=sleep
    )
    assert running["status"]["assignedNodes"] == ["leaf-0-node-0"]
    apiserver.kubectl(
        "patch",
        "gpuworkload.gpu.warp.dev",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Failed", "reason": "BackoffLimitExceeded"}}',
    )
    with pytest.raises(client.WorkloadFailed, match="BackoffLimitExceeded"):
        client.wait(f"gpuworkload.gpu.warp.dev/{name}", ("Succeeded",), namespace=namespace, kube=kube)
    with pytest.raises(KubeError, match="not found"):
        client.wait("gpuworkload/nope", namespace=namespace, kube=kube)
