"""env_guard's pure functions: which device requests a pod may not write itself, and the messages."""

from __future__ import annotations

import pytest

from gpuledger.core.model import BindingMode, Placement
from gpuledger.core.pods.placement_codec import encode_placement
from gpuledger.names import PLACEMENT_ANNOTATION
from gpuledger.webhook.admission import env_guard
from gpuledger.webhook.admission.patch import apply_placement, shallow_pod, strip_ledger_keys
from tests.webhook.webhook_support import HMAC_KEY, config, gpu_pod

KEY = HMAC_KEY.encode()
PLACEMENT = Placement(id="r1", node="node-0000", devices=(2, 5), uuids=("GPU-a", "GPU-b"))


def with_env(pod: dict, container: int, **env) -> dict:
    c = pod["spec"]["containers"][container]
    c["env"] = [*c.get("env", []), *({"name": k, "value": v} for k, v in env.items())]
    return pod


def placed_pod(mode: str, containers: int = 2, limits: bool = True) -> dict:
    """A pod as gpuledger's mutation leaves it, for `PLACEMENT` in visibility mode `mode`."""
    pod = shallow_pod(gpu_pod(2, limits=limits, containers=containers))
    strip_ledger_keys(pod)
    apply_placement(
        pod,
        PLACEMENT,
        encode_placement(PLACEMENT, KEY),
        binding_mode=BindingMode.AFFINITY,
        visibility_mode=mode,
    )
    return pod


@pytest.mark.parametrize("value", ["all", "0", "GPU-a,GPU-b", "nvidia.com/gpu=all", "VOID"])
def test_a_pod_naming_devices_is_refused_with_field_value_and_what_is_accepted(value):
    pod = with_env(gpu_pod(None, containers=2), 1, NVIDIA_VISIBLE_DEVICES=value)
    message = env_guard.refusal(pod, KEY, config())
    assert message is not None
    assert f'container "c1" sets spec.containers[1].env[NVIDIA_VISIBLE_DEVICES]={value!r}' in message
    assert "nvidia.com/gpu" in message and "topology.scheduler/gpu-count" in message
    assert "gpuledger writes the device variables" in message


@pytest.mark.parametrize("value", ["void", "none", ""])
def test_values_that_expose_no_gpu_are_accepted(value):
    pod = with_env(gpu_pod(None), 0, NVIDIA_VISIBLE_DEVICES=value)
    assert env_guard.refusal(pod, KEY, config()) is None


def test_other_nvidia_variables_and_cuda_visible_devices_are_harmless():
    pod = with_env(
        gpu_pod(None),
        0,
        NVIDIA_DRIVER_CAPABILITIES="all",
        NVIDIA_REQUIRE_CUDA="cuda>=12",
        CUDA_VISIBLE_DEVICES="0,1",
    )
    assert env_guard.findings(pod, {}) == []
    assert env_guard.refusal(pod, KEY, config()) is None


def test_value_from_is_refused_since_admission_cannot_read_it():
    pod = gpu_pod(None)
    pod["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "which"}}}
    ]
    [found] = env_guard.findings(pod, {})
    assert "spec.containers[0].env[NVIDIA_VISIBLE_DEVICES] from valueFrom" in found


def test_init_and_ephemeral_containers_are_checked():
    pod = gpu_pod(None)
    pod["spec"]["initContainers"] = [
        {"name": "init", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    ]
    pod["spec"]["ephemeralContainers"] = [
        {"name": "debug", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "1"}]}
    ]
    found = env_guard.findings(pod, {})
    assert found == [
        "container \"init\" sets spec.initContainers[0].env[NVIDIA_VISIBLE_DEVICES]='all'",
        "container \"debug\" sets spec.ephemeralContainers[0].env[NVIDIA_VISIBLE_DEVICES]='1'",
    ]


def test_cdi_annotations_naming_gpus_are_refused_others_not():
    pod = gpu_pod(
        None, annotations={"cdi.k8s.io/ctr": "nvidia.com/gpu=all", "cdi.k8s.io/nic": "vendor.com/net=eth1"}
    )
    [found] = env_guard.findings(pod, {})
    assert found == "annotation cdi.k8s.io/ctr='nvidia.com/gpu=all' asks the runtime for GPU devices by CDI"
    for value in ("vendor.com/net=a, amd.com/gpu=0", "nvidia.com/mig=0:1"):
        assert env_guard.findings(gpu_pod(None, annotations={"cdi.k8s.io/x": value}), {})


def test_the_runtime_device_list_mounts_are_refused():
    pod = gpu_pod(None)
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/data"},
        {"name": "x", "mountPath": "/var/run/nvidia-container-devices/all"},
        {"name": "y", "mountPath": "//run/nvidia-container-devices/../nvidia-container-devices/GPU-a"},
    ]
    found = env_guard.findings(pod, {})
    assert len(found) == 2
    assert "spec.containers[0].volumeMounts[1].mountPath='/var/run/nvidia-container-devices/all'" in found[0]
    assert "'/run/nvidia-container-devices/GPU-a'" in found[1]


@pytest.mark.parametrize(
    "path", ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps/", "/dev/dri", "/dev", "/"]
)
def test_host_paths_holding_gpu_device_nodes_are_refused(path):
    pod = gpu_pod(None)
    pod["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": path}}]
    [found] = env_guard.findings(pod, {})
    assert found.startswith('volume "dev" mounts spec.volumes[0].hostPath.path=')


@pytest.mark.parametrize("path", ["/data", "/device", "/dev/shm", "/var/lib/kubelet"])
def test_other_host_paths_pass(path):
    pod = gpu_pod(None)
    pod["spec"]["volumes"] = [{"name": "v", "hostPath": {"path": path}}]
    assert env_guard.findings(pod, {}) == []


@pytest.mark.parametrize("mode", ["runtime-uuids", "host-indices", "device-plugin"])
def test_what_the_placement_wrote_is_accepted_exactly(mode):
    pod = placed_pod(mode)
    assert env_guard.refusal(pod, KEY, config(visibility_mode=mode)) is None
    # ...and nothing else: one device more, or a value in the container the placement left alone
    tampered = with_env(placed_pod(mode), 1, NVIDIA_VISIBLE_DEVICES="all")
    message = env_guard.refusal(tampered, KEY, config(visibility_mode=mode))
    assert message and "spec.containers[1].env[NVIDIA_VISIBLE_DEVICES]='all'" in message


def test_runtime_uuids_writes_are_accepted_only_with_a_valid_signature():
    pod = placed_pod("runtime-uuids")
    assert env_guard.placed_env(pod, PLACEMENT, config()) == {
        ("containers", 0): "GPU-a,GPU-b",
        ("containers", 1): "void",
    }
    assert env_guard.refusal(pod, b"another key", config()) is not None
    del pod["metadata"]["annotations"][PLACEMENT_ANNOTATION]
    assert "='GPU-a,GPU-b'" in (env_guard.refusal(pod, KEY, config()) or "")


def test_replacements_warn_per_container_only_when_the_value_changes():
    before = with_env(gpu_pod(2, limits=True, containers=2), 0, CUDA_VISIBLE_DEVICES="3,4")
    with_env(before, 1, CUDA_VISIBLE_DEVICES="0")
    after = shallow_pod(before)
    apply_placement(after, PLACEMENT, "x", binding_mode=BindingMode.AFFINITY, visibility_mode="runtime-uuids")
    assert env_guard.replacements(before, after, "runtime-uuids") == [
        "gpuledger replaced CUDA_VISIBLE_DEVICES=3,4 in container \"c0\" with '0,1': in visibility mode "
        "runtime-uuids the placement sets it (it numbers the GPUs the container sees); docs/webhook.md",
        'gpuledger replaced CUDA_VISIBLE_DEVICES=0 in container "c1" (removed: this container gets no GPU): '
        "in visibility mode runtime-uuids the placement sets it (it numbers the GPUs the container sees); "
        "docs/webhook.md",
    ]
    same = with_env(gpu_pod(2, limits=True), 0, CUDA_VISIBLE_DEVICES="0,1")
    after = shallow_pod(same)
    apply_placement(after, PLACEMENT, "x", binding_mode=BindingMode.AFFINITY, visibility_mode="runtime-uuids")
    assert env_guard.replacements(same, after, "runtime-uuids") == []  # the worker-pool "0,1" on 2 GPUs


def test_device_plugin_mode_keeps_the_users_cuda_visible_devices_silently():
    before = with_env(gpu_pod(2, limits=True), 0, CUDA_VISIBLE_DEVICES="1,0")
    after = shallow_pod(before)
    apply_placement(after, PLACEMENT, "x", binding_mode=BindingMode.AFFINITY, visibility_mode="device-plugin")
    assert after["spec"]["containers"][0]["env"] == [{"name": "CUDA_VISIBLE_DEVICES", "value": "1,0"}]
    assert env_guard.replacements(before, after, "device-plugin") == []


def test_on_update_only_what_the_update_adds_is_refused():
    stored = with_env(gpu_pod(None), 0, NVIDIA_VISIBLE_DEVICES="all")  # admitted before this rule existed
    relabelled = with_env(gpu_pod(None, name=stored["metadata"]["name"]), 0, NVIDIA_VISIBLE_DEVICES="all")
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert env_guard.refusal(relabelled, KEY, config(), before=stored) is None
    debugged = with_env(gpu_pod(None), 0, NVIDIA_VISIBLE_DEVICES="all")
    debugged["spec"]["ephemeralContainers"] = [
        {"name": "debugger", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    ]
    message = env_guard.refusal(debugged, KEY, config(), before=stored)
    assert message and message.startswith(
        "container \"debugger\" sets spec.ephemeralContainers[0].env[NVIDIA_VISIBLE_DEVICES]='all': "
    )
    assert "spec.containers[0]" not in message
